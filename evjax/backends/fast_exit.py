"""A prompt exit for processes that compiled or loaded kernels.

At exit, Python runs several full garbage collections while it tears its
modules down.  Numba's compiler leaves a few hundred thousand tracked objects
behind (types, IR, typing templates), and each of those collections walks
them all: a script whose last statement ran after one cold CSR compile took
0.8-1.3 s more to exit, where ``import jax`` alone takes about 0.4 s.  Nothing
in those collections matters at exit, where the operating system frees the
memory anyway.

:func:`register` (called by the bridges the first time they prepare a
handler) adds one ``atexit`` hook, ``gc.freeze()``: it moves every object
alive at that point out of the collector's reach, so the final collections
skip them.  ``atexit`` hooks registered earlier still run after it, and
those registered later run before it; objects are still deallocated as
their modules are torn down (reference counting is unaffected), so only
cyclic garbage left at exit is not collected, which Python does not promise
to collect at exit either.

This module imports neither Numba nor JAX.
"""
from __future__ import annotations

import atexit
import gc
import threading

__all__ = ["register"]

_lock = threading.Lock()
_registered = False


def register() -> None:
    """Register the exit hook (once per process)."""
    global _registered
    with _lock:
        if not _registered:
            atexit.register(gc.freeze)
            _registered = True

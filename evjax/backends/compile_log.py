"""Compile notices: which op a kernel is compiled for, and one log line when that takes long.

A Numba kernel compiles the first time an op lowers it at a new signature
(or loads from the disk cache in milliseconds).  The compile runs on the
calling thread, inside that lowering: nothing stands in for the kernel while
it compiles, no thread outlives the call, and a process exits as soon as its
last statement is done.

* :func:`lowering` records, per thread, the op being lowered, so that the
  bridges can name it (:func:`current_op`).
* :func:`announce_slow_compile` logs one line through :mod:`logging` (logger
  ``"evjax"``, level WARNING) when a compile is still running after
  :data:`SLOW_COMPILE_S` seconds, so a new user sees why the first call
  takes a while: ``evjax: compiling <op> for <signature> (first use; cached
  in <dir>)``.  ``python -m evjax.precompile`` fills the cache ahead of time.

This module imports neither Numba nor JAX.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from typing import Iterator

__all__ = ["lowering", "current_op", "announce_slow_compile", "SLOW_COMPILE_S"]

logger = logging.getLogger("evjax")

SLOW_COMPILE_S = 1.0  # a compile running longer than this logs its one line

_local = threading.local()


@contextlib.contextmanager
def lowering(op_name: str) -> Iterator[None]:
    """Within the block, kernels compiled on this thread are compiled for op ``op_name``."""
    previous = getattr(_local, "op", None)
    _local.op = op_name
    try:
        yield
    finally:
        _local.op = previous


def current_op() -> str | None:
    """The op being lowered on this thread, if any (for messages)."""
    return getattr(_local, "op", None)


@contextlib.contextmanager
def announce_slow_compile(what: str, signature: str, where: str, *,
                          after: float | None = None) -> Iterator[None]:
    """Log ``evjax: compiling <what> for <signature> (first use; cached in <where>)`` once,
    if the block is still running after ``after`` seconds (default :data:`SLOW_COMPILE_S`).

    The timer is a daemon thread started only while the block runs, so it
    never delays the exit of a process.
    """
    message = f"evjax: compiling {what} for {signature} (first use; cached in {where})"
    timer = threading.Timer(SLOW_COMPILE_S if after is None else after, logger.warning, (message,))
    timer.daemon = True
    try:
        timer.start()
    except RuntimeError:  # no new thread at interpreter shutdown (Python 3.12+): compile without the notice
        timer = None
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()

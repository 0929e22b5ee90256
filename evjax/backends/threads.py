"""How many threads evjax's parallel Numba kernels split their work into: one process-wide number.

The number lives in one C ``int32`` (``evjax_thread_count``) that compiled
handlers read at every call through :func:`thread_count`, an intrinsic that
loads it as an external symbol.  The symbol is resolved when a handler's
machine code is linked, from a fresh compile or from Numba's disk cache, so
one cached handler serves every setting and :func:`set_num_threads` takes
effect at the next call of every compiled program: no retrace, no recompile.

The count starts at Numba's pool size (``NUMBA_NUM_THREADS``, all cores by
default).  A kernel given ``1`` runs on the calling thread and never enters a
parallel region.

This module imports Numba and llvmlite, not JAX.
"""
from __future__ import annotations

import ctypes
import threading

import numba
from llvmlite import binding as llvm
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = ["SYMBOL", "thread_count", "set_num_threads", "get_num_threads", "pool_size"]

SYMBOL = "evjax_thread_count"

_lock = threading.Lock()
_cell = ctypes.c_int32(0)
llvm.add_symbol(SYMBOL, ctypes.addressof(_cell))  # before any handler that reads it is linked


def pool_size() -> int:
    """Numba's thread pool size: the most threads a kernel can use (``NUMBA_NUM_THREADS``)."""
    return max(int(numba.config.NUMBA_NUM_THREADS), 1)


_cell.value = pool_size()


@intrinsic
def thread_count(typingctx):
    """The current thread count (an ``int32`` load of :data:`SYMBOL`), for compiled handlers."""

    def codegen(context, builder, signature, args):
        module = builder.module
        cell = module.globals.get(SYMBOL)
        if cell is None:
            cell = ir.GlobalVariable(module, ir.IntType(32), SYMBOL)
            cell.linkage = "external"
        return builder.load(cell)

    return types.int32(), codegen


def set_num_threads(n: int) -> None:
    """Split evjax's parallel kernels into at most ``n`` threads, from their next call on.

    Applies to every op's Numba CPU kernels in this process, in programs
    already compiled too.  ``1`` runs every kernel on the thread that calls it:
    the safe choice on a machine shared with other jobs (see
    ``docs/performance.md``, "Busy machines").  A CSR vector scatter sums its
    output in another order on one thread than on several, so its results can
    differ in the last bits between settings; for a given setting they are
    the same on every call.

    Args:
        n: from 1 to Numba's pool size (``NUMBA_NUM_THREADS``; raise that
            environment variable before starting Python for more).

    Raises:
        TypeError: ``n`` is not an integer.
        ValueError: ``n`` is out of range.

    Example:
        >>> evjax.set_num_threads(1)     # serial kernels, e.g. beside other training jobs
    """
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"evjax.set_num_threads: n must be an int, got {type(n).__name__} {n!r}")
    if not 1 <= n <= pool_size():
        raise ValueError(
            f"evjax.set_num_threads: n={n} is outside [1, {pool_size()}] (Numba's pool size, "
            f"NUMBA_NUM_THREADS); set NUMBA_NUM_THREADS before starting Python for a larger pool"
        )
    with _lock:
        _cell.value = n


def get_num_threads() -> int:
    """The thread count evjax's parallel kernels use now (see :func:`set_num_threads`)."""
    return int(_cell.value)

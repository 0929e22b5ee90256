"""How many threads evjax's parallel Numba kernels use: a process-wide setting and a fall-back under load.

**The setting.**  The thread count lives in one C ``int32``
(``evjax_thread_count``) that compiled handlers read at every call through an
intrinsic that loads it as an external symbol.  The symbol is resolved when
a handler's machine code is linked, from a fresh compile or from Numba's disk
cache, so one cached handler serves every setting and
:func:`set_num_threads` takes effect at the next call of every compiled
program: no retrace, no recompile.  It starts at Numba's pool size
(``NUMBA_NUM_THREADS``, all cores by default).  A kernel given ``1`` runs on
the calling thread and never enters a parallel region.

**The fall-back.**  A parallel region is fork-join: the calling thread waits
for every worker.  On a machine with more runnable threads than cores, a
worker that the scheduler has put aside makes the whole call wait for a
time slice (milliseconds), so a 100 us kernel took 1-8 ms on two threads
where it took 0.1-0.4 ms on one.  Every parallel region of evjax's kernels
therefore stamps when each of its parts ends (:func:`part_done`) and, at its
join, compares them (:func:`region_done`): when the last part ended more
than :data:`STALL_NS` and half the region's own time after the first, a
worker was held up, and the handlers run kernels on the calling thread
(:func:`threads_now` returns 1) for a back-off period that doubles, from
:data:`BACKOFF_MIN_NS` to :data:`BACKOFF_MAX_NS`, while stalls go on, and
is forgotten at the first clean parallel region.  This only ever changes
speed, never results: every kernel gives the same bits on one thread as on
many (the parallel split of a sum depends on the inputs and on Numba's pool
size, never on the threads that run it).

This module imports Numba and llvmlite, not JAX.
"""
from __future__ import annotations

import ctypes
import threading

import numba
import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = ["thread_count", "pool_chunks", "threads_now", "now_ns", "start_region", "part_done", "region_done",
           "add_parts", "set_num_threads", "get_num_threads", "pool_size", "STALL_NS", "BACKOFF_MIN_NS", "BACKOFF_MAX_NS"]

STALL_NS = 100_000  # a part ending this much (and half the region's time) after the first: a stall
BACKOFF_MIN_NS = 20_000_000  # kernels stay on the calling thread this long after a first stall ...
BACKOFF_MAX_NS = 1_000_000_000  # ... doubling up to this while stalls go on

I32 = ir.IntType(32)
I64 = ir.IntType(64)

_lock = threading.Lock()
# The cells compiled code reads and writes, each under its symbol, registered before any code that
# reads them is linked.
_cells = {
    "evjax_thread_count": ctypes.c_int32(0),  # set_num_threads
    "evjax_pool_size": ctypes.c_int32(0),  # Numba's pool size: how many parts a sum is split into at most
    "evjax_serial_until_ns": ctypes.c_int64(0),  # the fall-back: kernels on one thread until then
    "evjax_backoff_ns": ctypes.c_int64(0),  # the fall-back's current length (0: no recent stall)
}
for _symbol, _cell in _cells.items():
    llvm.add_symbol(_symbol, ctypes.addressof(_cell))


def pool_size() -> int:
    """Numba's thread pool size: the most threads a kernel can use (``NUMBA_NUM_THREADS``)."""
    return max(int(numba.config.NUMBA_NUM_THREADS), 1)


_cells["evjax_thread_count"].value = _cells["evjax_pool_size"].value = pool_size()


def _global(builder, symbol: str, kind):
    module = builder.module
    cell = module.globals.get(symbol)
    if cell is None:
        cell = ir.GlobalVariable(module, kind, symbol)
        cell.linkage = "external"
    return cell


def _cell_loader(symbol: str, kind, numba_type, doc: str):
    def load(typingctx):
        def codegen(context, builder, signature, args):
            return builder.load(_global(builder, symbol, kind))

        return numba_type(), codegen

    load.__doc__ = doc
    return intrinsic(load)


def _cell_storer(symbol: str, kind, numba_type, doc: str):
    def store(typingctx, value):
        def codegen(context, builder, signature, args):
            builder.store(args[0], _global(builder, symbol, kind))

        return types.void(numba_type), codegen

    store.__doc__ = doc
    return intrinsic(store)


thread_count = _cell_loader("evjax_thread_count", I32, types.int32, "The thread count set by set_num_threads.")
pool_chunks = _cell_loader("evjax_pool_size", I32, types.int32, "Numba's pool size (the most parts of a split sum).")
_serial_until = _cell_loader("evjax_serial_until_ns", I64, types.int64, "The fall-back's end (ns).")
_set_serial_until = _cell_storer("evjax_serial_until_ns", I64, types.int64, "Set the fall-back's end (ns).")
_backoff = _cell_loader("evjax_backoff_ns", I64, types.int64, "The fall-back's current length (ns).")
_set_backoff = _cell_storer("evjax_backoff_ns", I64, types.int64, "Set the fall-back's length (ns).")


def emit_now_ns(builder):
    """``clock_gettime(CLOCK_MONOTONIC)`` in nanoseconds: the IR of :func:`now_ns`."""
    timespec = ir.LiteralStructType([I64, I64])
    module = builder.module
    fn = module.globals.get("clock_gettime")
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(I32, [I32, timespec.as_pointer()]), "clock_gettime")
    with builder.goto_entry_block():  # one stack slot per function, not per call
        ts = builder.alloca(timespec)
    builder.call(fn, [I32(1), ts])  # CLOCK_MONOTONIC
    seconds = builder.load(builder.gep(ts, [I32(0), I32(0)], inbounds=True))
    nanoseconds = builder.load(builder.gep(ts, [I32(0), I32(1)], inbounds=True))
    return builder.add(builder.mul(seconds, I64(1_000_000_000)), nanoseconds)


@intrinsic
def now_ns(typingctx):
    """``CLOCK_MONOTONIC`` in nanoseconds (libc's ``clock_gettime``, a vDSO call: ~40 ns)."""

    def codegen(context, builder, signature, args):
        return emit_now_ns(builder)

    return types.int64(), codegen


@intrinsic
def threads_now(typingctx):
    """The threads a kernel called now may use: the setting, or 1 during a fall-back (handlers call
    this).  As C: ``n = thread_count; return n > 1 && now_ns() < serial_until ? 1 : n``.  IR, so
    that it costs no compile of its own (a Numba-compiled one cost a process's first handler 0.05 s)."""

    def codegen(context, builder, signature, args):
        n = builder.sext(builder.load(_global(builder, "evjax_thread_count", I32)), I64)
        before = builder.block
        with builder.if_then(builder.icmp_signed(">", n, I64(1))):
            stalled = builder.icmp_signed("<", emit_now_ns(builder),
                                          builder.load(_global(builder, "evjax_serial_until_ns", I64)))
            limited = builder.select(stalled, I64(1), n)
            checked = builder.block
        result = builder.phi(I64)
        result.add_incoming(n, before)
        result.add_incoming(limited, checked)
        return result

    return types.int64(), codegen


@numba.njit(cache=True, nogil=True)
def start_region(parts):
    """Before a parallel region of ``parts`` parts: ``(ends, t0)``, the stamps :func:`part_done` fills."""
    return np.zeros(parts, np.int64), now_ns()


@numba.njit(cache=True, nogil=True, inline="always")
def part_done(ends, part):
    """The last statement of part ``part`` of a parallel region."""
    ends[part] = now_ns()


@numba.njit(cache=True, nogil=True)
def add_parts(out, parts, lo, hi):
    """``out[lo:hi] += parts[0][lo:hi] + parts[1][lo:hi] + ...``, one term after the other, in order: the
    end of a sum split into parts, the same bits whichever thread adds which slice."""
    for p in range(parts.shape[0]):
        part = parts[p]
        for j in range(lo, hi):
            out[j] += part[j]


@numba.njit(cache=True, nogil=True)
def region_done(ends, t0):
    """After the join: start or lengthen the fall-back if a part was held up, else forget past stalls."""
    first = ends[0]
    last = ends[0]
    for e in ends:
        first = min(first, e)
        last = max(last, e)
    spread = last - first
    if spread > STALL_NS and 2 * spread > first - t0:
        backoff = min(max(2 * _backoff(), numba.int64(BACKOFF_MIN_NS)), numba.int64(BACKOFF_MAX_NS))
        _set_backoff(backoff)
        _set_serial_until(now_ns() + backoff)
    elif _backoff() != 0:
        _set_backoff(numba.int64(0))


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
        _cells["evjax_thread_count"].value = n


def get_num_threads() -> int:
    """The thread count set for evjax's parallel kernels (see :func:`set_num_threads`).

    Returns:
        The count, from 1 to Numba's pool size.

    Example:
        >>> evjax.get_num_threads()      # Numba's pool size until set_num_threads is called
    """
    return int(_cells["evjax_thread_count"].value)


def fallback_state() -> tuple[float, float]:
    """``(seconds the kernels stay on one thread from now, current back-off in seconds)`` (for tests and logs)."""
    import time

    until = _cells["evjax_serial_until_ns"].value
    return max(until - time.monotonic_ns(), 0) / 1e9, _cells["evjax_backoff_ns"].value / 1e9

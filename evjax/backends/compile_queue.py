"""Cold start: kernels that compile in the background while the first calls run the reference.

A Numba CPU kernel with empty caches takes seconds to compile (the CSR scatter
about 8 s of CPU on this project's 2-core machine), far more than tracing and
compiling the rest of a program.  So, where that is safe, the first lowering
does not wait for it:

1. An :class:`~evjax.XLACustomKernel` lowers its chosen backend inside
   :func:`lowering`, saying whether it may fall back (the backend is the op's
   default, not one the user chose, and the op has a reference).
2. A bridge that finds the kernel's handler neither compiled in this process
   nor in the disk cache calls :func:`submit` with the compile and raises
   :class:`CompileDeferred`; the op lowers its pure-JAX reference instead, so
   the first call returns at once, with the same result.
3. One worker thread compiles the queued handlers (into the disk cache, so
   the next process finds them), then calls the hooks of :func:`on_ready`:
   the op layer bumps a value that is part of ``jax.jit``'s cache key, so
   jitted functions are traced again on their next call and now lower the
   compiled kernel.  A program that is already compiled is never patched:
   it keeps running the reference until its function is traced again.

Outside such a lowering (a raw :func:`evjax.numba_kernel` call, a backend the
user named), or with ``EVJAX_BACKGROUND_COMPILE=0``, a kernel compiles on
the spot, as before.  :func:`wait_for_kernels` waits for the queue (tests,
ahead-of-time export, benchmarks of steady state).

Every compile that runs longer than about a second, in the background or not,
logs one line through :mod:`logging` (logger ``"evjax"``, level WARNING, so a
new user sees why the CPU is busy): ``evjax: compiling <op> for <signature>
(first use; cached in <dir>)``.

This module imports neither Numba nor JAX.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Callable, Iterator

__all__ = [
    "CompileDeferred", "lowering", "may_defer", "current_op", "submit", "on_ready", "wait_for_kernels",
    "pending", "compile_cpu_seconds", "background_enabled", "set_background_compile", "announce_slow_compile", "SLOW_COMPILE_S",
]

logger = logging.getLogger("evjax")

SLOW_COMPILE_S = 1.0  # a compile running longer than this logs its one line


class CompileDeferred(Exception):
    """Raised inside a deferrable lowering: the kernel is compiling in the background."""


# ---------------------------------------------------------------------------
# Policy
# ---------------------------------------------------------------------------
_enabled: bool | None = None  # None: read EVJAX_BACKGROUND_COMPILE on first use


def background_enabled() -> bool:
    """Whether first calls may run the reference while kernels compile in the background.

    On unless ``EVJAX_BACKGROUND_COMPILE`` is ``0``/``false``/``no``/``off``
    in the environment or :func:`set_background_compile` turned it off.
    """
    if _enabled is None:
        value = os.environ.get("EVJAX_BACKGROUND_COMPILE", "1").strip().lower()
        return value not in ("0", "false", "no", "off")
    return _enabled


def set_background_compile(enabled: bool | None) -> None:
    """Turn background compilation on or off for code lowered from now on (``None``: the environment's choice).

    Off, the first call of an op waits for its kernel to compile (the
    behaviour of evjax before this option): choose it where the first calls
    must already run the compiled kernel, e.g. before ``jax.export``.

    Args:
        enabled: True (first calls may run the reference while kernels
            compile), False (they wait), or None (``EVJAX_BACKGROUND_COMPILE``
            decides; on when it is unset).

    Raises:
        TypeError: ``enabled`` is not a bool or None.

    Example:
        >>> evjax.set_background_compile(False)   # the next first calls wait for their kernels
    """
    global _enabled
    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError(f"set_background_compile expects True, False or None, got {enabled!r}")
    _enabled = enabled


# ---------------------------------------------------------------------------
# The lowering context (per thread)
# ---------------------------------------------------------------------------
_local = threading.local()


@contextlib.contextmanager
def lowering(op_name: str, deferrable: bool) -> Iterator[None]:
    """Within the block, bridges compile kernels for op ``op_name``; with ``deferrable``
    they may raise :class:`CompileDeferred` instead of compiling on the spot."""
    previous = getattr(_local, "context", None)
    _local.context = (op_name, bool(deferrable))
    try:
        yield
    finally:
        _local.context = previous


def current_op() -> str | None:
    """The op being lowered on this thread, if any (for messages)."""
    context = getattr(_local, "context", None)
    return context[0] if context else None


def may_defer() -> bool:
    """Whether a bridge called now may defer a cold compile (see :func:`lowering`)."""
    context = getattr(_local, "context", None)
    return bool(context and context[1]) and background_enabled()


# ---------------------------------------------------------------------------
# The worker
# ---------------------------------------------------------------------------
_cond = threading.Condition()
_queue: list[tuple[str, Callable[[], None]]] = []
_busy = 0  # jobs taken by the worker and not finished
_worker: threading.Thread | None = None
_hooks: list[Callable[[], None]] = []
_cpu_done = 0.0  # CPU seconds of the worker's finished jobs
_cpu_running: tuple[int, float] | None = None  # (worker thread id, its CPU clock when its job started)


def on_ready(hook: Callable[[], None]) -> None:
    """Call ``hook()`` (on the worker thread) each time the queue has drained after a compile."""
    with _cond:
        if hook not in _hooks:
            _hooks.append(hook)


def submit(label: str, job: Callable[[], None]) -> None:
    """Queue ``job()`` (a compile; it stores its own result or error) on the worker thread.

    The worker is not a daemon: a process that ends while kernels compile
    finishes them first, so that the next process finds them in the disk cache.
    """
    global _worker, _busy
    with _cond:
        _queue.append((label, job))
        if _worker is None:
            _worker = threading.Thread(target=_work, name="evjax-compile", daemon=False)
            _worker.start()
        _cond.notify_all()


def _work() -> None:
    global _worker, _busy, _cpu_done, _cpu_running
    while True:
        with _cond:
            if not _queue:
                _worker = None
                _cond.notify_all()
                return
            label, job = _queue.pop(0)
            _busy += 1
            _cpu_running = (threading.get_ident(), time.thread_time())
        try:
            job()
        except BaseException:  # noqa: BLE001 - the job keeps its error for the next lowering
            logger.debug("evjax: background compile of %s failed", label, exc_info=True)
        with _cond:
            _cpu_done += time.thread_time() - _cpu_running[1]
            _cpu_running = None
        with _cond:
            drained = not _queue
        if drained:
            for hook in list(_hooks):
                try:
                    hook()
                except Exception:  # noqa: BLE001 - a hook must not stop the worker
                    logger.exception("evjax: a compile-ready hook failed")
        with _cond:
            _busy -= 1
            _cond.notify_all()


def pending() -> int:
    """How many background compiles are queued or running."""
    with _cond:
        return len(_queue) + _busy


def compile_cpu_seconds() -> float:
    """CPU seconds the background worker has spent compiling in this process (finished jobs;
    with ``time.pthread_getcpuclockid``, the running one too).  For measurements: the CPU time
    of a first call is the process's minus this."""
    with _cond:
        total, running = _cpu_done, _cpu_running
    if running is not None and hasattr(time, "pthread_getcpuclockid"):
        try:
            total += time.clock_gettime(time.pthread_getcpuclockid(running[0])) - running[1]
        except (OSError, OverflowError):
            pass
    return total


def wait_for_kernels(timeout: float | None = None) -> bool:
    """Wait until every kernel compiling in the background is ready.

    Jitted functions that ran the reference meanwhile are traced again on
    their next call and then run the compiled kernels.

    Args:
        timeout: seconds to wait at most (``None``: as long as it takes).

    Returns:
        True if nothing is left compiling, False on timeout.

    Example:
        >>> y = f(W, spikes)             # first call: the reference, kernels compiling
        >>> evjax.wait_for_kernels()      # from here, f's next call runs the kernels
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    with _cond:
        while _queue or _busy:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            _cond.wait(left)
    return True


# ---------------------------------------------------------------------------
# Progress
# ---------------------------------------------------------------------------
@contextlib.contextmanager
def announce_slow_compile(what: str, signature: str, where: str, *,
                          after: float | None = None) -> Iterator[None]:
    """Log ``evjax: compiling <what> for <signature> (first use; cached in <where>)`` once,
    if the block is still running after ``after`` seconds (default :data:`SLOW_COMPILE_S`)."""
    message = f"evjax: compiling {what} for {signature} (first use; cached in {where})"
    timer = threading.Timer(SLOW_COMPILE_S if after is None else after, logger.warning, (message,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()

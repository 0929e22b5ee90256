"""Numba CPU bridge: ``@numba.njit`` kernels called from JAX through the XLA FFI.

For every (kernel, argument types) signature :func:`get_handler` makes a
handler with :func:`evjax.backends.ffi_core.compile_handler`: after the shared
prologue it wraps each buffer of the call frame as a zero-copy array and calls
the kernel, so a call from jitted JAX code runs no Python.  Only the error
path (a kernel that raised) enters Python, to recover the exception's message.

Handlers are named by content (the kernel's source, closure and options), so
the same kernel wrapped twice, or re-defined by running a notebook cell again,
shares one registered handler, and Numba caches it on disk when the kernel
itself is cacheable.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import inspect
import logging
import marshal
import os
import threading
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Sequence

import jax
import numpy as np

from .. import _kernel_compat
from . import compile_log, fast_exit, ffi_abi, ffi_core

# Numba's type names are numpy's, except for bool.
NUMBA_TYPE_NAMES = {
    dt: "boolean" if dt == np.bool_ else dt.name
    for dt in ffi_abi.COMMON_KERNEL_DTYPES + (np.dtype(np.complex64), np.dtype(np.complex128))
}

_lock = threading.RLock()
# kernel object -> {signature: handler}; weak in the kernel, so a kernel defined anew (a factory, a notebook
# cell run again) is freed with its last reference: the handler lives on in _by_target, shared by content
_handlers: "weakref.WeakKeyDictionary[Any, dict[tuple, CompiledHandler]]" = weakref.WeakKeyDictionary()
_by_target: dict[str, "CompiledHandler"] = {}  # content-named target -> handler
_jobs: dict[str, "_Job"] = {}  # content-named target -> its compile, until registered (shared by threads)
_tier_upgrades: dict[str, Any] = {}  # a serial tier's content-named target -> compiles (or loads) its full handler
_tier_slots: dict[str, int] = {}  # a serial tier's target -> where its handler keeps the next handler's address


def cache_dir() -> str:
    """The evjax cache folder (``$EVJAX_CACHE_DIR``, else ``~/.cache/evjax``)."""
    return ffi_core.cache_dir()


def prepare_kernel(kernel):
    """The kernel to compile: itself, or a serial clone where Numba has no thread-safe layer.

    The threading layer is chosen here, where the first parallel kernel is
    compiled, never at import (see :func:`evjax._kernel_compat.threadsafe_layer`).
    """
    if _kernel_compat.kernel_options(kernel).get("parallel") and not _kernel_compat.threadsafe_layer():
        warnings.warn(
            f"numba has no thread-safe threading layer (omp/tbb) here; evjax runs the parallel "
            f"kernel '{kernel.__name__}' serially. Install tbb (`pip install tbb`) or OpenMP "
            f"(libgomp) to run it in parallel.",
            RuntimeWarning,
            stacklevel=3,
        )
        return _kernel_compat.serial_clone(kernel)
    return kernel  # (Numba's threads are launched where the handler is compiled: see _compile)


@dataclass
class CompiledHandler:
    """One compiled FFI handler for a kernel at one argument signature."""

    kernel: Any
    target_name: str
    key: int
    module: Any
    kernel_name: str
    threads: bool = False  # the kernel takes the thread count first
    full_kernel_name: str | None = None  # a serial tier's: the kernel that takes over from it

    @property
    def address(self) -> int:
        return self.module.handler.address


def _kernel_fingerprint(kernel) -> tuple[str, bool]:
    """(fingerprint, cacheable) of a kernel's code, closure and options.

    Two kernel objects of the same content (a factory called twice, a notebook
    cell run again) get the same fingerprint, hence one handler.  The code is
    its source where Python can find it, else its compiled code object; a
    kernel is cacheable on disk only when its source lives in a file.  As in
    Numba's own cache, the values of globals the kernel reads are not part of
    it: they are frozen when the kernel compiles.
    """
    import numba

    py_func = kernel.py_func
    try:
        code = inspect.getsource(py_func)
        filename = os.path.realpath(inspect.getsourcefile(py_func) or "")  # one name for one file (sys.path may say "a/../b")
        mtime = os.path.getmtime(filename) if os.path.exists(filename) else 0.0
        # an evjax kernel also depends on the files it inlines code from (see kernel_source_stamp)
        mtime = (mtime, _kernel_compat.kernel_source_stamp(filename)) if filename else mtime
    except (OSError, TypeError):
        code, filename, mtime = marshal.dumps(py_func.__code__).hex(), "", 0.0
    cacheable = bool(filename) and os.path.exists(filename) and "<" not in filename
    closure = []
    for cell in py_func.__closure__ or ():
        value = cell.cell_contents
        if isinstance(value, (int, float, bool, str, complex, type(None), np.generic)):
            closure.append(repr(value))
        else:
            cacheable = False
            closure.append(f"<{type(value).__name__}@{id(value)}>")  # alive as long as the handler
    options = sorted((k, _option_text(v)) for k, v in _kernel_compat.kernel_options(kernel).items())
    text = "\n".join([code, filename, repr(mtime), repr(closure), repr(options), numba.__version__])
    return hashlib.sha1(text.encode()).hexdigest(), cacheable


_first_seen: dict[int, tuple[dict, str]] = {}  # id -> (the dict, kept alive; its text when first seen)


def _option_text(value) -> str:
    """A kernel option as text, the same before and after the kernel compiles.

    Numba empties a ``parallel={...}`` dict as it compiles (``ParallelOptions``
    pops its keys), so a dict is described as it was when first seen here;
    otherwise a kernel's handler would be named differently once the kernel
    has compiled, and missed both in this process and on disk.
    """
    if isinstance(value, dict):
        with _lock:
            return _first_seen.setdefault(id(value), (value, repr(value)))[1]
    return repr(value)


def huge_pages_advised() -> bool:
    """Whether new handlers ask Linux for huge pages under their large outputs
    (:func:`evjax.backends.intrinsics.advise_huge_pages`): yes, unless ``EVJAX_MADVISE_HUGEPAGE=0``.
    Read when a handler is generated; the choice is part of its source, hence of its cache key."""
    return os.environ.get("EVJAX_MADVISE_HUGEPAGE", "1") != "0"


def _handler_source(in_types, out_types, threads: bool, tiered: bool = False,
                    advise_huge_pages: bool = True) -> str:
    """The body of a handler calling ``KERNEL`` on the frame's buffers.

    With ``threads``, the kernel's first argument is the number of threads it
    may use now (:func:`evjax.backends.threads.threads_now`, read at every call).
    The kernel is called through ``raised`` (:func:`evjax._kernel_compat.raised_intrinsic`),
    which tells whether it raised: then the handler returns the error that
    :func:`evjax.backends.ffi_core.report` composes.  There is no other
    generated function (no ``try``/``except``, whose front end costs a compile
    some 0.2 s of CPU; see ``benchmarks/handler_compile.py``).

    With ``advise_huge_pages``, each output buffer of 4 MiB or more is advised to huge pages before
    the kernel writes it (:func:`evjax.backends.intrinsics.advise_huge_pages`: fewer page faults).

    With ``tiered``, ``KERNEL`` is a serial tier (see :func:`call`): the
    handler first reads its own slot (:func:`evjax.backends.intrinsics.own_slot`:
    the full handler's address, and a count); once it holds the full kernel's
    handler, every call goes there.  Until then the serial tier runs.  Where it
    declines a call (:data:`DECLINED`), the handler asks Python for the full
    handler (:func:`evjax.backends.ffi_core.upgrade`), keeps its address in the
    slot and passes it the call.  Where the tier did a call that the full kernel
    would have split across threads (:data:`SPLITTABLE`), the handler takes the
    full handler at once if that costs no compile (compiled in this process,
    or in the disk cache), else only once such calls have kept the tier busy
    for :data:`HOT_NS` (then the compile is worth it).  All of that after the
    tier's call is one intrinsic, :func:`evjax.backends.ffi_core.after_tier`.
    """
    names = [f"a{i}" for i in range(len(in_types))] + [f"r{i}" for i in range(len(out_types))]
    params = ("threads, " if threads else "") + ", ".join(names)
    body = []
    if tiered:
        body += [
            "    slot = own_slot()",
            "    full = load_acquire_i64(slot)",
            "    if full != 0:",
            "        return as_voidptr(call_ptr_ptr(full, frame))",
        ]
    if threads:
        body.append("    threads = threads_now()")
    for name, table, index, (dtype, rank) in (
        [(f"a{i}", ffi_abi.FRAME_ARGS, i, t) for i, t in enumerate(in_types)]
        + [(f"r{i}", ffi_abi.FRAME_RETS, i, t) for i, t in enumerate(out_types)]
    ):
        advise = int(table == ffi_abi.FRAME_RETS and rank > 0 and advise_huge_pages)  # see intrinsics.advise_huge_pages
        body.append(f"    {name} = frame_array(frame, {table}, {index}, types.{NUMBA_TYPE_NAMES[dtype]}, {rank}, {advise})")
    failed = (f"as_voidptr(report(frame, numba.int64(HANDLER_KEY), numba.int64({{detail}}), "
              f"numba.int64({ffi_abi.ERRC_INTERNAL})))")
    if not tiered:
        body += [
            f"    if raised(KERNEL, ({params},)):",
            f"        return {failed.format(detail=KERNEL_RAISED)}",
            "    return as_voidptr(0)",
        ]
        return "\n".join(body)
    body += [
        "    start = now_ns()",
        f"    outcome = outcome_of(KERNEL, ({params},))",
        f"    return as_voidptr(after_tier(frame, numba.int64(HANDLER_KEY), slot, outcome, start, "
        f"numba.int64({HOT_NS})))",
    ]
    return "\n".join(body)


# The tier protocol (ffi_core.after_tier): what a serial tier returns, and what a tiered handler's error
# report says went wrong.
DONE, SPLITTABLE, DECLINED = ffi_core.DONE, ffi_core.SPLITTABLE, ffi_core.DECLINED
KERNEL_RAISED, UPGRADE_FAILED = ffi_core.KERNEL_RAISED, ffi_core.UPGRADE_FAILED
# Splittable calls run on the tier until they have kept it busy this long (ns), unless the full kernel
# costs no compile (then it takes over at the first): on several threads the full kernel would have
# saved at most about this much, the price of its compile (1 to 3 s of CPU for the built-in kernels).
# A constant of each tiered handler's source (hence of its cache key).
HOT_NS = 1_000_000_000


class _Job:
    """The compile of one handler: its module (handler not compiled yet) and, once done, its error."""

    def __init__(self, module, digest: str, kernel_name: str, what: str, signature: str, cached: bool,
                 threads: bool = False):
        self.module = module
        self.target = f"evjax_numba_{kernel_name}_{digest}"  # named by content
        self.kernel_name = kernel_name
        self.what = what
        self.signature = signature
        self.cached = cached  # in Numba's disk cache: loading it takes milliseconds
        self.threads = threads
        self.done = False
        self.error: BaseException | None = None
        self.lock = threading.Lock()  # held while compiling


def _signature_text(in_types, out_types) -> str:
    def one(dtype, rank):
        return f"{np.dtype(dtype).name}[{', '.join(':' * rank)}]" if rank else np.dtype(dtype).name

    return f"({', '.join(one(*t) for t in in_types)}) -> ({', '.join(one(*t) for t in out_types)})"


def _tiers(serial) -> tuple:
    """``serial`` as a tuple of serial tiers, cheapest first (None: none)."""
    if serial is None:
        return ()
    return tuple(serial) if isinstance(serial, (tuple, list)) else (serial,)


def _new_job(kernel, in_types, out_types, traits, threads: bool, full=None) -> _Job:
    """The job of ``kernel``'s handler; of a serial tier's where ``full`` is what takes over from it
    (the kernel behind, then any further tiers before it)."""
    compiled = prepare_kernel(kernel)
    fingerprint, cacheable = _kernel_fingerprint(compiled)
    if full is not None:  # a serial tier: named for what takes over from it (its upgrader compiles that)
        fingerprint = ":".join([fingerprint] + [_kernel_fingerprint(k)[0] for k in full])
    body = _handler_source(in_types, out_types, threads, tiered=full is not None,
                           advise_huge_pages=huge_pages_advised())
    imports = ("from evjax._kernel_compat import raised_intrinsic, outcome_intrinsic\n"
               "raised, outcome_of = raised_intrinsic(), outcome_intrinsic()")
    if threads:
        imports += "\nfrom evjax.backends.threads import threads_now"
    if full is not None:
        imports += "\nfrom evjax.backends.threads import now_ns"
    module, digest = ffi_core.compile_handler(
        body, traits=traits, imports=imports, namespace={"KERNEL": compiled},
        cache=cacheable, fingerprint=fingerprint, lazy=True, depends=(_kernel_compat,),  # its intrinsics
    )
    name = getattr(kernel, "__name__", "kernel")
    op = compile_log.current_op()
    what = f"{op} (numba kernel '{name}')" if op else f"numba kernel '{name}'"
    cached = cacheable and _kernel_compat.cfunc_in_disk_cache(module.handler)
    return _Job(module, digest, name, what, _signature_text(in_types, out_types), cached, threads)


def _compile(job: _Job) -> None:
    """Compile (or load from the disk cache) the job's handler, once; keep its error."""
    with job.lock:
        if job.done:
            return
        try:
            where = _kernel_compat.cfunc_cache_dir(job.module.handler)
            announce = contextlib.nullcontext() if job.cached else \
                compile_log.announce_slow_compile(job.what, job.signature, where)
            with announce, _kernel_compat.quiet_numba_compile():
                _kernel_compat.launch_numba_threads()  # before any call of a (maybe parallel) kernel
                _kernel_compat.compile_cfunc(job.module.handler)
        except BaseException as exc:  # noqa: BLE001 - re-raised where the handler is asked for
            job.error = exc
        job.done = True


def get_handler(kernel, in_types: Sequence[tuple[np.dtype, int]], out_types, traits: int = 0, *,
                threads: bool = False, serial=None):
    """The (cached) compiled handler of ``kernel`` for these argument types.

    Compiled (or loaded from Numba's disk cache) on the calling thread, once
    per process: threads asking for the same handler at once wait for one
    compile.

    Args:
        kernel: a numba ``CPUDispatcher`` (``@numba.njit`` function).
        in_types: ``(dtype, rank)`` per input buffer.
        out_types: ``(dtype, rank)`` per output buffer.
        traits: FFI handler traits to declare (0 on CPU).
        threads: pass the kernel the number of threads it may use now as its
            first argument (an int64, read at every call; see :mod:`evjax.backends.threads`).
        serial: a serial tier of ``kernel``, or several, cheapest first (see
            :func:`call`): the handler runs the first, and compiles the next
            tier's handler (in the end ``kernel``'s own) only when a call needs it.
    """
    serial = _tiers(serial) or None
    signature = (tuple(in_types), tuple(out_types), traits, threads, serial)
    with _lock:
        known = _handlers.setdefault(kernel, {})
        handler = known.get(signature)
        if handler is not None:
            return handler
        fast_exit.register()  # Numba's compiler state would slow the exit down (see fast_exit)
        if serial is None:
            job = _new_job(kernel, in_types, out_types, traits, threads)
        else:
            job = _new_job(serial[0], in_types, out_types, traits, threads, full=(kernel,) + serial[1:])
        handler = _by_target.get(job.target)
        if handler is not None:  # a kernel of the same content shares the handler registered first
            known[signature] = handler
            return handler
        job = _jobs.setdefault(job.target, job)  # ... and its compile
    _compile(job)  # waits while another thread compiles it; at once when done
    with _lock:
        if job.error is not None:
            if _jobs.get(job.target) is job:
                del _jobs[job.target]  # the next call tries again
            raise job.error
        upgrade = None
        if serial is not None:
            target = job.target

            def upgrade(compile: bool, slot: int = 0) -> int:  # the next handler, compiled (or loaded) when needed
                if slot:
                    _tier_slots[target] = slot
                if not compile and not _available(kernel, in_types, out_types, traits, threads, serial[1:]):
                    return 0
                return get_handler(kernel, in_types, out_types, traits, threads=threads,
                                   serial=serial[1:] or None).address
            _tier_upgrades.setdefault(job.target, upgrade)
        handler = _handlers.setdefault(kernel, {})[signature] = _register(
            job, upgrade, None if serial is None else getattr(kernel, "__name__", "kernel"))
        _jobs.pop(job.target, None)
        return handler


def _available(kernel, in_types, out_types, traits, threads: bool, serial=()) -> bool:
    """Whether the handler of ``kernel`` (with the serial tiers ``serial``) at this signature costs no
    compile: compiled in this process, or in Numba's disk cache."""
    with _lock:
        if (tuple(in_types), tuple(out_types), traits, threads, serial or None) in _handlers.get(kernel, {}):
            return True
        if serial:
            job = _new_job(serial[0], in_types, out_types, traits, threads, full=(kernel,) + tuple(serial[1:]))
        else:
            job = _new_job(kernel, in_types, out_types, traits, threads)
        return job.target in _by_target or job.cached


def tier_targets() -> frozenset:
    """The serial tiers' handlers this process has made so far (for :func:`compile_full_kernels`)."""
    with _lock:
        return frozenset(_tier_upgrades)


def compile_full_kernels(skip: frozenset = frozenset(), hand_over: bool = False) -> int:
    """Compile (or load from the disk cache) the full kernel behind every serial tier this process has
    used, but those in ``skip`` (a :func:`tier_targets` taken before); the number of tiers.  One that
    fails to compile logs a warning (the call that needs it raises).

    A handler takes the full kernel over by itself when a call needs it (see :func:`call`).  With
    ``hand_over``, each tier's handler that has asked Python for its next handler before (a call it
    declined, or one it could have split) gets it now: its next call goes there, as it would have
    once the tier had been busy for :data:`HOT_NS`.  What a benchmark of the kernels' steady state
    (or a long run that wants them at once) calls after its first calls.

    What ``python -m evjax.precompile`` does after running the families' ops on tiny inputs, which
    only ever reach the serial tiers.
    """
    done: set = set(skip)
    while True:  # a tier's upgrade may make the handler of a further tier, with an upgrade of its own
        with _lock:
            todo = [(target, upgrade) for target, upgrade in _tier_upgrades.items() if target not in done]
        if not todo:
            return len(done - skip)
        for target, upgrade in todo:
            done.add(target)
            try:
                address = upgrade(True)
                slot = _tier_slots.get(target) if hand_over else None
                if slot:
                    ctypes.c_int64.from_address(slot).value = address  # an aligned 8-byte store: atomic
            except Exception as exc:  # noqa: BLE001 - a call that needs it reports it; the others go on
                logging.getLogger("evjax").warning("evjax: a full kernel behind a serial tier did not compile "
                                                   "(%s: %s); a call that needs it will raise", type(exc).__name__, exc)


def call(kernel, args: Sequence, out_shape: Sequence[int], out_dtype, *, threads: bool = True,
         bool_as_bytes: bool = False, in_place: int | None = None, serial=None):
    """Call ``kernel(threads, *args, out)`` (or ``kernel(*args, out)``) through its FFI handler.

    The one call path of the operator families' Numba CPU kernels: the
    handler is compiled (or loaded) once per kernel and signature, and a call
    from jitted code runs no Python.

    Args:
        kernel: a ``@numba.njit`` kernel writing its one output in place.
        args: its input arrays.
        out_shape, out_dtype: the output.
        threads: pass the thread count in force as the first argument.
        bool_as_bytes: the kernel reads a bool buffer as its uint8 bytes (one
            byte per element either way; Numba's bool loads are slower, and a
            kernel then compiles no bool-to-bytes view).
        in_place: the index of an input of the output's shape and dtype that
            the output aliases (XLA's ``input_output_aliases``): the kernel
            finds that input's values already in its output buffer and edits
            them there.  XLA writes in place where the input is not used
            afterwards (a weight carried through ``jax.lax.scan``, a donated
            argument) and copies it first where it is.
        serial: a serial tier of ``kernel`` (or a tuple of them, cheapest first:
            each declines what the next does): a small ``@numba.njit`` function of
            the same arguments that returns an int64: :data:`DONE` where it has
            computed the call with the same bits as ``kernel`` (tests prove it);
            :data:`SPLITTABLE` where it has, but what comes after it would be
            faster (``kernel`` would have split the work across threads, or the
            next tier runs a faster loop); :data:`DECLINED`, before writing
            anything, where it leaves the call to the next tier or ``kernel``
            (a sum split into parts).  It compiles in a fraction of ``kernel``'s time; ``kernel``
            itself is compiled (or loaded from the disk cache) inside the first
            declined call, or a splittable one once the full kernel costs no compile or
            the tier has spent :data:`HOT_NS` on such calls, and from then on serves
            every call of the handler: no retrace, the same bits.

    Returns:
        The output array.
    """
    return call_outputs(kernel, args, [(out_shape, out_dtype)], threads=threads, bool_as_bytes=bool_as_bytes,
                        in_place=in_place, serial=serial)[0]


def call_outputs(kernel, args: Sequence, outs: Sequence[tuple[Sequence[int], object]], *, threads: bool = True,
                 bool_as_bytes: bool = False, in_place: int | None = None, serial=None) -> list:
    """:func:`call` for a kernel of several outputs, ``kernel(threads, *args, *outs)``.

    Args:
        outs: ``(shape, dtype)`` of each output, in the kernel's order.
        in_place: as in :func:`call`, aliasing the first output.
        serial: as in :func:`call`.

    Returns:
        The output arrays.
    """
    in_types = [(np.dtype(np.uint8) if bool_as_bytes and a.dtype == np.bool_ else np.dtype(a.dtype), a.ndim)
                for a in args]
    out_types = [(np.dtype(dtype), len(shape)) for shape, dtype in outs]
    handler = get_handler(kernel, in_types, out_types, threads=threads, serial=serial)
    ffi = jax.ffi.ffi_call(handler.target_name, [jax.ShapeDtypeStruct(tuple(shape), dtype) for shape, dtype in outs],
                           input_output_aliases=None if in_place is None else {in_place: 0})
    return list(ffi(*args))


def _register(job: _Job, upgrade=None, full_kernel_name: str | None = None) -> CompiledHandler:
    """Register a compiled handler with XLA (once per content-named target), and the upgrader of a serial tier."""
    handler = _by_target.get(job.target)
    if handler is None:
        module = job.module
        handler = CompiledHandler(module.KERNEL, job.target, module.HANDLER_KEY, module, job.kernel_name, job.threads,
                                  full_kernel_name)
        ffi_core.register_describer(lambda frame, detail: _describe_failure(handler, frame, detail), key=handler.key)
        if upgrade is not None:
            ffi_core.register_upgrader(handler.key, upgrade)
        jax.ffi.register_ffi_target(job.target, jax.ffi.pycapsule(handler.address), platform="cpu")
        _by_target[job.target] = handler
    return handler


def _describe_failure(handler: CompiledHandler, frame: int, detail: int) -> str:
    """The message of a handler's failure: its kernel raised, or (a serial tier) the full kernel's
    handler could not be made."""
    if detail == UPGRADE_FAILED:
        error = ffi_core.upgrade_error(handler.key)
        return (f"evjax: numba kernel '{handler.full_kernel_name}' failed to compile (its serial tier "
                f"'{handler.kernel_name}' passed this call on to it): {type(error).__name__}: {error}")
    return _describe_kernel_error(handler, frame)


def _describe_kernel_error(handler: CompiledHandler, frame: int) -> str:
    """Run the kernel again from Python on the frame's buffers, to recover its exception's message."""
    name = handler.kernel_name
    try:
        ins, outs = ffi_abi.decode_frame(frame)
        arrays = [b.as_numpy() for b in ins] + [b.as_numpy() for b in outs]
        kernel = _kernel_compat.python_callable(handler.kernel)
        kernel(*([np.int64(1)] if handler.threads else []), *arrays)
    except Exception as exc:  # noqa: BLE001 - reported to the caller
        return f"evjax: numba kernel '{name}' raised {type(exc).__name__}: {exc}"
    return (
        f"evjax: numba kernel '{name}' raised an exception that did not reproduce when "
        f"re-run from Python (is the kernel non-deterministic?)"
    )

"""The one module of evjax that touches Numba's and Warp's private APIs.

Everything else reaches the internals of its kernel languages through the
functions here (as :mod:`evjax._compat` does for JAX), so an upgrade of Numba
or Warp breaks at most this file.  Nothing here imports Warp or ``numba.cuda``
at import time.
"""
from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import sys
import threading
import warnings
from typing import Any

import numpy as np

from . import _disk_cache

__all__ = [
    # Numba (CPU)
    "quiet_numba_compile", "is_cpu_dispatcher", "kernel_options", "can_compile", "declared_signatures",
    "serial_clone", "python_callable", "prange_only", "threadsafe_layer", "launch_numba_threads", "COMPILED_CODE_ONLY",
    "raised_intrinsic", "lazy_cfunc", "cfunc_in_disk_cache",
    "compile_cfunc", "cfunc_cache_dir", "kernel_source_stamp", "stamp_kernel_caches", "guard_numba_cache",
    # Numba CUDA
    "cuda_simulator_enabled", "cuda_simulator_threadsafe_shared", "is_cuda_dispatcher", "is_cuda_device_function", "cuda_overload", "cuda_function", "cuda_kernel_limits",
    "cuda_packing", "cuda_launch", "cuda_needs_python_launch",
    # Warp
    "warp_initialize", "warp_cpu_entry", "warp_cuda_entry", "warp_cuda_launch_address", "warp_kernel_dim",
    "warp_params", "warp_is_kernel", "warp_is_array_type", "warp_is_generic", "warp_specialize",
]


# ---------------------------------------------------------------------------
# Numba, CPU target
# ---------------------------------------------------------------------------
@contextlib.contextmanager
def quiet_numba_compile():
    """Hide Numba's pedantic ``NumbaIRAssumptionWarning`` while compiling.

    Numba reports it for ``while`` loops inside ``inline="always"`` helpers
    (as in the CSR kernels): the compiled code is correct and the user can do
    nothing about it.
    """
    from numba.core.errors import NumbaIRAssumptionWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumbaIRAssumptionWarning)
        yield


def is_cpu_dispatcher(obj) -> bool:
    """Whether ``obj`` is an ``@numba.njit`` function."""
    from numba.core.registry import CPUDispatcher

    return isinstance(obj, CPUDispatcher)


def kernel_options(kernel) -> dict:
    """The options a Numba dispatcher was made with (``parallel``, ``cache``, ...)."""
    return dict(getattr(kernel, "targetoptions", {}))


def can_compile(kernel) -> bool:
    """Whether the dispatcher compiles new signatures (False once given explicit signatures)."""
    return bool(getattr(kernel, "_can_compile", True))


def declared_signatures(kernel) -> list:
    """The signatures a dispatcher was compiled for (explicit ones, when it cannot compile more)."""
    return list(getattr(kernel, "signatures", []))


def serial_clone(kernel):
    """``kernel`` recompiled without ``parallel`` (and outside its disk cache entry)."""
    import numba

    options = kernel_options(kernel)
    options["parallel"] = False
    options.pop("cache", None)  # the on-disk cache entry belongs to the parallel build
    options.pop("nopython", None)
    return numba.njit(**options)(kernel.py_func)


def python_callable(kernel):
    """``kernel``, or, when it was compiled for compiled callers only (:data:`COMPILED_CODE_ONLY`), a
    recompile of its Python source that Python can call (outside the disk cache): for re-running a
    kernel from Python to recover an exception's message."""
    import numba

    options = kernel_options(kernel)
    if not any(options.get(flag) for flag in COMPILED_CODE_ONLY):
        return kernel
    for flag in (*COMPILED_CODE_ONLY, "cache", "nopython"):
        options.pop(flag, None)
    return numba.njit(**options)(kernel.py_func)


_THREADSAFE: bool | None = None


def threadsafe_layer() -> bool:
    """Whether parallel kernels run on a thread-safe Numba threading layer (OpenMP or TBB).

    Numba's ``workqueue`` layer aborts the process when two threads run
    parallel kernels at once, which XLA does routinely.  Called where the first
    parallel kernel is compiled (never at import): if the user left Numba's
    layer at ``"default"`` and Numba's threads have not started, it is set to
    ``"threadsafe"``, which is what ``"default"`` picks anyway where OpenMP or
    TBB exists.  Returns False when the user forced ``workqueue`` or neither
    layer loads.
    """
    global _THREADSAFE
    if _THREADSAFE is None:
        from numba import config
        from numba.np.ufunc import parallel

        forced = os.environ.get("NUMBA_THREADING_LAYER", "").strip().lower() or str(config.THREADING_LAYER)
        available = False
        if forced != "workqueue":
            for module in ("numba.np.ufunc.omppool", "numba.np.ufunc.tbbpool"):
                try:
                    importlib.import_module(module)
                    available = True
                    break
                except Exception:  # noqa: BLE001 - any failure means "not usable"
                    continue
        if available and forced == "default" and not parallel._is_initialized:
            config.THREADING_LAYER = "threadsafe"
        _THREADSAFE = available
    return _THREADSAFE


def prange_only():
    """Numba's ``parallel=`` option for kernels whose only parallel regions are explicit ``prange`` loops.

    Array expressions (``out[:] = 0``, ``np.zeros``), reductions and fusion
    stay serial, so the serial path never wakes the thread pool.  A
    ``ParallelOptions`` object, not a dict: Numba pops the keys of a dict
    when it compiles, so a dict shared by several kernels (or signatures)
    would give every later compile all of the parallel passes.
    """
    from numba.core.cpu import ParallelOptions

    return ParallelOptions({"prange": True, "comprehension": False, "reduction": False, "inplace_binop": False,
                            "setitem": False, "numpy": False, "stencil": False, "fusion": False})


def launch_numba_threads() -> None:
    """Start Numba's thread pool.

    A parallel kernel (or one calling a parallel function) loaded from Numba's
    disk cache and called from a handler, not through its dispatcher, finds the
    pool not started and crashes.
    """
    from numba.np.ufunc import parallel

    parallel._launch_threads()


# Options of an ``@numba.njit`` helper that only compiled code calls (the FFI core's): Numba compiles
# no Python entry point (nor C wrapper) for it.  That wrapper is most of a small helper's LLVM work:
# without it the FFI core's helpers compile in about half the time.  (Numba's target options, not in
# its user documentation; the helper cannot be called from Python.)
COMPILED_CODE_ONLY = {"no_cpython_wrapper": True, "no_cfunc_wrapper": True}


_RAISED = _OUTCOME = _STACK_ARRAY = _HEAP_ARRAY = None
_intrinsics_lock = threading.Lock()


def raised_intrinsic():
    """A Numba intrinsic ``raised(kernel, args) -> int64``: call the ``@numba.njit`` function
    ``kernel`` on the tuple ``args``; 1 if it raised an exception, else 0.

    What ``try: kernel(*args) except Exception: ...`` does in a handler, without
    Numba's ``try``/``except``, whose front end cost a generated handler some
    0.2 s of CPU to compile: the kernel is typed (and compiled) as a call of it
    would be, its code is linked in the same way, and the call's status is
    tested, not propagated.  A value the kernel returns is dropped (and
    released); a dynamic exception's record is left as Numba's own ``except``
    leaves it.  Built at first use (no Numba import before).
    """
    global _RAISED
    with _intrinsics_lock:
        if _RAISED is None:
            _RAISED = _make_raised(tier=False)
    return _RAISED


def outcome_intrinsic():
    """A Numba intrinsic ``outcome(tier, args) -> int64``: :func:`raised_intrinsic` for a serial tier
    (see :func:`evjax.backends.numba_cpu.call`), which returns an int64: -1 if it raised, else what
    it returned.  A tier of another return type does not compile (a clear typing error)."""
    global _OUTCOME
    with _intrinsics_lock:
        if _OUTCOME is None:
            _OUTCOME = _make_raised(tier=True)
    return _OUTCOME


def _make_raised(tier: bool):
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    @intrinsic
    def raised(typingctx, kernel, args):
        if not isinstance(kernel, types.Dispatcher) or not isinstance(args, types.BaseTuple):
            return None
        call = typingctx.resolve_function_type(kernel, tuple(args.types), {})  # compiles the kernel
        if call is None:
            return None
        if tier and call.return_type != types.int64:
            from numba.core.errors import TypingError

            name = getattr(kernel.dispatcher, "__name__", "kernel")
            raise TypingError(f"evjax: the serial tier '{name}' returns {call.return_type}; a serial tier "
                              f"returns an int64, one of numba_cpu.DONE, SPLITTABLE or DECLINED")

        def codegen(context, builder, signature, llargs):
            compiled = kernel.dispatcher.overloads[tuple(call.args)]
            context.add_linking_libs([compiled.library])
            function = context.declare_function(builder.module, compiled.fndesc)
            values = [context.cast(builder, value, have, want) for value, have, want in
                      zip(cgutils.unpack_tuple(builder, llargs[1], len(args)), args.types, call.args)]
            status, result = context.call_conv.call_function(
                builder, function, compiled.fndesc.restype, compiled.fndesc.argtypes, values)
            returned = compiled.signature.return_type
            i64 = ir.IntType(64)
            if tier:  # the tier's outcome, or -1
                return builder.select(status.is_error, i64(-1), result)
            if context.enable_nrt and not isinstance(returned, (types.NoneType, types.Optional)):
                with builder.if_then(status.is_ok):
                    context.nrt.decref(builder, returned, result)
            return builder.zext(status.is_error, i64)

        return types.int64(kernel, args), codegen

    return raised


def c_array_value(context, builder, array_type, data, shape):
    """The value of a C-contiguous ``array_type`` (not memory-managed) over the pointer ``data``, of
    extents ``shape`` (int64 IR values): what :func:`stack_array_intrinsic`,
    :func:`heap_array_intrinsics` and :func:`evjax.backends.ffi_core.frame_array` return."""
    from llvmlite import ir
    from numba.np.arrayobj import make_array, populate_array

    itemsize = ir.IntType(64)(context.get_abi_sizeof(context.get_data_type(array_type.dtype)))
    strides, step = [], itemsize
    for extent in reversed(shape):
        strides.append(step)
        step = builder.mul(step, extent)
    array = make_array(array_type)(context, builder)
    populate_array(array, data=data, shape=shape, strides=strides[::-1], itemsize=itemsize, meminfo=None)
    return array._getvalue()


def stack_array_intrinsic():
    """A Numba intrinsic ``stack_array(n, dtype)``: a C-contiguous 1-d array of ``n`` (a literal)
    elements of ``dtype`` (a Numba dtype, e.g. ``out.dtype``) on the calling function's stack, not
    memory-managed, its contents undefined.

    For a kernel's small fixed scratch: ``np.empty`` compiles Numba's allocator for each dtype it
    is asked for (0.03-0.08 s each in a first call).  The space is reserved in the entry block of
    the function being lowered (after Numba's inlining: the kernel, or the body of a parallel
    loop), so a call in a loop reuses it; it lives until that function returns.
    """
    global _STACK_ARRAY
    with _intrinsics_lock:
        if _STACK_ARRAY is None:
            _STACK_ARRAY = _make_stack_array()
    return _STACK_ARRAY


def _make_stack_array():
    from llvmlite import ir
    from numba.core import types
    from numba.extending import intrinsic

    @intrinsic(prefer_literal=True)
    def stack_array(typingctx, n, dtype):
        if not isinstance(n, types.IntegerLiteral) or not isinstance(getattr(dtype, "dtype", None), types.Type):
            return None
        array_type = types.Array(dtype.dtype, 1, "C")
        count = int(n.literal_value)

        def codegen(context, builder, signature, args):
            item = context.get_data_type(array_type.dtype)
            with builder.goto_entry_block():
                slot = builder.alloca(ir.ArrayType(item, count), name="evjax_stack_array")
                slot.align = 16
            shape = [ir.IntType(64)(count)]
            return c_array_value(context, builder, array_type, builder.bitcast(slot, item.as_pointer()), shape)

        return array_type(n, dtype), codegen

    return stack_array


def heap_array_intrinsics():
    """Two Numba intrinsics: ``heap_array(n, dtype)``, a C-contiguous 1-d array of ``n`` (an int64)
    elements of ``dtype`` (a Numba dtype, e.g. ``out.dtype``) from C's ``malloc``, not
    memory-managed, its contents undefined, of length 0 where the allocation failed; and
    ``free_array(array)``, which gives it back (C's ``free``).

    For a serial tier's scratch the size of an output: ``np.empty`` compiles Numba's allocator
    (and its reference counting) into the tier, a large part of a first call's compile
    (docs/performance.md).  The caller checks the length before writing anything (a failed
    allocation is its to report, e.g. by declining the call) and frees the array on every path.
    """
    global _HEAP_ARRAY
    with _intrinsics_lock:
        if _HEAP_ARRAY is None:
            _HEAP_ARRAY = _make_heap_array()
    return _HEAP_ARRAY


def _make_heap_array():
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic
    from numba.np.arrayobj import make_array

    i64, bytes_ptr = ir.IntType(64), ir.IntType(8).as_pointer()

    @intrinsic
    def heap_array(typingctx, n, dtype):
        if not isinstance(n, types.Integer) or not isinstance(getattr(dtype, "dtype", None), types.Type):
            return None
        array_type = types.Array(dtype.dtype, 1, "C")

        def codegen(context, builder, signature, args):
            item = context.get_data_type(array_type.dtype)
            count = context.cast(builder, args[0], signature.args[0], types.int64)
            count = builder.select(builder.icmp_signed("<", count, i64(0)), i64(0), count)
            malloc = cgutils.get_or_insert_function(builder.module, ir.FunctionType(bytes_ptr, [i64]), "malloc")
            data = builder.call(malloc, [builder.mul(count, i64(context.get_abi_sizeof(item)))])
            length = builder.select(cgutils.is_null(builder, data), i64(0), count)  # 0: the allocation failed
            return c_array_value(context, builder, array_type, builder.bitcast(data, item.as_pointer()), [length])

        return array_type(n, dtype), codegen

    @intrinsic
    def free_array(typingctx, array):
        if not isinstance(array, types.Array):
            return None

        def codegen(context, builder, signature, args):
            data = make_array(array)(context, builder, args[0]).data
            free = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [bytes_ptr]), "free")
            builder.call(free, [builder.bitcast(data, bytes_ptr)])
            return context.get_dummy_value()

        return types.none(array), codegen

    return heap_array, free_array


def lazy_cfunc(sig, cache: bool = False, **options):
    """Like ``@numba.cfunc(sig, cache=cache, **options)``, but the decorated function is not compiled yet.

    Compile it with :func:`compile_cfunc` (which loads it from Numba's disk
    cache when it is there); :func:`cfunc_in_disk_cache` tells, without
    compiling or loading anything, whether it is.
    """
    from numba.core import sigutils
    from numba.core.ccallback import CFunc

    signature = sigutils.normalize_signature(sig)

    def decorate(func):
        cfunc = CFunc(func, signature, locals={}, options=options)
        if cache:
            cfunc.enable_caching()
        return cfunc

    return decorate


def compile_cfunc(cfunc) -> None:
    """Compile (or load from disk: :func:`guard_numba_cache`) a :func:`lazy_cfunc`; its ``address`` is then valid.

    Ctrl-C stops the compile within one compiler pass (:func:`interruptible_compile`).
    """
    with _disk_cache.compiling(), interruptible_compile():
        cfunc.compile()


@contextlib.contextmanager
def interruptible_compile():
    """Within the block (a compile on the main thread), Ctrl-C always stops it.

    Python raises KeyboardInterrupt at the next bytecode the main thread runs,
    and Numba's compiler triggers many garbage collections: when that bytecode
    is a garbage-collection callback (JAX installs one), the exception is
    printed as "ignored" and lost, and the compile went on for seconds.  Here
    the SIGINT handler also records the press, and a listener on Numba's
    ``numba:run_pass`` events raises KeyboardInterrupt at the next compiler
    pass.  A handler the user installed, or a thread other than the main
    one, is left as it is.
    """
    import signal

    from numba.core import event

    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return

    class InterruptAtNextPass(event.Listener):
        pressed = False

        def on_start(self, _event):
            if self.pressed:
                raise KeyboardInterrupt

        def on_end(self, _event):
            self.on_start(_event)

    listener = InterruptAtNextPass()

    def on_sigint(signum, frame):
        listener.pressed = True
        signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGINT, on_sigint)
    try:
        with event.install_listener("numba:run_pass", listener):
            yield
        if listener.pressed:  # pressed during a pass that finished the compile
            raise KeyboardInterrupt
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def cfunc_in_disk_cache(cfunc) -> bool:
    """Whether Numba's disk cache holds a fresh entry for this cfunc's code and signature.

    Reads the cache index only (no compile, no load, no compiler lock).  The
    machine part of Numba's key (CPU name and features) is not compared: an
    entry built on another CPU reads as present, and loading it then compiles.
    """
    cache = getattr(cfunc, "_cache", None)
    index = getattr(cache, "_cache_file", None)
    if index is None:  # caching disabled (a NullCache); compiled in memory, its index path is no file
        return False
    try:
        overloads = index._load_index()
        code = cache._py_func.__code__.co_code
    except Exception:  # noqa: BLE001 - an unreadable index is a miss
        return False
    import hashlib

    code_hash = hashlib.sha256(code).hexdigest()
    return any(
        isinstance(key, tuple) and len(key) == 3 and key[0] == cfunc._sig and key[2][0] == code_hash
        for key in overloads
    )


def cfunc_cache_dir(cfunc) -> str:
    """The folder where Numba caches this cfunc (or ``"memory only"`` when it is not cached)."""
    cache = getattr(cfunc, "_cache", None)
    in_memory = getattr(_cache_locator(cache), "_evjax_memory", False)
    return "memory only" if in_memory else str(getattr(cache, "cache_path", None) or "memory only")


# ---------------------------------------------------------------------------
# Numba's disk cache: kernels that inline code from other files
# ---------------------------------------------------------------------------
_ROOT = os.path.dirname(os.path.abspath(__file__))
# files whose code or constants every evjax kernel may inline (relative to the package)
KERNEL_SUPPORT = ("_kernel_compat.py", "numba_kernel.py", "numba_cuda_kernel.py", "backends")
_stamps: dict[tuple, str] = {}
_stamped_roots: set[str] = set()
_stamp_lock = threading.Lock()


def _py_files(path: str) -> list[str]:
    if os.path.isdir(path):
        return sorted(os.path.join(path, name) for name in os.listdir(path) if name.endswith(".py"))
    return [path] if os.path.isfile(path) else []


def kernel_source_stamp(path: str, root: str = _ROOT, support=KERNEL_SUPPORT) -> str | None:
    """A digest of the sources a kernel defined in ``path`` may inline, or None outside ``root``.

    Numba's disk cache checks only the kernel's own file (its modification
    time and size), so a kernel that inlines a helper or reads a constant from
    another file kept its old machine code after that file changed (a stale
    threshold in ``csr/numba_rows.py`` did, in development).  Here a kernel's
    freshness covers every ``.py`` file of its own package folder (a family:
    its kernels, row loops, generation scheme and ops) and the shared kernel
    support (``support``, relative to ``root``), by name, modification time
    and size: read once per folder and process.
    """
    path = os.path.abspath(path)
    root = os.path.abspath(root)
    if os.path.commonpath([path, root]) != root:
        return None
    key = (os.path.dirname(path), root, tuple(support))
    with _stamp_lock:
        stamp = _stamps.get(key)
        if stamp is None:
            import hashlib

            files = _py_files(key[0]) + [f for rel in support for f in _py_files(os.path.join(root, rel))]
            digest = hashlib.sha1()
            for file in sorted(set(files)):
                info = os.stat(file)
                digest.update(f"{os.path.relpath(file, root)}:{info.st_mtime_ns}:{info.st_size}\n".encode())
            stamp = _stamps[key] = digest.hexdigest()
    return stamp


def stamp_kernel_caches(root: str = _ROOT, support=KERNEL_SUPPORT) -> None:
    """Make Numba's disk cache of the kernels under ``root`` fresh only while
    :func:`kernel_source_stamp` is unchanged (idempotent; evjax does this for
    itself on import, before any of its kernels is declared).

    Registers a cache locator ahead of Numba's own: for a file under ``root``
    it takes the locator Numba would have chosen (same cache folder) and adds
    the stamp to that locator's source stamp, which Numba stores in the cache
    index and compares on load.  It also locates (and guards: :func:`guard_numba_cache`) what
    is declared within :func:`evjax._disk_cache.compiling` (handlers) or compiled in memory.
    """
    from numba.core import caching

    root = os.path.abspath(root)
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl")
    guard_numba_cache()
    with _stamp_lock:
        if root in _stamped_roots:
            return
        _stamped_roots.add(root)
        numba_locators = [cls for cls in impl._locator_classes if not getattr(cls, "_evjax_root", None)]

    class StampedLocator:
        _evjax_root = root

        @classmethod
        def from_function(cls, py_func, py_file):
            if _disk_cache.is_in_memory(py_file):
                return _disk_cache.MemoryLocator(py_func, py_file)
            stamp = kernel_source_stamp(py_file, root, support)
            if stamp is None and not _disk_cache.in_scope():
                return None
            for base in numba_locators:
                locator = base.from_function(py_func, py_file)
                if locator is not None:
                    if stamp is not None:
                        own = locator.get_source_stamp
                        locator.get_source_stamp = lambda: (own(), stamp)
                    locator._evjax_guarded = True
                    return locator
            _disk_cache.unwritable(os.environ.get("NUMBA_CACHE_DIR") or os.path.dirname(py_file),  # Numba would raise
                                   PermissionError(f"no writable folder for Numba's cache of {py_file}"))
            return _disk_cache.MemoryLocator(py_func, py_file)

    impl._locator_classes.insert(0, StampedLocator)


def _cache_locator(cache):  # the Numba cache locator that chose the folder of ``cache``
    return getattr(getattr(cache, "_impl", None), "locator", None)


def guard_numba_cache() -> None:
    """Guard the loads and saves of Numba's disk cache that evjax makes (idempotent): see
    :func:`evjax._disk_cache.guard_cache_methods`.  Other caches behave exactly as Numba's."""
    from numba.core import caching

    with _stamp_lock:
        if not getattr(caching.Cache.load_overload, "_evjax_guard", False):
            caching.Cache.load_overload, caching.Cache.save_overload = _disk_cache.guard_cache_methods(
                caching.Cache.load_overload, caching.Cache.save_overload, _cache_locator, _discard_cache_entry)


def _discard_cache_entry(cache, sig, target_context) -> str | None:
    """Delete the entry of ``sig`` that failed to load; the broken file (None: no entry for ``sig``)."""
    index = cache._cache_file
    try:
        overloads = index._load_index()
    except Exception:  # noqa: BLE001 - the index is broken: it goes, with the keys it held
        return _disk_cache.remove(index._index_path)
    name = overloads.pop(cache._index_key(sig, target_context.codegen()), None)
    if name is None:
        return None
    with contextlib.suppress(Exception):  # read-only: Numba reads a missing data file as a miss
        index._save_index(overloads)
    return _disk_cache.remove(index._data_path(name))


# ---------------------------------------------------------------------------
# Numba, CUDA target (numba.cuda is imported by these functions only)
# ---------------------------------------------------------------------------
def cuda_simulator_enabled() -> bool:
    """Whether Numba's CUDA simulator is on (``NUMBA_ENABLE_CUDASIM=1`` when numba was imported)."""
    from numba.core import config

    return bool(getattr(config, "ENABLE_CUDASIM", False))


_shared_patch_lock = threading.Lock()


def cuda_simulator_threadsafe_shared() -> None:
    """Make the simulator's ``cuda.shared.array`` safe for the block's threads (idempotent).

    The simulator runs one Python thread per CUDA thread, and each thread's
    ``cuda.shared.array(...)`` looks its buffer up in a dict keyed by source
    line, creating it when absent: a check-then-set with no lock.  When the
    interpreter switches threads between the check and the set (rare, but
    seen under load: one run in about 100 of a warp-reduction kernel), two
    threads of a block get different buffers and the reduction loses their
    partial sums.  This replaces the lookup with one under a lock, keyed the
    same way (the file and line of the kernel's call).
    """
    from numba.core import types
    from numba.cuda.simulator import kernelapi
    from numba.np import numpy_support

    shared = kernelapi.FakeCUDAShared
    with _shared_patch_lock:
        if getattr(shared.array, "_evjax_locked", False):
            return
        unlocked = shared.array
        lock = threading.Lock()

        def array(self, shape, dtype):
            if shape == 0:  # dynamic shared memory: one preallocated buffer, no lookup
                return unlocked(self, shape, dtype)
            if isinstance(dtype, types.Type):
                dtype = numpy_support.as_dtype(dtype)
            caller = sys._getframe(1)  # keyed like the simulator: (file, line) of the kernel's call
            key = (caller.f_code.co_filename, caller.f_lineno)
            with lock:
                buffer = self._allocations.get(key)
                if buffer is None:
                    buffer = self._allocations[key] = np.empty(shape, dtype)
            return buffer

        array._evjax_locked = True
        shared.array = array


def is_cuda_dispatcher(obj) -> bool:
    """Whether ``obj`` is a ``@numba.cuda.jit`` kernel (or the simulator's)."""
    return type(obj).__name__ in ("CUDADispatcher", "FakeCUDAKernel")


def is_cuda_device_function(obj) -> bool:
    """Whether a CUDA dispatcher is a device function (``device=True``), which cannot be launched."""
    return bool(kernel_options(obj).get("device") or getattr(obj, "_device", False))


def numba_array_type(shape, dtype):
    """The Numba type of a C-contiguous array."""
    from numba import types
    from numba.np.numpy_support import from_dtype

    return types.Array(from_dtype(np.dtype(dtype)), len(shape), "C")


def cuda_overload(kernel, specs):
    """The compiled overload (``_Kernel``) of a CUDA kernel for arrays of ``(shape, dtype)`` specs.

    Raises:
        TypeError: the kernel was declared with explicit signatures that do not fit.
    """
    argtypes = tuple(numba_array_type(s, d) for s, d in specs)
    for types_, overload in kernel.overloads.items():
        if len(types_) == len(argtypes) and all(
            getattr(t, "dtype", None) == a.dtype and getattr(t, "ndim", None) == a.ndim
            for t, a in zip(types_, argtypes)
        ):
            return overload
    if not can_compile(kernel):
        declared = "; ".join(str(s) for s in kernel.overloads) or "none"
        given = ", ".join(str(t) for t in argtypes)
        raise TypeError(
            f"CUDA kernel '{kernel.__name__}' was declared with signatures ({declared}) but is called with "
            f"inputs+outputs ({given}). Pass arrays of the declared dtypes and ranks, or fix `outs`."
        )
    return kernel.compile(argtypes)


def handle_address(handle) -> int:
    """An integer address from a ctypes pointer or integer, a cuda-python handle or an int."""
    if handle is None:
        return 0
    # c_void_p, or the c_size_t of numba-cuda 0.30's device_ctypes_pointer: int() of a ctypes scalar
    # would read its bytes as a numeral (it exposes the buffer protocol), so take its value
    if isinstance(handle, (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_int64)):
        return int(handle.value or 0)
    try:
        return int(handle)
    except TypeError:  # older cuda-python handles
        return int(handle.getPtr())


def cuda_function(overload) -> tuple[int, bool]:
    """``(address, is_library_kernel)`` of an overload's function, loaded in the current context.

    With numba-cuda on ``cuda.core`` the handle is a ``CUkernel`` (a library
    kernel) whose ``CUfunction`` the caller gets with ``cuKernelGetFunction``.
    """
    cufunc = overload._codelibrary.get_cufunc()
    return handle_address(cufunc.handle), type(cufunc.handle).__name__ == "CUkernel"


def cuda_kernel_limits(overload, default_threads: int) -> tuple[int, int]:
    """``(max threads per block, static shared memory bytes)`` of a compiled overload."""
    attrs = overload._codelibrary.get_cufunc().attrs
    return int(getattr(attrs, "maxthreads", default_threads)), int(getattr(attrs, "shared", 0))


def cuda_needs_python_launch(overload) -> bool:
    """Whether the overload uses debug mode, cooperative groups or argument extensions."""
    return bool(overload.debug or getattr(overload, "cooperative", False) or overload.extensions)


def cuda_packing(overload, specs, make_view) -> list:
    """The kernel parameters Numba itself passes for arrays made by ``make_view(spec)`` (ctypes values or ints).

    Each view goes through Numba's own argument path (``InOut``: a device array is used in place,
    uncopied), which numba-cuda 0.30 changed to pass a strided memory view rather than the array.
    """
    kernelargs: list = []
    for spec in specs:
        overload._prepare_args(numba_array_type(*spec), make_view(spec), 0, [], kernelargs)
    return kernelargs


def cuda_launch(overload, arrays, grid, block, stream, shared_mem) -> None:
    """Launch a compiled overload directly (no dispatch, no type inference)."""
    overload.launch(arrays, grid, block, stream, shared_mem)


# ---------------------------------------------------------------------------
# Warp (imported by these functions only)
# ---------------------------------------------------------------------------
def warp_initialize(cache_folder):
    """Import and initialise Warp, pointing its kernel cache at ``cache_folder`` (or what it returns, if a
    function) unless Warp is already initialised or the user chose a folder.  Returns the ``warp`` module."""
    import warp as wp
    from warp._src import context as wp_context

    if getattr(wp_context, "runtime", None) is None:
        if not wp.config.kernel_cache_dir and not os.environ.get("WARP_CACHE_PATH"):
            wp.config.kernel_cache_dir = cache_folder() if callable(cache_folder) else cache_folder
        wp.init()
    return wp


def _warp_load(kernel, device, block_dim: int) -> tuple[Any, Any]:
    """Load the kernel's module on ``device``, compiled again (one logged line) if its cached files do not load."""
    import warp as wp

    module, cached = kernel.module, []
    with contextlib.suppress(Exception):  # the binary and metadata files Module.load reads, if both are cached
        folder = os.path.join(wp.config.kernel_cache_dir, module.get_module_identifier(block_dim))
        cached = [os.path.join(folder, module._get_compile_output_name(device, block_dim=block_dim)),
                  os.path.join(folder, module._get_meta_name(block_dim=block_dim))]
        cached = cached if all(os.path.exists(f) for f in cached) else []
    try:
        exe = module.load(device, block_dim)
    except Exception as exc:  # noqa: BLE001
        if not cached:  # compiled, not loaded from the cache: Warp's own error
            raise
        _disk_cache.discarded(" and ".join(_disk_cache.remove(f) for f in cached), exc)
        exe = module.load(device, block_dim)
    if exe is None:  # pragma: no cover - Warp reports its own build errors
        raise RuntimeError(f"Warp could not load the module of kernel '{kernel.key}' on {device}")
    return exe, exe.get_kernel_hooks(kernel)


def warp_cpu_entry(kernel, device) -> tuple[int, tuple]:
    """``(address of the kernel's *_cpu_forward entry, objects to keep alive)``, compiled or cached."""
    exe, hooks = _warp_load(kernel, device, 1)
    if hooks.forward is None:  # pragma: no cover
        raise RuntimeError(f"Warp kernel '{kernel.key}' has no CPU forward entry point")
    return int(ctypes.cast(hooks.forward, ctypes.c_void_p).value), (exe, hooks, kernel)


def warp_cuda_entry(kernel, device) -> tuple[int, int, dict, tuple]:
    """``(CUfunction, CUcontext, launch options, objects to keep alive)`` of ``kernel`` on a CUDA device.

    The options are ``block_dim``, ``grid_stride``, ``cluster_dim`` and
    ``smem`` (dynamic shared memory bytes).
    """
    block_dim = int(kernel.module.options["block_dim"])
    exe, hooks = _warp_load(kernel, device, block_dim)
    if hooks.forward is None:  # pragma: no cover
        raise RuntimeError(f"Warp kernel '{kernel.key}' has no CUDA forward entry on {device}")
    meta = getattr(hooks, "det_launch_meta", None)
    if meta is not None and getattr(meta, "needs_deterministic", False):
        raise NotImplementedError(
            f"Warp kernel '{kernel.key}' is compiled in Warp's deterministic mode, which needs hidden "
            f"buffers that evjax does not provide; use wp.launch, or turn deterministic mode off."
        )
    if getattr(hooks, "forward_smem_shortfall", None):
        raise RuntimeError(
            f"Warp kernel '{kernel.key}' needs more shared memory than {device} offers: "
            f"{hooks.forward_smem_shortfall}"
        )
    forward = hooks.forward
    function = forward if isinstance(forward, int) else ctypes.cast(forward, ctypes.c_void_p).value
    options = {
        "block_dim": block_dim,
        "grid_stride": int(bool(kernel.grid_stride)),
        "cluster_dim": int(getattr(hooks, "cluster_dim", 1) or 1),
        "smem": int(hooks.forward_smem_bytes or 0),
    }
    return int(function or 0), int(device.context or 0), options, (exe, hooks, kernel)


def warp_cuda_launch_address() -> int:
    """Address of Warp's native ``wp_cuda_launch_kernel``."""
    from warp._src import context as wp_context

    return ctypes.cast(wp_context.runtime.core.wp_cuda_launch_kernel, ctypes.c_void_p).value


def warp_params(kernel) -> list:
    """The kernel's parameters (each has ``label`` and ``type``)."""
    return list(kernel.adj.args)


def warp_kernel_dim(kernel) -> int:
    """How many indices ``wp.tid()`` returns in ``kernel``."""
    dim = getattr(kernel.adj, "kernel_dim", None)
    if dim is None:
        kernel.adj.get_references()
        dim = getattr(kernel.adj, "kernel_dim", 1)
    return int(dim)


def warp_is_kernel(obj) -> bool:
    """Whether ``obj`` is a ``@warp.kernel``."""
    import warp as wp

    return isinstance(obj, wp.Kernel)


def warp_is_array_type(annotation) -> bool:
    """Whether a kernel parameter's annotation is a ``wp.array``."""
    import warp as wp

    return isinstance(annotation, wp.array)


def warp_is_generic(kernel) -> bool:
    """Whether the kernel has generic (``typing.Any``) parameters to specialise."""
    return bool(kernel.is_generic)


def warp_specialize(kernel, arg_types):
    """A generic kernel specialised to ``arg_types`` (Warp types, one per parameter)."""
    return kernel.add_overload(list(arg_types))

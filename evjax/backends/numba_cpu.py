"""Numba CPU bridge: ``@numba.njit`` kernels called from JAX through the XLA FFI.

For every (kernel, argument types) signature we generate a small Python module
holding a ``@numba.cfunc`` that *is* the FFI handler.  It decodes the typed call
frame with the intrinsics of :mod:`evjax.backends.numba_abi`, wraps each buffer
as a zero-copy array and calls the kernel, so a call from jitted JAX code runs
no Python.  Only the error path (a kernel that raised) enters Python, to
recover the exception's message and hand it to XLA.

The generated module lives in the evjax cache folder, which lets Numba cache the
handler on disk (``cache=True``) when the kernel itself is cacheable.
"""
from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import jax
import numpy as np

from .. import _compat
from . import ffi_abi

# Numba's type names are numpy's, except for bool.
NUMBA_TYPE_NAMES = {
    dt: "boolean" if dt == np.bool_ else dt.name
    for dt in ffi_abi.COMMON_KERNEL_DTYPES + (np.dtype(np.complex64), np.dtype(np.complex128))
}

# Bump when the generated handler code changes, so stale disk caches are never reused.
HANDLER_FORMAT = 2

_lock = threading.RLock()
_handlers: dict[tuple, "CompiledHandler"] = {}
_by_key: dict[int, "CompiledHandler"] = {}


def cache_dir() -> str:
    """The evjax cache folder (``$EVJAX_CACHE_DIR``, else ``~/.cache/evjax``)."""
    root = os.environ.get("EVJAX_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "evjax"
    )
    os.makedirs(root, exist_ok=True)
    return root


# ---------------------------------------------------------------------------
# Threading layer: never let numba's `workqueue` layer abort the process.
# ---------------------------------------------------------------------------
_THREADSAFE: bool | None = None


def threadsafe_layer_available() -> bool:
    """Whether a thread-safe numba threading layer (omp or tbb) can be used.

    Numba's ``workqueue`` layer aborts the whole process when two threads run
    parallel kernels at once, which XLA does routinely.  When the user forced
    ``workqueue`` (or neither OpenMP nor TBB loads), evjax compiles
    ``parallel=True`` kernels serially instead.
    """
    global _THREADSAFE
    if _THREADSAFE is None:
        from numba import config

        forced = os.environ.get("NUMBA_THREADING_LAYER", "").strip().lower()
        if forced == "workqueue":
            _THREADSAFE = False
        else:
            _THREADSAFE = False
            for module in ("numba.np.ufunc.omppool", "numba.np.ufunc.tbbpool"):
                try:
                    importlib.import_module(module)
                    _THREADSAFE = True
                    break
                except Exception:  # noqa: BLE001 - any failure means "not usable"
                    continue
            if _THREADSAFE and forced in ("", "default"):
                config.THREADING_LAYER = "threadsafe"
    return _THREADSAFE


def _serial_clone(kernel):
    """Recompile a ``parallel=True`` kernel without parallelism."""
    import numba

    options = dict(kernel.targetoptions)
    options["parallel"] = False
    options.pop("cache", None)  # the on-disk cache entry belongs to the parallel build
    options.pop("nopython", None)
    return numba.njit(**options)(kernel.py_func)


def prepare_kernel(kernel):
    """The kernel to compile: itself, or a serial clone where threads are unsafe."""
    if kernel.targetoptions.get("parallel") and not threadsafe_layer_available():
        warnings.warn(
            f"numba has no thread-safe threading layer (omp/tbb) here; evjax runs the parallel "
            f"kernel '{kernel.__name__}' serially. Install tbb (`pip install tbb`) or OpenMP "
            f"(libgomp) to run it in parallel.",
            RuntimeWarning,
            stacklevel=3,
        )
        return _serial_clone(kernel)
    # A parallel kernel (or one that calls a parallel function) loaded from
    # numba's disk cache and called from the handler, not through its
    # dispatcher, finds numba's thread pool not started and crashes: start it.
    from numba.np.ufunc import parallel

    parallel._launch_threads()
    return kernel


# ---------------------------------------------------------------------------
# Handler generation
# ---------------------------------------------------------------------------
@dataclass
class CompiledHandler:
    """One compiled FFI handler for a kernel at one argument signature."""

    kernel: Any
    target_name: str
    key: int
    module: Any
    kernel_name: str

    @property
    def address(self) -> int:
        return self.module.handler.address


def _kernel_fingerprint(kernel) -> tuple[str, bool]:
    """(fingerprint, cacheable) of a kernel's source, closure and options."""
    import numba

    py_func = kernel.py_func
    try:
        source = inspect.getsource(py_func)
        filename = inspect.getsourcefile(py_func) or ""
        mtime = os.path.getmtime(filename) if os.path.exists(filename) else 0.0
    except (OSError, TypeError):
        return f"{id(kernel)}", False
    cacheable = bool(filename) and os.path.exists(filename) and "<" not in filename
    closure = []
    for cell in py_func.__closure__ or ():
        value = cell.cell_contents
        if isinstance(value, (int, float, bool, str, complex, type(None), np.generic)):
            closure.append(repr(value))
        else:
            cacheable = False
            closure.append(f"<{type(value).__name__}@{id(value)}>")
    options = sorted((k, repr(v)) for k, v in kernel.targetoptions.items())
    text = "\n".join([
        source, filename, repr(mtime), repr(closure), repr(options), numba.__version__,
        f"format={HANDLER_FORMAT}", f"threadsafe={threadsafe_layer_available()}",
    ])
    return hashlib.sha1(text.encode()).hexdigest(), cacheable


def _buffer_lines(kind: str, index: int, dtype: np.dtype, rank: int) -> list[str]:
    name = f"{kind}{index}"
    dims = f"{name}_dims"
    shape = "(" + "".join(f"load_i64({dims}, {8 * d}), " for d in range(rank)) + ")"
    table = "args" if kind == "a" else "rets"
    return [
        f"    {name}_buf = to_voidptr(load_i64({table}, {8 * index}))",
        f"    {dims} = to_voidptr(load_i64({name}_buf, {ffi_abi.BUFFER_DIMS}))",
        f"    {name} = numba.carray(typed_pointer(load_i64({name}_buf, {ffi_abi.BUFFER_DATA}), "
        f"types.{NUMBA_TYPE_NAMES[dtype]}), {shape})",
    ]


def _module_source(in_types, out_types, cache: bool, traits: int) -> str:
    names = [f"a{i}" for i in range(len(in_types))] + [f"r{i}" for i in range(len(out_types))]
    arglist = ", ".join(names)
    major, minor = _compat.ffi_api_header_version()
    lines = [
        "# Generated by evjax.backends.numba_cpu: an XLA FFI handler as a numba cfunc.",
        "import numba",
        "from numba import types",
        "from evjax.backends.numba_abi import load_i64, load_i32, store_i32, to_voidptr, typed_pointer",
        "from evjax.backends.numba_cpu import report_kernel_error",
        "",
        f"@numba.njit(cache={cache}, nogil=True)",
        f"def guarded({arglist}):",
        "    try:",
        f"        KERNEL({arglist})",
        "    except Exception:",
        "        return 1",
        "    return 0",
        "",
        f"@numba.cfunc(types.voidptr(types.voidptr), cache={cache}, nogil=True)",
        "def handler(frame):",
        f"    ext = load_i64(frame, {ffi_abi.FRAME_EXTENSION_START})",
        f"    if ext != 0 and load_i32(to_voidptr(ext), {ffi_abi.EXT_TYPE}) == {ffi_abi.EXT_TYPE_METADATA}:",
        f"        metadata = to_voidptr(load_i64(to_voidptr(ext), {ffi_abi.EXT_METADATA_PTR}))",
        f"        api = load_i64(frame, {ffi_abi.FRAME_API})",
        f"        major = numba.int32({major})",
        f"        minor = numba.int32({minor})",
        "        if api != 0:",
        f"            major = load_i32(to_voidptr(api), {ffi_abi.API_VERSION_MAJOR})",
        f"            minor = load_i32(to_voidptr(api), {ffi_abi.API_VERSION_MINOR})",
        f"        store_i32(metadata, {ffi_abi.METADATA_API_MAJOR}, major)",
        f"        store_i32(metadata, {ffi_abi.METADATA_API_MINOR}, minor)",
        f"        store_i32(metadata, {ffi_abi.METADATA_TRAITS}, numba.int32({traits}))",
        "        return to_voidptr(0)",
        f"    if load_i32(frame, {ffi_abi.FRAME_STAGE}) != {ffi_abi.STAGE_EXECUTE}:",
        "        return to_voidptr(0)",
        f"    args = to_voidptr(load_i64(frame, {ffi_abi.FRAME_ARGS}))",
        f"    rets = to_voidptr(load_i64(frame, {ffi_abi.FRAME_RETS}))",
    ]
    for i, (dtype, rank) in enumerate(in_types):
        lines += _buffer_lines("a", i, dtype, rank)
    for i, (dtype, rank) in enumerate(out_types):
        lines += _buffer_lines("r", i, dtype, rank)
    lines += [
        f"    if guarded({arglist}) != 0:",
        "        return to_voidptr(report_kernel_error(frame, KEY))",
        "    return to_voidptr(0)",
        "",
    ]
    return "\n".join(lines)


def _file_has(path: str, text: str) -> bool:
    try:
        with open(path) as f:
            return f.read() == text
    except OSError:
        return False


def _load_module(path: str, module_name: str, namespace: dict):
    """Import the generated handler module, which compiles the handler and its kernel.

    Numba's pedantic SSA check reports ``NumbaIRAssumptionWarning`` for ``while``
    loops inside ``inline="always"`` helpers (as in the CSR kernels): the compiled
    code is correct and the user can do nothing about it, so it is not shown.
    """
    from numba.core.errors import NumbaIRAssumptionWarning

    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update(namespace)
    sys.modules[module_name] = module
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumbaIRAssumptionWarning)
        spec.loader.exec_module(module)
    return module


def get_handler(kernel, in_types: Sequence[tuple[np.dtype, int]], out_types, traits: int = 0):
    """The (cached) compiled handler of ``kernel`` for these argument types.

    Args:
        kernel: a numba ``CPUDispatcher`` (``@numba.njit`` function).
        in_types: ``(dtype, rank)`` per input buffer.
        out_types: ``(dtype, rank)`` per output buffer.
        traits: FFI handler traits to declare (0 on CPU).
    """
    signature = (kernel, tuple(in_types), tuple(out_types), traits)
    with _lock:
        handler = _handlers.get(signature)
        if handler is not None:
            return handler
        compiled = prepare_kernel(kernel)
        fingerprint, cacheable = _kernel_fingerprint(compiled)
        source = _module_source(in_types, out_types, cacheable, traits)
        digest = hashlib.sha1((fingerprint + source).encode()).hexdigest()[:20]
        if not cacheable:  # unique per process: never reuse a stale module
            digest = f"{digest}_{os.getpid()}_{id(kernel):x}"
        module_name = f"_evjax_handler_{digest}"
        folder = os.path.join(cache_dir(), "numba_handlers")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, module_name + ".py")
        if not _file_has(path, source):
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                f.write(source)
            os.replace(tmp, path)
        key = int(digest[:15], 16)
        module = _load_module(path, module_name, {"KERNEL": compiled, "KEY": key})
        if not cacheable:
            try:
                os.remove(path)
            except OSError:
                pass
        target = f"evjax_numba_{getattr(kernel, '__name__', 'kernel')}_{digest}"
        handler = CompiledHandler(compiled, target, key, module, getattr(kernel, "__name__", "kernel"))
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(handler.address), platform="cpu")
        _handlers[signature] = handler
        _by_key[key] = handler
        return handler


# ---------------------------------------------------------------------------
# Error path (Python, runs only after a kernel raised)
# ---------------------------------------------------------------------------
def _describe_kernel_error(frame: int, key: int) -> str:
    handler = _by_key.get(key)
    if handler is None:
        return "evjax: a numba kernel raised an exception (kernel unknown to this process)"
    name = handler.kernel_name
    try:
        ins, outs = ffi_abi.decode_frame(frame)
        arrays = [b.as_numpy() for b in ins] + [b.as_numpy() for b in outs]
        handler.kernel(*arrays)  # run again from Python to recover the message
    except Exception as exc:  # noqa: BLE001 - reported to the caller
        return f"evjax: numba kernel '{name}' raised {type(exc).__name__}: {exc}"
    return (
        f"evjax: numba kernel '{name}' raised an exception that did not reproduce when "
        f"re-run from Python (is the kernel non-deterministic?)"
    )


def _report_kernel_error_py(frame: int, key: int) -> int:
    try:
        message = _describe_kernel_error(frame, key)
    except Exception as exc:  # noqa: BLE001
        message = f"evjax: numba kernel raised an exception ({exc!r} while describing it)"
    return ffi_abi.make_error(frame, message)


def _build_error_reporter():
    import numba

    from .numba_abi import voidptr_to_int

    @numba.njit(cache=False)
    def report_kernel_error(frame, key):
        address = voidptr_to_int(frame)
        with numba.objmode(error="int64"):
            error = _report_kernel_error_py(address, key)
        return error

    return report_kernel_error


report_kernel_error = _build_error_reporter()

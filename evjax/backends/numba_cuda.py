"""Numba CUDA bridge: ``@cuda.jit`` kernels and Python launchers called from JAX
on NVIDIA GPUs through the XLA FFI (platform ``"CUDA"``).

Two kinds of handler (what a signature needs is built once and cached):

* **compiled** (``numba_cuda_kernel``, the default where possible): one
  generic handler from :mod:`evjax.backends.numba_cuda_launch`, the
  handler of every kernel, reads a per-signature launch plan (passed as an
  FFI attribute), the buffers' device addresses and XLA's stream, and calls
  ``cuLaunchKernel`` with the Numba-compiled ``CUfunction`` and parameters
  packed in Numba's CUDA array ABI.  No Python runs per call, and a new
  signature costs no compilation beyond the kernel's own.  Before using it
  evjax checks, once per signature, that its packing equals what the installed
  Numba itself would pass (``_Kernel._prepare_args``); on any doubt it falls
  back to the Python handler (with a warning under
  ``EVJAX_NUMBA_CUDA_LAUNCH=compiled``).
* **Python** (``numba_cuda_callable`` always; ``numba_cuda_kernel`` with
  several GPUs, ``debug=True`` or cooperative kernels, or
  ``EVJAX_NUMBA_CUDA_LAUNCH=python``): a :class:`evjax.backends.ffi_core.PythonHandler`
  whose callback wraps the buffers as Numba device arrays (zero-copy, cached
  per address) and XLA's stream as ``cuda.external_stream``, then launches the
  already-compiled overload directly, skipping Numba's dispatch and type
  inference.

Neither path synchronises.  Nothing here imports ``numba.cuda`` at import time;
Numba's private CUDA API is reached through :mod:`evjax._kernel_compat`.
"""
from __future__ import annotations

import ctypes
import os
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import jax
import numpy as np

from .. import _kernel_compat
from . import ffi_abi, numba_cuda_launch
from .ffi_core import PythonHandler

LAUNCH_ENV = "EVJAX_NUMBA_CUDA_LAUNCH"  # "auto" (default), "compiled" or "python"
MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK_DIMS = (1024, 1024, 64)
MAX_GRID_DIMS = (2**31 - 1, 65535, 65535)
MAX_SHARED_MEM_ANY_GPU = 232448  # 227 KiB: the largest opt-in dynamic shared memory of current GPUs

Spec = tuple  # (shape tuple, numpy dtype)

_lock = threading.RLock()
_handlers: dict[tuple, "Handler"] = {}


# ---------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------
def cuda_module():
    """``numba.cuda`` (imported on first use only)."""
    from numba import cuda

    return cuda


def simulator_enabled() -> bool:
    """Whether Numba's CUDA simulator is on (``NUMBA_ENABLE_CUDASIM=1`` at numba import)."""
    return _kernel_compat.cuda_simulator_enabled()


def gpu_devices() -> list:
    """JAX's GPU devices ([] on a CPU-only machine or jaxlib)."""
    try:
        return list(jax.devices("gpu"))
    except RuntimeError:
        return []


def require_gpu(who: str) -> None:
    """Raise a clear error unless JAX has a CUDA GPU and Numba can use it."""
    if not gpu_devices():
        raise RuntimeError(
            f"{who} launches CUDA kernels and needs an NVIDIA GPU, but JAX found no GPU "
            f"(backend: {jax.default_backend()!r}). On CPU use the CPU backends instead: "
            f"evjax.numba_kernel for your own @numba.njit kernels, or backend='numba' / "
            f"backend='warp' for evjax's operators. To check a kernel's logic on CPU, set "
            f"NUMBA_ENABLE_CUDASIM=1 before numba is imported: the wrappers then run it in "
            f"Numba's CUDA simulator."
        )
    try:
        available = cuda_module().is_available()
    except Exception:  # noqa: BLE001 - any failure means "not usable"
        available = False
    if not available:
        raise RuntimeError(
            f"{who}: JAX sees a GPU but numba.cuda cannot use it. Install the CUDA target of "
            f"Numba matching your CUDA major version, e.g. `pip install 'numba-cuda[cu12]'` "
            f"(or `pip install 'evjax[cuda]'`), and check `python -c 'from numba import cuda; "
            f"cuda.detect()'`."
        )


def launch_mode() -> str:
    """The requested launch path: ``auto``, ``compiled`` or ``python``."""
    mode = os.environ.get(LAUNCH_ENV, "auto").strip().lower() or "auto"
    if mode not in ("auto", "compiled", "python"):
        raise ValueError(f"{LAUNCH_ENV}={mode!r}; use 'auto', 'compiled' or 'python'")
    return mode


# ---------------------------------------------------------------------------
# The CUDA driver, through ctypes (independent of Numba's binding flavour)
# ---------------------------------------------------------------------------
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK = 8
CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97


class LibCuda:
    """The few driver entry points evjax calls itself."""

    def __init__(self, path: str = "libcuda.so.1"):
        self.lib = ctypes.CDLL(path)
        signatures = {
            "cuGetErrorName": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
            "cuGetErrorString": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
            "cuDeviceGetAttribute": [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int],
            "cuFuncSetAttribute": [ctypes.c_void_p, ctypes.c_int, ctypes.c_int],
            "cuCtxGetDevice": [ctypes.POINTER(ctypes.c_int)],
            "cuKernelGetFunction": [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p],  # CUDA >= 12.0
        }
        for name, argtypes in signatures.items():
            function = getattr(self.lib, name, None)
            if function is not None:
                function.argtypes = argtypes

    def address(self, *names: str) -> int:
        """The address of the first exported symbol among ``names``.

        Pass the ABI-versioned name first: ``cuda.h`` maps e.g.
        ``cuCtxPushCurrent`` to ``cuCtxPushCurrent_v2``.
        """
        for name in names:
            function = getattr(self.lib, name, None)
            if function is not None:
                return int(ctypes.cast(function, ctypes.c_void_p).value)
        raise RuntimeError(f"evjax: the CUDA driver exports none of {names}")

    def error_name(self, status: int) -> str:
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        if self.lib.cuGetErrorName(status, ctypes.byref(name)) != 0 or not name.value:
            return f"CUresult {status}"
        self.lib.cuGetErrorString(status, ctypes.byref(text))
        detail = (text.value or b"").decode(errors="replace")
        return f"{name.value.decode()} ({detail})" if detail else name.value.decode()

    def check(self, status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"evjax: {what} failed: {self.error_name(status)}")

    def device_attribute(self, attribute: int, device: int) -> int:
        value = ctypes.c_int()
        self.check(self.lib.cuDeviceGetAttribute(ctypes.byref(value), attribute, device), "cuDeviceGetAttribute")
        return value.value

    def current_device(self) -> int:
        value = ctypes.c_int()
        self.check(self.lib.cuCtxGetDevice(ctypes.byref(value)), "cuCtxGetDevice")
        return value.value

    def set_max_dynamic_shared(self, function: int, size: int) -> None:
        status = self.lib.cuFuncSetAttribute(function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, size)
        self.check(status, "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")

    def kernel_function(self, kernel_handle: int) -> int:
        """The ``CUfunction`` of a ``CUkernel`` in the current context."""
        out = ctypes.c_void_p()
        self.check(self.lib.cuKernelGetFunction(ctypes.byref(out), kernel_handle), "cuKernelGetFunction")
        return int(out.value or 0)


_libcuda: LibCuda | None = None


def libcuda() -> LibCuda:
    global _libcuda
    if _libcuda is None:
        _libcuda = LibCuda()
    return _libcuda


# ---------------------------------------------------------------------------
# Kernels: overload selection and parameter packing
# ---------------------------------------------------------------------------
def get_overload(kernel, specs: Sequence[Spec]):
    """The compiled ``_Kernel`` of ``kernel`` for arrays of these specs."""
    return _kernel_compat.cuda_overload(kernel, specs)


def pack_plan(specs: Sequence[Spec], n_in: int) -> tuple[list[int], list[tuple[int, bool, int]]]:
    """Our packing: parameter values (data pointers 0) and the data slots."""
    values: list[int] = []
    slots: list[tuple[int, bool, int]] = []
    for k, (shape, dtype) in enumerate(specs):
        is_ret = k >= n_in
        slots.append((len(values) + numba_cuda_launch.DATA_FIELD, is_ret, k - n_in if is_ret else k))
        values += numba_cuda_launch.array_params(shape, np.dtype(dtype).itemsize)
    return values, slots


def numba_packing(overload, specs: Sequence[Spec], make_view: Callable[[Spec], Any]) -> list[int]:
    """What Numba itself passes for arrays made by ``make_view``, as integers.

    Raises:
        TypeError: a parameter is not 8 bytes wide (the compiled path assumes it).
    """
    kernelargs = _kernel_compat.cuda_packing(overload, specs, make_view)
    values = []
    for value in kernelargs:
        if isinstance(value, ctypes._SimpleCData):
            if ctypes.sizeof(value) != 8:
                raise TypeError(f"a kernel parameter is {ctypes.sizeof(value)} bytes, not 8")
            values.append(int(value.value or 0))
        elif isinstance(value, (int, np.integer)):
            values.append(int(value))
        else:
            values.append(_kernel_compat.handle_address(value))
    return values


def packing_agrees(overload, specs: Sequence[Spec], n_in: int, make_view, base: int) -> bool:
    """Whether our packing equals Numba's for views at address ``base``."""
    ours, slots = pack_plan(specs, n_in)
    for slot, _, _ in slots:
        ours[slot] = base
    try:
        theirs = numba_packing(overload, specs, make_view)
    except Exception:  # noqa: BLE001 - any doubt means "use the Python path"
        return False
    return ours == theirs


# ---------------------------------------------------------------------------
# Device arrays and streams for the Python path
# ---------------------------------------------------------------------------
class DeviceViews:
    """Zero-copy Numba device arrays over XLA buffers, cached per address."""

    def __init__(self, specs: Sequence[Spec], limit: int = 64):
        self.specs = [(tuple(s), np.dtype(d)) for s, d in specs]
        self.cache: list[dict[int, Any]] = [{} for _ in self.specs]
        self.limit = limit

    def __call__(self, pointers: Sequence[int]) -> list:
        arrays = []
        for k, pointer in enumerate(pointers):
            cache = self.cache[k]
            array = cache.get(pointer)
            if array is None:
                if len(cache) >= self.limit:
                    cache.clear()
                shape, dtype = self.specs[k]
                array = cache[pointer] = device_view(pointer, shape, dtype)
            arrays.append(array)
        return arrays


def device_view(pointer: int, shape, dtype):
    """A Numba device array over device memory at ``pointer`` (no copy, no sync)."""
    cuda = cuda_module()
    description = {"shape": tuple(shape), "typestr": np.dtype(dtype).str, "data": (pointer, False),
                   "version": 3, "strides": None}
    return cuda.from_cuda_array_interface(description, owner=None, sync=False)


_streams: dict[int, Any] = {}


def external_stream(pointer: int):
    """A (cached) Numba stream object for XLA's ``cudaStream_t``."""
    stream = _streams.get(pointer)
    if stream is None:
        stream = _streams[pointer] = cuda_module().external_stream(pointer)
    return stream


_FRAME_WORDS = ctypes.c_int64 * 15  # the call frame up to the results' pointer table (offset 112)
_DATA_WORDS = ctypes.c_int64 * (ffi_abi.BUFFER_DATA // 8 + 1)  # an XLA_FFI_Buffer up to its data pointer
_int64_arrays: dict[int, Any] = {}


def _int64_array(count: int):
    """``ctypes.c_int64 * count``, cached (making an array type costs microseconds)."""
    kind = _int64_arrays.get(count)
    if kind is None:
        kind = _int64_arrays[count] = ctypes.c_int64 * count
    return kind


def frame_words(frame: int):
    """The call frame as int64 words (one ctypes object instead of one per field)."""
    return _FRAME_WORDS.from_address(frame)


def buffer_pointers(frame: int, n_args: int, n_rets: int) -> list[int]:
    """The device addresses of a frame's buffers (arguments, then results)."""
    words = frame_words(frame)
    got = (words[ffi_abi.FRAME_ARGS_SIZE // 8], words[ffi_abi.FRAME_RETS_SIZE // 8])
    if got != (n_args, n_rets):
        raise RuntimeError(f"call frame has {got[0]} arguments and {got[1]} results, expected {n_args}, {n_rets}")
    pointers = []
    for table, count in ((ffi_abi.FRAME_ARGS, n_args), (ffi_abi.FRAME_RETS, n_rets)):
        if count:
            for buffer in _int64_array(count).from_address(words[table // 8]):
                pointers.append(_DATA_WORDS.from_address(buffer)[ffi_abi.BUFFER_DATA // 8])
    return pointers


# ---------------------------------------------------------------------------
# Handlers
# ---------------------------------------------------------------------------
@dataclass
class Handler:
    """A registered FFI target, the attributes to call it with, and what keeps it alive."""

    target_name: str
    kind: str  # "compiled" or "python"
    address: int
    keepalive: list = field(default_factory=list)
    attributes: dict = field(default_factory=dict)


COMPILED_TARGET = "evjax_numba_cuda_launch"
_compiled_registered = False


def compiled_target() -> str:
    """The FFI target of the generic compiled launch handler (registered on first use)."""
    global _compiled_registered
    with _lock:
        if not _compiled_registered:
            address = numba_cuda_launch.handler_address()
            jax.ffi.register_ffi_target(COMPILED_TARGET, jax.ffi.pycapsule(address), platform="CUDA")
            _compiled_registered = True
    return COMPILED_TARGET


def check_shared_memory(who: str, static: int, dynamic: int, function: int, device: int, lib: LibCuda) -> None:
    """Check the shared memory request against the device; opt in above 48 KiB.

    Raises:
        ValueError: ``static + dynamic`` exceeds what the device allows per block.
    """
    default = lib.device_attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, device)
    optin = max(default, lib.device_attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device))
    if static + dynamic > optin:
        raise ValueError(
            f"{who}: shared_mem={dynamic} bytes plus the kernel's {static} bytes of static shared memory "
            f"exceed the {optin} bytes per block this GPU allows (device {device}). Lower shared_mem or the "
            f"kernel's cuda.shared.array sizes."
        )
    if static + dynamic > default and dynamic:
        lib.set_max_dynamic_shared(function, dynamic)


def kernel_handler(kernel, in_specs, out_specs, grid, block, shared_mem: int, who: str) -> Handler:
    """The (cached, registered) handler launching ``kernel`` for this signature."""
    specs = [(tuple(s), np.dtype(d)) for s, d in list(in_specs) + list(out_specs)]
    key = ("kernel", kernel, tuple(specs), len(in_specs), tuple(grid), tuple(block), shared_mem, launch_mode())
    with _lock:
        handler = _handlers.get(key)
        if handler is None:
            handler = _build_kernel_handler(kernel, specs, len(in_specs), grid, block, shared_mem, who)
            _handlers[key] = handler
        return handler


def _build_kernel_handler(kernel, specs, n_in, grid, block, shared_mem, who) -> Handler:
    cuda = cuda_module()
    lib = libcuda()
    overload = get_overload(kernel, specs)
    function, library_kernel = _kernel_compat.cuda_function(overload)  # loads it into the current context
    if library_kernel:  # numba-cuda on cuda.core: a CUkernel, whose CUfunction we need
        function = lib.kernel_function(function)
    threads = block[0] * block[1] * block[2]
    maxthreads, static_shared = _kernel_compat.cuda_kernel_limits(overload, MAX_THREADS_PER_BLOCK)
    if threads > maxthreads:
        raise ValueError(
            f"{who}: a block of {threads} threads {tuple(block)} is more than the {maxthreads} this kernel "
            f"can run per block (its register use limits it). Use a smaller block or threads_per_block."
        )
    device = lib.current_device()
    check_shared_memory(who, static_shared, shared_mem, function, device, lib)

    mode = launch_mode()
    reason = None
    if mode == "python":
        reason = f"{LAUNCH_ENV}=python"
    elif len(gpu_devices()) > 1:
        reason = "several GPUs are visible (one CUfunction per device)"
    elif _kernel_compat.cuda_needs_python_launch(overload):
        reason = "the kernel uses debug=True, cooperative groups or argument extensions"
    else:
        scratch = cuda.device_array(64, np.uint8)
        base = _kernel_compat.handle_address(scratch.device_ctypes_pointer)

        def make_view(spec):
            return device_view(base, spec[0], spec[1])

        if not packing_agrees(overload, specs, n_in, make_view, base):
            reason = "this Numba version packs kernel parameters differently from what evjax expects"
    describe = _describe_failure(who, kernel.__name__, grid, block, shared_mem, lib)
    if reason is None:
        values, slots = pack_plan(specs, n_in)
        context = _kernel_compat.handle_address(cuda.current_context().handle)
        plan = numba_cuda_launch.LaunchPlan(
            tuple(values), tuple(slots), tuple(grid), tuple(block), int(shared_mem), function, context,
            lib.address("cuLaunchKernel"), lib.address("cuCtxGetCurrent"),
            lib.address("cuCtxPushCurrent_v2", "cuCtxPushCurrent"),
            lib.address("cuCtxPopCurrent_v2", "cuCtxPopCurrent"),
        )
        compiled = numba_cuda_launch.build(plan, describe)
        target = compiled_target()
        return Handler(target, "compiled", compiled.address, [compiled, overload], compiled.attributes)
    if mode == "compiled":
        warnings.warn(f"{who}: using the Python launch path because {reason}", RuntimeWarning, stacklevel=4)
    run = PythonLaunch(overload, DeviceViews(specs), n_in, len(specs) - n_in, grid, block, shared_mem)
    python = PythonHandler(f"numba_cuda_kernel '{kernel.__name__}'", run)
    return Handler(python.target_name, "python", python.address, [python, overload], python.attributes)


class PythonLaunch:
    """The Python path of one kernel signature: ``run(frame) -> error_or_0``.

    ``overload`` is the compiled ``_Kernel``; its ``launch`` skips Numba's
    dispatch (type inference, overload lookup, configuration objects).
    """

    def __init__(self, overload, views, n_in, n_out, grid, block, shared_mem,
                 stream_of=None, wrap_stream=None):
        self.overload = overload
        self.views = views
        self.n_in, self.n_out = n_in, n_out
        self.grid, self.block = tuple(grid), tuple(block)
        self.shared_mem = int(shared_mem)
        self.stream_of = stream_of or ffi_abi.get_stream
        self.wrap_stream = wrap_stream or external_stream

    def __call__(self, frame: int) -> int:
        stream, error = self.stream_of(frame)
        if error:
            return error
        if 0 in self.grid:
            return 0
        arrays = self.views(buffer_pointers(frame, self.n_in, self.n_out))
        _kernel_compat.cuda_launch(self.overload, arrays, self.grid, self.block, self.wrap_stream(stream),
                                   self.shared_mem)
        return 0


def _describe_failure(who, name, grid, block, shared_mem, lib: LibCuda) -> Callable[[int], str]:
    def describe(status: int) -> str:
        return (
            f"evjax: {who}: CUDA kernel '{name}' failed to launch with grid={tuple(grid)}, "
            f"block={tuple(block)}, shared_mem={shared_mem}: {lib.error_name(status)}"
        )

    return describe


def callable_handler(
    func: Callable,
    in_specs,
    out_specs,
    who: str,
    *,
    platform: str = "CUDA",
    views: Callable[[Sequence[Spec]], Callable] | None = None,
    stream_of: Callable[[int], tuple[int, int]] | None = None,
    wrap_stream: Callable[[int], Any] | None = None,
) -> Handler:
    """The (cached, registered) handler calling ``func(*ins, *outs, stream)``.

    The keyword arguments exist for the tests, which run the handler on CPU
    with host arrays: ``views(specs)`` builds the array wrapper,
    ``stream_of(frame)`` returns ``(stream, error)`` and ``wrap_stream`` wraps it.
    """
    specs = [(tuple(s), np.dtype(d)) for s, d in list(in_specs) + list(out_specs)]
    key = ("callable", func, tuple(specs), len(in_specs), platform, views, stream_of, wrap_stream)
    with _lock:
        handler = _handlers.get(key)
        if handler is not None:
            return handler
        wrap = (views or DeviceViews)(specs)
        get_stream = stream_of or ffi_abi.get_stream
        stream_object = wrap_stream or external_stream
        n_in, n_out = len(in_specs), len(out_specs)

        def run(frame: int) -> int:
            stream, error = get_stream(frame)
            if error:
                return error
            arrays = wrap(buffer_pointers(frame, n_in, n_out))
            func(*arrays, stream_object(stream))
            return 0

        python = PythonHandler(who, run, platform=platform)
        handler = _handlers[key] = Handler(python.target_name, "python", python.address, [python, func],
                                           python.attributes)
        return handler

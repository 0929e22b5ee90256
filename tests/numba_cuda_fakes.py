"""Hand-built XLA FFI call frames and a fake CUDA driver, for testing the CUDA
bridge's handlers on a machine without a GPU."""
from __future__ import annotations

import ctypes
import types

import numpy as np

from evjax.backends import ffi_abi

LAUNCH_T = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
    ctypes.c_void_p,
)
STATUS_T = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
PTR_T = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
HANDLER_T = PTR_T  # XLA_FFI_Error* handler(XLA_FFI_CallFrame*)


def address(cfunc) -> int:
    return int(ctypes.cast(cfunc, ctypes.c_void_p).value)


class FakeDriver:
    """``cuLaunchKernel`` and the context functions, recording their calls."""

    def __init__(self, n_params: int, status: int = 0, current_context: int = 0):
        self.n_params = n_params
        self.status = status
        self.current_context = current_context
        self.launches: list[dict] = []
        self.pushed: list[int] = []
        self.popped = 0

        @LAUNCH_T
        def launch(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
            values = [ctypes.c_int64.from_address(params[k]).value for k in range(self.n_params)]
            self.launches.append(dict(function=f, grid=(gx, gy, gz), block=(bx, by, bz), shared=shared,
                                      stream=stream, values=values, extra=extra))
            return self.status

        @STATUS_T
        def get_current(out):
            ctypes.c_int64.from_address(out).value = self.current_context
            return 0

        @STATUS_T
        def push(ctx):
            self.pushed.append(ctx)
            return 0

        @STATUS_T
        def pop(out):
            self.popped += 1
            return 0

        self.launch, self.get_current, self.push, self.pop = launch, get_current, push, pop


class FakeApi:
    """An ``XLA_FFI_Api`` table with ``Stream_Get`` and ``Error_Create``."""

    def __init__(self, stream: int = 0xABC0, stream_error: int = 0):
        self.messages: list[str] = []
        self.stream, self.stream_error = stream, stream_error
        self.table = (ctypes.c_int64 * 32)()

        @PTR_T
        def stream_get(args):
            ctypes.c_int64.from_address(args + 24).value = self.stream
            return self.stream_error

        @PTR_T
        def error_create(args):
            message = ctypes.c_char_p.from_address(args + 16).value
            self.messages.append(message.decode())
            return 0xE000 + len(self.messages)

        self.table[ffi_abi.API_STREAM_GET // 8] = address(stream_get)
        self.table[ffi_abi.API_ERROR_CREATE // 8] = address(error_create)
        self._keep = (stream_get, error_create)


class Frame:
    """An ``XLA_FFI_CallFrame`` over host numpy arrays (their data pointers)."""

    def __init__(self, api: FakeApi, ins, outs, stage: int = ffi_abi.STAGE_EXECUTE, metadata: bool = False,
                 attributes: dict | None = None):
        self.keep: list = []
        self.raw = (ctypes.c_int64 * 24)()
        base = ctypes.addressof(self.raw)
        self.raw[0] = ffi_abi.CALL_FRAME_STRUCT_SIZE
        self.raw[ffi_abi.FRAME_API // 8] = ctypes.addressof(api.table)
        self.raw[ffi_abi.FRAME_CTX // 8] = 0x77
        ctypes.c_int32.from_address(base + ffi_abi.FRAME_STAGE).value = stage
        for size_off, ptr_off, arrays in ((ffi_abi.FRAME_ARGS_SIZE, ffi_abi.FRAME_ARGS, ins),
                                          (ffi_abi.FRAME_RETS_SIZE, ffi_abi.FRAME_RETS, outs)):
            table = (ctypes.c_int64 * max(len(arrays), 1))()
            for i, a in enumerate(arrays):
                table[i] = self._buffer(a)
            self.keep.append(table)
            self.raw[size_off // 8] = len(arrays)
            self.raw[ptr_off // 8] = ctypes.addressof(table)
        if attributes:  # int64 scalars: XLA_FFI_Scalar {int32 dtype; void* value}
            n = len(attributes)
            kinds = (ctypes.c_int32 * n)(*([3] * n))  # XLA_FFI_AttrType_SCALAR
            table = (ctypes.c_int64 * n)()
            for i, value in enumerate(attributes.values()):
                cell = (ctypes.c_int64 * 1)(int(value))
                scalar = (ctypes.c_int64 * 2)()
                ctypes.c_int32.from_address(ctypes.addressof(scalar)).value = ffi_abi.FFI_DTYPE_CODES[np.dtype(np.int64)]
                scalar[1] = ctypes.addressof(cell)
                table[i] = ctypes.addressof(scalar)
                self.keep += [cell, scalar]
            self.keep += [kinds, table]
            self.raw[ffi_abi.FRAME_ATTRS_SIZE // 8] = n
            self.raw[144 // 8] = ctypes.addressof(kinds)
            self.raw[ffi_abi.FRAME_ATTRS // 8] = ctypes.addressof(table)
        if metadata:
            self.metadata = (ctypes.c_int32 * 16)()
            ctypes.c_int64.from_address(ctypes.addressof(self.metadata)).value = ffi_abi.METADATA_STRUCT_SIZE
            ext = (ctypes.c_int64 * 4)()
            ext[0] = ffi_abi.METADATA_EXTENSION_STRUCT_SIZE
            ctypes.c_int32.from_address(ctypes.addressof(ext) + ffi_abi.EXT_TYPE).value = ffi_abi.EXT_TYPE_METADATA
            ext[ffi_abi.EXT_METADATA_PTR // 8] = ctypes.addressof(self.metadata)
            self.keep.append(ext)
            self.raw[ffi_abi.FRAME_EXTENSION_START // 8] = ctypes.addressof(ext)

    def _buffer(self, a: np.ndarray) -> int:
        buf = (ctypes.c_int64 * 6)()
        dims = (ctypes.c_int64 * max(a.ndim, 1))(*a.shape)
        ctypes.c_int32.from_address(ctypes.addressof(buf) + ffi_abi.BUFFER_DTYPE).value = ffi_abi.FFI_DTYPE_CODES[a.dtype]
        buf[ffi_abi.BUFFER_DATA // 8] = a.ctypes.data
        buf[ffi_abi.BUFFER_RANK // 8] = a.ndim
        buf[ffi_abi.BUFFER_DIMS // 8] = ctypes.addressof(dims)
        self.keep += [buf, dims]
        return ctypes.addressof(buf)

    @property
    def address(self) -> int:
        return ctypes.addressof(self.raw)


def call_handler(handler_address: int, frame: Frame) -> int:
    return int(HANDLER_T(handler_address)(frame.address) or 0)


def duck_device_array(shape, dtype, pointer: int):
    """An object with what Numba's ``_prepare_args`` reads from a device array
    (built-in numba.cuda and the numba-cuda package)."""
    a = np.empty(shape, dtype)
    duck = types.SimpleNamespace(
        size=a.size, dtype=a.dtype, ndim=a.ndim, shape=a.shape, strides=a.strides, __cuda_memory__=True,
        device_ctypes_pointer=ctypes.c_void_p(pointer), ptr=pointer,
        _layout=types.SimpleNamespace(strides_in_bytes=a.strides, is_contiguous_c=True, is_contiguous_f=a.ndim <= 1),
    )
    duck._strided_memory_view_shim = duck  # numba-cuda 0.30's InOut.to_device passes this (ptr, shape, ...)
    return duck


class HostViews:
    """Host numpy views of a frame's buffers: stand-ins for device arrays on CPU."""

    def __init__(self, specs):
        self.specs = [(tuple(shape), np.dtype(dtype)) for shape, dtype in specs]

    def __call__(self, pointers):
        views = []
        for pointer, (shape, dtype) in zip(pointers, self.specs):
            count = int(np.prod(shape, dtype=np.int64))
            raw = (ctypes.c_char * max(count * dtype.itemsize, 1)).from_address(pointer)
            views.append(np.frombuffer(raw, dtype=dtype, count=count).reshape(shape))
        return views

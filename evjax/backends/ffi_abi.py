"""The typed XLA FFI call frame: offsets, dtype codes, and a ``ctypes`` decoder.

The offsets are those of ``xla/ffi/api/c_api.h`` on LP64 platforms (checked
against jaxlib's shipped header, API 0.x).  Compiled handlers read the frame
with :mod:`evjax.backends.intrinsics` and share the prologue of
:mod:`evjax.backends.ffi_core`; the ``ctypes`` view here (:func:`decode_frame`,
:func:`get_stream`) serves the rare paths that run Python: describing a
kernel's exception and Numba CUDA's Python launch path.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

# --- XLA_FFI_CallFrame ------------------------------------------------------
FRAME_EXTENSION_START = 8
FRAME_API = 16
FRAME_CTX = 24
FRAME_STAGE = 32
FRAME_ARGS_SIZE = 56
FRAME_ARGS_TYPES = 64
FRAME_ARGS = 72
FRAME_RETS_SIZE = 96
FRAME_RETS_TYPES = 104
FRAME_RETS = 112
FRAME_ATTRS_SIZE = 136
FRAME_ATTRS_NAMES = 152
FRAME_ATTRS = 160
STAGE_EXECUTE = 3

# --- XLA_FFI_Buffer ---------------------------------------------------------
BUFFER_DTYPE = 16
BUFFER_DATA = 24
BUFFER_RANK = 32
BUFFER_DIMS = 40

# --- Metadata extension -----------------------------------------------------
EXT_TYPE = 8
EXT_TYPE_METADATA = 1
EXT_METADATA_PTR = 24
METADATA_API_MAJOR = 24
METADATA_API_MINOR = 28
METADATA_TRAITS = 32
TRAIT_COMMAND_BUFFER_COMPATIBLE = 1

# --- XLA_FFI_Api ------------------------------------------------------------
API_VERSION_MAJOR = 32
API_VERSION_MINOR = 36
API_ERROR_CREATE = 48
API_STREAM_GET = 80
API_DEVICE_ORDINAL_GET = 184
ERROR_CREATE_ARGS_SIZE = 28  # XLA_FFI_STRUCT_SIZE(XLA_FFI_Error_Create_Args, errc)
STREAM_GET_ARGS_SIZE = 32  # XLA_FFI_STRUCT_SIZE(XLA_FFI_Stream_Get_Args, stream)
DEVICE_ORDINAL_GET_ARGS_SIZE = 28  # XLA_FFI_STRUCT_SIZE(XLA_FFI_DeviceOrdinal_Get_Args, device_ordinal)

# --- Attributes ---------------------------------------------------------------
SCALAR_VALUE = 8  # offset of ``void* value`` in XLA_FFI_Scalar {int32 dtype; void* value}
FFI_DTYPE_CODES_S64 = 5  # XLA_FFI_DataType of int64
ERRC_INVALID_ARGUMENT = 3
ERRC_INTERNAL = 13

# The dtypes every kernel backend (Numba CPU and CUDA, Warp) takes: bool, signed and
# unsigned integers of 8 to 64 bits, float16/32/64.  Each backend keeps its own
# mapping to type names and adds what only it supports (Numba: complex).
COMMON_KERNEL_DTYPES: tuple[np.dtype, ...] = tuple(
    np.dtype(name)
    for name in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
    + ("float16", "float32", "float64")
)

# XLA_FFI_DataType codes <-> numpy dtypes.
FFI_DTYPE_CODES: dict[np.dtype, int] = {
    np.dtype(np.bool_): 1,
    np.dtype(np.int8): 2,
    np.dtype(np.int16): 3,
    np.dtype(np.int32): 4,
    np.dtype(np.int64): 5,
    np.dtype(np.uint8): 6,
    np.dtype(np.uint16): 7,
    np.dtype(np.uint32): 8,
    np.dtype(np.uint64): 9,
    np.dtype(np.float16): 10,
    np.dtype(np.float32): 11,
    np.dtype(np.float64): 12,
    np.dtype(np.complex64): 15,
    np.dtype(np.complex128): 18,
}
CODE_TO_DTYPE = {code: dt for dt, code in FFI_DTYPE_CODES.items()}


# --------------------------------------------------------------------------
# ctypes view (Python paths only)
# --------------------------------------------------------------------------
def _i64(addr: int) -> int:
    return ctypes.c_int64.from_address(addr).value


def _i32(addr: int) -> int:
    return ctypes.c_int32.from_address(addr).value


@dataclass
class BufferView:
    """One decoded ``XLA_FFI_Buffer``."""

    dtype: np.dtype
    data: int
    shape: tuple[int, ...]

    def as_numpy(self) -> np.ndarray:
        """A zero-copy numpy view of a host buffer."""
        count = int(np.prod(self.shape, dtype=np.int64))
        if count == 0 or self.data == 0:
            return np.zeros(self.shape, self.dtype)
        raw = (ctypes.c_char * (count * self.dtype.itemsize)).from_address(self.data)
        return np.frombuffer(raw, dtype=self.dtype).reshape(self.shape)


def _decode_buffers(frame: int, size_off: int, ptrs_off: int) -> list[BufferView]:
    count = _i64(frame + size_off)
    ptrs = _i64(frame + ptrs_off)
    out = []
    for k in range(count):
        buf = _i64(ptrs + 8 * k)
        rank = _i64(buf + BUFFER_RANK)
        dims = _i64(buf + BUFFER_DIMS)
        shape = tuple(_i64(dims + 8 * d) for d in range(rank))
        dtype = CODE_TO_DTYPE.get(_i32(buf + BUFFER_DTYPE), np.dtype(np.uint8))
        out.append(BufferView(dtype, _i64(buf + BUFFER_DATA), shape))
    return out


def decode_frame(frame: int) -> tuple[list[BufferView], list[BufferView]]:
    """Decode the argument and result buffers of a call frame (ctypes)."""
    return (
        _decode_buffers(frame, FRAME_ARGS_SIZE, FRAME_ARGS),
        _decode_buffers(frame, FRAME_RETS_SIZE, FRAME_RETS),
    )


_STREAM_GET = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
_STREAM_ARGS = ctypes.c_int64 * 4  # XLA_FFI_Stream_Get_Args {struct_size, extension_start, ctx, stream}
_stream_getters: dict[int, object] = {}


def get_stream(frame: int) -> tuple[int, int]:
    """``(stream, error)`` of the frame's execution context (``XLA_FFI_Stream_Get``; GPU only)."""
    api = _i64(frame + FRAME_API)
    getter = _stream_getters.get(api)
    if getter is None:
        getter = _stream_getters[api] = _STREAM_GET(_i64(api + API_STREAM_GET))
    args = _STREAM_ARGS(STREAM_GET_ARGS_SIZE, 0, _i64(frame + FRAME_CTX), 0)
    error = getter(ctypes.addressof(args))
    return int(args[3]), int(error or 0)

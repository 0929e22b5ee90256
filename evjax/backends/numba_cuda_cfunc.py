"""A compiled XLA FFI handler that launches CUDA kernels with no Python per call.

Everything a launch needs is known once a call is traced, except the buffers'
device addresses and XLA's stream: the ``CUfunction``, grid, block, dynamic
shared memory and the kernel's parameters in Numba's CUDA array ABI (per
array: meminfo, parent, nitems, itemsize, data, shape..., strides...; every
field 8 bytes and passed as its own parameter).  That is written once per
signature into a *plan*, an int64 array whose address travels to the handler
as an FFI attribute of the call.

One generic ``@numba.cfunc``, compiled once per process, is the handler of
every kernel.  Per call it

1. answers XLA's metadata query (API version, no traits);
2. reads the plan's address from the call's only attribute;
3. asks XLA for the stream (``XLA_FFI_Stream_Get``);
4. copies the plan's parameters to its own stack, fills in the data pointers
   read from the call frame, and builds the parameter pointer array;
5. makes the kernel's CUDA context current if XLA's thread has another one,
   and calls the driver's ``cuLaunchKernel`` through its address.

Nothing here synchronises.  A failed launch becomes an XLA error carrying the
driver's error name (that path enters Python to format the message).

Nothing here needs a GPU to be imported or compiled: the driver's functions
are addresses in the plan, so the tests run the handler on CPU with fakes.
"""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .. import _compat
from . import ffi_abi

_I64 = ir.IntType(64)
_I32 = ir.IntType(32)
_PTR = ir.IntType(8).as_pointer()


# ---------------------------------------------------------------------------
# Intrinsics over int64 addresses
# ---------------------------------------------------------------------------
@intrinsic
def peek_i64(typingctx, address):
    """``*(int64*)address``."""

    def codegen(context, builder, signature, args):
        return builder.load(builder.inttoptr(args[0], _I64.as_pointer()))

    return types.int64(types.int64), codegen


@intrinsic
def peek_i32(typingctx, address):
    """``*(int32*)address``."""

    def codegen(context, builder, signature, args):
        return builder.load(builder.inttoptr(args[0], _I32.as_pointer()))

    return types.int32(types.int64), codegen


@intrinsic
def poke_i64(typingctx, address, value):
    """``*(int64*)address = value``."""

    def codegen(context, builder, signature, args):
        builder.store(args[1], builder.inttoptr(args[0], _I64.as_pointer()))

    return types.void(types.int64, types.int64), codegen


@intrinsic
def poke_i32(typingctx, address, value):
    """``*(int32*)address = value``."""

    def codegen(context, builder, signature, args):
        builder.store(args[1], builder.inttoptr(args[0], _I32.as_pointer()))

    return types.void(types.int64, types.int32), codegen


@intrinsic(prefer_literal=True)
def stack_i64(typingctx, count):
    """Address of ``count`` int64 slots on the calling function's stack."""
    if not isinstance(count, types.IntegerLiteral):
        return None
    n = int(count.literal_value)

    def codegen(context, builder, signature, args):
        slots = cgutils.alloca_once(builder, _I64, size=n)
        return builder.ptrtoint(slots, _I64)

    return types.int64(count), codegen


@intrinsic
def as_int(typingctx, pointer):
    """A ``void*`` as an int64."""

    def codegen(context, builder, signature, args):
        return builder.ptrtoint(args[0], _I64)

    return types.int64(types.voidptr), codegen


@intrinsic
def as_voidptr(typingctx, address):
    """An int64 as a ``void*``."""

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], _PTR)

    return types.voidptr(types.int64), codegen


@intrinsic
def call_ptr_ptr(typingctx, function, argument):
    """Call ``void* function(void*)`` (e.g. ``XLA_FFI_Stream_Get``); int64 result."""

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(_PTR, [_PTR])
        callee = builder.inttoptr(args[0], fnty.as_pointer())
        result = builder.call(callee, [builder.inttoptr(args[1], _PTR)])
        return builder.ptrtoint(result, _I64)

    return types.int64(types.int64, types.int64), codegen


@intrinsic
def call_status_ptr(typingctx, function, argument):
    """Call ``int function(void*)`` (``cuCtxGetCurrent``, ``cuCtxPushCurrent`` ...)."""

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(_I32, [_PTR])
        callee = builder.inttoptr(args[0], fnty.as_pointer())
        return builder.call(callee, [builder.inttoptr(args[1], _PTR)])

    return types.int32(types.int64, types.int64), codegen


@intrinsic
def call_launch(typingctx, function, kernel, gx, gy, gz, bx, by, bz, shared, stream, params):
    """Call ``cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, NULL)``."""
    sig = types.int32(*([types.int64] * 11))

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(_I32, [_PTR] + [_I32] * 7 + [_PTR, _PTR, _PTR])
        callee = builder.inttoptr(args[0], fnty.as_pointer())
        dims = [builder.trunc(a, _I32) for a in args[2:9]]
        call_args = [builder.inttoptr(args[1], _PTR)] + dims + [
            builder.inttoptr(args[9], _PTR),
            builder.inttoptr(args[10], _PTR),
            ir.Constant(_PTR, None),
        ]
        return builder.call(callee, call_args)

    return sig, codegen


# ---------------------------------------------------------------------------
# The launch plan and the one generic handler
# ---------------------------------------------------------------------------
# Plan words (int64), then ``values`` and 3 words per data slot.
P_LAUNCH, P_FUNCTION, P_CONTEXT, P_CTX_GET, P_CTX_PUSH, P_CTX_POP = range(6)
P_GRID, P_BLOCK, P_SHARED, P_N_VALUES, P_N_SLOTS, P_KEY = 6, 9, 12, 13, 14, 15
PLAN_HEADER = 16
MAX_PARAMS = 512  # kernel parameters (8 bytes each) the handler packs on its stack
PLAN_ATTRIBUTE = "evjax_plan"  # the FFI attribute carrying the plan's address
SCALAR_VALUE = 8  # offset of ``void* value`` in XLA_FFI_Scalar {int32 dtype; void* value}


@dataclass(frozen=True)
class LaunchPlan:
    """Everything one launch needs except the buffers' addresses and the stream.

    Attributes:
        values: the kernel parameters, 8 bytes each, with 0 in data slots.
        data_slots: ``(slot, is_result, buffer_index)`` per array parameter:
            where the buffer's device address goes.
        grid: ``(gx, gy, gz)``; a zero means "launch nothing".
        block: ``(bx, by, bz)``.
        shared_mem: dynamic shared memory in bytes.
        function: the ``CUfunction`` (or ``CUkernel``) address.
        context: the CUDA context to make current (0: leave as it is).
        launch: address of ``cuLaunchKernel``.
        ctx_get_current, ctx_push, ctx_pop: addresses of the driver's context
            functions (used when ``context`` is not 0).
    """

    values: tuple[int, ...]
    data_slots: tuple[tuple[int, bool, int], ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    function: int
    context: int
    launch: int
    ctx_get_current: int = 0
    ctx_push: int = 0
    ctx_pop: int = 0

    def words(self, key: int) -> np.ndarray:
        """The plan as the int64 array the handler reads."""
        if len(self.values) > MAX_PARAMS:
            raise ValueError(f"{len(self.values)} kernel parameters; the compiled launch packs at most {MAX_PARAMS}")
        header = [0] * PLAN_HEADER
        header[P_LAUNCH], header[P_FUNCTION], header[P_CONTEXT] = self.launch, self.function, self.context
        header[P_CTX_GET], header[P_CTX_PUSH], header[P_CTX_POP] = self.ctx_get_current, self.ctx_push, self.ctx_pop
        header[P_GRID:P_GRID + 3] = self.grid
        header[P_BLOCK:P_BLOCK + 3] = self.block
        header[P_SHARED], header[P_N_VALUES], header[P_N_SLOTS] = self.shared_mem, len(self.values), len(self.data_slots)
        header[P_KEY] = key
        slots = [int(x) for slot in self.data_slots for x in slot]
        return np.array(header + [int(v) for v in self.values] + slots, dtype=np.int64)


def _source() -> str:
    major, minor = _compat.ffi_api_header_version()
    f = ffi_abi
    return f"""
import numba
from numba import types
from evjax.backends.numba_cuda_cfunc import (peek_i64, peek_i32, poke_i64, poke_i32, stack_i64,
    as_int, as_voidptr, call_ptr_ptr, call_status_ptr, call_launch, report_launch_error, report_missing_plan)

@numba.cfunc(types.voidptr(types.voidptr), nogil=True)
def handler(frame_ptr):
    frame = as_int(frame_ptr)
    ext = peek_i64(frame + {f.FRAME_EXTENSION_START})
    if ext != 0 and peek_i32(ext + {f.EXT_TYPE}) == {f.EXT_TYPE_METADATA}:
        metadata = peek_i64(ext + {f.EXT_METADATA_PTR})
        api = peek_i64(frame + {f.FRAME_API})
        major = numba.int32({major})
        minor = numba.int32({minor})
        if api != 0:
            major = peek_i32(api + {f.API_VERSION_MAJOR})
            minor = peek_i32(api + {f.API_VERSION_MINOR})
        poke_i32(metadata + {f.METADATA_API_MAJOR}, major)
        poke_i32(metadata + {f.METADATA_API_MINOR}, minor)
        poke_i32(metadata + {f.METADATA_TRAITS}, numba.int32(0))
        return as_voidptr(0)
    if peek_i32(frame + {f.FRAME_STAGE}) != {f.STAGE_EXECUTE}:
        return as_voidptr(0)
    if peek_i64(frame + {f.FRAME_ATTRS_SIZE}) != 1:
        return as_voidptr(report_missing_plan(frame))
    plan = peek_i64(peek_i64(peek_i64(peek_i64(frame + {f.FRAME_ATTRS})) + {SCALAR_VALUE}))
    gx = peek_i64(plan + {8 * P_GRID})
    gy = peek_i64(plan + {8 * (P_GRID + 1)})
    gz = peek_i64(plan + {8 * (P_GRID + 2)})
    if gx == 0 or gy == 0 or gz == 0:  # an empty launch: nothing to do
        return as_voidptr(0)
    # XLA_FFI_Stream_Get_Args {{struct_size, extension_start, ctx, stream}}
    stream_args = stack_i64(4)
    poke_i64(stream_args, {f.STREAM_GET_ARGS_SIZE})
    poke_i64(stream_args + 8, 0)
    poke_i64(stream_args + 16, peek_i64(frame + {f.FRAME_CTX}))
    poke_i64(stream_args + 24, 0)
    api = peek_i64(frame + {f.FRAME_API})
    error = call_ptr_ptr(peek_i64(api + {f.API_STREAM_GET}), stream_args)
    if error != 0:
        return as_voidptr(error)
    stream = peek_i64(stream_args + 24)
    args = peek_i64(frame + {f.FRAME_ARGS})
    rets = peek_i64(frame + {f.FRAME_RETS})
    n_values = peek_i64(plan + {8 * P_N_VALUES})
    n_slots = peek_i64(plan + {8 * P_N_SLOTS})
    values = stack_i64({MAX_PARAMS})
    params = stack_i64({MAX_PARAMS})
    for k in range(n_values):
        poke_i64(values + 8 * k, peek_i64(plan + {8 * PLAN_HEADER} + 8 * k))
        poke_i64(params + 8 * k, values + 8 * k)
    slots = plan + {8 * PLAN_HEADER} + 8 * n_values
    for j in range(n_slots):
        slot = peek_i64(slots + 24 * j)
        table = rets if peek_i64(slots + 24 * j + 8) != 0 else args
        buffer = peek_i64(table + 8 * peek_i64(slots + 24 * j + 16))
        poke_i64(values + 8 * slot, peek_i64(buffer + {f.BUFFER_DATA}))
    key = peek_i64(plan + {8 * P_KEY})
    context = peek_i64(plan + {8 * P_CONTEXT})
    current = stack_i64(1)
    pushed = False
    if context != 0:
        poke_i64(current, 0)
        call_status_ptr(peek_i64(plan + {8 * P_CTX_GET}), current)
        if peek_i64(current) != context:
            status = call_status_ptr(peek_i64(plan + {8 * P_CTX_PUSH}), context)
            if status != 0:
                return as_voidptr(report_launch_error(frame, key, status))
            pushed = True
    status = call_launch(peek_i64(plan + {8 * P_LAUNCH}), peek_i64(plan + {8 * P_FUNCTION}), gx, gy, gz,
                         peek_i64(plan + {8 * P_BLOCK}), peek_i64(plan + {8 * (P_BLOCK + 1)}),
                         peek_i64(plan + {8 * (P_BLOCK + 2)}), peek_i64(plan + {8 * P_SHARED}), stream, params)
    if pushed:
        call_status_ptr(peek_i64(plan + {8 * P_CTX_POP}), current)
    if status != 0:
        return as_voidptr(report_launch_error(frame, key, status))
    return as_voidptr(0)
"""


_lock = threading.Lock()
_keys = itertools.count(1)
_describers: dict[int, Callable[[int], str]] = {}
_handler_namespace: dict | None = None


def handler_address() -> int:
    """The address of the generic launch handler (compiled on first use, once per process)."""
    global _handler_namespace
    with _lock:
        if _handler_namespace is None:
            namespace: dict = {"__name__": "_evjax_cuda_launch"}
            exec(compile(_source(), "<evjax cuda launch handler>", "exec"), namespace)
            _handler_namespace = namespace
        return int(_handler_namespace["handler"].address)


@dataclass
class CompiledLaunch:
    """A launch plan for the generic handler; keep it alive as long as XLA may call it.

    Attributes:
        address: the handler's address (the same for every plan).
        key: identifies the plan's error message.
        words: the plan (int64 array) the handler reads.
        attributes: the FFI attributes to pass with each call (the plan's address).
    """

    address: int
    key: int
    words: np.ndarray
    attributes: dict


def build(plan: LaunchPlan, describe: Callable[[int], str]) -> CompiledLaunch:
    """Prepare ``plan`` for the generic handler.

    Args:
        plan: the launch.
        describe: ``describe(status)`` formats the message of a failed launch
            (``status`` is the driver's ``CUresult``).
    """
    with _lock:
        key = next(_keys)
        _describers[key] = describe
    words = plan.words(key)
    return CompiledLaunch(handler_address(), key, words, {PLAN_ATTRIBUTE: np.int64(words.ctypes.data)})


# ---------------------------------------------------------------------------
# Error path (Python; runs only after a failed launch)
# ---------------------------------------------------------------------------
def _report_launch_error_py(frame: int, key: int, status: int) -> int:
    try:
        describe = _describers.get(key)
        message = describe(status) if describe else f"evjax: CUDA launch failed (CUresult {status})"
    except Exception as exc:  # noqa: BLE001 - reported to XLA
        message = f"evjax: CUDA launch failed (CUresult {status}; {exc!r} while describing it)"
    return ffi_abi.make_error(frame, message, ffi_abi.ERRC_INTERNAL)


def _report_missing_plan_py(frame: int) -> int:
    message = (f"evjax: the CUDA launch handler was called without its single '{PLAN_ATTRIBUTE}' attribute; "
               f"call it through evjax.numba_cuda_kernel")
    return ffi_abi.make_error(frame, message, ffi_abi.ERRC_INVALID_ARGUMENT)


def _build_reporters():
    import numba

    @numba.njit(cache=False)
    def report_launch_error(frame, key, status):
        with numba.objmode(error="int64"):
            error = _report_launch_error_py(frame, key, status)
        return error

    @numba.njit(cache=False)
    def report_missing_plan(frame):
        with numba.objmode(error="int64"):
            error = _report_missing_plan_py(frame)
        return error

    return report_launch_error, report_missing_plan


report_launch_error, report_missing_plan = _build_reporters()


def array_params(shape: Sequence[int], itemsize: int) -> list[int]:
    """Numba's CUDA ABI for one C-contiguous array, with 0 for the data pointer.

    Per array: meminfo, parent, nitems, itemsize, data, shape..., strides...
    (see :data:`DATA_FIELD` for the data pointer's position).
    """
    shape = [int(d) for d in shape]
    strides = [0] * len(shape)
    step = int(itemsize)
    for axis in range(len(shape) - 1, -1, -1):  # C order, as Numba's from_cuda_array_interface
        strides[axis] = step
        step *= shape[axis]
    nitems = 1
    for d in shape:
        nitems *= d
    return [0, 0, nitems, int(itemsize), 0, *shape, *strides]


DATA_FIELD = 4

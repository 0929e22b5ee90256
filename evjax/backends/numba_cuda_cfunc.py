"""A compiled XLA FFI handler that launches one CUDA kernel with no Python per call.

For a fixed signature (buffer shapes and dtypes, grid, block, dynamic shared
memory) everything a launch needs is known before the first call, except the
buffers' device addresses and XLA's stream.  So the handler is a
``@numba.cfunc`` generated per signature that

1. answers XLA's metadata query (API version, no traits);
2. asks XLA for the stream (``XLA_FFI_Stream_Get``);
3. builds, on its own stack, the kernel parameters in Numba's CUDA array ABI
   (per array: meminfo, parent, nitems, itemsize, data, shape..., strides...;
   every field 8 bytes and passed as its own parameter), filling in the data
   pointers read from the call frame;
4. calls the driver's ``cuLaunchKernel`` through its address, with the
   ``CUfunction`` of the Numba-compiled kernel, making the kernel's CUDA
   context current first if XLA's thread has another one.

Nothing here synchronises.  A failed launch becomes an XLA error carrying the
driver's error name (that path enters Python to format the message).

The module needs no GPU to be imported or compiled: every address (driver
functions, ``CUfunction``, context) is a number baked into the generated
source, so the tests build handlers with fake addresses on CPU.
"""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

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
# Code generation
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class LaunchPlan:
    """Everything baked into one compiled handler.

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
            functions (0 when ``context`` is 0).
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


def _source(plan: LaunchPlan, key: int) -> str:
    major, minor = _compat.ffi_api_header_version()
    n = max(len(plan.values), 1)
    lines = [
        "# Generated by evjax.backends.numba_cuda_cfunc: a CUDA launch as an XLA FFI handler.",
        "import numba",
        "from numba import types",
        "from evjax.backends.numba_cuda_cfunc import (peek_i64, peek_i32, poke_i64, poke_i32, stack_i64,",
        "    as_int, as_voidptr, call_ptr_ptr, call_status_ptr, call_launch)",
        "from evjax.backends.numba_cuda_cfunc import report_launch_error",
        "",
        "@numba.cfunc(types.voidptr(types.voidptr), nogil=True)",
        "def handler(frame_ptr):",
        "    frame = as_int(frame_ptr)",
        f"    ext = peek_i64(frame + {ffi_abi.FRAME_EXTENSION_START})",
        f"    if ext != 0 and peek_i32(ext + {ffi_abi.EXT_TYPE}) == {ffi_abi.EXT_TYPE_METADATA}:",
        f"        metadata = peek_i64(ext + {ffi_abi.EXT_METADATA_PTR})",
        f"        api = peek_i64(frame + {ffi_abi.FRAME_API})",
        f"        major = numba.int32({major})",
        f"        minor = numba.int32({minor})",
        "        if api != 0:",
        f"            major = peek_i32(api + {ffi_abi.API_VERSION_MAJOR})",
        f"            minor = peek_i32(api + {ffi_abi.API_VERSION_MINOR})",
        f"        poke_i32(metadata + {ffi_abi.METADATA_API_MAJOR}, major)",
        f"        poke_i32(metadata + {ffi_abi.METADATA_API_MINOR}, minor)",
        f"        poke_i32(metadata + {ffi_abi.METADATA_TRAITS}, numba.int32(0))",
        "        return as_voidptr(0)",
        f"    if peek_i32(frame + {ffi_abi.FRAME_STAGE}) != {ffi_abi.STAGE_EXECUTE}:",
        "        return as_voidptr(0)",
    ]
    if 0 in plan.grid:  # an empty launch: nothing to do (outputs stay as XLA made them)
        lines += ["    return as_voidptr(0)", ""]
        return "\n".join(lines)
    lines += [
        # XLA_FFI_Stream_Get_Args {struct_size, extension_start, ctx, stream}
        "    stream_args = stack_i64(4)",
        f"    poke_i64(stream_args, {ffi_abi.STREAM_GET_ARGS_SIZE})",
        "    poke_i64(stream_args + 8, 0)",
        f"    poke_i64(stream_args + 16, peek_i64(frame + {ffi_abi.FRAME_CTX}))",
        "    poke_i64(stream_args + 24, 0)",
        f"    api = peek_i64(frame + {ffi_abi.FRAME_API})",
        f"    error = call_ptr_ptr(peek_i64(api + {ffi_abi.API_STREAM_GET}), stream_args)",
        "    if error != 0:",
        "        return as_voidptr(error)",
        "    stream = peek_i64(stream_args + 24)",
        f"    args = peek_i64(frame + {ffi_abi.FRAME_ARGS})",
        f"    rets = peek_i64(frame + {ffi_abi.FRAME_RETS})",
        f"    values = stack_i64({n})",
        f"    params = stack_i64({n})",
    ]
    data = {slot: (is_ret, index) for slot, is_ret, index in plan.data_slots}
    for slot, value in enumerate(plan.values):
        if slot in data:
            is_ret, index = data[slot]
            table = "rets" if is_ret else "args"
            value_expr = f"peek_i64(peek_i64({table} + {8 * index}) + {ffi_abi.BUFFER_DATA})"
        else:
            value_expr = str(int(value))
        lines.append(f"    poke_i64(values + {8 * slot}, {value_expr})")
    lines += [
        f"    for k in range({len(plan.values)}):",
        "        poke_i64(params + 8 * k, values + 8 * k)",
    ]
    if plan.context:
        lines += [
            "    current = stack_i64(1)",
            "    poke_i64(current, 0)",
            f"    call_status_ptr({plan.ctx_get_current}, current)",
            "    pushed = False",
            f"    if peek_i64(current) != {plan.context}:",
            f"        status = call_status_ptr({plan.ctx_push}, {plan.context})",
            "        if status != 0:",
            f"            return as_voidptr(report_launch_error(frame, {key}, status))",
            "        pushed = True",
        ]
    gx, gy, gz = plan.grid
    bx, by, bz = plan.block
    lines.append(
        f"    status = call_launch({plan.launch}, {plan.function}, {gx}, {gy}, {gz}, {bx}, {by}, {bz}, "
        f"{plan.shared_mem}, stream, params)"
    )
    if plan.context:
        lines += ["    if pushed:", f"        call_status_ptr({plan.ctx_pop}, current)"]
    lines += [
        "    if status != 0:",
        f"        return as_voidptr(report_launch_error(frame, {key}, status))",
        "    return as_voidptr(0)",
        "",
    ]
    return "\n".join(lines)


_lock = threading.Lock()
_keys = itertools.count(1)
_describers: dict[int, Callable[[int], str]] = {}


@dataclass
class CompiledLaunch:
    """A compiled handler; keep this object alive as long as XLA may call it."""

    address: int
    key: int
    source: str
    namespace: dict


def build(plan: LaunchPlan, describe: Callable[[int], str]) -> CompiledLaunch:
    """Compile a handler for ``plan``.

    Args:
        plan: the launch to bake in.
        describe: ``describe(status)`` formats the message of a failed launch
            (``status`` is the driver's ``CUresult``).
    """
    with _lock:
        key = next(_keys)
        _describers[key] = describe
    source = _source(plan, key)
    namespace: dict = {"__name__": f"_evjax_cuda_launch_{key}"}
    exec(compile(source, f"<evjax cuda launch {key}>", "exec"), namespace)
    address = namespace["handler"].address
    return CompiledLaunch(address, key, source, namespace)


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


def _build_reporter():
    import numba

    @numba.njit(cache=False)
    def report_launch_error(frame, key, status):
        with numba.objmode(error="int64"):
            error = _report_launch_error_py(frame, key, status)
        return error

    return report_launch_error


report_launch_error = _build_reporter()


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

"""The two generic XLA FFI handlers of the Warp bridge, as ``@numba.cfunc``.

Imported lazily by :mod:`evjax.backends.warp` (compiling them takes a moment
the first time; Numba caches them on disk afterwards).  Both handlers read the
int64 launch attribute written by :func:`evjax.backends.warp.launch_attr`,
build Warp's launch bounds and ``array_t`` structs on their stack from the FFI
buffers, and launch: the CPU one calls the kernel's ``*_cpu_forward`` entry
point, the CUDA one Warp's native ``wp_cuda_launch_kernel`` on XLA's stream.
No Python runs per call.
"""
from __future__ import annotations

import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import ffi_abi as abi
from .numba_abi import load_i32, load_i64, store_i32, to_voidptr, voidptr_to_int
from .warp import (
    ARRAY_T_SIZE,
    ATTR_VERSION,
    L_BLOCK,
    L_CLUSTER,
    L_DEVICES,
    L_GRID_STRIDE,
    L_KDIM,
    L_LAUNCH_FN,
    L_MASK,
    L_MULT,
    L_NDEV,
    L_NPARAMS,
    L_SHAPE,
    L_SIZE,
    L_SMEM,
    L_VERSION,
    MAX_PARAMS,
    SCRATCH_BYTES,
)

_i8p = cgutils.voidptr_t
_i64 = ir.IntType(64)
_i32 = ir.IntType(32)


# ---------------------------------------------------------------------------
# Intrinsics
# ---------------------------------------------------------------------------
def _address(builder, base, offset):
    return builder.gep(builder.bitcast(base, cgutils.int8_t.as_pointer()), [offset])


@intrinsic
def store_i64(typingctx, base, offset, value):
    """``*(int64*)(base + offset) = value``."""

    def codegen(context, builder, signature, args):
        builder.store(args[2], builder.bitcast(_address(builder, args[0], args[1]), _i64.as_pointer()))

    return types.void(types.voidptr, types.int64, types.int64), codegen


@intrinsic
def store_u16(typingctx, base, offset, value):
    """``*(uint16*)(base + offset) = (uint16)value``."""

    def codegen(context, builder, signature, args):
        value16 = builder.trunc(args[2], ir.IntType(16))
        builder.store(value16, builder.bitcast(_address(builder, args[0], args[1]), ir.IntType(16).as_pointer()))

    return types.void(types.voidptr, types.int64, types.int64), codegen


@intrinsic
def scratch(typingctx):
    """``SCRATCH_BYTES`` of 16-byte aligned stack memory (entry-block alloca)."""

    def codegen(context, builder, signature, args):
        with builder.goto_entry_block():
            slot = builder.alloca(ir.ArrayType(cgutils.int8_t, SCRATCH_BYTES), name="warp_scratch")
            slot.align = 16
        return builder.bitcast(slot, _i8p)

    return types.voidptr(), codegen


@intrinsic
def cstring(typingctx, text):
    """A constant NUL-terminated C string (``text`` must be a literal)."""
    if not isinstance(text, types.StringLiteral):
        return None
    value = text.literal_value

    def codegen(context, builder, signature, args):
        return context.insert_const_string(builder.module, value)

    return types.voidptr(text), codegen


@intrinsic
def call_void_pp(typingctx, function, a, b):
    """Call ``void (*function)(void*, void*)``."""

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.VoidType(), [_i8p, _i8p])
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()), [args[1], args[2]])

    return types.void(types.int64, types.voidptr, types.voidptr), codegen


@intrinsic
def call_p_p(typingctx, function, a):
    """Call ``void* (*function)(void*)`` and return the result as an int64."""

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(_i8p, [_i8p])
        result = builder.call(builder.inttoptr(args[0], fnty.as_pointer()), [args[1]])
        return builder.ptrtoint(result, _i64)

    return types.int64(types.int64, types.voidptr), codegen


@intrinsic
def call_cuda_launch(typingctx, function, context_, kernel, dim, block_dim, grid_stride, cluster, smem, params, stream):
    """Call Warp's ``size_t wp_cuda_launch_kernel(ctx, kernel, dim, max_blocks=0, block_dim,
    grid_stride, cluster_dim, smem, void** params, stream, apic=NULL)``."""

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(_i64, [_i8p, _i8p, _i64, _i32, _i32, _i32, _i32, _i32, _i8p, _i8p, _i8p])
        f = builder.inttoptr(args[0], fnty.as_pointer())
        as_ptr = lambda v: builder.inttoptr(v, _i8p)  # noqa: E731
        as_i32 = lambda v: builder.trunc(v, _i32)  # noqa: E731
        return builder.call(
            f,
            [
                as_ptr(args[1]),
                as_ptr(args[2]),
                args[3],
                _i32(0),
                as_i32(args[4]),
                as_i32(args[5]),
                as_i32(args[6]),
                as_i32(args[7]),
                args[8],
                as_ptr(args[9]),
                _i8p(None),
            ],
        )

    sig = types.int64(
        types.int64, types.int64, types.int64, types.int64, types.int64, types.int64, types.int64,
        types.int64, types.voidptr, types.int64,
    )
    return sig, codegen


# ---------------------------------------------------------------------------
# Shared pieces (compiled code)
# ---------------------------------------------------------------------------
@numba.njit(cache=True, nogil=True)
def _error(frame, message, errc):
    api = to_voidptr(load_i64(frame, abi.FRAME_API))
    args = scratch()
    store_i64(args, 0, abi.ERROR_CREATE_ARGS_SIZE)
    store_i64(args, 8, 0)
    store_i64(args, 16, voidptr_to_int(message))
    store_i32(args, 24, numba.int32(errc))
    return call_p_p(load_i64(api, abi.API_ERROR_CREATE), args)


@numba.njit(cache=True, nogil=True)
def _metadata(frame, traits):
    """Answer XLA's metadata query; 1 if this call was one, else 0."""
    ext = load_i64(frame, abi.FRAME_EXTENSION_START)
    if ext == 0 or load_i32(to_voidptr(ext), abi.EXT_TYPE) != abi.EXT_TYPE_METADATA:
        return 0
    metadata = to_voidptr(load_i64(to_voidptr(ext), abi.EXT_METADATA_PTR))
    api = load_i64(frame, abi.FRAME_API)
    major = numba.int32(0)
    minor = numba.int32(1)
    if api != 0:
        major = load_i32(to_voidptr(api), abi.API_VERSION_MAJOR)
        minor = load_i32(to_voidptr(api), abi.API_VERSION_MINOR)
    store_i32(metadata, abi.METADATA_API_MAJOR, major)
    store_i32(metadata, abi.METADATA_API_MINOR, minor)
    store_i32(metadata, abi.METADATA_TRAITS, numba.int32(traits))
    return 1


@numba.njit(cache=True, nogil=True)
def _itemsize(code):
    if code == 1 or code == 2 or code == 6:
        return 1
    if code == 3 or code == 7 or code == 10 or code == 16:
        return 2
    if code == 4 or code == 8 or code == 11:
        return 4
    if code == 5 or code == 9 or code == 12 or code == 15:
        return 8
    if code == 18:
        return 16
    return 0


@numba.njit(cache=True, nogil=True)
def _launch_table(frame):
    """The int64 launch attribute's data pointer (as int64), or 0 if malformed."""
    if load_i64(frame, abi.FRAME_ATTRS_SIZE) != 1:
        return 0
    attrs = to_voidptr(load_i64(frame, abi.FRAME_ATTRS))
    array = to_voidptr(load_i64(attrs, 0))  # XLA_FFI_Array {dtype, size, data}
    if load_i32(array, 0) != 5:  # S64
        return 0
    size = load_i64(array, 8)
    data = load_i64(array, 16)
    if size < L_DEVICES or load_i64(to_voidptr(data), 8 * L_VERSION) != ATTR_VERSION:
        return 0
    if size < L_DEVICES + 2 * load_i64(to_voidptr(data), 8 * L_NDEV):
        return 0
    return data


@numba.njit(cache=True, nogil=True)
def _fill(frame, table, space):
    """Write launch bounds at ``space`` and the array_t structs after it.

    Returns the offset of the first array_t (8-aligned) or -1 on bad input.
    """
    n_params = load_i64(table, 8 * L_NPARAMS)
    mask = load_i64(table, 8 * L_MASK)
    kdim = load_i64(table, 8 * L_KDIM)
    if n_params < 0 or n_params > MAX_PARAMS or kdim < 1 or kdim > 4:
        return -1
    for d in range(kdim):
        store_i32(space, 4 * d, numba.int32(load_i64(table, 8 * (L_SHAPE + d))))
    size_at = 8 if kdim <= 2 else 16
    store_i64(space, size_at, load_i64(table, 8 * L_SIZE))
    store_i64(space, size_at + 8, load_i64(table, 8 * L_MULT))
    first = 32
    n_args = load_i64(frame, abi.FRAME_ARGS_SIZE)
    n_rets = load_i64(frame, abi.FRAME_RETS_SIZE)
    args = to_voidptr(load_i64(frame, abi.FRAME_ARGS))
    rets = to_voidptr(load_i64(frame, abi.FRAME_RETS))
    next_arg = 0
    next_ret = 0
    for k in range(n_params):
        if (mask >> k) & 1:
            if next_ret >= n_rets:
                return -1
            buf = to_voidptr(load_i64(rets, 8 * next_ret))
            next_ret += 1
        else:
            if next_arg >= n_args:
                return -1
            buf = to_voidptr(load_i64(args, 8 * next_arg))
            next_arg += 1
        rank = load_i64(buf, abi.BUFFER_RANK)
        itemsize = _itemsize(load_i32(buf, abi.BUFFER_DTYPE))
        if rank < 1 or rank > 4 or itemsize == 0:
            return -1
        dims = to_voidptr(load_i64(buf, abi.BUFFER_DIMS))
        at = first + ARRAY_T_SIZE * k
        store_i64(space, at, load_i64(buf, abi.BUFFER_DATA))
        store_i64(space, at + 8, 0)
        stride = itemsize
        for d in range(3, -1, -1):
            if d < rank:
                extent = load_i64(dims, 8 * d)
                store_i32(space, at + 16 + 4 * d, numba.int32(extent))
                store_i32(space, at + 32 + 4 * d, numba.int32(stride))
                stride *= extent
            else:
                store_i32(space, at + 16 + 4 * d, numba.int32(0))
                store_i32(space, at + 32 + 4 * d, numba.int32(0))
        store_u16(space, at + 48, rank)
        store_u16(space, at + 50, 0)
    return first


# ---------------------------------------------------------------------------
# Handlers
# ---------------------------------------------------------------------------
@numba.cfunc(types.voidptr(types.voidptr), cache=True, nogil=True)
def cpu_handler(frame):
    if _metadata(frame, 0) == 1:
        return to_voidptr(0)
    if load_i32(frame, abi.FRAME_STAGE) != abi.STAGE_EXECUTE:
        return to_voidptr(0)
    data = _launch_table(frame)
    if data == 0:
        return to_voidptr(_error(frame, cstring("evjax warp (cpu): malformed launch attribute"), abi.ERRC_INTERNAL))
    table = to_voidptr(data)
    space = scratch()
    first = _fill(frame, table, space)
    if first < 0:
        return to_voidptr(
            _error(frame, cstring("evjax warp (cpu): buffers do not match the kernel's parameters"), abi.ERRC_INTERNAL)
        )
    function = load_i64(table, 8 * L_DEVICES)
    if load_i64(table, 8 * L_SIZE) > 0 and function != 0:
        call_void_pp(function, space, to_voidptr(voidptr_to_int(space) + first))
    return to_voidptr(0)


@numba.cfunc(types.voidptr(types.voidptr), cache=True, nogil=True)
def cuda_handler(frame):
    # A kernel launch on XLA's stream: no sync, no allocation -> CUDA-graph safe.
    if _metadata(frame, abi.TRAIT_COMMAND_BUFFER_COMPATIBLE) == 1:
        return to_voidptr(0)
    if load_i32(frame, abi.FRAME_STAGE) != abi.STAGE_EXECUTE:
        return to_voidptr(0)
    data = _launch_table(frame)
    if data == 0:
        return to_voidptr(_error(frame, cstring("evjax warp (cuda): malformed launch attribute"), abi.ERRC_INTERNAL))
    table = to_voidptr(data)
    api = to_voidptr(load_i64(frame, abi.FRAME_API))
    ctx = load_i64(frame, abi.FRAME_CTX)
    space = scratch()
    # stream: XLA_FFI_Stream_Get_Args {size, ext, ctx, stream(out)} in the tail of the scratch
    query = to_voidptr(voidptr_to_int(space) + SCRATCH_BYTES - 64)
    store_i64(query, 0, abi.STREAM_GET_ARGS_SIZE)
    store_i64(query, 8, 0)
    store_i64(query, 16, ctx)
    store_i64(query, 24, 0)
    err = call_p_p(load_i64(api, abi.API_STREAM_GET), query)
    if err != 0:
        return to_voidptr(err)
    stream = load_i64(query, 24)
    # device ordinal: XLA_FFI_DeviceOrdinal_Get_Args {size, ext, ctx, int32 ordinal(out)}
    ordinal = 0
    if load_i64(api, 0) >= 192 and load_i64(api, 184) != 0:
        store_i64(query, 0, 28)
        store_i64(query, 8, 0)
        store_i64(query, 16, ctx)
        store_i64(query, 24, 0)
        err = call_p_p(load_i64(api, 184), query)
        if err != 0:
            return to_voidptr(err)
        ordinal = load_i32(query, 24)
    if ordinal < 0 or ordinal >= load_i64(table, 8 * L_NDEV):
        return to_voidptr(
            _error(frame, cstring("evjax warp (cuda): the kernel is not loaded on this device"), abi.ERRC_INTERNAL)
        )
    function = load_i64(table, 8 * (L_DEVICES + 2 * ordinal))
    context = load_i64(table, 8 * (L_DEVICES + 2 * ordinal + 1))
    if function == 0:
        return to_voidptr(
            _error(frame, cstring("evjax warp (cuda): the kernel is not loaded on this device"), abi.ERRC_INTERNAL)
        )
    first = _fill(frame, table, space)
    if first < 0:
        return to_voidptr(
            _error(frame, cstring("evjax warp (cuda): buffers do not match the kernel's parameters"), abi.ERRC_INTERNAL)
        )
    n_params = load_i64(table, 8 * L_NPARAMS)
    # void* params[1 + n]: &bounds, &array_t[0], ...
    params_at = first + ARRAY_T_SIZE * n_params
    base = voidptr_to_int(space)
    store_i64(space, params_at, base)
    for k in range(n_params):
        store_i64(space, params_at + 8 * (k + 1), base + first + ARRAY_T_SIZE * k)
    size = load_i64(table, 8 * L_SIZE)
    if size == 0:
        return to_voidptr(0)
    result = call_cuda_launch(
        load_i64(table, 8 * L_LAUNCH_FN),
        context,
        function,
        size,
        load_i64(table, 8 * L_BLOCK),
        load_i64(table, 8 * L_GRID_STRIDE),
        load_i64(table, 8 * L_CLUSTER),
        load_i64(table, 8 * L_SMEM),
        to_voidptr(base + params_at),
        stream,
    )
    if result != 0:
        return to_voidptr(
            _error(frame, cstring("evjax warp (cuda): cuLaunchKernel failed for a Warp kernel"), abi.ERRC_INTERNAL)
        )
    return to_voidptr(0)

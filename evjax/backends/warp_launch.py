"""The compiled part of the Warp bridge: launching a Warp kernel from an FFI handler.

Both handlers (see :func:`evjax.backends.warp.cpu_target` and ``cuda_target``)
are the shared prologue of :mod:`evjax.backends.ffi_core` followed by
``cpu_launch`` or ``cuda_launch`` below.  These read the int64 launch
attribute (its layout is defined here, written by
:func:`evjax.backends.warp.launch_attr`), build Warp's launch bounds and one
``array_t`` per kernel parameter on the stack from the FFI buffers (zero
copy), and launch: on CPU by calling the kernel's ``*_cpu_forward`` entry
point, on CUDA through Warp's native ``wp_cuda_launch_kernel`` on XLA's
stream.  No Python runs per call.
"""
from __future__ import annotations

import numba
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from . import ffi_abi as abi
from .ffi_core import array_attribute, create_error, query_device_ordinal, query_stream
from .intrinsics import (
    I32, I64, PTR, call_void_ptr_ptr, cstring, load_i32, load_i64, stack_bytes, store_i32, store_i64, store_u16,
)

MAX_PARAMS = 48  # kernel parameters per launch (routing mask is one int64)
ARRAY_T_SIZE = 56  # warp.types.array_t: data, grad, shape[4], strides[4], ndim, flags
# Layout of the int64 launch attribute.
L_VERSION, L_NPARAMS, L_MASK, L_KDIM, L_SIZE, L_MULT = 0, 1, 2, 3, 4, 5
L_SHAPE = 6  # 4 entries
L_BLOCK, L_GRID_STRIDE, L_CLUSTER, L_SMEM, L_LAUNCH_FN, L_NDEV = 10, 11, 12, 13, 14, 15
L_DEVICES = 16  # then (function, context) per device ordinal
ATTR_VERSION = 1
BOUNDS_BYTES = 32  # launch_bounds_t: shape[4] (int32), size, mult (int64)
SCRATCH_BYTES = BOUNDS_BYTES + ARRAY_T_SIZE * MAX_PARAMS + 8 * (MAX_PARAMS + 1)


@intrinsic
def call_cuda_launch(typingctx, function, context_, kernel, dim, block_dim, grid_stride, cluster, smem, params, stream):
    """Call Warp's ``size_t wp_cuda_launch_kernel(ctx, kernel, dim, max_blocks=0, block_dim,
    grid_stride, cluster_dim, smem, void** params, stream, apic=NULL)``."""

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(I64, [PTR, PTR, I64, I32, I32, I32, I32, I32, PTR, PTR, PTR])
        f = builder.inttoptr(args[0], fnty.as_pointer())
        as_ptr = lambda v: builder.inttoptr(v, PTR)  # noqa: E731
        as_i32 = lambda v: builder.trunc(v, I32)  # noqa: E731
        return builder.call(f, [
            as_ptr(args[1]), as_ptr(args[2]), args[3], I32(0), as_i32(args[4]), as_i32(args[5]),
            as_i32(args[6]), as_i32(args[7]), as_ptr(args[8]), as_ptr(args[9]), PTR(None),
        ])

    return types.int64(*([types.int64] * 10)), codegen


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
def launch_table(frame):
    """The launch attribute's data address, or 0 if it is malformed."""
    size, data = array_attribute(frame)
    if data == 0 or size < L_DEVICES or load_i64(data + 8 * L_VERSION) != ATTR_VERSION:
        return 0
    if size < L_DEVICES + 2 * load_i64(data + 8 * L_NDEV):
        return 0
    return data


@numba.njit(cache=True, nogil=True)
def fill(frame, table, space):
    """Write the launch bounds at ``space`` and the ``array_t`` structs after them.

    Returns the offset of the first ``array_t``, or -1 when the buffers do not
    match the parameters the table describes.
    """
    n_params = load_i64(table + 8 * L_NPARAMS)
    mask = load_i64(table + 8 * L_MASK)
    kdim = load_i64(table + 8 * L_KDIM)
    if n_params < 0 or n_params > MAX_PARAMS or kdim < 1 or kdim > 4:
        return -1
    for d in range(kdim):
        store_i32(space + 4 * d, numba.int32(load_i64(table + 8 * (L_SHAPE + d))))
    size_at = 8 if kdim <= 2 else 16
    store_i64(space + size_at, load_i64(table + 8 * L_SIZE))
    store_i64(space + size_at + 8, load_i64(table + 8 * L_MULT))
    n_args = load_i64(frame + abi.FRAME_ARGS_SIZE)
    n_rets = load_i64(frame + abi.FRAME_RETS_SIZE)
    args = load_i64(frame + abi.FRAME_ARGS)
    rets = load_i64(frame + abi.FRAME_RETS)
    next_arg = 0
    next_ret = 0
    for k in range(n_params):
        if (mask >> k) & 1:
            if next_ret >= n_rets:
                return -1
            buf = load_i64(rets + 8 * next_ret)
            next_ret += 1
        else:
            if next_arg >= n_args:
                return -1
            buf = load_i64(args + 8 * next_arg)
            next_arg += 1
        rank = load_i64(buf + abi.BUFFER_RANK)
        itemsize = _itemsize(load_i32(buf + abi.BUFFER_DTYPE))
        if rank < 1 or rank > 4 or itemsize == 0:
            return -1
        dims = load_i64(buf + abi.BUFFER_DIMS)
        at = space + BOUNDS_BYTES + ARRAY_T_SIZE * k
        store_i64(at, load_i64(buf + abi.BUFFER_DATA))
        store_i64(at + 8, 0)
        stride = itemsize
        for d in range(3, -1, -1):
            if d < rank:
                extent = load_i64(dims + 8 * d)
                store_i32(at + 16 + 4 * d, numba.int32(extent))
                store_i32(at + 32 + 4 * d, numba.int32(stride))
                stride *= extent
            else:
                store_i32(at + 16 + 4 * d, numba.int32(0))
                store_i32(at + 32 + 4 * d, numba.int32(0))
        store_u16(at + 48, rank)
        store_u16(at + 50, 0)
    return BOUNDS_BYTES


@numba.njit(cache=True, nogil=True)
def cpu_launch(frame):
    """Run the kernel through its CPU forward entry point; an XLA error (int64) or 0."""
    table = launch_table(frame)
    if table == 0:
        return create_error(frame, cstring("evjax warp (cpu): malformed launch attribute"), abi.ERRC_INTERNAL)
    space = stack_bytes(SCRATCH_BYTES)
    first = fill(frame, table, space)
    if first < 0:
        return create_error(frame, cstring("evjax warp (cpu): buffers do not match the kernel's parameters"),
                            abi.ERRC_INTERNAL)
    function = load_i64(table + 8 * L_DEVICES)
    if load_i64(table + 8 * L_SIZE) > 0 and function != 0:
        call_void_ptr_ptr(function, space, space + first)
    return 0


@numba.njit(cache=True, nogil=True)
def cuda_launch(frame):
    """Launch the kernel on XLA's stream through ``wp_cuda_launch_kernel``; an XLA error or 0."""
    table = launch_table(frame)
    if table == 0:
        return create_error(frame, cstring("evjax warp (cuda): malformed launch attribute"), abi.ERRC_INTERNAL)
    error, stream = query_stream(frame)
    if error != 0:
        return error
    error, ordinal = query_device_ordinal(frame)
    if error != 0:
        return error
    if ordinal < 0 or ordinal >= load_i64(table + 8 * L_NDEV) or load_i64(table + 8 * (L_DEVICES + 2 * ordinal)) == 0:
        return create_error(frame, cstring("evjax warp (cuda): the kernel is not loaded on this device"),
                            abi.ERRC_INTERNAL)
    function = load_i64(table + 8 * (L_DEVICES + 2 * ordinal))
    context = load_i64(table + 8 * (L_DEVICES + 2 * ordinal + 1))
    space = stack_bytes(SCRATCH_BYTES)
    first = fill(frame, table, space)
    if first < 0:
        return create_error(frame, cstring("evjax warp (cuda): buffers do not match the kernel's parameters"),
                            abi.ERRC_INTERNAL)
    n_params = load_i64(table + 8 * L_NPARAMS)
    # void* params[1 + n]: &bounds, &array_t[0], ...
    params = space + first + ARRAY_T_SIZE * n_params
    store_i64(params, space)
    for k in range(n_params):
        store_i64(params + 8 * (k + 1), space + first + ARRAY_T_SIZE * k)
    size = load_i64(table + 8 * L_SIZE)
    if size == 0:
        return 0
    result = call_cuda_launch(
        load_i64(table + 8 * L_LAUNCH_FN), context, function, size, load_i64(table + 8 * L_BLOCK),
        load_i64(table + 8 * L_GRID_STRIDE), load_i64(table + 8 * L_CLUSTER), load_i64(table + 8 * L_SMEM),
        params, stream,
    )
    if result != 0:
        return create_error(frame, cstring("evjax warp (cuda): cuLaunchKernel failed for a Warp kernel"),
                            abi.ERRC_INTERNAL)
    return 0


CPU_BODY = "    return as_voidptr(warp_launch.cpu_launch(frame))"
CUDA_BODY = "    return as_voidptr(warp_launch.cuda_launch(frame))"
IMPORTS = "from evjax.backends import warp_launch"

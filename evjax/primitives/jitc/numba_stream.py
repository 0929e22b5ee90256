"""The JITC generation scheme in Numba (inlined into the kernels of :mod:`.numba`).

:mod:`.generation`'s scheme written again on ``uint64`` values masked to 32
bits (Numba widens ``uint32`` products), so the structure is bitwise the
reference's; nothing here uses ``fastmath``, so LLVM contracts nothing.  The
stream is walked in blocks of :data:`BLOCK` synapses (:func:`_next_block`).
Nothing here is called from Python.

The kernels in ``numba.py`` inline this file; their disk cache is fresh only
while every file of this folder is unchanged
(:func:`evjax._kernel_compat.stamp_kernel_caches`), so an edit here rebuilds them.
"""
from __future__ import annotations

import llvmlite.ir as ir
import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

from ..._kernel_compat import COMPILED_CODE_ONLY, stack_array_intrinsic
from .generation import TWO_LN2, cos_table, log2_table

_INLINE = dict(cache=True, nogil=True, inline="always", **COMPILED_CODE_ONLY)

_LOG2 = log2_table().astype(np.uint64)
_COS = cos_table().astype(np.uint64)
_M32 = np.uint64(0xFFFFFFFF)
_U16, _U15, _U8, _U1, _U4 = np.uint64(16), np.uint64(15), np.uint64(8), np.uint64(1), np.uint64(4)
_TWO_LN2 = np.float32(TWO_LN2)
_SCALE24 = np.float32(2.0 ** -24)
_SCALE22 = np.float32(2.0 ** -22)


# ---------------------------------------------------------------------------
# the generation scheme (generation.py), on uint64 masked to 32 bits
# ---------------------------------------------------------------------------
@numba.njit(**_INLINE)
def _mix32(x):
    x ^= x >> _U16
    x = (x * np.uint64(0x7FEB352D)) & _M32
    x ^= x >> _U15
    x = (x * np.uint64(0x846CA68B)) & _M32
    return x ^ (x >> _U16)


@numba.njit(**_INLINE)
def _keys(seed, o):
    s = _mix32(seed)
    ka = _mix32((np.uint64(o) * np.uint64(0x9E3779B9) + s) & _M32)
    kb = _mix32(ka ^ _mix32(seed ^ np.uint64(0x85EBCA6B)))
    return ka, kb


@numba.njit(**_INLINE)
def _draw(ka, kb, c):
    return _mix32((_mix32(c ^ ka) + kb) & _M32)


@intrinsic
def _leading_zeros64(typingctx, x):
    """LLVM's ``ctlz`` of a uint64 (one instruction; a zero input is never passed)."""
    def codegen(context, builder, signature, args):
        return builder.ctlz(args[0], ir.Constant(ir.IntType(1), 1))

    return types.uint64(types.uint64), codegen


@numba.njit(**_INLINE)
def _neg_log2_q24(h):
    """``-log2(h / 2^32)`` in Q24: ``e`` leading zeros, then the table on the normalised mantissa."""
    u = h if h > 0 else _U1
    e = _leading_zeros64(u) - np.uint64(32)
    u = u << e
    idx = (u >> np.uint64(21)) & np.uint64(1023)
    frac = (u >> np.uint64(5)) & np.uint64(0xFFFF)
    lo = _LOG2[idx]
    return ((e + _U1) << np.uint64(24)) - (lo + (((_LOG2[idx + 1] - lo) * frac) >> _U16))


@numba.njit(**_INLINE)
def _gap(ka, kb, k, r, s, cap):
    """The gap before synapse ``k``: ``min((E2 * R) >> S, cap)`` (E2 < 2^29, R < 2^32: no overflow)."""
    g = (_neg_log2_q24(_draw(ka, kb, k * _U4)) * r) >> s
    return np.int64(g if g < cap else cap)


@intrinsic
def _sqrt32(typingctx, x):
    """LLVM's ``sqrt`` of a float32 (correctly rounded; ``np.sqrt`` calls libm's ``sqrtf``, whose errno
    keeps LLVM from vectorising the loop around it)."""
    def codegen(context, builder, signature, args):
        return builder.call(builder.module.declare_intrinsic("llvm.sqrt", [args[0].type]), [args[0]])

    return types.float32(types.float32), codegen


# Float conversions go through int64 (every value is below 2^29, so the result is the same):
# AVX-512 converts signed 64-bit lanes in one instruction.
@numba.njit(**_INLINE)
def _w_scalar(ka, kb, k, p0, p1):
    return p0  # w


@numba.njit(**_INLINE)
def _w_uniform(ka, kb, k, p0, p1):
    u = np.float32(np.int64(_draw(ka, kb, k * _U4 + _U1) >> _U8)) * _SCALE24  # exact
    return p0 + (p1 - p0) * u  # w = low + (high - low) u


@numba.njit(**_INLINE)
def _w_normal(ka, kb, k, p0, p1):
    radius = _sqrt32(_TWO_LN2 * (np.float32(np.int64(_neg_log2_q24(_draw(ka, kb, k * _U4 + _U1)))) * _SCALE24))
    h2 = _draw(ka, kb, k * _U4 + np.uint64(2))
    idx = h2 >> np.uint64(22)
    frac = (h2 >> np.uint64(14)) & np.uint64(255)
    c = (_COS[idx] * (np.uint64(256) - frac) + _COS[idx + 1] * frac) >> _U8
    cosine = np.float32(np.int64(c) - np.int64(1 << 22)) * _SCALE22
    return p0 + p1 * (radius * cosine)  # w = loc + scale z


# ---------------------------------------------------------------------------
# the stream in blocks of BLOCK synapses: every draw of a block is independent
# (counter-based), so the gaps and weights of a block are computed in one
# vectorised loop each (AVX-512: 8 or 16 lanes), then the positions summed.
# Past the end of a stream at most BLOCK - 1 synapses are drawn for nothing.
# ---------------------------------------------------------------------------
BLOCK = 16


# One block-weight function per law, called (not inlined: it is an argument) once per block; its loop
# calls its law by name, so LLVM vectorises it.
@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _wb_scalar(ka, kb, k, p0, p1, w):
    for j in range(BLOCK):
        w[j] = p0


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _wb_uniform(ka, kb, k, p0, p1, w):
    for j in range(BLOCK):
        w[j] = _w_uniform(ka, kb, k + np.uint64(j), p0, p1)


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _wb_normal(ka, kb, k, p0, p1, w):
    for j in range(BLOCK):
        w[j] = _w_normal(ka, kb, k + np.uint64(j), p0, p1)


stack_array = stack_array_intrinsic()


@numba.njit(**_INLINE)
def _scratch(dtype_like):
    """A block's positions and weights, on the stack of the function the row loop is inlined into
    (the kernel, or a parallel loop's body: one pair per thread).  ``np.empty`` cost a first call
    0.1 s: Numba's allocator compiled for int64 and for the weights' dtype."""
    return stack_array(BLOCK, numba.int64), stack_array(BLOCK, dtype_like.dtype)


@numba.njit(**_INLINE)
def _next_block(block_weights, ka, kb, k, pos, r, s, n_inner, p0, p1, at, w):
    """Synapses ``k .. k + BLOCK - 1`` of the stream after position ``pos``: their inner indices
    into ``at`` and weights into ``w``; returns ``(count, last position)``, ``count < BLOCK`` when the
    stream ends inside the block."""
    cap = np.uint64(n_inner)
    for j in range(BLOCK):  # vectorised: independent draws
        at[j] = _gap(ka, kb, k + np.uint64(j), r, s, cap)
    block_weights(ka, kb, k, p0, p1, w)
    count = 0
    for j in range(BLOCK):  # pos_k = pos_{k-1} + 1 + gap_k, until pos_k >= n_inner
        pos += 1 + at[j]
        if pos >= n_inner:
            break
        at[j] = pos
        count += 1
    return count, pos

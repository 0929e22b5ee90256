"""Numba CPU backend of the plasticity ops in :mod:`evjax.primitives.plasticity.ops`.

Imported by the ops the first time they lower with ``backend="numba"``; it
registers its generators on them.  One kernel serves both CSR ops: for each
active line (a row for ``update_csr_on_binary_pre``, a column of the CSC view
for ``_post``) it moves the weight of each entry by the trace of its other end
and clips it.  ``positions`` is empty for the row view (an entry is its own
weight position) and ``weight_indices`` for the column view.  Serial: each
synapse is written at most once per call (the positions are a permutation),
so the order of the lines cannot change a bit.  A malformed traced structure
(:mod:`evjax.primitives.spans`): each line's span is clamped to ``[0, nnz]``
and an entry whose position or other end is out of range is skipped.

The kernels' output aliases the weights (``numba_cpu.call(in_place=0)``): XLA
writes in place where the weights are not used afterwards (a ``jax.lax.scan``
carry, a donated argument), so a call touches only the synapses of active
lines; where they are still used, XLA copies them first.

One kernel serves both dense ops (``axis``: rows or columns); for columns it
lists the active ones once, then each row updates only those.

Spikes reach the kernels as bytes (``s != 0`` computed by XLA before the call),
so one compiled kernel per weight and index dtype serves bool, integer and
float spikes.  float16 and bfloat16 are computed in float32, as the reference
does.
"""
from __future__ import annotations

import jax.numpy as jnp
import numba
import numpy as np

from ..._kernel_compat import COMPILED_CODE_ONLY
from ...backends import numba_cpu
from ...dtypes import compute_dtype
from ..spans import row_span
from . import ops

__all__ = ["update_generator", "dense_update_generator"]


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _clipped(v, lo, hi):
    """``min(max(v, lo), hi)``, NaN propagated (``jnp.clip``'s rule)."""
    if lo != lo or v < lo:
        v = lo
    if hi != hi or v > hi:
        v = hi
    return v


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _update_lines(weight, indices, indptr, positions, trace, spikes, bounds, out):
    """``out[p] = clip(out[p] + trace[indices[e]])`` for each entry ``e`` of each line ``i`` with
    ``spikes[i]``; ``p = positions[e]``, or ``e`` when ``positions`` is empty.  ``out`` aliases
    ``weight`` (it holds the weights on entry), so only the synapses of active lines are touched."""
    lo, hi = bounds[0], bounds[1]
    direct = positions.shape[0] == 0
    nnz = indices.shape[0]
    n_out = np.uint64(out.shape[0])
    n_trace = np.uint64(trace.shape[0])
    for i in range(spikes.shape[0]):
        if spikes[i]:
            a, b = row_span(indptr, i, nnz)
            for e in range(a, b):
                p = e if direct else np.uint64(np.int64(positions[e]))
                j = np.uint64(np.int64(indices[e]))
                if p < n_out and j < n_trace:  # (a malformed traced structure: skipped)
                    out[p] = _clipped(out[p] + trace[j], lo, hi)
    return


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _update_dense(weight, spikes, trace, bounds, axis, out):
    """``out[i, j] = clip(out[i, j] + trace[other])`` on the rows (``axis[0] == 0``: other = j) or columns
    (other = i) whose spike is set; the active columns are listed once.  ``out`` aliases ``weight``."""
    n_rows, n_cols = weight.shape
    lo, hi = bounds[0], bounds[1]
    if axis[0] == 0:
        for i in range(n_rows):
            if spikes[i]:
                for j in range(n_cols):
                    out[i, j] = _clipped(out[i, j] + trace[j], lo, hi)
        return
    cols = np.empty(n_cols, np.int64)
    n = 0
    for j in range(n_cols):
        if spikes[j]:
            cols[n] = j
            n += 1
    for i in range(n_rows):
        t = trace[i]
        for a in range(n):
            j = cols[a]
            out[i, j] = _clipped(out[i, j] + t, lo, hi)
    return


def update_generator(outs, ins, indirect: bool, clip_min: bool, clip_max: bool):
    """Numba kernel for ``update_csr_on_binary_pre_p`` / ``update_csr_on_binary_post_p``."""
    out = outs[0]
    dtype = compute_dtype(out.dtype)

    def kernel(*args):
        y = numba_cpu.call(_update_lines, ops.kernel_lines(args, indirect, dtype), out.shape, dtype,
                           threads=False, bool_as_bytes=True, in_place=0)
        return [y.astype(out.dtype)]

    return kernel


def dense_update_generator(outs, ins, axis: int, clip_min: bool, clip_max: bool):
    """Numba kernel for ``update_dense_on_binary_pre_p`` / ``update_dense_on_binary_post_p``."""
    out = outs[0]
    dtype = compute_dtype(out.dtype)

    def kernel(*args):
        operands = ops.kernel_dense(args, axis, dtype) + (jnp.full((1,), axis, jnp.int32),)
        y = numba_cpu.call(_update_dense, operands, out.shape, dtype, threads=False, bool_as_bytes=True, in_place=0)
        return [y.astype(out.dtype)]

    return kernel


for _op in ops.CSR_OPS:
    _op.def_numba_kernel(update_generator)
for _op in ops.DENSE_OPS:
    _op.def_numba_kernel(dense_update_generator)

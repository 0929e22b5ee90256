"""Warp backend of the plasticity ops (backend ``"warp"``: CPU, and CUDA GPUs).

Imported (through the family's ``BACKEND_LOADERS``) the first time an op needs
this backend; it registers its generators at the bottom.  The CSR ops: one kernel, one
thread per line (a row, or a column of the CSC view): an active line moves
the weight of each of its entries by the trace of the other end and clips
it, in the in-out weight buffer (the call starts it as a copy of the
weights).  Each synapse is written by one thread at most (the positions are
a permutation), so no atomics and no order to fix.  Indices are int32 here
(int64 structures are narrowed; their values fit, as the shape does), and
float16/bfloat16 compute in float32.  The dense ops: one thread per weight,
which moves only if its row (pre) or column (post) fired.
"""
# No `from __future__ import annotations`: Warp reads the kernels' annotations as objects.

import functools
import threading

import jax.numpy as jnp
import numpy as np

from ...backends import warp as bridge
from ...dtypes import compute_dtype
from ...warp_kernel import jaxtype_to_warptype, warp_kernel
from . import ops

__all__ = ["plasticity_kernels", "update_warp", "dense_update_warp"]

wp = bridge.import_warp()
_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def plasticity_kernels(compute_dt: str) -> dict:
    """The Warp kernels for weights in ``compute_dt`` (``"float32"``/``"float64"``), in one module:
    ``"lines"`` (the CSR ops: one thread per line) and ``"dense"`` (one thread per weight)."""
    F = jaxtype_to_warptype(compute_dt)  # noqa: N806
    F1, F2 = wp.array(dtype=F, ndim=1), wp.array(dtype=F, ndim=2)  # noqa: N806
    I1, B1 = wp.array(dtype=wp.int32, ndim=1), wp.array(dtype=wp.bool, ndim=1)  # noqa: N806
    module = wp.get_module(f"evjax_plasticity_{compute_dt}")

    @wp.func(module=module)
    def clipped(v: F, bounds: F1):  # min(max(v, lo), hi), NaN propagated (jnp.clip's rule)
        lo = bounds[0]
        hi = bounds[1]
        r = v
        if lo != lo or r < lo:
            r = lo
        if hi != hi or r > hi:
            r = hi
        return r

    @wp.kernel(enable_backward=False, module=module)
    def update_lines(indices: I1, indptr: I1, positions: I1, trace: F1, spikes: B1, bounds: F1, out: F1):
        i = wp.tid()
        if spikes[i]:
            direct = positions.shape[0] == 0
            # a malformed traced structure: the span clamped to [0, nnz], an out-of-range entry skipped
            for e in range(wp.max(indptr[i], 0), wp.min(indptr[i + 1], indices.shape[0])):
                p = e
                if not direct:
                    p = positions[e]
                j = indices[e]
                if p >= 0 and p < out.shape[0] and j >= 0 and j < trace.shape[0]:
                    out[p] = clipped(out[p] + trace[j], bounds)

    @wp.kernel(enable_backward=False, module=module)
    def update_dense(spikes: B1, trace: F1, bounds: F1, by_row: B1, out: F2):
        i, j = wp.tid()
        line = j
        other = i
        if by_row[0]:
            line = i
            other = j
        if spikes[line]:
            out[i, j] = clipped(out[i, j] + trace[other], bounds)

    return {"lines": update_lines, "dense": update_dense}


def _in_place(name: str, dtype, launch_dims):
    """The kernel ``name`` in ``dtype`` over ``launch_dims`` threads, updating its in-out ``out`` (the weights)."""
    with _lock:
        kernel = plasticity_kernels(str(np.dtype(dtype)))[name]
    call = warp_kernel(kernel, [], launch_dims=launch_dims, in_out_argnames=["out"])
    return lambda *operands: call(*operands)[0]  # an in-out buffer: warp_kernel returns a tuple, here of one


def dense_update_warp(outs, ins, axis: int, clip_min: bool, clip_max: bool):
    """Warp generator for ``update_dense_on_binary_pre_p`` / ``_post_p``: ``run(*operands) -> [weights]``."""
    out = outs[0]
    dtype = compute_dtype(out.dtype)
    shape = tuple(int(d) for d in out.shape)
    empty = 0 in shape
    if not empty:
        call = _in_place("dense", dtype, shape)

    def run(*args):
        if empty:
            return [args[0]]
        w, active, t, b = ops.kernel_dense(args, axis, dtype)
        return [call(active, t, b, jnp.full((1,), axis == 0), w).astype(out.dtype)]

    return run


def update_warp(outs, ins, indirect: bool, clip_min: bool, clip_max: bool):
    """Warp generator for ``update_csr_on_binary_pre_p`` / ``_post_p``: ``run(*operands) -> [weights]``."""
    out = outs[0]
    dtype = compute_dtype(out.dtype)
    n_lines = int(ins[2].shape[0]) - 1
    empty = n_lines == 0 or int(out.shape[0]) == 0
    if not empty:
        call = _in_place("lines", dtype, n_lines)

    def run(*args):
        if empty:
            return [args[0]]
        w, indices, indptr, positions, t, active, b = ops.kernel_lines(args, indirect, dtype)
        narrow = (x.astype(jnp.int32) for x in (indices, indptr, positions))  # int32 structures (module docstring)
        return [call(*narrow, t, active, b, w).astype(out.dtype)]

    return run


for _op in ops.CSR_OPS:
    _op.def_warp_kernel(update_warp)
for _op in ops.DENSE_OPS:
    _op.def_warp_kernel(dense_update_warp)

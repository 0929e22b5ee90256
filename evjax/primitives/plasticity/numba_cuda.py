"""Numba CUDA backend of the plasticity ops (backend ``"numba_cuda"``, GPU).

Imported (through the family's ``BACKEND_LOADERS``) the first time an op needs
this backend; it registers its generator at the bottom.  One module-level
kernel (Numba specialises it per signature), one thread per line (a row, or a
column of the CSC view): an active line moves the weight of each of its
entries by the trace of the other end and clips it, in place in the output,
which aliases the weights (XLA hands the kernel a copy where the weights are
still needed).  Each synapse is written by one thread at most (the positions
are a permutation): no atomics, no order to fix.  float16/bfloat16 compute in
float32; an empty structure skips the launch.  The dense ops: one thread per
weight (``update_dense``), which moves only if its row (pre) or column (post) fired.
"""
import jax.numpy as jnp
from numba import cuda

from ...dtypes import compute_dtype
from ...numba_cuda_kernel import numba_cuda_kernel
from . import ops

__all__ = ["update_lines", "update_dense", "update_numba_cuda", "dense_update_numba_cuda", "THREADS"]

THREADS = 256  # threads per block


# The clip min(max(v, lo), hi) with NaN propagated (jnp.clip's rule) is written out in both kernels: a
# device function would need a CUDA driver to compile (its compute capability), and the PTX of these
# kernels is checked on machines without one (tests/test_numba_cuda_ptx.py).


@cuda.jit
def update_lines(weight, indices, indptr, positions, trace, spikes, bounds, out):
    i = cuda.grid(1)
    if i < spikes.shape[0] and spikes[i]:
        lo, hi = bounds[0], bounds[1]
        direct = positions.shape[0] == 0
        # a malformed traced structure: the span clamped to [0, nnz], an out-of-range entry skipped
        a = indptr[i] if indptr[i] > 0 else 0
        b = indptr[i + 1] if indptr[i + 1] < indices.shape[0] else indices.shape[0]
        for e in range(a, b):
            p = e if direct else positions[e]
            j = indices[e]
            if p < 0 or p >= out.shape[0] or j < 0 or j >= trace.shape[0]:
                continue
            v = out[p] + trace[j]
            if lo != lo or v < lo:
                v = lo
            if hi != hi or v > hi:
                v = hi
            out[p] = v


@cuda.jit
def update_dense(weight, spikes, trace, bounds, by_row, out):
    t = cuda.grid(1)
    n_rows, n_cols = out.shape
    if t < n_rows * n_cols:
        i, j = t // n_cols, t % n_cols  # neighbouring threads on neighbouring weights of a row
        line, other = (i, j) if by_row[0] else (j, i)
        if spikes[line]:
            lo, hi = bounds[0], bounds[1]
            v = out[i, j] + trace[other]
            if lo != lo or v < lo:
                v = lo
            if hi != hi or v > hi:
                v = hi
            out[i, j] = v


def _in_place(kernel, out, dtype, threads: int):
    """``kernel`` launched with one of ``threads`` per thread, its output (in ``dtype``) aliasing the weights."""
    return numba_cuda_kernel(kernel, out.update(dtype=dtype), grid=max(-(-threads // THREADS), 1), block=THREADS,
                             input_output_aliases={0: 0})


def dense_update_numba_cuda(outs, ins, axis: int, clip_min: bool, clip_max: bool):
    """Numba CUDA generator for ``update_dense_on_binary_pre_p`` / ``_post_p``: ``run(*operands) -> [weights]``."""
    out = outs[0]
    dtype = compute_dtype(out.dtype)
    size = int(out.shape[0]) * int(out.shape[1])
    if size:
        call = _in_place(update_dense, out, dtype, size)

    def run(*args):
        if not size:
            return [args[0]]
        return [call(*ops.kernel_dense(args, axis, dtype), jnp.full((1,), axis == 0)).astype(out.dtype)]

    return run


def update_numba_cuda(outs, ins, indirect: bool, clip_min: bool, clip_max: bool):
    """Numba CUDA generator for ``update_csr_on_binary_pre_p`` / ``_post_p``: ``run(*operands) -> [weights]``."""
    out = outs[0]
    dtype = compute_dtype(out.dtype)
    n_lines = int(ins[2].shape[0]) - 1
    empty = n_lines == 0 or int(out.shape[0]) == 0
    if not empty:
        call = _in_place(update_lines, out, dtype, n_lines)

    def run(*args):
        if empty:
            return [args[0]]
        return [call(*ops.kernel_lines(args, indirect, dtype)).astype(out.dtype)]

    return run


for _op in ops.CSR_OPS:
    _op.def_numba_cuda_kernel(update_numba_cuda)
for _op in ops.DENSE_OPS:
    _op.def_numba_cuda_kernel(dense_update_numba_cuda)

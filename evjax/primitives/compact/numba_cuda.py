"""Numba CUDA backend of ``active_list_p`` (GPU): one thread per row, a serial pass over it.

Imported (through the family's ``BACKEND_LOADERS``) the first time the op runs with ``backend="numba_cuda"``.
Not the GPU default (the reference is: XLA's ``nonzero`` scans in parallel there); chosen by name.
"""
import math

from numba import cuda

from ...numba_cuda_kernel import numba_cuda_kernel
from . import ops

__all__ = ["list_active", "active_list_numba_cuda", "THREADS"]

THREADS = 128  # threads (rows) per block


@cuda.jit
def list_active(x, ids, count):
    r = cuda.grid(1)
    if r < x.shape[0]:
        n = x.shape[1]
        m = 0
        for i in range(n):
            if x[r, i]:
                ids[r, m] = i
                m += 1
        for i in range(m, n):
            ids[r, i] = 0
        count[r, 0] = m


def active_list_numba_cuda(outs, ins):
    """Numba CUDA kernel generator for ``active_list_p``: ``run(x) -> [ids, count]``."""
    def build(rows, results):
        return numba_cuda_kernel(list_active, results, grid=max(1, math.ceil(rows / THREADS)), block=THREADS)

    return ops.row_lists(outs, ins, build)


ops.active_list_p.def_numba_cuda_kernel(active_list_numba_cuda)

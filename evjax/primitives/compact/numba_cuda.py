"""Numba CUDA backend of ``active_list_p`` (GPU): one thread per row, a serial pass over it.

Imported (through the family's ``BACKEND_LOADERS``) the first time the op runs with ``backend="numba_cuda"``.
Not the GPU default (the reference is: XLA's ``nonzero`` scans in parallel there); chosen by name.
"""
import math

import jax
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
    ids_out, count_out = outs
    n = ins[0].shape[-1]
    rows = int(ids_out.size // n) if n else 0
    if ids_out.size == 0:  # no entries: nothing to launch
        return lambda x: ops.empty_lists(outs)
    call = numba_cuda_kernel(list_active, [jax.ShapeDtypeStruct((rows, n), ids_out.dtype),
                                           jax.ShapeDtypeStruct((rows, 1), count_out.dtype)],
                             grid=max(1, math.ceil(rows / THREADS)), block=THREADS)

    def run(x):
        ids, count = call(x.reshape((rows, n)))
        return [ids.reshape(ids_out.shape), count.reshape(count_out.shape)]

    return run


ops.active_list_p.def_numba_cuda_kernel(active_list_numba_cuda)

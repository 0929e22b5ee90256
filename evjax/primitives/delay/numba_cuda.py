"""Numba CUDA backend of the delay ops (backend ``"numba_cuda"``, GPU).

Imported (through the family's ``BACKEND_LOADERS``) the first time an op needs
this backend; it registers its generators at the bottom.  Module-level
kernels (Numba specialises them per signature), one thread per row:

* ``deliver``: an active row adds ``w_e * f`` at each of its edges' slots
  with ``cuda.atomic.add``, in place in the output, which aliases the ring
  (XLA hands the kernel a copy where the ring is still needed); rows that
  share a target add in an unspecified order.
* ``gather``: each visited row writes its own edges (or its own sum) into
  the output, which aliases a zero-filled buffer: no atomics.

Each delay is clamped to ``[0, L - 1]``; a column outside ``[0, n_post)`` is
skipped; float16/bfloat16 compute in float32; an empty problem skips the launch.
"""
import jax.numpy as jnp
from numba import cuda

from ...numba_cuda_kernel import numba_cuda_kernel
from . import ops

__all__ = ["deliver", "gather", "deliver_numba_cuda", "gather_numba_cuda", "THREADS"]

THREADS = 256  # threads per block


# The slot (t mod L + clamp(d, 0, L - 1), wrapped once) is written out in both kernels: a device
# function would need a CUDA driver to compile (its compute capability), and the PTX of these kernels
# is checked on machines without one (tests/test_numba_cuda_ptx.py).


@cuda.jit
def deliver(ring, events, data, indices, indptr, delays, t_mod, out):
    i = cuda.grid(1)
    if i < events.shape[0]:
        f = events[i]
        if f != 0:
            n_slots, n_post = out.shape
            tm = t_mod[0]
            lo = indptr[i] if indptr[i] > 0 else 0  # the span clamped to [0, nnz] (a malformed traced structure)
            hi = indptr[i + 1] if indptr[i + 1] < indices.shape[0] else indices.shape[0]
            for e in range(lo, hi):
                j = indices[e]
                if j >= 0 and j < n_post:
                    d = delays[0] if delays.shape[0] == 1 else delays[e]
                    if d < 0:
                        d = 0
                    if d > n_slots - 1:
                        d = n_slots - 1
                    s = tm + d
                    if s >= n_slots:
                        s -= n_slots
                    w = data[0] if data.shape[0] == 1 else data[e]
                    cuda.atomic.add(out, (s, j), w * f)


@cuda.jit
def gather(zeros, g, events, data, indices, indptr, delays, t_mod, flags, out):
    i = cuda.grid(1)
    if i < events.shape[0]:
        f = events[i]
        by_event = flags[1] != 0
        if (not by_event) or f != 0:
            n_slots, n_post = g.shape
            tm = t_mod[0]
            total = out[i] if flags[0] == 0 else out[0]  # 0 (typed) where summing
            total = total - total
            lo = indptr[i] if indptr[i] > 0 else 0  # the span clamped to [0, nnz] (a malformed traced structure)
            hi = indptr[i + 1] if indptr[i + 1] < indices.shape[0] else indices.shape[0]
            for e in range(lo, hi):
                j = indices[e]
                if j >= 0 and j < n_post:
                    d = delays[0] if delays.shape[0] == 1 else delays[e]
                    if d < 0:
                        d = 0
                    if d > n_slots - 1:
                        d = n_slots - 1
                    s = tm + d
                    if s >= n_slots:
                        s -= n_slots
                    w = data[0] if data.shape[0] == 1 else data[e]
                    term = w * g[s, j]
                    if by_event:
                        term = f * term
                    if flags[0] != 0:
                        out[e] = term
                    else:
                        total += term
            if flags[0] == 0:
                out[i] = total


def _rows_call(kernel, out, dtype, n_rows: int):
    """``kernel`` with one thread per row, its output (``out`` in ``dtype``) aliasing its first operand."""
    return numba_cuda_kernel(kernel, out.update(dtype=dtype), grid=max(-(-n_rows // THREADS), 1), block=THREADS,
                             input_output_aliases={0: 0})


def deliver_numba_cuda(outs, ins, shape, weighted: bool):
    """Numba CUDA generator for ``csr_delay_deliver_p``: ``run(*operands) -> [ring]``."""
    def build(dtype):
        call = _rows_call(deliver, outs[0], dtype, int(shape[0]))
        return lambda ring, values, weights, indices, indptr, delays, t: call(
            ring, values, weights, indices, indptr, delays, ops.t_mod(t, ring.shape[0], delays.dtype))

    return ops.deliver_runner(outs, weighted, build)


def gather_numba_cuda(outs, ins, shape, weighted: bool, per_edge: bool, by_event: bool):
    """Numba CUDA generator for ``csr_delay_gather_p``: ``run(*operands) -> [cotangent]``."""
    def build(dtype):
        call = _rows_call(gather, outs[0], dtype, int(shape[0]))
        return lambda g, values, weights, indices, indptr, delays, t, flags: call(
            jnp.zeros(outs[0].shape, dtype), g, values, weights, indices, indptr, delays,
            ops.t_mod(t, g.shape[0], delays.dtype), flags)

    return ops.gather_runner(outs, ins, weighted, per_edge, by_event, build)


ops.csr_delay_deliver_p.def_numba_cuda_kernel(deliver_numba_cuda)
ops.csr_delay_gather_p.def_numba_cuda_kernel(gather_numba_cuda)

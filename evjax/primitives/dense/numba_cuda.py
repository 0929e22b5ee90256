"""Numba CUDA backend of the dense event ops (backend ``"numba_cuda"``, GPU).

Imported (through the family's ``BACKEND_LOADERS``) the first time an op needs this
backend; it registers its generators at the bottom.  The kernels are
module-level and dtype-generic (Numba specialises them per signature), picked
from :data:`KERNELS`; a vector of events is a ``(k, 1)`` matrix:

* ``compact``: one thread per sample ``c`` lists its active events in order
  (``idx[c, :count[c]]``) with their values (1 for a bool spike): O(k), once;
* ``scatter`` (``transpose=True``, ``W (k, m)``) and ``gather``
  (``transpose=False``, ``W (m, k)``): one thread per output ``(i, c)``
  (neighbouring threads on neighbouring ``i``: coalesced weight reads in the
  scatter) sums ``vals * W`` over the listed events only, in order: cost
  ``m x active``, deterministic, no atomics;
* ``outer_rows`` / ``outer_cols``: the weight gradient ``outer(e(x), g)`` as
  ``(k, m)`` / ``(m, k)``, one thread per entry, each written once: 0 for an
  inactive event whatever ``g`` holds, else ``sum_c v * g``.

Events select (``docs/semantics.md``): an inactive event is never read past its
test.  float16/bfloat16 compute in float32; empty results skip the launch.
"""
import jax
import jax.numpy as jnp
from numba import cuda

from ...dtypes import compute_dtype
from ...numba_cuda_kernel import numba_cuda_kernel
from . import ops

__all__ = ["KERNELS", "THREADS", "matmul_numba_cuda", "outer_numba_cuda"]

THREADS = 256  # threads per block of every launch


@cuda.jit
def compact(x, idx, vals, count):
    c = cuda.grid(1)
    if c < x.shape[1]:
        n = 0
        for j in range(x.shape[0]):
            e = x[j, c]
            if e != 0:
                idx[c, n] = j
                vals[c, n] = e  # a bool spike is 1
                n += 1
        count[c] = n


@cuda.jit
def scatter(w, idx, vals, count, out):
    t = cuda.grid(1)
    m = out.shape[0]
    if t < m * out.shape[1]:
        i, c = t % m, t // m
        acc = out.dtype.type(0)
        for a in range(count[c]):
            acc += w[idx[c, a], i] * vals[c, a]
        out[i, c] = acc


@cuda.jit
def gather(w, idx, vals, count, out):
    t = cuda.grid(1)
    m = out.shape[0]
    if t < m * out.shape[1]:
        i, c = t % m, t // m
        acc = out.dtype.type(0)
        for a in range(count[c]):
            acc += w[i, idx[c, a]] * vals[c, a]
        out[i, c] = acc


@cuda.jit
def outer_rows(x, g, out):
    t = cuda.grid(1)
    m = out.shape[1]
    if t < out.shape[0] * m:
        j, i = t // m, t % m  # out (k, m)
        acc = out.dtype.type(0)
        for c in range(x.shape[1]):
            e = x[j, c]
            if e != 0:
                acc += g[i, c] * e
        out[j, i] = acc


@cuda.jit
def outer_cols(x, g, out):
    t = cuda.grid(1)
    k = out.shape[1]
    if t < out.shape[0] * k:
        i, j = t // k, t % k  # out (m, k)
        acc = out.dtype.type(0)
        for c in range(x.shape[1]):
            e = x[j, c]
            if e != 0:
                acc += g[i, c] * e
        out[i, j] = acc


# (kind, transpose) -> kernel
KERNELS = {("matmul", True): scatter, ("matmul", False): gather,
           ("outer", True): outer_rows, ("outer", False): outer_cols}


def _launch(threads: int) -> dict:
    return dict(grid=max(-(-threads // THREADS), 1), block=THREADS)


def _events(x, weighted: bool, dtype):
    """Events as ``(k, n)``: bool for spikes (value 1), values in the compute dtype when weighted."""
    x = x if x.ndim == 2 else x.reshape(x.shape[0], 1)
    if not weighted:
        return x if x.dtype == jnp.bool_ else x != 0
    return x if x.dtype == dtype else x.astype(dtype)


def matmul_numba_cuda(outs, ins, transpose, weighted):
    """Numba CUDA generator for ``binary_densemv_p``/``binary_densemm_p``: ``run(weights, spikes) -> [out]``."""
    out = outs[0]
    dtype = compute_dtype(out.dtype)
    s_in = ins[1]
    k, n, m = int(s_in.shape[0]), (int(s_in.shape[1]) if len(s_in.shape) == 2 else 1), int(out.shape[0])
    lists = [jax.ShapeDtypeStruct((n, k), jnp.int32), jax.ShapeDtypeStruct((n, k), dtype),
             jax.ShapeDtypeStruct((n,), jnp.int32)]
    empty = k == 0 or m == 0 or n == 0
    if not empty:
        compact_call = numba_cuda_kernel(compact, lists, **_launch(n))
        product = numba_cuda_kernel(KERNELS[("matmul", bool(transpose))], jax.ShapeDtypeStruct((m, n), dtype),
                                    **_launch(m * n))

    def run(weights, spikes):
        if empty:
            return [jnp.zeros(out.shape, out.dtype)]
        w = weights if weights.dtype == dtype else weights.astype(dtype)
        idx, vals, count = compact_call(_events(spikes, weighted, dtype))
        return [product(w, idx, vals, count).reshape(out.shape).astype(out.dtype)]

    return run


def outer_numba_cuda(outs, ins, transpose, weighted):
    """Numba CUDA generator for ``binary_dense_outer_p``: ``run(spikes, g) -> [outer(e(spikes), g)]``."""
    out = outs[0]
    dtype = compute_dtype(out.dtype)
    shape = tuple(int(d) for d in out.shape)
    empty = 0 in shape
    if not empty:
        call = numba_cuda_kernel(KERNELS[("outer", bool(transpose))], jax.ShapeDtypeStruct(shape, dtype),
                                 **_launch(shape[0] * shape[1]))

    def run(spikes, g):
        if empty:
            return [jnp.zeros(out.shape, out.dtype)]
        g = g if g.dtype == dtype else g.astype(dtype)
        g2 = g if g.ndim == 2 else g.reshape(g.shape[0], 1)
        return [call(_events(spikes, weighted, dtype), g2).astype(out.dtype)]

    return run


for _op in (ops.binary_densemv_p, ops.binary_densemm_p):
    _op.def_numba_cuda_kernel(matmul_numba_cuda)
ops.binary_dense_outer_p.def_numba_cuda_kernel(outer_numba_cuda)

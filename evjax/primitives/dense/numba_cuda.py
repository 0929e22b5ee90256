"""Numba CUDA backend of the dense event ops (backend ``"numba_cuda"``, GPU).

Imported (through the family's ``BACKEND_LOADERS``) the first time an op needs this
backend; it registers its generators at the bottom.  The kernels are
dtype-generic (Numba specialises them per signature), built at import (the
product and the gradient each by one factory of ``transpose``) and picked
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

from ...dtypes import as_dtype, compute_dtype
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


# The product and the weight gradient are each written once, as a factory of ``transpose``: a closure
# constant of the kernel, whose branches on it Numba prunes before typing (as csr/numba_cuda.py's
# flavours), so each built kernel compiles its own orientation only.
def _named(kernel, name: str):
    """``cuda.jit`` of a factory's Python function under its table name."""
    kernel.__name__ = kernel.__qualname__ = name
    return cuda.jit(kernel)


def _product(transpose: bool):
    """``scatter`` (``transpose``, W (k, m)) or ``gather`` (W (m, k)): ``out[i, c] = sum_a W(i, idx[c, a])
    * vals[c, a]`` over the listed events of sample ``c``, in order."""
    def product(w, idx, vals, count, out):
        t = cuda.grid(1)
        m = out.shape[0]
        if t < m * out.shape[1]:
            i, c = t % m, t // m
            acc = out.dtype.type(0)
            for a in range(count[c]):
                if transpose:
                    acc += w[idx[c, a], i] * vals[c, a]
                else:
                    acc += w[i, idx[c, a]] * vals[c, a]
            out[i, c] = acc

    return _named(product, "scatter" if transpose else "gather")


def _outer(transpose: bool):
    """``outer_rows`` (``transpose``: out (k, m), entry ``(j, i)``) or ``outer_cols`` (out (m, k), entry
    ``(i, j)``): ``sum_c e(x[j, c]) g[i, c]``, an inactive event selected out, never multiplied by 0."""
    def outer(x, g, out):
        t = cuda.grid(1)
        width = out.shape[1]
        if t < out.shape[0] * width:
            r, s = t // width, t % width  # the entry out[r, s]
            j, i = (r, s) if transpose else (s, r)
            acc = out.dtype.type(0)
            for c in range(x.shape[1]):
                e = x[j, c]
                if e != 0:
                    acc += g[i, c] * e
            out[r, s] = acc

    return _named(outer, "outer_rows" if transpose else "outer_cols")


# (kind, transpose) -> kernel
KERNELS = {("matmul", True): _product(True), ("matmul", False): _product(False),
           ("outer", True): _outer(True), ("outer", False): _outer(False)}


def _launch(threads: int) -> dict:
    return dict(grid=max(-(-threads // THREADS), 1), block=THREADS)


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
        idx, vals, count = compact_call(ops.kernel_events(spikes, weighted, dtype))
        return [product(as_dtype(weights, dtype), idx, vals, count).reshape(out.shape).astype(out.dtype)]

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
        return [call(*ops.outer_operands(spikes, g, weighted, dtype)).astype(out.dtype)]

    return run


for _op in (ops.binary_densemv_p, ops.binary_densemm_p):
    _op.def_numba_cuda_kernel(matmul_numba_cuda)
ops.binary_dense_outer_p.def_numba_cuda_kernel(outer_numba_cuda)

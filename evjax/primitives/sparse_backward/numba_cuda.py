"""Numba CUDA backend of the sparse-backward family (GPU): one thread per output entry, gathering.

Imported (through the family's ``BACKEND_LOADERS``) the first time an op runs
with ``backend="numba_cuda"``; it registers its generators at the bottom.

The kernels are those of the Warp backend (:mod:`.warp`, whose docstring
gives the orders): no atomics, one thread per output entry adding its terms
in the order of the Numba CPU kernels (:mod:`.numba`) from 0, so the results
are deterministic and have their bits:

* ``csrmv_select`` / ``csrmv_columns`` (``csrmv_nonzero``, a thread per
  ``(b, output)``): ``A v`` over a row in (column, position) order (stored
  order when the thread finds its row sorted, else by selection,
  ``O(len^2)`` per unsorted row); ``A.T v`` over the column view in its
  order;
* ``sddmm_nonzero`` (``csr_sddmm_nonzero``, a thread per ``(G, synapse)``,
  its row by binary search on ``indptr``, the batch ``b`` ascending);
* ``densemv`` / ``densemv_t`` (``densemv_nonzero``, a thread per ``(b,
  output)``, the contracted index ascending);
* ``outer_nonzero`` (``dense_outer_nonzero``, a thread per ``(G, i, j)``, the
  batch ``b`` ascending).

The zero entries of the vector operand are skipped as the threads meet them
(the CPU kernels' run-time choice of path has no counterpart here).

No FMA: NVVM contracts ``acc += w * x`` into a fused multiply-add by default
(one rounding instead of two: other bits than the CPU's).  Each product is
``libdevice.fmul_rn`` / ``dmul_rn`` (PTX ``mul.rn``, never contracted), so
the kernels are built once per compute dtype (:data:`KERNELS`, keyed by
``(name, "float32" | "float64")``); in Numba's CUDA simulator, which lacks
libdevice, the product is Python's ``*`` on NumPy scalars (the same IEEE
rounding).  No ``@cuda.jit(device=True)`` helpers (see
:mod:`evjax.primitives.csr.numba_cuda`: ``compile_ptx`` without a GPU could
not type-check them); spans are clamped inline and out-of-range indices
ignored, so a malformed structure never reads out of bounds.  float16 and
bfloat16 are computed in float32 (:func:`~evjax.dtypes.compute_dtype`) and
rounded back.
"""
import functools
import math
import operator

import jax
from numba import cuda
from numba.cuda import libdevice

from ...backends import numba_cuda as bridge
from ...numba_cuda_kernel import numba_cuda_kernel
from . import ops

__all__ = ["KERNELS", "COMPUTE_DTYPES", "THREADS", "csrmv_nonzero_numba_cuda", "csr_sddmm_nonzero_numba_cuda",
           "densemv_nonzero_numba_cuda", "dense_outer_nonzero_numba_cuda"]

THREADS = 128  # threads per block (one output entry each)
COMPUTE_DTYPES = ("float32", "float64")


def _multiply(compute: str):
    """The product of ``compute`` scalars, rounded on its own (never fused with the next add)."""
    if bridge.simulator_enabled():
        return operator.mul
    return libdevice.fmul_rn if compute == "float32" else libdevice.dmul_rn


def _named(kernel, name: str):
    kernel.__name__ = kernel.__qualname__ = name
    return cuda.jit(kernel)


# ---------------------------------------------------------------------------
# csrmv_nonzero: out[b, o] (o a row of A for A v, a column for A.T v); thread t = b * n_out + o
# ---------------------------------------------------------------------------
def _csrmv_select(compute: str):
    MUL = _multiply(compute)

    def csrmv_select(data, indices, indptr, t_indices, t_indptr, perm, v, out):
        t = cuda.grid(1)
        n_out = out.shape[1]
        if t < out.shape[0] * n_out:
            b = t // n_out
            i = t - b * n_out
            nnz = indices.shape[0]
            n = v.shape[1]
            shared = data.shape[0] == 1
            lo = indptr[i] if indptr[i] > 0 else 0
            hi = indptr[i + 1] if indptr[i + 1] < nnz else nnz
            in_order = True
            for e in range(lo + 1, hi):
                if indices[e] < indices[e - 1]:
                    in_order = False
            acc = out.dtype.type(0)
            if in_order:
                for e in range(lo, hi):
                    j = indices[e]
                    if j >= 0 and j < n:
                        x = v[b, j]
                        if x != 0:
                            acc += MUL(data[0] if shared else data[e], x)
            else:  # the next entry in (column, position) order, len times
                prev_c = -1
                prev_e = -1
                for _ in range(lo, hi):
                    best_c = -1
                    best_e = -1
                    for e in range(lo, hi):
                        c = indices[e]
                        if c >= 0 and c < n:
                            if c > prev_c or (c == prev_c and e > prev_e):
                                if best_e < 0 or c < best_c:  # ties keep the first (lowest) position
                                    best_c = c
                                    best_e = e
                    if best_e >= 0:
                        x = v[b, best_c]
                        if x != 0:
                            acc += MUL(data[0] if shared else data[best_e], x)
                        prev_c = best_c
                        prev_e = best_e
            out[b, i] = acc

    return _named(csrmv_select, f"csrmv_select_{compute}")


def _csrmv_columns(compute: str):
    MUL = _multiply(compute)

    def csrmv_columns(data, indices, indptr, t_indices, t_indptr, perm, v, out):
        t = cuda.grid(1)
        n_out = out.shape[1]
        if t < out.shape[0] * n_out:
            b = t // n_out
            j = t - b * n_out
            n_view = t_indices.shape[0] if t_indices.shape[0] < perm.shape[0] else perm.shape[0]
            m = v.shape[1]
            n_data = data.shape[0]
            shared = n_data == 1
            lo = t_indptr[j] if t_indptr[j] > 0 else 0
            hi = t_indptr[j + 1] if t_indptr[j + 1] < n_view else n_view
            acc = out.dtype.type(0)
            for p in range(lo, hi):
                i = t_indices[p]
                if i >= 0 and i < m:
                    x = v[b, i]
                    if x != 0:
                        k = perm[p]
                        if shared:
                            acc += MUL(data[0], x)
                        elif k >= 0 and k < n_data:
                            acc += MUL(data[k], x)
                        else:  # a synapse outside data: weight 0, as the Warp kernel
                            acc += MUL(out.dtype.type(0), x)
            out[b, j] = acc

    return _named(csrmv_columns, f"csrmv_columns_{compute}")


# ---------------------------------------------------------------------------
# csr_sddmm_nonzero: g[G, e] = sum over b ascending of r[G, b, row e] q[G, b, col e] where both are
# nonzero, from 0; thread t = G * nnz + e, row e by binary search on indptr
# ---------------------------------------------------------------------------
def _sddmm(compute: str):
    MUL = _multiply(compute)

    def sddmm_nonzero(indices, indptr, t_indices, t_indptr, perm, r, q, g):
        t = cuda.grid(1)
        nnz = g.shape[1]
        if t < g.shape[0] * nnz:
            grp = t // nnz
            e = t - grp * nnz
            m = indptr.shape[0] - 1
            lo = 0
            hi = m
            while lo < hi:  # the rows i with indptr[i + 1] <= e
                mid = (lo + hi) // 2
                if indptr[mid + 1] <= e:
                    lo = mid + 1
                else:
                    hi = mid
            acc = g.dtype.type(0)
            if lo < m and lo < r.shape[2]:
                if indptr[lo] <= e:
                    c = indices[e]
                    if c >= 0 and c < q.shape[2]:
                        for b in range(r.shape[1]):
                            ri = r[grp, b, lo]
                            qj = q[grp, b, c]
                            if ri != 0 and qj != 0:
                                acc += MUL(ri, qj)
            g[grp, e] = acc

    return _named(sddmm_nonzero, f"sddmm_nonzero_{compute}")


# ---------------------------------------------------------------------------
# dense: densemv_nonzero (thread t = b * n_out + o) and dense_outer_nonzero (t = (G * m + i) * n + j)
# ---------------------------------------------------------------------------
def _densemv(compute: str, TRANSPOSE: bool):
    MUL = _multiply(compute)

    # transpose: out[b, j] = sum_{i ascending, v[b, i] != 0} w[i, j] v[b, i]
    # else:      out[b, i] = sum_{j ascending, v[b, j] != 0} w[i, j] v[b, j]
    def densemv(w, v, out):
        t = cuda.grid(1)
        n_out = out.shape[1]
        if t < out.shape[0] * n_out:
            b = t // n_out
            o = t - b * n_out
            acc = out.dtype.type(0)
            for c in range(v.shape[1]):
                x = v[b, c]
                if x != 0:
                    if TRANSPOSE:
                        acc += MUL(w[c, o], x)
                    else:
                        acc += MUL(w[o, c], x)
            out[b, o] = acc

    return _named(densemv, f"densemv{'_t' if TRANSPOSE else ''}_{compute}")


def _outer(compute: str):
    MUL = _multiply(compute)

    # g[G, i, j] = sum over b ascending of r[G, b, i] q[G, b, j] where both are nonzero, from 0
    def outer_nonzero(r, q, g):
        t = cuda.grid(1)
        m, n = g.shape[1], g.shape[2]
        if t < g.shape[0] * m * n:
            gi = t // n
            j = t - gi * n
            grp = gi // m
            i = gi - grp * m
            acc = g.dtype.type(0)
            for b in range(r.shape[1]):
                ri = r[grp, b, i]
                qj = q[grp, b, j]
                if ri != 0 and qj != 0:
                    acc += MUL(ri, qj)
            g[grp, i, j] = acc

    return _named(outer_nonzero, f"outer_nonzero_{compute}")


# (name, compute dtype) -> kernel
_FACTORIES = {"csrmv_select": _csrmv_select, "csrmv_columns": _csrmv_columns,
              "sddmm_nonzero": _sddmm, "densemv": lambda c: _densemv(c, False),
              "densemv_t": lambda c: _densemv(c, True), "outer_nonzero": _outer}
KERNELS = {(name, compute): factory(compute) for name, factory in _FACTORIES.items() for compute in COMPUTE_DTYPES}


# ---------------------------------------------------------------------------
# generators (the ops' "numba_cuda" backend)
# ---------------------------------------------------------------------------
def _run(op, name: str, outs):
    """``op``'s kernel: ``name`` in the output's compute dtype, one thread per output entry."""
    (out,) = outs
    return ops.in_compute_dtype(op, out, functools.partial(_call, name, out))


def _call(name: str, out, dtype):
    """The kernel ``name`` of ``dtype`` on a pure output of ``out``'s shape, one thread per entry."""
    shape = tuple(int(d) for d in out.shape)
    return numba_cuda_kernel(KERNELS[(name, str(dtype))], jax.ShapeDtypeStruct(shape, dtype),
                             grid=max(1, math.ceil(math.prod(shape) / THREADS)), block=THREADS)


def csrmv_nonzero_numba_cuda(outs, ins, *, shape, transpose, sorted_rows):
    """Numba CUDA kernel generator for ``csrmv_nonzero_p``: one thread per ``(b, output)``.

    Returns:
        ``run(data, indices, indptr, t_indices, t_indptr, perm, v) -> [out]``.
    """
    name = "csrmv_columns" if transpose else "csrmv_select"  # a sorted row is walked in stored order
    return _run(ops.csrmv_nonzero_p, name, outs)


def csr_sddmm_nonzero_numba_cuda(outs, ins, *, shape):
    """Numba CUDA kernel generator for ``csr_sddmm_nonzero_p``: one thread per ``(G, synapse)``.

    Returns:
        ``run(indices, indptr, t_indices, t_indptr, perm, r, q) -> [g]``.
    """
    return _run(ops.csr_sddmm_nonzero_p, "sddmm_nonzero", outs)


def densemv_nonzero_numba_cuda(outs, ins, *, transpose):
    """Numba CUDA kernel generator for ``densemv_nonzero_p``: one thread per ``(b, output)``.

    Returns:
        ``run(w, v) -> [out]``.
    """
    return _run(ops.densemv_nonzero_p, "densemv_t" if transpose else "densemv", outs)


def dense_outer_nonzero_numba_cuda(outs, ins):
    """Numba CUDA kernel generator for ``dense_outer_nonzero_p``: one thread per ``(G, i, j)``.

    Returns:
        ``run(r, q) -> [g]``.
    """
    return _run(ops.dense_outer_nonzero_p, "outer_nonzero", outs)


for _op, _generator in ((ops.csrmv_nonzero_p, csrmv_nonzero_numba_cuda),
                        (ops.csr_sddmm_nonzero_p, csr_sddmm_nonzero_numba_cuda),
                        (ops.densemv_nonzero_p, densemv_nonzero_numba_cuda),
                        (ops.dense_outer_nonzero_p, dense_outer_nonzero_numba_cuda)):
    _op.def_numba_cuda_kernel(_generator)

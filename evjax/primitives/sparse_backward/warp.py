"""Warp backend of the sparse-backward family (CPU and GPU): one thread per output entry, gathering.

Imported (through the family's ``BACKEND_LOADERS``) the first time an op runs
with ``backend="warp"``; importing it registers the generators below as the
``"warp"`` backend (cpu and gpu) of ``csrmv_nonzero_p``,
``csr_sddmm_nonzero_p``, ``densemv_nonzero_p`` and ``dense_outer_nonzero_p``.

No atomics: every output entry is written by one thread, which adds its
terms in the order of the Numba CPU kernels (:mod:`.numba`), starting from 0,
one rounded product then one rounded sum per term in the output's compute
dtype.  So the result is deterministic and has the Numba kernels' bits:

* ``csrmv_nonzero`` (a thread per ``(b, output)``):

  - ``transpose=True`` (``A.T v``): the output column's synapses through the
    column view ``(t_indices, t_indptr, perm)``, in its order (row, stored
    position), the Numba order;
  - ``transpose=False``: the Numba kernel adds a row's terms in (column,
    stored position) order.  The thread first checks whether its row is
    sorted (one pass) and then walks it in stored order;
    otherwise it walks the row by selection, each step taking the next entry
    in (column, position) order: ``O(len^2)`` per unsorted row (rows of a
    synaptic structure are short; sort them, or build the structure sorted,
    for long ones).

  An entry of ``v`` that is zero is skipped, whatever the weight holds.
* ``csr_sddmm_nonzero`` (a thread per ``(G, synapse)``): the synapse's row
  by binary search on ``indptr``, then the sum over ``b`` ascending of
  ``r[G, b, row] q[G, b, col]`` where both are nonzero, from 0.
* ``densemv_nonzero`` (a thread per ``(b, output)``): the contracted index
  ascending, the zero entries of ``v`` skipped.
* ``dense_outer_nonzero`` (a thread per ``(G, i, j)``): the sum over ``b``
  ascending of ``r[G, b, i] q[G, b, j]`` where both are nonzero, from 0.

The "skip" choice of the CPU kernels (walk everything or only the nonzero
entries, decided from a count) has no counterpart here: a gathering thread
skips the zero terms as it meets them.

Floating-point contraction is off in these Warp modules (``fuse_fp=False``):
CUDA compiles with ``--fmad=false`` and the CPU with strict FP fusion, so a
product and the following sum are never fused into one FMA (which would
round once instead of twice and change the bits).

float16 and bfloat16 (which Warp lacks) are computed in float32
(:func:`evjax.dtypes.compute_dtype`) and rounded back.  A malformed
structure never reads out of bounds: spans are clamped to the arrays and
out-of-range indices ignored.
"""
# No `from __future__ import annotations`: Warp reads the kernels' annotations as objects.

import functools
import threading
from types import SimpleNamespace

import jax
import numpy as np

from ...backends import warp as bridge
from ...warp_kernel import jaxtype_to_warptype, warp_kernel
from . import ops

__all__ = ["csr_kernels", "dense_kernels", "csrmv_nonzero_warp", "csr_sddmm_nonzero_warp",
           "densemv_nonzero_warp", "dense_outer_nonzero_warp", "CSRMV_ORDERS"]

wp = bridge.import_warp()
_lock = threading.Lock()

# csrmv_nonzero's kernels by the order they add a row's (or column's) terms in
CSRMV_ORDERS = ("select", "columns")


def _module(name: str):
    """A Warp module of this family, FP contraction off (no FMA: the Numba kernels' bits)."""
    module = wp.get_module(name)
    wp.set_module_options({"fuse_fp": False}, module=module)
    return module


# ---------------------------------------------------------------------------
# CSR kernels (csrmv_nonzero, csr_sddmm_nonzero) of one dtype signature
# ---------------------------------------------------------------------------
def _csr_types(compute_dt: str, index_dts: tuple) -> SimpleNamespace:
    """Types, module and helpers of one signature: the compute dtype, then the dtypes of
    ``indices, indptr, t_indices, t_indptr, perm``."""
    F = jaxtype_to_warptype(compute_dt)
    module = _module("evjax_sparse_backward_csr_" + "_".join((compute_dt,) + index_dts))
    I1, P1, TI1, TP1, Q1 = (wp.array(dtype=jaxtype_to_warptype(dt), ndim=1) for dt in index_dts)
    t = SimpleNamespace(F=F, module=module, opts=dict(enable_backward=False, module=module),
                        F1=wp.array(dtype=F, ndim=1), F2=wp.array(dtype=F, ndim=2),
                        F3=wp.array(dtype=F, ndim=3), I1=I1, P1=P1, TI1=TI1, TP1=TP1, Q1=Q1)

    @wp.func(module=module)
    def span(ptr: P1, i: int, n: int):
        """Row ``i``'s entries, clamped to [0, n]."""
        return wp.max(int(ptr[i]), 0), wp.min(int(ptr[i + 1]), n)

    @wp.func(module=module)
    def t_span(ptr: TP1, j: int, n: int):
        """Column ``j``'s entries in the column view, clamped to [0, n]."""
        return wp.max(int(ptr[j]), 0), wp.min(int(ptr[j + 1]), n)

    @wp.func(module=module)
    def weight(data: t.F1, k: int):
        """Synapse ``k``'s weight: ``data[0]`` when shared (0 for a synapse outside ``data``)."""
        if data.shape[0] == 1:
            return data[0]
        if k >= 0 and k < data.shape[0]:
            return data[k]
        return F(0)

    t.span, t.t_span, t.weight = span, t_span, weight
    return t


def _csrmv_select(t):
    span, weight, F = t.span, t.weight, t.F

    # out[b, i] = sum over row i's synapses in (column, stored position) order: stored order when the
    # row is sorted (checked), else by selection of the next entry in that order (O(len^2))
    @wp.kernel(**t.opts)
    def csrmv_select(data: t.F1, indices: t.I1, indptr: t.P1, t_indices: t.TI1, t_indptr: t.TP1, perm: t.Q1,
                     v: t.F2, out: t.F2):
        b, i = wp.tid()
        n = v.shape[1]
        lo, hi = span(indptr, i, indices.shape[0])
        in_order = int(1)
        for e in range(lo + 1, hi):
            if int(indices[e]) < int(indices[e - 1]):
                in_order = 0
        acc = F(0)
        if in_order == 1:
            for e in range(lo, hi):
                j = int(indices[e])
                if j >= 0 and j < n:
                    x = v[b, j]
                    if x != F(0):
                        acc += weight(data, e) * x
        else:
            prev_c = int(-1)
            prev_e = int(-1)
            for step in range(lo, hi):
                best_c = int(-1)
                best_e = int(-1)
                for e in range(lo, hi):
                    c = int(indices[e])
                    if c >= 0 and c < n:
                        if c > prev_c or (c == prev_c and e > prev_e):
                            if best_e < 0 or c < best_c:  # ties keep the first (lowest) position
                                best_c = c
                                best_e = e
                if best_e >= 0:
                    x = v[b, best_c]
                    if x != F(0):
                        acc += weight(data, best_e) * x
                    prev_c = best_c
                    prev_e = best_e
        out[b, i] = acc

    return csrmv_select


def _csrmv_columns(t):
    t_span, weight, F = t.t_span, t.weight, t.F

    # out[b, j] = sum over column j's synapses through the column view, in its (row, position) order
    @wp.kernel(**t.opts)
    def csrmv_columns(data: t.F1, indices: t.I1, indptr: t.P1, t_indices: t.TI1, t_indptr: t.TP1, perm: t.Q1,
                      v: t.F2, out: t.F2):
        b, j = wp.tid()
        m = v.shape[1]
        lo, hi = t_span(t_indptr, j, wp.min(t_indices.shape[0], perm.shape[0]))
        acc = F(0)
        for p in range(lo, hi):
            i = int(t_indices[p])
            if i >= 0 and i < m:
                x = v[b, i]
                if x != F(0):
                    acc += weight(data, int(perm[p])) * x
        out[b, j] = acc

    return csrmv_columns


def _sddmm(t):
    F = t.F

    # g[G, e] = sum over b ascending of r[G, b, row e] q[G, b, col e] where both are nonzero, from 0;
    # row e by binary search on indptr
    @wp.kernel(**t.opts)
    def sddmm_nonzero(indices: t.I1, indptr: t.P1, t_indices: t.TI1, t_indptr: t.TP1, perm: t.Q1,
                      r: t.F3, q: t.F3, g: t.F2):
        grp, e = wp.tid()
        m = indptr.shape[0] - 1
        lo = int(0)
        hi = m
        while lo < hi:  # the rows i with indptr[i + 1] <= e
            mid = (lo + hi) // 2
            if int(indptr[mid + 1]) <= e:
                lo = mid + 1
            else:
                hi = mid
        acc = F(0)
        if lo < m and lo < r.shape[2]:
            if int(indptr[lo]) <= e:
                c = int(indices[e])
                if c >= 0 and c < q.shape[2]:
                    for b in range(r.shape[1]):
                        ri = r[grp, b, lo]
                        qj = q[grp, b, c]
                        if ri != F(0) and qj != F(0):
                            acc += ri * qj
        g[grp, e] = acc

    return sddmm_nonzero


@functools.lru_cache(maxsize=None)
def csr_kernels(compute_dt: str, index_dts: tuple) -> dict:
    """The CSR kernels of one dtype signature, in one Warp module.

    Args:
        compute_dt: ``"float32"`` or ``"float64"``.
        index_dts: the dtypes of ``(indices, indptr, t_indices, t_indptr, perm)``.

    Returns:
        ``{"select" | "columns": csrmv kernel, "sddmm": kernel}`` (:data:`CSRMV_ORDERS`).
    """
    t = _csr_types(compute_dt, tuple(index_dts))
    return {"select": _csrmv_select(t), "columns": _csrmv_columns(t),
            "sddmm": _sddmm(t)}


# ---------------------------------------------------------------------------
# dense kernels (densemv_nonzero, dense_outer_nonzero) of one compute dtype
# ---------------------------------------------------------------------------
def _densemv(t, TRANSPOSE: bool):
    F = t.F

    # transpose: out[b, j] = sum_{i ascending, v[b, i] != 0} w[i, j] v[b, i]
    # else:      out[b, i] = sum_{j ascending, v[b, j] != 0} w[i, j] v[b, j]
    @wp.kernel(name="densemv_t" if TRANSPOSE else "densemv", **t.opts)
    def densemv(w: t.F2, v: t.F2, out: t.F2):
        b, o = wp.tid()
        acc = F(0)
        for c in range(v.shape[1]):
            x = v[b, c]
            if x != F(0):
                if TRANSPOSE:
                    acc += w[c, o] * x
                else:
                    acc += w[o, c] * x
        out[b, o] = acc

    return densemv


def _outer(t):
    F = t.F

    # g[G, i, j] = sum over b ascending of r[G, b, i] q[G, b, j] where both are nonzero, from 0
    @wp.kernel(**t.opts)
    def outer_nonzero(r: t.F3, q: t.F3, g: t.F3):
        grp, i, j = wp.tid()
        acc = F(0)
        for b in range(r.shape[1]):
            ri = r[grp, b, i]
            qj = q[grp, b, j]
            if ri != F(0) and qj != F(0):
                acc += ri * qj
        g[grp, i, j] = acc

    return outer_nonzero


@functools.lru_cache(maxsize=None)
def dense_kernels(compute_dt: str) -> dict:
    """The dense kernels of one compute dtype, in one Warp module:
    ``{("mv", transpose): kernel, "outer": kernel}``."""
    F = jaxtype_to_warptype(compute_dt)
    module = _module(f"evjax_sparse_backward_dense_{compute_dt}")
    t = SimpleNamespace(F=F, opts=dict(enable_backward=False, module=module),
                        F2=wp.array(dtype=F, ndim=2), F3=wp.array(dtype=F, ndim=3))
    return {("mv", False): _densemv(t, False), ("mv", True): _densemv(t, True), "outer": _outer(t)}


# ---------------------------------------------------------------------------
# generators (the ops' "warp" backend)
# ---------------------------------------------------------------------------
def _run(op, outs, kernel_of):
    """``op``'s kernel: ``kernel_of(compute dtype name)`` in the output's compute dtype, one thread per
    output entry."""
    (out,) = outs
    return ops.in_compute_dtype(op, out, functools.partial(_call, kernel_of, out))


def _call(kernel_of, out, dtype):
    """The kernel ``kernel_of(str(dtype))`` on a pure output of ``out``'s shape, one thread per entry."""
    with _lock:
        kernel = kernel_of(str(dtype))
    dims = tuple(int(d) for d in out.shape)
    return warp_kernel(kernel, jax.ShapeDtypeStruct(dims, dtype), launch_dims=dims)


def _dtypes(structs) -> tuple:
    return tuple(str(np.dtype(s.dtype)) for s in structs)


def csrmv_nonzero_warp(outs, ins, *, shape, transpose, sorted_rows):
    """Warp kernel generator for ``csrmv_nonzero_p``: one thread per ``(b, output)``.

    Returns:
        ``run(data, indices, indptr, t_indices, t_indptr, perm, v) -> [out]``.
    """
    order = "columns" if transpose else "select"  # a sorted row is walked in stored order
    index_dts = _dtypes(ins[1:6])
    return _run(ops.csrmv_nonzero_p, outs, lambda dt: csr_kernels(dt, index_dts)[order])


def csr_sddmm_nonzero_warp(outs, ins, *, shape):
    """Warp kernel generator for ``csr_sddmm_nonzero_p``: one thread per ``(G, synapse)``.

    Returns:
        ``run(indices, indptr, t_indices, t_indptr, perm, r, q) -> [g]``.
    """
    index_dts = _dtypes(ins[0:5])
    return _run(ops.csr_sddmm_nonzero_p, outs, lambda dt: csr_kernels(dt, index_dts)["sddmm"])


def densemv_nonzero_warp(outs, ins, *, transpose):
    """Warp kernel generator for ``densemv_nonzero_p``: one thread per ``(b, output)``.

    Returns:
        ``run(w, v) -> [out]``.
    """
    return _run(ops.densemv_nonzero_p, outs, lambda dt: dense_kernels(dt)[("mv", bool(transpose))])


def dense_outer_nonzero_warp(outs, ins):
    """Warp kernel generator for ``dense_outer_nonzero_p``: one thread per ``(G, i, j)``.

    Returns:
        ``run(r, q) -> [g]``.
    """
    return _run(ops.dense_outer_nonzero_p, outs, lambda dt: dense_kernels(dt)["outer"])


for _op, _generator in ((ops.csrmv_nonzero_p, csrmv_nonzero_warp),
                        (ops.csr_sddmm_nonzero_p, csr_sddmm_nonzero_warp),
                        (ops.densemv_nonzero_p, densemv_nonzero_warp),
                        (ops.dense_outer_nonzero_p, dense_outer_nonzero_warp)):
    _op.def_warp_kernel(_generator)

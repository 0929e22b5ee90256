"""Warp kernels of the CSR ops with weighted events (``weighted=True``), CPU and GPU.

Kernel factories of one dtype signature's types ``t`` (built by
:func:`evjax.primitives.csr.warp._types`), chosen by :data:`KERNELS` in
``warp.py`` when an op is bound with ``weighted=True``, and the two weighted
SDDMM modes' rules.  Built in their own Warp module, so code that uses spikes
only never compiles them.

Weighted events are values ``v`` of the compute dtype: only nonzero entries
contribute, each ``v * w`` (IEEE); a zero entry contributes nothing whatever
its weights hold (``wp.where``, a select, never ``0 * w``):

* gather (``W @ v``): one thread per output row (mv) or element (mm);
* scatter (``W.T @ v``): one thread per source row (mv) or (row, column) (mm);
  a zero entry returns at once, so the work follows the nonzero rows; atomics
  into an in-out buffer of zeros;
* SDDMM ``r_weighted`` (rows of zero ``r`` skipped, ``g = where(r != 0, r q, 0)``)
  and ``q_weighted`` (every row, ``g = where(q != 0, r q, 0)``).
"""
# No `from __future__ import annotations`: Warp reads the kernels' annotations as objects.

from ...backends import warp as bridge

__all__ = ["KERNELS", "sddmm_rules"]

wp = bridge.import_warp()


def _mv_gather(t):
    span, weight = t.span, t.weight

    @wp.kernel(**t.opts)
    def weighted_mv_gather(data: t.F1, indices: t.I1, indptr: t.P1, x: t.F1, out: t.F1):
        i = wp.tid()
        a, b = span(indptr, i, indices.shape[0])
        acc = t.F(0)
        for j in range(a, b):
            col = int(indices[j])
            if col >= 0 and col < x.shape[0]:
                v = x[col]
                acc += wp.where(v != t.F(0), weight(data, j) * v, t.F(0))
        out[i] = acc

    return weighted_mv_gather


def _mm_gather(t):
    span, weight = t.span, t.weight

    @wp.kernel(**t.opts)
    def weighted_mm_gather(data: t.F1, indices: t.I1, indptr: t.P1, x: t.F2, out: t.F2):
        i, c = wp.tid()
        a, b = span(indptr, i, indices.shape[0])
        acc = t.F(0)
        for j in range(a, b):
            col = int(indices[j])
            if col >= 0 and col < x.shape[0]:
                v = x[col, c]
                acc += wp.where(v != t.F(0), weight(data, j) * v, t.F(0))
        out[i, c] = acc

    return weighted_mm_gather


def _mv_scatter(t):
    span, weight = t.span, t.weight

    @wp.kernel(**t.opts)
    def weighted_mv_scatter(data: t.F1, indices: t.I1, indptr: t.P1, x: t.F1, out: t.F1):
        i = wp.tid()
        v = x[i]
        if v != t.F(0):  # zero rows cost nothing, whatever their weights hold
            a, b = span(indptr, i, indices.shape[0])
            for j in range(a, b):
                col = int(indices[j])
                if col >= 0 and col < out.shape[0]:
                    wp.atomic_add(out, col, weight(data, j) * v)

    return weighted_mv_scatter


def _mm_scatter(t):
    span, weight = t.span, t.weight

    @wp.kernel(**t.opts)
    def weighted_mm_scatter(data: t.F1, indices: t.I1, indptr: t.P1, x: t.F2, out: t.F2):
        i, c = wp.tid()
        v = x[i, c]
        if v != t.F(0):
            a, b = span(indptr, i, indices.shape[0])
            for j in range(a, b):
                col = int(indices[j])
                if col >= 0 and col < out.shape[0]:
                    wp.atomic_add(out, col, c, weight(data, j) * v)

    return weighted_mm_scatter


# (kind, transpose) -> kernel factory; kind "mv" (vector) or "mm" (matrix)
KERNELS = {
    ("mv", False): _mv_gather,
    ("mv", True): _mv_scatter,
    ("mm", False): _mm_gather,
    ("mm", True): _mm_scatter,
}


def sddmm_rules(t, mode: str):
    """``visits(r_i)`` and ``term(r, q)`` of a weighted SDDMM mode (both operands of type ``t.F``).

    ``r_weighted``: a zero ``r`` selects 0 and its rows are skipped;
    ``q_weighted``: a zero ``q`` selects 0, every row is visited (``0 * inf`` is nan).
    """
    if mode == "r_weighted":
        @wp.func(module=t.module)
        def visits(r: t.F):
            return r != t.F(0)

        @wp.func(module=t.module)
        def term(r: t.F, q: t.F):
            return wp.where(r != t.F(0), r * q, t.F(0))
    else:
        @wp.func(module=t.module)
        def visits(r: t.F):
            return True

        @wp.func(module=t.module)
        def term(r: t.F, q: t.F):
            return wp.where(q != t.F(0), r * q, t.F(0))
    return visits, term

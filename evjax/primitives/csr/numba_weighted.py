"""Numba CPU kernels of the CSR ops with weighted events (``weighted=True``).

Chosen by :mod:`evjax.primitives.csr.numba` from :data:`KERNELS` and
:data:`SDDMM_KERNELS` when an op is bound with ``weighted=True`` (what
:class:`evjax.WeightedArray` dispatches to), so the binary kernels keep their
code and a user of spikes only never compiles these.

Weighted events are values ``v`` of the weights' compute dtype.  Only the
nonzero entries are visited; each contributes ``v * w`` (IEEE, ``inf * w`` is
inf or nan as arithmetic says), and a zero entry contributes nothing whatever
its weights hold (a select, never ``0 * w``):

* gather (``y = A @ v``): ``y_i = sum_{k in row i} where(v_j != 0, w_k v_j, 0)``;
* scatter (``y = A.T @ v``): only rows with ``v_i != 0`` are read, so the cost
  follows the synapses of the nonzero rows, as for spikes;
* the weight gradient ``g_k = where(e != 0, r_i q_j, 0)`` with ``e`` the
  weighted operand: ``r`` (the scatter orientation, rows of all-zero ``r``
  skipped and zero-filled in runs) or ``q`` (every row: ``r_i = 0`` meets
  ``q_j = inf`` by IEEE).  The SDDMM kernels take ``r`` and ``q`` as matrices
  (``(n, k)``; a vector is passed as ``(n, 1)``).

Parallel above the work thresholds of ``numba_rows``, like the binary kernels;
malformed structures are clamped the same way (spans to ``[0, nnz]``, columns
outside the matrix ignored).  Every kernel takes the thread count first (see numba.py).
"""
from __future__ import annotations

import numba
import numpy as np
from numba import prange

from .numba_rows import (
    _PARALLEL,
    PARALLEL_MIN_WORK,
    _balanced_rows,
    _batch_scatter_serial,
    _column,
    _scatter_row,
    _sddmm_serial,
    _span,
    _split_scatter,
    _vector_scatter_parts,
    _zero,
    _zero_of,
)
from ...backends.threads import part_done, pool_chunks, region_done, start_region

__all__ = ["KERNELS", "SDDMM_KERNELS"]


# ---------------------------------------------------------------------------
# row loops (inlined)
# ---------------------------------------------------------------------------
@numba.njit(cache=True, nogil=True, inline="always")
def _gather_row(data, indices, a, b, v, homogeneous, zero):
    """``sum_{k in [a, b)} where(v[j_k] != 0, data[k] * v[j_k], 0)``."""
    n = np.uint64(v.shape[0])
    acc = zero
    for k in range(a, b):
        j = _column(indices, k)
        if j < n:
            vj = v[j]
            if vj != 0:  # a zero event hides its weight (nan, inf)
                acc += (data[0] if homogeneous else data[k]) * vj
    return acc


@numba.njit(cache=True, nogil=True, inline="always")
def _gather_rows_mm(data, indices, indptr, v, out, lo, hi, homogeneous):
    """Rows ``[lo, hi)`` of ``out[i, c] = sum_k where(v[j_k, c] != 0, data[k] * v[j_k, c], 0)``."""
    n = np.uint64(v.shape[0])
    width = v.shape[1]
    nnz = indices.shape[0]
    zero = _zero_of(out)
    for i in range(lo, hi):
        row = out[i]
        _zero(row, 0, width)
        a, b = _span(indptr, i, nnz)
        for k in range(a, b):
            j = _column(indices, k)
            if j < n:
                vj = v[j]
                w = data[0] if homogeneous else data[k]
                for c in range(width):
                    row[c] += w * vj[c] if vj[c] != 0 else zero  # a select: vectorisable


@numba.njit(cache=True, nogil=True, inline="always")
def _scatter_rows(data, indices, indptr, v, target, lo, hi, homogeneous):
    """``target[j_k] += data[k] * v[i]`` for the rows ``i`` in ``[lo, hi)`` with ``v[i] != 0``."""
    for i in range(lo, hi):
        s = v[i]
        if s != 0:  # zero rows cost nothing, whatever their weights hold
            _scatter_row(data, indices, indptr, i, s, target, homogeneous)


@numba.njit(cache=True, nogil=True)
def _scatter_part(data, indices, indptr, v, out, private, bounds, part, homogeneous):
    """Part ``part`` of a split weighted scatter (see ``numba_rows._split_scatter``)."""
    target = out if part == 0 else private[part - 1]
    _scatter_rows(data, indices, indptr, v, target, bounds[part], bounds[part + 1], homogeneous)


@numba.njit(cache=True, nogil=True, inline="always")
def _nonzero_work(indptr, v):
    """Synapses of the rows with ``v != 0`` (unclamped: only used to decide on threads)."""
    work = 0
    for i in range(v.shape[0]):
        if v[i] != 0:
            work += np.int64(indptr[i + 1]) - np.int64(indptr[i])
    return work


# ---------------------------------------------------------------------------
# kernels: y = A @ v (gather) and y = A.T @ v (scatter), vector and batch
# ---------------------------------------------------------------------------
@numba.njit(parallel=_PARALLEL, cache=True, nogil=True)
def weighted_gather_mv(threads, data, indices, indptr, v, out):
    """``out[i] = sum_{k in row i} where(v[j_k] != 0, data[k] * v[j_k], 0)``."""
    zero = _zero_of(out)
    n_rows = out.shape[0]
    nnz = indices.shape[0]
    homogeneous = data.shape[0] != nnz
    if threads < 2 or nnz < PARALLEL_MIN_WORK:
        for i in range(n_rows):
            a, b = _span(indptr, i, nnz)
            out[i] = _gather_row(data, indices, a, b, v, homogeneous, zero)
        return
    bounds = _balanced_rows(indptr, n_rows, nnz, threads)
    ends, t0 = start_region(threads)
    for t in prange(threads):
        for i in range(bounds[t], bounds[t + 1]):
            a, b = _span(indptr, i, nnz)
            out[i] = _gather_row(data, indices, a, b, v, homogeneous, zero)
        part_done(ends, t)
    region_done(ends, t0)


@numba.njit(parallel=_PARALLEL, cache=True, nogil=True)
def weighted_scatter_mv(threads, data, indices, indptr, v, out):
    """``out[j] = sum_{i: v[i] != 0} v[i] * sum_{k in row i, j_k = j} data[k]``; zero rows skipped.

    Split over row ranges of equal synapse count, each part into its own copy
    of ``out`` (summed at the end in part order), when the nonzero rows hold
    enough work (see ``numba_rows._split_scatter``).
    """
    n_rows = v.shape[0]
    n = out.shape[0]
    nnz = indices.shape[0]
    homogeneous = data.shape[0] != nnz
    _zero(out, 0, n)
    parts = _vector_scatter_parts(_nonzero_work(indptr, v), n) if pool_chunks() > 1 else 1
    if parts == 1:
        _scatter_rows(data, indices, indptr, v, out, 0, n_rows, homogeneous)
        return
    bounds = _balanced_rows(indptr, n_rows, nnz, parts)
    _split_scatter(threads, bounds, _scatter_part, data, indices, indptr, v, out, homogeneous)


@numba.njit(parallel=_PARALLEL, cache=True, nogil=True)
def weighted_gather_mm(threads, data, indices, indptr, v, out):
    """``out[i, :] = sum_{k in row i} where(v[j_k, :] != 0, data[k] * v[j_k, :], 0)``; v (n_cols, K)."""
    n_rows = out.shape[0]
    nnz = indices.shape[0]
    homogeneous = data.shape[0] != nnz
    if threads < 2 or nnz * max(v.shape[1], 1) < PARALLEL_MIN_WORK:
        _gather_rows_mm(data, indices, indptr, v, out, 0, n_rows, homogeneous)
        return
    bounds = _balanced_rows(indptr, n_rows, nnz, threads)
    ends, t0 = start_region(threads)
    for t in prange(threads):
        _gather_rows_mm(data, indices, indptr, v, out, bounds[t], bounds[t + 1], homogeneous)
        part_done(ends, t)
    region_done(ends, t0)


@numba.njit(cache=True, nogil=True, inline="always")
def _scatter_samples(data, indices, indptr, vt, out_t, lo, hi, homogeneous):
    for c in range(lo, hi):
        row = out_t[c]
        _zero(row, 0, row.shape[0])
        _scatter_rows(data, indices, indptr, vt[c], row, 0, vt.shape[1], homogeneous)


@numba.njit(parallel=_PARALLEL, cache=True, nogil=True)
def weighted_scatter_mm_batch_major(threads, data, indices, indptr, vt, out_t):
    """``out_t[c] = A.T @ vt[c]`` for each sample ``c`` (zero rows skipped); vt (K, n_rows)."""
    width = vt.shape[0]
    nnz = indices.shape[0]
    homogeneous = data.shape[0] != nnz
    if 1 < width < pool_chunks():  # few samples: split inside each one (the pool size decides: same bits)
        for c in range(width):
            weighted_scatter_mv(threads, data, indices, indptr, vt[c], out_t[c])
        return
    work = 0
    if threads > 1:
        for c in range(width):
            work += _nonzero_work(indptr, vt[c])
    if threads < 2 or _batch_scatter_serial(work, out_t.size):
        _scatter_samples(data, indices, indptr, vt, out_t, 0, width, homogeneous)
        return
    ends, t0 = start_region(threads)
    for t in prange(threads):
        _scatter_samples(data, indices, indptr, vt, out_t, (width * t) // threads, (width * (t + 1)) // threads,
                         homogeneous)
        part_done(ends, t)
    region_done(ends, t0)


# ---------------------------------------------------------------------------
# kernels: g[k] = sum_c where(e != 0, r[i, c] * q[j, c], 0), e = r (or q) [., c]
# ---------------------------------------------------------------------------
@numba.njit(cache=True, nogil=True, inline="always")
def _any_nonzero(u):
    for c in range(u.shape[0]):
        if u[c] != 0:
            return True
    return False


@numba.njit(cache=True, nogil=True, inline="always")
def _sddmm_rows(indices, indptr, r, q, g, lo, hi, r_selects):
    """Rows ``[lo, hi)`` of the weighted SDDMM; ``r_selects`` (a constant of the calling kernel):
    r holds the events and all-zero rows of r are skipped (zero-filled in runs), else q does."""
    n = np.uint64(q.shape[0])
    width = r.shape[1]
    nnz = indices.shape[0]
    zero = _zero_of(g)
    zero_from, _ = _span(indptr, lo, nnz)
    for i in range(lo, hi):
        ri = r[i]
        if not r_selects or _any_nonzero(ri):
            a, b = _span(indptr, i, nnz)
            if a > zero_from:
                _zero(g, zero_from, a)
            for k in range(a, b):
                j = _column(indices, k)
                acc = zero
                if j < n:
                    qj = q[j]
                    for c in range(width):
                        e = ri[c] if r_selects else qj[c]
                        acc += ri[c] * qj[c] if e != 0 else zero
                g[k] = acc
            zero_from = max(zero_from, b)
    _, end = _span(indptr, hi - 1, nnz)
    if end > zero_from:
        _zero(g, zero_from, end)


@numba.njit(cache=True, nogil=True)
def _sddmm_parts(threads, indices, indptr, n_rows, width, g):
    """Zero g if the structure leaves holes; the row boundaries of the parallel parts (one part
    unless the entries to compute, at most ``nnz * width``, are many: see ``_sddmm_serial``)."""
    nnz = indices.shape[0]
    if n_rows == 0 or indptr[0] != 0 or indptr[n_rows] != nnz:
        _zero(g, 0, nnz)  # malformed (or no rows): some entries may belong to no row
    parts = 1 if threads < 2 or _sddmm_serial(nnz * width, nnz) else threads
    return _balanced_rows(indptr, n_rows, nnz, parts)


@numba.njit(parallel=_PARALLEL, cache=True, nogil=True)
def sddmm_r_weighted(threads, indices, indptr, r, q, g):
    """``g[k] = sum_c where(r[i, c] != 0, r[i, c] * q[j, c], 0)``; all-zero rows of r skipped."""
    bounds = _sddmm_parts(threads, indices, indptr, r.shape[0], max(r.shape[1], 1), g)
    if bounds.shape[0] == 2:
        if r.shape[0]:
            _sddmm_rows(indices, indptr, r, q, g, 0, r.shape[0], True)
        return
    ends, t0 = start_region(bounds.shape[0] - 1)
    for t in prange(bounds.shape[0] - 1):
        if bounds[t + 1] > bounds[t]:
            _sddmm_rows(indices, indptr, r, q, g, bounds[t], bounds[t + 1], True)
        part_done(ends, t)
    region_done(ends, t0)


@numba.njit(parallel=_PARALLEL, cache=True, nogil=True)
def sddmm_q_weighted(threads, indices, indptr, r, q, g):
    """``g[k] = sum_c where(q[j, c] != 0, r[i, c] * q[j, c], 0)``, every row (IEEE where q selects)."""
    bounds = _sddmm_parts(threads, indices, indptr, r.shape[0], max(r.shape[1], 1), g)
    if bounds.shape[0] == 2:
        if r.shape[0]:
            _sddmm_rows(indices, indptr, r, q, g, 0, r.shape[0], False)
        return
    ends, t0 = start_region(bounds.shape[0] - 1)
    for t in prange(bounds.shape[0] - 1):
        if bounds[t + 1] > bounds[t]:
            _sddmm_rows(indices, indptr, r, q, g, bounds[t], bounds[t + 1], False)
        part_done(ends, t)
    region_done(ends, t0)


# (batched, transpose) -> kernel
KERNELS = {
    (False, False): weighted_gather_mv,
    (False, True): weighted_scatter_mv,
    (True, False): weighted_gather_mm,
    (True, True): weighted_scatter_mm_batch_major,
}
# sddmm mode (ops.sddmm_mode) -> kernel; r and q as (n, k) matrices
SDDMM_KERNELS = {"r_weighted": sddmm_r_weighted, "q_weighted": sddmm_q_weighted}

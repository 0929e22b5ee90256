"""Numba CPU backend of the CSR operators in :mod:`evjax.primitives.csr.ops`.

Imported (through the family's ``BACKEND_LOADERS``) the first time its ops lower with ``backend="numba"``; it
registers its generators on them (the ops never import this module).

The kernels are module-level ``@numba.njit(cache=True)`` entry points, one
line each, over a few drivers (``@numba.njit(parallel=...)``, ``prange`` loops
only, see ``_PARALLEL``) that split the rows into parts and run the shared row
loops of ``numba_rows`` on them, serially or in parallel.  Numba compiles each
once per dtype/rank signature and keeps the machine code on disk; the XLA FFI handlers around them (see
:mod:`evjax.backends.numba_cpu`) are cached the same way.  Shapes are read from
the buffers at run time, so one compiled kernel serves every shape.
The row loops they call live in :mod:`evjax.primitives.csr.numba_rows`.

Orientation of the stored matrix ``A`` (``n_rows x n_cols``):

* gather (``transpose=False``, ``y = A @ x``): each output row reads its own
  synapses; parallel over rows, with row chunks balanced by synapse count.
* scatter (``transpose=True``, ``y = A.T @ x``): for events, silent rows are
  skipped, so the cost follows the synapses of active rows, not ``nnz``, and
  the rows to visit are found a few visits ahead and their first synapses
  prefetched (``numba_rows.SCATTER_LOOKAHEAD``); for
  values every row is visited, ``x[i] == 0`` included (IEEE).  A
  vector is split into per-thread row ranges of equal active work, each thread
  accumulating into a private copy of ``y`` that is summed at the end; a batch
  is processed sample by sample in parallel, batch-major (the transposes that
  this needs around the call cancel with the caller's ``spikes (K, n) @ W``
  under XLA's algebraic simplifier, see :func:`_matmul_generator`).
* the weight gradient (SDDMM, ``g[k] = <r[row k], q[indices[k]]>``): where an
  operand is events it skips the rows where ``r`` is zero and zero-fills their
  entries in runs, so for events in the scatter orientation only active rows
  are computed; two float operands give the IEEE product on every row.

NaN and inf follow ``docs/semantics.md``: an event selects its weights (a
silent one contributes nothing, whatever they hold), a value multiplies them
(IEEE), and a weighted event (``weighted=True``: values that select) does
both: a zero entry contributes nothing, a nonzero one ``v * w``.  Which
operand selects is the ``selects`` flag of the row loops: events by their
dtype, weighted events by their kernel (``weighted_*``).

Below ``PARALLEL_MIN_WORK`` synapses (for the weight gradient
``SDDMM_PARALLEL_MIN_COST``, computed entries plus a quarter of all; for a
vector scatter ``VECTOR_SCATTER_PARALLEL_MIN_WORK`` and
``VECTOR_SCATTER_WORK_PER_OUTPUT`` synapses per output; for a batch scatter
``BATCH_SCATTER_PARALLEL_MIN_COST``, synapses plus a quarter of the outputs)
a kernel runs on the calling thread; a ``prange`` is never entered for a
single part.  The
thresholds live in ``numba_rows`` (an edit there rebuilds the cached kernels:
see :func:`evjax._kernel_compat.stamp_kernel_caches`).

Every kernel tolerates a malformed structure passed under ``jit`` (where it
cannot be validated): row spans are clamped to ``[0, nnz]`` and column indices
outside ``[0, n_cols)`` are ignored, so nothing is read or written out of
bounds.

Low-precision weights (float16, bfloat16) are converted to float32 around the
call and the op rounds the result back to the weight dtype.  Gathers
accumulate in the compute dtype (float32 or float64) with four independent
partial sums, dot products of batches in float64.  Bool events reach the
kernels as their uint8 bytes (the handler reads the buffer so).  Every kernel takes the thread count first: its handler
passes the one in force at each call (:mod:`evjax.backends.threads`).
"""
from __future__ import annotations

import jax.numpy as jnp
import numba
import numpy as np
from numba import prange

from ..._kernel_compat import COMPILED_CODE_ONLY, heap_array_intrinsics
from ...backends import numba_cpu
from ...backends.threads import add_parts, part_done, pool_chunks, region_done, start_region
from ...dtypes import compute_dtype
from ..._event_values import as_bool_events
from . import ops
from .numba_rows import (  # the row loops the drivers run, and the parallel thresholds
    _PARALLEL,
    PARALLEL_MIN_WORK,
    _active_work,
    _balanced_rows,
    _batch_scatter_serial,
    _count_visited,
    _any,
    _dot,
    _gather_rows,
    _gathered_values,
    _listed_work,
    _scatter_listed_part,
    _scatter_part,
    _scatter_rows,
    _scatter_samples,
    _sddmm_rows,
    _sddmm_serial,
    _selects,
    _split_active_work,
    _split_listed_work,
    _vector_scatter_parts,
    VECTOR_SCATTER_PARALLEL_MIN_WORK,
    VECTOR_SCATTER_WORK_PER_OUTPUT,
    _width,
    _zero,
)

__all__ = [
    "csrmv_generator",
    "csrmm_generator",
    "binary_csrmv_generator",
    "binary_csrmm_generator",
    "binary_csrmv_active_generator",
    "sddmm_generator",
]

I0 = np.int64(0)
heap_array, free_array = heap_array_intrinsics()  # a serial tier's scratch (no np.empty: a cheaper compile)


# ---------------------------------------------------------------------------
# serial parts: what a kernel does where it runs on one thread in one part
#
# Each returns what a serial tier returns (evjax.backends.numba_cpu: DONE,
# SPLITTABLE, DECLINED).  A kernel's driver calls its serial part first, with
# ``tier=False`` (decline whatever it would split), and goes on only where it
# was declined; a kernel's later serial tiers (``SERIAL_TIERS``) are the same
# function alone, with ``tier=True`` (also do the work the kernel would split
# across threads, where that gives the same bits).  Such a tier compiles in a
# fraction of the kernel's time and, running the same code, gives the same
# bits.  The first tiers of the vector scatter and weight gradient are plainer
# still (``_plain_*``, ``serial_sddmm_mv``): the same sums as plain loops, for
# the cheapest first compile; tests/test_serial_tiers.py proves their bits.
# ---------------------------------------------------------------------------
DONE, SPLITTABLE, DECLINED = numba_cpu.DONE, numba_cpu.SPLITTABLE, numba_cpu.DECLINED


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _serial_gather(threads, data, indices, indptr, x, out, selects, tier):
    """``out = A @ x`` on this thread; splittable (rows in parts, each row one part's own sum: the
    same bits) from ``PARALLEL_MIN_WORK`` synapses on several threads."""
    split = threads >= 2 and indices.shape[0] * max(_width(x), 1) >= PARALLEL_MIN_WORK
    if split and not tier:
        return DECLINED
    _gather_rows(data, indices, indptr, x, out, I0, np.int64(out.shape[0]), selects)
    return SPLITTABLE if split else DONE


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _rows_to_visit(x, ids, count):
    """The rows of a vector scatter's loop: ``len(x)``, or the listed count ``count[0]`` clamped to
    ``[0, len(ids)]`` (as :func:`numba_rows._listed_count`)."""
    if ids is None:
        return np.int64(x.shape[0])
    return min(max(np.int64(count[0]), I0), np.int64(ids.shape[0]))


@numba.njit(cache=True, nogil=True, inline="always", **COMPILED_CODE_ONLY)
def _one_pass_kept(indices, indptr, x, rows, n_out, count_active):
    """Whether a vector scatter of ``rows`` visited rows stays in one pass: a pool of one, or the first
    estimate of its work (the visited rows, the nonzero ones of ``x[:rows]`` where ``count_active``, at
    twice the mean row length) below the thresholds of :func:`_vector_scatter_parts`.  The one rule of
    the one-pass tiers and :func:`_one_pass_scatter` (their bits agree only where it does).  Inlined
    (Numba IR): no compile of its own."""
    if pool_chunks() < 2:
        return True
    visited = rows
    if count_active:  # (as _count_visited)
        visited = 0
        for i in range(rows):
            visited += x[i] != 0
    n_rows = np.int64(indptr.shape[0] - 1)
    estimate = 2 * visited * (np.int64(indices.shape[0]) // (n_rows if n_rows > 1 else 1))
    return estimate < VECTOR_SCATTER_PARALLEL_MIN_WORK or estimate < VECTOR_SCATTER_WORK_PER_OUTPUT * n_out


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _one_pass_scatter(threads, data, indices, indptr, x, out, selects, ids, count):
    """``out = A.T @ x`` for a vector ``x`` (or the listed rows ``ids[:count]``) in one pass, where the
    first estimate of the work (the visited rows at twice the mean row length) keeps the sum in one
    part (:func:`_vector_scatter_parts`; always with a pool of one): DONE; else DECLINED, nothing
    written.  The estimate (:func:`_one_pass_kept`) is inlined and the zero-fill written out here, not
    called: each called function costs a first call a compile of its own."""
    n = out.shape[0]
    rows = _rows_to_visit(x, ids, count)
    if not _one_pass_kept(indices, indptr, x, rows, n, ids is None and selects):
        return DECLINED
    for j in range(n):
        out[j] = 0
    _scatter_rows(data, indices, indptr, x, out, I0, rows, selects, ids)
    return DONE


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _serial_scatter(threads, data, indices, indptr, x, out, selects, ids, count, tier):
    """``out = A.T @ x`` for a vector ``x`` (or the listed rows ``ids[:count]``) on this thread: in one
    pass (:func:`_one_pass_scatter`), or, from the exact work, in the parts
    :func:`_vector_scatter_parts` gives (Numba's pool size at most), one after the other, each into
    its own copy of ``out``, summed in part order: the bits of the parallel run (SPLITTABLE on
    several threads).  Without ``tier`` such a call on several threads is DECLINED before anything
    is written: the driver runs the parts on the pool."""
    if _one_pass_scatter(threads, data, indices, indptr, x, out, selects, ids, count) == DONE:
        return DONE
    if threads >= 2 and not tier:
        return DECLINED
    bounds, private = _scatter_plan(indptr, x, out, selects, ids, count)
    parts = bounds.shape[0] - 1
    for t in range(parts):
        _scatter_rows(data, indices, indptr, x, out if t == 0 else private[t - 1], bounds[t], bounds[t + 1],
                      selects, ids)
    if parts == 1:
        return DONE
    add_parts(out, private, I0, np.int64(out.shape[0]))
    return SPLITTABLE if threads >= 2 else DONE


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _scatter_plan(indptr, x, out, selects, ids, count):
    """The parts of a vector scatter (``x``, or the listed rows ``ids[:count]``), with ``out`` zeroed:
    their bounds (``parts + 1`` row indices, or positions in ``ids``) from the exact work, the synapses
    of the visited rows (:func:`_vector_scatter_parts`), and a zeroed private copy of ``out`` for each
    part after the first.  The serial tier runs these parts in turn, the driver on the pool: the same
    parts, summed in part order, so the same bits."""
    n = out.shape[0]
    rows = _rows_to_visit(x, ids, count)
    _zero(out, I0, np.int64(n))
    if ids is None:
        work = _active_work(indptr, x, selects)
    else:
        work = _listed_work(indptr, ids, rows)
    parts = _vector_scatter_parts(work, n)
    if parts == 1:
        bounds = np.empty(2, np.int64)
        bounds[0] = 0
        bounds[1] = rows
    elif ids is None:
        bounds = _split_active_work(indptr, x, work, parts, selects)
    else:
        bounds = _split_listed_work(indptr, ids, rows, work, parts)
    return bounds, np.zeros((parts - 1, n), out.dtype)


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _serial_sddmm(threads, indices, indptr, r, q, g, r_selects, q_selects, tier):
    """The weight gradient on this thread; splittable (rows in parts: each entry is one product,
    the same bits) on several threads where the computed entries plus a quarter of all are many
    (``_sddmm_serial``).  Where rows may be skipped (``r`` selects, or ``q`` is events) the
    all-zero rows of ``r`` are zero-filled, not computed."""
    n_rows = r.shape[0]
    nnz = indices.shape[0]
    split = False
    if threads >= 2:
        active = n_rows
        if r_selects or _selects(q):
            active = 0
            for i in range(n_rows):
                active += _any(r[i])
        split = not _sddmm_serial(active * (nnz // max(n_rows, 1)) * max(_width(r), 1), nnz)
    if split and not tier:
        return DECLINED
    if n_rows == 0 or indptr[0] != 0 or indptr[n_rows] != nnz:
        _zero(g, I0, np.int64(nnz))  # malformed (or no rows): some entries may belong to no row
    if n_rows:
        _sddmm_rows(indices, indptr, r, q, g, I0, np.int64(n_rows), r_selects, q_selects)
    return SPLITTABLE if split else DONE


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _serial_samples(threads, data, indices, indptr, xt, out_t, selects, tier):
    """``out_t[c] = A.T @ xt[c]`` for every sample ``c`` (batch-major), each whole and one after the
    other on this thread; splittable (the samples divided whole between threads: each sample's sum is
    the same, so the same bits) on several threads from ``BATCH_SCATTER_PARALLEL_MIN_COST``."""
    width = xt.shape[0]
    split = False
    if threads > 1:
        visited = 0
        for c in range(width):
            visited += _count_visited(xt[c], selects)
        n_rows = np.int64(xt.shape[1])
        split = not _batch_scatter_serial(visited * (indices.shape[0] // max(n_rows, 1)), out_t.size)  # synapses, about
    if split and not tier:
        return DECLINED
    _scatter_samples(data, indices, indptr, xt, out_t, I0, np.int64(width), selects)
    return SPLITTABLE if split else DONE


# ---------------------------------------------------------------------------
# drivers: split the rows into parts, run the row loops serially or in parallel
#
# Each parallel region is a small function of its own (``*_parallel``): Numba's
# parallel passes then analyse only its few lines, not the whole driver.
# ---------------------------------------------------------------------------
@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _gather(threads, data, indices, indptr, x, out, selects):
    """``out = A @ x`` (x a vector or a row-major (n_cols, K) batch): rows in parts of equal synapse
    count, one per thread, above ``PARALLEL_MIN_WORK``; every output row is one part's own sum."""
    n_rows = out.shape[0]
    nnz = indices.shape[0]
    values = _gathered_values(x, out)  # (once, for either path)
    if _serial_gather(threads, data, indices, indptr, values, out, selects, False) != DECLINED:
        return
    _gather_parallel(data, indices, indptr, values, out, _balanced_rows(indptr, n_rows, nnz, threads), selects)


@numba.njit(parallel=_PARALLEL, cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _gather_parallel(data, indices, indptr, x, out, bounds, selects):
    """The row parts ``bounds`` of a gather on the pool (a parallel region of its own)."""
    parts = bounds.shape[0] - 1
    ends, t0 = start_region(parts)
    for t in prange(parts):
        _gather_rows(data, indices, indptr, x, out, bounds[t], bounds[t + 1], selects)
        part_done(ends, t)
    region_done(ends, t0)


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _scatter_vector(threads, data, indices, indptr, x, out, selects):
    """``out = A.T @ x`` for a vector: one pass below the thresholds; above, row ranges of equal
    active work, each into its own copy of ``out``, summed in part order per output.

    The parts depend on the inputs and Numba's pool size only, never on the threads that run
    them: one thread runs the same parts in turn, so the sum is the same bits either way.
    """
    # on this thread: one pass, or the parts in turn on one thread (see _serial_scatter)
    if _serial_scatter(threads, data, indices, indptr, x, out, selects, None, 0, False) != DECLINED:
        return
    bounds, private = _scatter_plan(indptr, x, out, selects, None, 0)
    if bounds.shape[0] == 2:
        _scatter_rows(data, indices, indptr, x, out, bounds[0], bounds[1], selects)
        return
    _scatter_parts_parallel(data, indices, indptr, x, out, private, bounds, selects)


@numba.njit(parallel=_PARALLEL, cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _scatter_parts_parallel(data, indices, indptr, x, out, private, bounds, selects):
    """The parts of a split vector scatter on the pool (a parallel region of its own: Numba's parallel
    passes see only these lines), then their sum, each output's terms in part order."""
    parts = bounds.shape[0] - 1
    ends, t0 = start_region(parts)
    for t in prange(parts):
        _scatter_part(data, indices, indptr, x, out, private, bounds, np.int64(t), selects)
        part_done(ends, t)
    region_done(ends, t0)
    _add_parts_parallel(out, private)


@numba.njit(parallel=_PARALLEL, cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _add_parts_parallel(out, private):
    """``out += private[0] + private[1] + ...`` on the pool, each output's terms in part order, the
    outputs split into as many ranges as there are parts (a parallel region of its own)."""
    parts = private.shape[0] + 1
    n = out.shape[0]
    ends, t0 = start_region(parts)
    for t in prange(parts):
        add_parts(out, private, np.int64((n * t) // parts), np.int64((n * (t + 1)) // parts))
        part_done(ends, t)
    region_done(ends, t0)


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _scatter_active(threads, data, indices, indptr, ids, count, out):
    """``out = A.T @ e`` for events ``e`` given as the list of their active rows ``ids[:count]``:
    :func:`_scatter_vector` with the list in place of the scan over ``e``, the same estimate, the
    same parts (of the same rows) and the same sums, so the same bits."""
    if _serial_scatter(threads, data, indices, indptr, ids, out, True, ids, count, False) != DECLINED:
        return
    bounds, private = _scatter_plan(indptr, ids, out, True, ids, count)
    if bounds.shape[0] == 2:
        _scatter_rows(data, indices, indptr, ids, out, bounds[0], bounds[1], True, ids)
        return
    _scatter_listed_parallel(data, indices, indptr, ids, out, private, bounds)


@numba.njit(parallel=_PARALLEL, cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _scatter_listed_parallel(data, indices, indptr, ids, out, private, bounds):
    """The parts of a split listed scatter on the pool, then their sum (as :func:`_scatter_parts_parallel`)."""
    parts = bounds.shape[0] - 1
    ends, t0 = start_region(parts)
    for t in prange(parts):
        _scatter_listed_part(data, indices, indptr, ids, out, private, bounds, np.int64(t))
        part_done(ends, t)
    region_done(ends, t0)
    _add_parts_parallel(out, private)


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _scatter_batch(threads, data, indices, indptr, xt, out_t, selects):
    """``out_t[c] = A.T @ xt[c]`` for each sample ``c`` (batch-major): few samples (fewer than the
    pool) are each split as a vector; more are divided between threads whole, above
    ``BATCH_SCATTER_PARALLEL_MIN_COST``."""
    width = xt.shape[0]
    if 1 < width < pool_chunks():  # the pool size decides: same bits on any thread count
        for c in range(width):
            _scatter_vector(threads, data, indices, indptr, xt[c], out_t[c], selects)
        return
    if _serial_samples(threads, data, indices, indptr, xt, out_t, selects, False) != DECLINED:
        return
    _scatter_samples_parallel(threads, data, indices, indptr, xt, out_t, selects)


@numba.njit(parallel=_PARALLEL, cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _scatter_samples_parallel(threads, data, indices, indptr, xt, out_t, selects):
    """The samples of a batch scatter divided whole between ``threads`` threads (a parallel region
    of its own)."""
    width = xt.shape[0]
    ends, t0 = start_region(threads)
    for t in prange(threads):
        _scatter_samples(data, indices, indptr, xt, out_t, np.int64((width * t) // threads),
                         np.int64((width * (t + 1)) // threads), selects)
        part_done(ends, t)
    region_done(ends, t0)


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _sddmm(threads, indices, indptr, r, q, g, r_selects, q_selects):
    """``g[k] = <r[row k], q[indices[k]]>`` (vectors or row-major matrices); where rows may be
    skipped (``r`` selects, or ``q`` is events) the all-zero rows of ``r`` are zero-filled, not
    computed.  Parallel over rows of equal synapse count when the computed entries plus a
    quarter of all are many (``_sddmm_serial``)."""
    n_rows = r.shape[0]
    nnz = indices.shape[0]
    if _serial_sddmm(threads, indices, indptr, r, q, g, r_selects, q_selects, False) != DECLINED:
        return
    if indptr[0] != 0 or indptr[n_rows] != nnz:
        _zero(g, I0, np.int64(nnz))  # malformed: some entries may belong to no row
    bounds = _balanced_rows(indptr, n_rows, nnz, threads)
    _sddmm_parallel(indices, indptr, r, q, g, bounds, r_selects, q_selects)


@numba.njit(parallel=_PARALLEL, cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _sddmm_parallel(indices, indptr, r, q, g, bounds, r_selects, q_selects):
    """The row parts ``bounds`` of a weight gradient on the pool (a parallel region of its own)."""
    parts = bounds.shape[0] - 1
    ends, t0 = start_region(parts)
    for t in prange(parts):
        if bounds[t + 1] > bounds[t]:
            _sddmm_rows(indices, indptr, r, q, g, bounds[t], bounds[t + 1], r_selects, q_selects)
        part_done(ends, t)
    region_done(ends, t0)


# ---------------------------------------------------------------------------
# kernels (what the handlers call): events select by their dtype, weighted events by name
# ---------------------------------------------------------------------------
@numba.njit(cache=True, nogil=True)
def gather_mv(threads, data, indices, indptr, x, out):
    """``out[i] = sum_{k in row i} data[k] * x[indices[k]]``; x values or events (uint8)."""
    _gather(threads, data, indices, indptr, x, out, _selects(x))


@numba.njit(cache=True, nogil=True)
def gather_mm(threads, data, indices, indptr, x, out):
    """``out[i, :] = sum_{k in row i} data[k] * x[indices[k], :]``; x (n_cols, K) row-major."""
    _gather(threads, data, indices, indptr, x, out, _selects(x))


@numba.njit(cache=True, nogil=True)
def scatter_mv(threads, data, indices, indptr, x, out):
    """``out[j] = sum_i x[i] * sum_{k in row i, indices[k] = j} data[k]``, silent events skipped."""
    _scatter_vector(threads, data, indices, indptr, x, out, _selects(x))


@numba.njit(cache=True, nogil=True)
def scatter_active_mv(threads, data, indices, indptr, ids, count, out):
    """``out[j] = sum_{a < count} sum_{k in row ids[a], indices[k] = j} data[k]``: the listed rows only."""
    _scatter_active(threads, data, indices, indptr, ids, count, out)


@numba.njit(cache=True, nogil=True)
def scatter_mm_batch_major(threads, data, indices, indptr, xt, out_t):
    """``out_t[c] = A.T @ xt[c]`` for each sample ``c``; xt (K, n_rows), out_t (K, n_cols)."""
    _scatter_batch(threads, data, indices, indptr, xt, out_t, _selects(xt))


@numba.njit(cache=True, nogil=True)
def weighted_gather_mv(threads, data, indices, indptr, v, out):
    """``out[i] = sum_{k in row i} where(v[j_k] != 0, data[k] * v[j_k], 0)``."""
    _gather(threads, data, indices, indptr, v, out, True)


@numba.njit(cache=True, nogil=True)
def weighted_gather_mm(threads, data, indices, indptr, v, out):
    """``out[i, :] = sum_{k in row i} where(v[j_k, :] != 0, data[k] * v[j_k, :], 0)``."""
    _gather(threads, data, indices, indptr, v, out, True)


@numba.njit(cache=True, nogil=True)
def weighted_scatter_mv(threads, data, indices, indptr, v, out):
    """``out[j] = sum_{i: v[i] != 0} v[i] * sum_{k in row i, j_k = j} data[k]``; zero rows skipped."""
    _scatter_vector(threads, data, indices, indptr, v, out, True)


@numba.njit(cache=True, nogil=True)
def weighted_scatter_mm_batch_major(threads, data, indices, indptr, vt, out_t):
    """``out_t[c] = A.T @ vt[c]`` for each weighted sample ``c`` (zero rows skipped)."""
    _scatter_batch(threads, data, indices, indptr, vt, out_t, True)


@numba.njit(cache=True, nogil=True)
def sddmm_mv(threads, indices, indptr, r, q, g):
    """``g[k] = r[i] * q[indices[k]]`` for k in row i (an event operand selects)."""
    _sddmm(threads, indices, indptr, r, q, g, _selects(r), _selects(q))


@numba.njit(cache=True, nogil=True)
def sddmm_mm(threads, indices, indptr, r, q, g):
    """``g[k] = sum_c r[i, c] * q[indices[k], c]`` for k in row i (row-major; an event operand selects)."""
    _sddmm(threads, indices, indptr, r, q, g, _selects(r), _selects(q))


@numba.njit(cache=True, nogil=True)
def sddmm_r_weighted(threads, indices, indptr, r, q, g):
    """``g[k] = <where(r[i] != 0, r[i], 0), q[j]>``: r weighted events (rows of zero r skipped)."""
    _sddmm(threads, indices, indptr, r, q, g, True, False)


@numba.njit(cache=True, nogil=True)
def sddmm_q_weighted(threads, indices, indptr, r, q, g):
    """``g[k] = <r[i], where(q[j] != 0, q[j], 0)>``: q weighted events (every row: IEEE where r is 0)."""
    _sddmm(threads, indices, indptr, r, q, g, False, True)


# ---------------------------------------------------------------------------
# serial tiers: a kernel's serial part alone, what a first call compiles (numba_cpu.call's ``serial``)
# ---------------------------------------------------------------------------
@numba.njit(cache=True, nogil=True)
def serial_gather(threads, data, indices, indptr, x, out):
    """The serial tier of :func:`gather_mv` and :func:`gather_mm` (a vector or a row-major batch):
    :func:`_serial_gather` (each output row one part's own sum: the same bits on any thread count)."""
    return _serial_gather(threads, data, indices, indptr, x, out, _selects(x), True)


@numba.njit(cache=True, nogil=True)
def serial_weighted_gather(threads, data, indices, indptr, v, out):
    """The serial tier of :func:`weighted_gather_mv` and :func:`weighted_gather_mm`."""
    return _serial_gather(threads, data, indices, indptr, v, out, True, True)


@numba.njit(cache=True, nogil=True, inline="always", **COMPILED_CODE_ONLY)
def _plain_rows(data, indices, indptr, x, y, lo, hi, selects, ids=None):
    """``y[indices[k]] += data[k] * s_i`` for the synapses of the visited rows ``i``: the rows
    ``[lo, hi)`` with ``s_i = x[i]`` (zero rows of a selecting ``x`` skipped), or, given ``ids``, the
    listed rows ``ids[lo:hi]`` with ``s_i = 1`` (a row outside the matrix adds nothing); in row then
    stored order: :func:`numba_rows._scatter_rows`'s sum as the plainest loop (no eight-synapse
    steps, no eight-row zero test)."""
    n = np.uint64(y.shape[0])
    nnz = np.int64(indices.shape[0])
    n_rows = np.int64(indptr.shape[0] - 1)
    homogeneous = data.shape[0] != nnz
    for p in range(lo, hi):
        if ids is None:
            i = np.int64(p)
            s = data.dtype.type(x[i])
            if selects and s == 0:
                continue
        else:
            i = np.int64(ids[p])
            if i < 0 or i >= n_rows:
                continue
            s = data.dtype.type(1)
        a, b = np.int64(indptr[i]), np.int64(indptr[i + 1])  # (clamped to [0, nnz] as row_span, without
        a = np.uint64(I0 if a < 0 else (nnz if a > nnz else a))  # min/max: each is a compile of its own)
        b = np.uint64(I0 if b < 0 else (nnz if b > nnz else b))
        w = data[0] * s if homogeneous else s  # (per-synapse data may be empty: no data[0] then)
        for k in range(a, b):
            j = np.uint64(np.int64(indices[k]))
            if j < n:
                y[j] += w if homogeneous else data[k] * s


def _plain_one_pass_tier(weighted: bool, name: str):
    """The first serial tier of a vector scatter (``weighted``: values that select; else events or
    floats, :func:`numba_rows._selects`): one plain pass (:func:`_plain_rows`) where
    :func:`_one_pass_scatter` keeps the sum in one pass (its estimate, :func:`_one_pass_kept`);
    DECLINED, nothing written, where that one declines (a sum in parts: the next tier).  SPLITTABLE
    otherwise: the row loop's tier takes the calls over once this one has been busy
    ``numba_cpu.HOT_NS`` (or at once where that costs no compile).

    The tier calls its inlined helpers itself: a helper that inlines others (Numba IR) costs its
    callers' compile about 0.15 s more than the same helpers inlined in one level."""

    def tier(threads, data, indices, indptr, x, out):
        selects = True if weighted else _selects(x)
        rows = np.int64(x.shape[0])
        if not _one_pass_kept(indices, indptr, x, rows, out.shape[0], selects):
            return np.int64(DECLINED)
        for j in range(out.shape[0]):
            out[j] = 0
        _plain_rows(data, indices, indptr, x, out, I0, rows, selects)
        return np.int64(SPLITTABLE)

    tier.__name__ = tier.__qualname__ = name  # (Numba's cache files and evjax's log name the tier)
    return numba.njit(cache=True, nogil=True)(tier)


def _plain_parts_tier(weighted: bool, name: str):
    """The second serial tier of a vector scatter: the sum as :func:`_serial_scatter` does it on one
    thread: one pass where the estimate of :func:`_one_pass_scatter` keeps it, else the parts of
    :func:`_scatter_plan` (from the exact work), the first into ``out``, each later one into a zeroed
    copy then added to ``out``: ``((p0 + p1) + p2) ...``, the order of ``add_parts``.  SPLITTABLE:
    the row loop's tier takes over once hot.

    Written for the cheapest compile (docs/performance.md, "What a first call's compile is made
    of"): every helper written out but :func:`_plain_rows`; :func:`_one_pass_kept`'s estimate
    counted in the same scan as the exact work (its visited rows); one copy serves every part, from
    C's ``malloc`` (:func:`evjax._kernel_compat.heap_array_intrinsics`: ``np.empty`` compiles
    Numba's allocator in).  Where that allocation fails the tier declines (nothing written yet) and
    the full kernel, whose ``np.zeros`` raises ``MemoryError``, takes the call."""

    def tier(threads, data, indices, indptr, x, out):
        selects = True if weighted else _selects(x)
        rows = np.int64(x.shape[0])
        n_out = np.int64(out.shape[0])
        pool = np.int64(pool_chunks())
        parts = np.int64(1)
        work = I0
        if pool >= 2:
            visited = I0
            for i in range(rows):  # the visited rows (as _one_pass_kept) and their synapses (_active_work)
                if not selects or x[i] != 0:
                    visited += 1
                    work += np.int64(indptr[i + 1]) - np.int64(indptr[i])
            n_rows = np.int64(indptr.shape[0] - 1)
            estimate = 2 * visited * (np.int64(indices.shape[0]) // (n_rows if n_rows > 1 else 1))
            if not (estimate < VECTOR_SCATTER_PARALLEL_MIN_WORK or estimate < VECTOR_SCATTER_WORK_PER_OUTPUT * n_out):
                # not kept in one pass: the parts of _vector_scatter_parts, in [2, the pool]
                if not (work < VECTOR_SCATTER_PARALLEL_MIN_WORK or work < VECTOR_SCATTER_WORK_PER_OUTPUT * n_out):
                    parts = work // (VECTOR_SCATTER_WORK_PER_OUTPUT * n_out)  # (no min/max: each is a
                    parts = np.int64(2) if parts < 2 else parts  # compile of its own)
                    parts = pool if pool < parts else parts
        copy = heap_array(n_out if parts > 1 else I0, out.dtype)
        if parts > 1 and copy.shape[0] != n_out:
            free_array(copy)
            return np.int64(DECLINED)  # no memory for the copy: the full kernel raises MemoryError
        for j in range(n_out):
            out[j] = 0
        start, done, row = I0, I0, I0
        for t in range(parts):  # (the bounds as _split_active_work)
            stop = rows
            if t < parts - 1:
                target = (work * (t + 1)) // parts
                while row < rows and done < target:
                    if not selects or x[row] != 0:
                        done += np.int64(indptr[row + 1]) - np.int64(indptr[row])
                    row += 1
                stop = row
            y = out if t == 0 else copy
            if t > 0:
                for j in range(n_out):
                    y[j] = 0
            _plain_rows(data, indices, indptr, x, y, start, stop, selects)
            if t > 0:  # (as add_parts: out += part t, in part order)
                for j in range(n_out):
                    out[j] += copy[j]
            start = stop
        free_array(copy)
        return np.int64(SPLITTABLE)

    tier.__name__ = tier.__qualname__ = name
    return numba.njit(cache=True, nogil=True)(tier)


serial_scatter_mv = _plain_one_pass_tier(False, "serial_scatter_mv")  # the first tiers of scatter_mv ...
plain_parts_scatter_mv = _plain_parts_tier(False, "plain_parts_scatter_mv")  # ... its second
serial_weighted_scatter_mv = _plain_one_pass_tier(True, "serial_weighted_scatter_mv")  # ... of weighted_scatter_mv
plain_parts_weighted_scatter_mv = _plain_parts_tier(True, "plain_parts_weighted_scatter_mv")


@numba.njit(cache=True, nogil=True)
def parts_scatter_mv(threads, data, indices, indptr, x, out):
    """The second serial tier of :func:`scatter_mv` (one pass, or its parts in turn)."""
    return _serial_scatter(threads, data, indices, indptr, x, out, _selects(x), None, 0, True)


@numba.njit(cache=True, nogil=True)
def parts_weighted_scatter_mv(threads, data, indices, indptr, v, out):
    """The second serial tier of :func:`weighted_scatter_mv`."""
    return _serial_scatter(threads, data, indices, indptr, v, out, True, None, 0, True)


@numba.njit(cache=True, nogil=True)
def serial_scatter_active_mv(threads, data, indices, indptr, ids, count, out):
    """The first serial tier of :func:`scatter_active_mv`: one plain pass over the listed rows
    (:func:`_plain_rows`) where :func:`_one_pass_scatter` keeps the sum in one pass; DECLINED, nothing
    written, where that one declines (a sum in parts: the next tier).  SPLITTABLE otherwise, as
    :func:`_plain_one_pass_tier`'s: the row loop's tier takes the calls over once this one is hot.
    Written as that tier is, for a cheap first compile: a call of :func:`_one_pass_scatter` inlines
    helpers that inline helpers (docs/performance.md, "What a first call's compile is made of")."""
    rows = np.int64(count[0])  # (as _rows_to_visit: count[0] clamped to [0, len(ids)], without min/max)
    rows = I0 if rows < 0 else rows
    rows = np.int64(ids.shape[0]) if rows > ids.shape[0] else rows
    if not _one_pass_kept(indices, indptr, ids, rows, out.shape[0], False):
        return np.int64(DECLINED)
    for j in range(out.shape[0]):
        out[j] = 0
    _plain_rows(data, indices, indptr, ids, out, I0, rows, True, ids)
    return np.int64(SPLITTABLE)


@numba.njit(cache=True, nogil=True)
def parts_scatter_active_mv(threads, data, indices, indptr, ids, count, out):
    """The second serial tier of :func:`scatter_active_mv`."""
    return _serial_scatter(threads, data, indices, indptr, ids, out, True, ids, count, True)


@numba.njit(cache=True, nogil=True)
def serial_sddmm_mv(threads, indices, indptr, r, q, g):
    """The serial tier of :func:`sddmm_mv`: :func:`_serial_sddmm`'s entries (each one product, or a
    selected zero), written as the plainest loop for vectors, so that it compiles in about a third of
    the time of the generic row loop; SPLITTABLE where the kernel would split the rows over threads
    (the same bits), else DONE."""
    r_selects, q_selects = _selects(r), _selects(q)
    skips = r_selects or q_selects
    n_rows = np.int64(r.shape[0])
    nnz = np.int64(indices.shape[0])
    n = np.uint64(q.shape[0])
    split = False
    if threads >= 2:  # (as _serial_sddmm, for vectors)
        active = n_rows
        if skips:
            active = 0
            for i in range(n_rows):
                active += r[i] != 0
        split = not _sddmm_serial(active * (nnz // (n_rows if n_rows > 1 else 1)), nnz)
    zero = g.dtype.type(0)
    for k in range(nnz):
        g[k] = zero
    for i in range(n_rows):
        a = g.dtype.type(r[i])
        if skips and r[i] == 0:
            continue
        lo, hi = np.int64(indptr[i]), np.int64(indptr[i + 1])  # (clamped as in _plain_rows)
        lo = np.uint64(I0 if lo < 0 else (nnz if lo > nnz else lo))
        hi = np.uint64(I0 if hi < 0 else (nnz if hi > nnz else hi))
        for k in range(lo, hi):
            j = np.uint64(np.int64(indices[k]))
            if j < n:
                b = g.dtype.type(q[j])
                g[k] = zero if ((r_selects and a == 0) or (q_selects and b == 0)) else a * b
    return SPLITTABLE if split else DONE


# The batched kernels' tiers (a vmap over trials, a batch of vectors; the batch gathers share the vector
# gathers' tiers above).  Without them a user's first vmapped call compiled the full batched scatter (its
# first forward took 8.4-9.0 s on 2 cores) and the full batched weight gradient (the first jit(grad) after
# it 2.8 s): benchmarks/cold_start.py's *_vmap cases, 2026-11-29.
def _plain_samples_tier(weighted: bool, name: str):
    """The first serial tier of a batch scatter (``weighted``: values that select; else events or
    floats): the samples whole, one after the other, each as one plain pass (:func:`_plain_rows`, the
    sum of :func:`_serial_samples`'s row loop); DECLINED, nothing written, where :func:`_scatter_batch`
    splits each of a few samples as a vector (fewer samples than the pool: the next tier).
    SPLITTABLE otherwise: the row loop's tier takes the calls over once this one has been busy
    ``numba_cpu.HOT_NS`` (or at once where that costs no compile).  Written as the vector scatter's
    plain tiers are, for the cheapest first compile."""

    def tier(threads, data, indices, indptr, xt, out_t):
        selects = True if weighted else _selects(xt)
        width = np.int64(xt.shape[0])
        if 1 < width and width < pool_chunks():
            return np.int64(DECLINED)
        rows = np.int64(xt.shape[1])
        for c in range(width):
            out = out_t[c]
            for j in range(out.shape[0]):
                out[j] = 0
            _plain_rows(data, indices, indptr, xt[c], out, I0, rows, selects)
        return np.int64(SPLITTABLE)

    tier.__name__ = tier.__qualname__ = name
    return numba.njit(cache=True, nogil=True)(tier)


@numba.njit(cache=True, nogil=True)
def _columns_tier(threads, data, indices, indptr, xt, out_t, selects):
    """A batch scatter's second tier, every call :func:`_scatter_batch` gets on this thread: a few
    samples each as :func:`_serial_scatter` does a vector (one pass, or its parts in turn: the bits of
    the parallel parts), SPLITTABLE where one of them was split on several threads; else the samples
    whole (:func:`_serial_samples`)."""
    width = xt.shape[0]
    if not 1 < width < pool_chunks():
        return _serial_samples(threads, data, indices, indptr, xt, out_t, selects, True)
    outcome = DONE
    for c in range(width):
        if _serial_scatter(threads, data, indices, indptr, xt[c], out_t[c], selects, None, 0, True) == SPLITTABLE:
            outcome = SPLITTABLE
    return outcome


serial_scatter_mm_batch_major = _plain_samples_tier(False, "serial_scatter_mm_batch_major")
serial_weighted_scatter_mm_batch_major = _plain_samples_tier(True, "serial_weighted_scatter_mm_batch_major")


@numba.njit(cache=True, nogil=True)
def parts_scatter_mm_batch_major(threads, data, indices, indptr, xt, out_t):
    """The second serial tier of :func:`scatter_mm_batch_major` (:func:`_columns_tier`)."""
    return _columns_tier(threads, data, indices, indptr, xt, out_t, _selects(xt))


@numba.njit(cache=True, nogil=True)
def parts_weighted_scatter_mm_batch_major(threads, data, indices, indptr, vt, out_t):
    """The second serial tier of :func:`weighted_scatter_mm_batch_major`."""
    return _columns_tier(threads, data, indices, indptr, vt, out_t, True)


@numba.njit(cache=True, nogil=True)
def serial_sddmm_mm(threads, indices, indptr, r, q, g):
    """The serial tier of :func:`sddmm_mm`: :func:`_serial_sddmm`'s entries for row-major matrices
    (each :func:`numba_rows._dot` of a row of ``r`` and one of ``q``, the kernel's own function, or a
    zero where ``r``'s row selects nothing), written as the plainest loop around that dot for a cheap
    first compile; SPLITTABLE where the kernel would split the rows over threads (each entry is one
    dot: the same bits), else DONE."""
    r_selects, q_selects = _selects(r), _selects(q)
    skips = r_selects or q_selects
    n_rows = np.int64(r.shape[0])
    width = np.int64(r.shape[1])
    nnz = np.int64(indices.shape[0])
    n = np.uint64(q.shape[0])
    zero = g.dtype.type(0)
    split = False
    if threads >= 2:  # (as _serial_sddmm)
        active = n_rows
        if skips:
            active = 0
            for i in range(n_rows):
                for c in range(width):
                    if r[i, c] != 0:
                        active += 1
                        break
        split = not _sddmm_serial(active * (nnz // (n_rows if n_rows > 1 else 1)) * (width if width > 1 else 1), nnz)
    for k in range(nnz):
        g[k] = zero
    for i in range(n_rows):
        ri = r[i]
        if skips:
            live = False
            for c in range(width):
                if ri[c] != 0:
                    live = True
                    break
            if not live:
                continue
        lo, hi = np.int64(indptr[i]), np.int64(indptr[i + 1])  # (clamped as in _plain_rows)
        lo = np.uint64(I0 if lo < 0 else (nnz if lo > nnz else lo))
        hi = np.uint64(I0 if hi < 0 else (nnz if hi > nnz else hi))
        for k in range(lo, hi):
            j = np.uint64(np.int64(indices[k]))
            if j < n:
                g[k] = g.dtype.type(_dot(ri, q[j], zero, r_selects, q_selects))
    return np.int64(SPLITTABLE if split else DONE)


@numba.njit(cache=True, nogil=True)
def serial_sddmm_r_weighted(threads, indices, indptr, r, q, g):
    """The serial tier of :func:`sddmm_r_weighted`."""
    return _serial_sddmm(threads, indices, indptr, r, q, g, True, False, True)


@numba.njit(cache=True, nogil=True)
def serial_sddmm_q_weighted(threads, indices, indptr, r, q, g):
    """The serial tier of :func:`sddmm_q_weighted`."""
    return _serial_sddmm(threads, indices, indptr, r, q, g, False, True, True)


# kernel -> its serial tiers, cheapest first (the vector kernels: a first script's calls); a scatter's
# first tier declines a sum in parts, which its second does in turn on one thread (plain loops, a
# cheap compile) and its third with the row loop (once the second has been busy HOT_NS)
SERIAL_TIERS = {
    gather_mv: (serial_gather,), weighted_gather_mv: (serial_weighted_gather,),
    scatter_mv: (serial_scatter_mv, plain_parts_scatter_mv, parts_scatter_mv),
    weighted_scatter_mv: (serial_weighted_scatter_mv, plain_parts_weighted_scatter_mv, parts_weighted_scatter_mv),
    scatter_active_mv: (serial_scatter_active_mv, parts_scatter_active_mv), sddmm_mv: (serial_sddmm_mv,),
    gather_mm: (serial_gather,), weighted_gather_mm: (serial_weighted_gather,),
    scatter_mm_batch_major: (serial_scatter_mm_batch_major, parts_scatter_mm_batch_major),
    weighted_scatter_mm_batch_major: (serial_weighted_scatter_mm_batch_major, parts_weighted_scatter_mm_batch_major),
    sddmm_mm: (serial_sddmm_mm,), sddmm_r_weighted: (serial_sddmm_r_weighted,),
    sddmm_q_weighted: (serial_sddmm_q_weighted,),
}

# (batched, transpose, weighted) -> kernel
MATMUL_KERNELS = {
    (False, False, False): gather_mv, (False, True, False): scatter_mv,
    (True, False, False): gather_mm, (True, True, False): scatter_mm_batch_major,
    (False, False, True): weighted_gather_mv, (False, True, True): weighted_scatter_mv,
    (True, False, True): weighted_gather_mm, (True, True, True): weighted_scatter_mm_batch_major,
}
# (mode of ops.sddmm_mode, vector operands) -> kernel
SDDMM_KERNELS = {
    ("values", True): sddmm_mv, ("r_events", True): sddmm_mv, ("q_events", True): sddmm_mv,
    ("values", False): sddmm_mm, ("r_events", False): sddmm_mm, ("q_events", False): sddmm_mm,
    ("r_weighted", True): sddmm_r_weighted, ("r_weighted", False): sddmm_r_weighted,
    ("q_weighted", True): sddmm_q_weighted, ("q_weighted", False): sddmm_q_weighted,
}


# ---------------------------------------------------------------------------
# generators (the op's backend slot)
# ---------------------------------------------------------------------------
def _as_compute(x, dtype):
    return x if x.dtype == jnp.bool_ or x.dtype == dtype else x.astype(dtype)




def _matmul_generator(outs, transpose: bool, event: bool, batched: bool, weighted: bool = False):
    out = outs[0]
    dtype = compute_dtype(out.dtype)
    kernel_fn = MATMUL_KERNELS[(batched, bool(transpose), bool(weighted))]
    events = event and not weighted

    def kernel(data, indices, indptr, x):
        data = _as_compute(data, dtype)
        x = as_bool_events(x) if events else _as_compute(x, dtype)
        if batched and transpose:
            # batch-major inside: x.T and y.T cancel with the caller's transposes
            # (e.g. ``spikes (K, n) @ W``) under XLA's algebraic simplifier.
            y = numba_cpu.call(kernel_fn, (data, indices, indptr, x.T), out.shape[::-1], dtype,
                               bool_as_bytes=True, serial=SERIAL_TIERS.get(kernel_fn)).T
        else:
            y = numba_cpu.call(kernel_fn, (data, indices, indptr, x), out.shape, dtype, bool_as_bytes=True,
                               serial=SERIAL_TIERS.get(kernel_fn))
        return [y.astype(out.dtype)]

    return kernel


def csrmv_generator(outs, ins, shape, transpose: bool):
    """Numba kernel for ``csrmv_p``: float vector."""
    return _matmul_generator(outs, transpose, event=False, batched=False)


def csrmm_generator(outs, ins, shape, transpose: bool):
    """Numba kernel for ``csrmm_p``: float matrix (contracted dimension first)."""
    return _matmul_generator(outs, transpose, event=False, batched=True)


def binary_csrmv_generator(outs, ins, shape, transpose: bool, weighted: bool):
    """Numba kernel for ``binary_csrmv_p``: event vector (bool, or float with nonzero = spike;
    weighted: values that select)."""
    return _matmul_generator(outs, transpose, event=True, batched=False, weighted=weighted)


def binary_csrmm_generator(outs, ins, shape, transpose: bool, weighted: bool):
    """Numba kernel for ``binary_csrmm_p``: event matrix."""
    return _matmul_generator(outs, transpose, event=True, batched=True, weighted=weighted)


def binary_csrmv_active_generator(outs, ins, shape):
    """Numba kernel for ``binary_csrmv_active_p``: the scatter over the listed active rows (the
    spikes operand is not read)."""
    out = outs[0]
    dtype = compute_dtype(out.dtype)

    def kernel(data, indices, indptr, active_ids, n_active, v):
        y = numba_cpu.call(scatter_active_mv, (_as_compute(data, dtype), indices, indptr, active_ids, n_active),
                           out.shape, dtype, serial=SERIAL_TIERS[scatter_active_mv])
        return [y.astype(out.dtype)]

    return kernel


def sddmm_generator(outs, ins, shape, weighted):
    """Numba kernel for ``csr_sddmm_p``: ``g[k] = <r[row k], q[indices[k]]>`` (vectors or
    row-major matrices; the kernel of each mode in :data:`SDDMM_KERNELS`)."""
    out = outs[0]
    dtype = compute_dtype(out.dtype)
    kernel_fn = SDDMM_KERNELS[(ops.sddmm_mode(ins[2].dtype, ins[3].dtype, weighted), len(ins[2].shape) == 1)]

    def kernel(indices, indptr, r, q):
        args = (indices, indptr, _as_compute(r, dtype), _as_compute(q, dtype))
        return [numba_cpu.call(kernel_fn, args, out.shape, dtype, bool_as_bytes=True,
                               serial=SERIAL_TIERS.get(kernel_fn)).astype(out.dtype)]

    return kernel


for _op, _generator in ((ops.csrmv_p, csrmv_generator), (ops.csrmm_p, csrmm_generator),
                        (ops.binary_csrmv_p, binary_csrmv_generator), (ops.binary_csrmm_p, binary_csrmm_generator),
                        (ops.binary_csrmv_active_p, binary_csrmv_active_generator),
                        (ops.csr_sddmm_p, sddmm_generator)):
    _op.def_numba_kernel(_generator)

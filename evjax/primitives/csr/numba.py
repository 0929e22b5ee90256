"""Numba CPU backend of the CSR operators in :mod:`evjax.primitives.csr.ops`.

Imported by the ops the first time they lower with ``backend="numba"``; it
registers its generators on them (the ops never import this module).

The kernels are module-level ``@numba.njit(parallel=..., cache=True)``
functions (``prange`` loops only, see ``_PARALLEL``), so Numba compiles each once per dtype/rank signature and keeps the
machine code on disk; the XLA FFI handlers around them (see
:mod:`evjax.backends.numba_cpu`) are cached the same way.  Shapes are read from
the buffers at run time, so one compiled kernel serves every shape.
The row-level loops they inline live in :mod:`evjax.primitives.csr.numba_rows`.

Orientation of the stored matrix ``A`` (``n_rows x n_cols``):

* gather (``transpose=False``, ``y = A @ x``): each output row reads its own
  synapses; parallel over rows, with row chunks balanced by synapse count.
* scatter (``transpose=True``, ``y = A.T @ x``): for events, silent rows are
  skipped, so the cost follows the synapses of active rows, not ``nnz``; for
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
(IEEE).  The two rules are ``_visits`` and ``_product`` in ``numba_rows``.

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
partial sums, dot products of batches in float64.  Bool events are read as
their uint8 bytes.  Every kernel takes the thread count first: its handler
passes the one in force at each call (:mod:`evjax.backends.threads`).
"""
from __future__ import annotations

import jax.numpy as jnp
import numba
import numpy as np
from numba import prange

from ...backends import numba_cpu
from ...dtypes import compute_dtype
from ...events import as_bool_events
from . import numba_weighted, ops
from ...backends.threads import part_done, pool_chunks, region_done, start_region
from .numba_rows import (  # the row loops the kernels inline, and the parallel thresholds
    _PARALLEL,
    PARALLEL_MIN_WORK,
    _active_work,
    _batch_scatter_serial,
    _balanced_rows,
    _column,
    _count_active,
    _count_nonzero,
    _gather_row,
    _numeric,
    _product,
    _scatter_rows,
    _sddmm_serial,
    _skips_zero_rows,
    _span,
    _split_active_work,
    _scatter_part,
    _split_scatter,
    _vector_scatter_parts,
    _zero,
    _zero_of,
)

__all__ = [
    "csrmv_generator",
    "csrmm_generator",
    "binary_csrmv_generator",
    "binary_csrmm_generator",
    "sddmm_generator",
]

_REASSOC = {"reassoc", "contract"}  # let LLVM vectorise the batch dot products


# ---------------------------------------------------------------------------
# kernels: y = A @ x (gather) and y = A.T @ x (scatter), vector and batch
# ---------------------------------------------------------------------------
@numba.njit(parallel=_PARALLEL, cache=True, nogil=True)
def gather_mv(threads, data, indices, indptr, x, out):
    """``out[i] = sum_{k in row i} data[k] * x[indices[k]]``; x float or bool."""
    x = _numeric(x)
    zero = _zero_of(out)
    n_rows = out.shape[0]
    nnz = indices.shape[0]
    homogeneous = data.shape[0] != nnz
    if threads < 2 or nnz < PARALLEL_MIN_WORK:
        for i in range(n_rows):
            a, b = _span(indptr, i, nnz)
            out[i] = _gather_row(data, indices, a, b, x, homogeneous, zero)
        return
    bounds = _balanced_rows(indptr, n_rows, nnz, threads)
    ends, t0 = start_region(threads)
    for t in prange(threads):
        for i in range(bounds[t], bounds[t + 1]):
            a, b = _span(indptr, i, nnz)
            out[i] = _gather_row(data, indices, a, b, x, homogeneous, zero)
        part_done(ends, t)
    region_done(ends, t0)


@numba.njit(parallel=_PARALLEL, cache=True, nogil=True)
def scatter_mv(threads, data, indices, indptr, x, out):
    """``out[j] = sum_i x[i] * sum_{k in row i, indices[k] = j} data[k]``, skipping silent events."""
    x = _numeric(x)
    n_rows = x.shape[0]
    n = out.shape[0]
    nnz = indices.shape[0]
    homogeneous = data.shape[0] != nnz
    _zero(out, 0, out.shape[0])
    expected = _count_active(x) * (nnz // max(n_rows, 1)) if pool_chunks() > 1 else 0  # cheap: spikes only
    parts = _vector_scatter_parts(2 * expected, n)  # an estimate: allow rows twice the mean
    work = 0
    if parts > 1:
        work = _active_work(indptr, x)  # exact: the synapses of the active rows
        parts = _vector_scatter_parts(work, n)
    if parts == 1:
        _scatter_rows(data, indices, indptr, x, out, 0, n_rows, homogeneous)
        return
    # row ranges of equal active work, each into its own copy of out
    bounds = _split_active_work(indptr, x, work, parts)
    _split_scatter(threads, bounds, _scatter_part, data, indices, indptr, x, out, homogeneous)


@numba.njit(cache=True, nogil=True, inline="always")
def _gather_mm_rows(data, indices, indptr, x, out, lo, hi, homogeneous):
    """Rows ``[lo, hi)`` of ``out[i, c] = sum_k _product(data[k], x[indices[k], c])``, term by term."""
    n = np.uint64(x.shape[0])
    width = x.shape[1]
    nnz = indices.shape[0]
    for i in range(lo, hi):
        row = out[i]
        _zero(row, 0, row.shape[0])
        a, b = _span(indptr, i, nnz)
        for k in range(a, b):
            j = _column(indices, k)
            if j < n:
                xj = x[j]
                w = data[0] if homogeneous else data[k]
                for c in range(width):
                    row[c] += _product(w, xj[c])


@numba.njit(parallel=_PARALLEL, cache=True, nogil=True)
def gather_mm(threads, data, indices, indptr, x, out):
    """``out[i, :] = sum_{k in row i} data[k] * x[indices[k], :]``; x (n_cols, K) row-major."""
    x = _numeric(x)
    n_rows = out.shape[0]
    nnz = indices.shape[0]
    homogeneous = data.shape[0] != nnz
    if threads < 2 or nnz * max(x.shape[1], 1) < PARALLEL_MIN_WORK:
        _gather_mm_rows(data, indices, indptr, x, out, 0, n_rows, homogeneous)
        return
    bounds = _balanced_rows(indptr, n_rows, nnz, threads)
    ends, t0 = start_region(threads)
    for t in prange(threads):
        _gather_mm_rows(data, indices, indptr, x, out, bounds[t], bounds[t + 1], homogeneous)
        part_done(ends, t)
    region_done(ends, t0)


@numba.njit(cache=True, nogil=True, inline="always")
def _scatter_samples(data, indices, indptr, xt, out_t, lo, hi, homogeneous):
    for c in range(lo, hi):
        row = out_t[c]
        _zero(row, 0, row.shape[0])
        _scatter_rows(data, indices, indptr, xt[c], row, 0, xt.shape[1], homogeneous)


@numba.njit(parallel=_PARALLEL, cache=True, nogil=True)
def scatter_mm_batch_major(threads, data, indices, indptr, xt, out_t):
    """``out_t[c] = A.T @ xt[c]`` for each sample ``c``; xt (K, n_rows), out_t (K, n_cols)."""
    samples = xt  # as given: scatter_mv below then shares the vector kernel's signature (and its cache)
    xt = _numeric(xt)
    width = xt.shape[0]
    n_rows = xt.shape[1]
    nnz = indices.shape[0]
    homogeneous = data.shape[0] != nnz
    if 1 < width < pool_chunks():  # few samples: split inside each one (the pool size decides: same bits)
        for c in range(width):
            scatter_mv(threads, data, indices, indptr, samples[c], out_t[c])
        return
    active = 0
    if threads > 1:
        for c in range(width):
            active += _count_active(xt[c])
    if threads < 2 or _batch_scatter_serial(active * (nnz // max(n_rows, 1)), out_t.size):  # synapses, about
        _scatter_samples(data, indices, indptr, xt, out_t, 0, width, homogeneous)
        return
    ends, t0 = start_region(threads)
    for t in prange(threads):
        _scatter_samples(data, indices, indptr, xt, out_t, (width * t) // threads, (width * (t + 1)) // threads,
                         homogeneous)
        part_done(ends, t)
    region_done(ends, t0)


# ---------------------------------------------------------------------------
# kernels: g[k] = <r[row k], q[indices[k]]> (the weight gradient, SDDMM)
# ---------------------------------------------------------------------------
@numba.njit(cache=True, nogil=True, fastmath=_REASSOC)
def _dot(u, v):
    acc = 0.0
    for c in range(u.shape[0]):
        acc += _product(u[c], v[c])
    return acc


@numba.njit(cache=True, nogil=True, inline="always")
def _any(u):
    for c in range(u.shape[0]):
        if u[c] != 0:
            return True
    return False


@numba.njit(cache=True, nogil=True, inline="always")
def _sddmm_rows_vec(indices, indptr, r, q, g, lo, hi):
    """Rows ``[lo, hi)`` of ``g[k] = _product(r[i], q[j])``; rows skipped (see
    ``_skips_zero_rows``) are zero-filled in runs."""
    n = np.uint64(q.shape[0])
    nnz = indices.shape[0]
    skips = _skips_zero_rows(r, q)
    zero_from, _ = _span(indptr, lo, nnz)
    for i in range(lo, hi):
        ri = r[i]
        if not skips or ri != 0:
            a, b = _span(indptr, i, nnz)
            if a > zero_from:
                _zero(g, zero_from, a)
            for k in range(a, b):
                j = _column(indices, k)
                g[k] = _product(ri, q[j]) if j < n else 0
            zero_from = max(zero_from, b)
    _, end = _span(indptr, hi - 1, nnz)
    if end > zero_from:
        _zero(g, zero_from, end)


@numba.njit(cache=True, nogil=True, inline="always")
def _sddmm_rows_mat(indices, indptr, r, q, g, lo, hi):
    """Rows ``[lo, hi)`` of ``g[k] = <r[i, :], q[j, :]>`` (terms by ``_product``); rows skipped
    (all-zero rows of r, see ``_skips_zero_rows``) are zero-filled in runs."""
    n = np.uint64(q.shape[0])
    nnz = indices.shape[0]
    skips = _skips_zero_rows(r, q)
    zero_from, _ = _span(indptr, lo, nnz)
    for i in range(lo, hi):
        ri = r[i]
        if not skips or _any(ri):
            a, b = _span(indptr, i, nnz)
            if a > zero_from:
                _zero(g, zero_from, a)
            for k in range(a, b):
                j = _column(indices, k)
                g[k] = _dot(ri, q[j]) if j < n else 0
            zero_from = max(zero_from, b)
    _, end = _span(indptr, hi - 1, nnz)
    if end > zero_from:
        _zero(g, zero_from, end)


@numba.njit(cache=True, nogil=True)
def _sddmm_parts(threads, indices, indptr, n_rows, active_rows, width, g):
    """Zero g if the structure leaves holes; the row boundaries of the parallel parts
    (one part unless the entries to compute, about ``active_rows * nnz / n_rows * width``,
    and to zero-fill are many, see ``_sddmm_serial``)."""
    nnz = indices.shape[0]
    if n_rows == 0 or indptr[0] != 0 or indptr[n_rows] != nnz:
        _zero(g, 0, nnz)  # malformed (or no rows): some entries may belong to no row
    computed = active_rows * (nnz // max(n_rows, 1)) * width
    parts = 1 if threads < 2 or _sddmm_serial(computed, nnz) else threads
    return _balanced_rows(indptr, n_rows, nnz, parts)


@numba.njit(parallel=_PARALLEL, cache=True, nogil=True)
def sddmm_mv(threads, indices, indptr, r, q, g):
    """``g[k] = r[i] * q[indices[k]]`` for k in row i (an event operand selects, see ``_product``);
    with an event operand, rows with r[i] == 0 are not read, only zeroed."""
    r = _numeric(r)
    q = _numeric(q)
    active = _count_nonzero(r) if _skips_zero_rows(r, q) else r.shape[0]
    bounds = _sddmm_parts(threads, indices, indptr, r.shape[0], active, 1, g)
    if bounds.shape[0] == 2:
        if r.shape[0]:
            _sddmm_rows_vec(indices, indptr, r, q, g, 0, r.shape[0])
        return
    ends, t0 = start_region(bounds.shape[0] - 1)
    for t in prange(bounds.shape[0] - 1):
        if bounds[t + 1] > bounds[t]:
            _sddmm_rows_vec(indices, indptr, r, q, g, bounds[t], bounds[t + 1])
        part_done(ends, t)
    region_done(ends, t0)


@numba.njit(parallel=_PARALLEL, cache=True, nogil=True)
def sddmm_mm(threads, indices, indptr, r, q, g):
    """``g[k] = sum_c r[i, c] * q[indices[k], c]`` for k in row i (row-major; an event operand
    selects, see ``_product``); with an event operand, all-zero rows of r are skipped."""
    r = _numeric(r)
    q = _numeric(q)
    active = r.shape[0]
    if _skips_zero_rows(r, q):
        active = 0
        for i in range(r.shape[0]):
            active += _any(r[i])
    bounds = _sddmm_parts(threads, indices, indptr, r.shape[0], active, max(r.shape[1], 1), g)
    if bounds.shape[0] == 2:
        if r.shape[0]:
            _sddmm_rows_mat(indices, indptr, r, q, g, 0, r.shape[0])
        return
    ends, t0 = start_region(bounds.shape[0] - 1)
    for t in prange(bounds.shape[0] - 1):
        if bounds[t + 1] > bounds[t]:
            _sddmm_rows_mat(indices, indptr, r, q, g, bounds[t], bounds[t + 1])
        part_done(ends, t)
    region_done(ends, t0)


# ---------------------------------------------------------------------------
# generators (the op's backend slot)
# ---------------------------------------------------------------------------
def _as_compute(x, dtype):
    return x if x.dtype == jnp.bool_ or x.dtype == dtype else x.astype(dtype)




def _matmul_generator(outs, transpose: bool, event: bool, batched: bool, weighted: bool = False):
    out = outs[0]
    dtype = compute_dtype(out.dtype)
    if weighted:  # values that select: their own small kernels (numba_weighted)
        return _weighted_matmul_generator(out, dtype, numba_weighted.KERNELS[(batched, bool(transpose))],
                                          batched and transpose)

    def kernel(data, indices, indptr, x):
        data = _as_compute(data, dtype)
        x = as_bool_events(x) if event else _as_compute(x, dtype)
        if not batched:
            y = numba_cpu.call(scatter_mv if transpose else gather_mv, (data, indices, indptr, x), out.shape, dtype)
        elif transpose:
            # batch-major inside: x.T and y.T cancel with the caller's transposes
            # (e.g. ``spikes (K, n) @ W``) under XLA's algebraic simplifier.
            y = numba_cpu.call(scatter_mm_batch_major, (data, indices, indptr, x.T), out.shape[::-1], dtype).T
        else:
            y = numba_cpu.call(gather_mm, (data, indices, indptr, x), out.shape, dtype)
        return [y.astype(out.dtype)]

    return kernel


def _weighted_matmul_generator(out, dtype, kernel_fn, batch_major: bool):
    def kernel(data, indices, indptr, v):
        args = (_as_compute(data, dtype), indices, indptr, _as_compute(v, dtype))
        if batch_major:  # as for spikes: the transposes cancel with the caller's
            y = numba_cpu.call(kernel_fn, args[:3] + (args[3].T,), out.shape[::-1], dtype).T
        else:
            y = numba_cpu.call(kernel_fn, args, out.shape, dtype)
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
    weighted: values, see :mod:`.numba_weighted`)."""
    return _matmul_generator(outs, transpose, event=True, batched=False, weighted=weighted)


def binary_csrmm_generator(outs, ins, shape, transpose: bool, weighted: bool):
    """Numba kernel for ``binary_csrmm_p``: event matrix."""
    return _matmul_generator(outs, transpose, event=True, batched=True, weighted=weighted)


def sddmm_generator(outs, ins, shape, weighted):
    """Numba kernel for ``csr_sddmm_p``: ``g[k] = <r[row k], q[indices[k]]>`` (weighted modes:
    :data:`.numba_weighted.SDDMM_KERNELS`, on ``(n, k)`` matrices)."""
    out = outs[0]
    dtype = compute_dtype(out.dtype)
    vector = len(ins[2].shape) == 1
    if weighted is not None:
        kernel_fn = numba_weighted.SDDMM_KERNELS[ops.sddmm_mode(ins[2].dtype, ins[3].dtype, weighted)]
        as_matrix = (lambda a: a[:, None]) if vector else (lambda a: a)  # noqa: E731
    else:
        kernel_fn = sddmm_mv if vector else sddmm_mm
        as_matrix = lambda a: a  # noqa: E731

    def kernel(indices, indptr, r, q):
        args = (indices, indptr, as_matrix(_as_compute(r, dtype)), as_matrix(_as_compute(q, dtype)))
        return [numba_cpu.call(kernel_fn, args, out.shape, dtype).astype(out.dtype)]

    return kernel


for _op, _generator in ((ops.csrmv_p, csrmv_generator), (ops.csrmm_p, csrmm_generator),
                        (ops.binary_csrmv_p, binary_csrmv_generator), (ops.binary_csrmm_p, binary_csrmm_generator),
                        (ops.csr_sddmm_p, sddmm_generator)):
    _op.def_numba_kernel(_generator)

"""Numba CPU backend of the dense event ops in :mod:`evjax.primitives.dense.ops`.

Imported by the ops the first time they lower with ``backend="numba"``; it
registers its generators on them.  Four kernels, chosen by a table
(:data:`KERNELS`), serve vectors and matrices of events alike: a vector is a
``(k, 1)`` matrix (a free reshape), so one compiled kernel per dtype signature
covers ``binary_densemv`` and ``binary_densemm``.  Every kernel first lists
the active events (``s != 0``) in one pass over the events (:func:`_active`:
their flat indices ``j * n + c`` in order, zero words of bool events skipped
eight at a time), then visits only them:

* ``scatter`` (``transpose=True``, ``W`` of shape ``(k, m)``): each active
  event ``(j, c)`` adds ``v * W[j, :]`` to its output row ``c``; the output is
  computed batch-major (``(n, m)``, transposed by XLA around the call) in
  event-row order (each row of ``W`` read once; one sample: four rows a pass).
  Cost ``active x m``; the inner loop is a contiguous multiply-add.  Parallel
  above ``PARALLEL_MIN_WORK``: a batch over samples (each thread its output
  rows), one sample over column blocks of ``W``.
* ``gather`` (``transpose=False``, ``W`` of shape ``(m, k)``): the active
  events are grouped by sample; for a block of rows, each active column ``j``
  of sample ``c`` adds ``v * W[rows, j]`` to an accumulator (a constant
  stride, which the hardware prefetches, four columns per pass).  Cost
  ``m x active``.  Parallel over row blocks.
* ``outer_rows`` / ``outer_cols``: the weight gradient ``outer(e(s), g)``
  (``(k, m)`` for ``transpose=True``, ``(m, k)`` otherwise), written once: the
  zeros everywhere, then only the entries of active events.

Events select (``docs/semantics.md``): only active events are visited, so an
inactive one contributes nothing whatever its weights hold.  Bool events are
read as their bytes and their value is 1 (``w * 1`` is ``w`` exactly, nan and
inf included); graded (weighted) events arrive as floats and scale.  float16
and bfloat16 are computed in float32.  Each kernel takes the thread count
first: its handler passes the one in force at each call
(:mod:`evjax.backends.threads`).
"""
from __future__ import annotations

import numba
import numpy as np
from numba import prange, types
from numba.extending import overload

from ..._kernel_compat import prange_only
from ...backends import numba_cpu
from ...backends.threads import part_done, region_done, start_region
from ...dtypes import compute_dtype
from ..._event_values import as_bool_events
from . import ops

__all__ = ["matmul_generator", "outer_generator", "KERNELS", "PARALLEL_MIN_WORK"]

# Below this many multiply-adds (or written entries; about 80 us of serial work) a kernel stays on
# the calling thread: waking the pool costs more than it saves, and on a busy machine a descheduled
# worker stalls the whole call.  Measured on 2 cores: a vector of 4000 events at 5 % against 4000
# columns (8e5) takes 57 us serial and 44-53 us on two threads; at 2^21 it stayed serial.
PARALLEL_MIN_WORK = 1 << 19
_GATHER_COST = 8  # a gathered weight is a cache miss more often than not: it weighs 8 multiply-adds
_BLOCK = 16  # column blocks of a parallel scatter are multiples of one cache line of float32
_ROWS = 256  # rows of a sparse gather's block: long constant-stride runs, a 1 KiB accumulator
# From one active event in _DENSE_GATHER (most cache lines of a row read anyway), a gather reads whole
# rows in order instead (streamed by the hardware): measured faster from about 8 % of events active.
_DENSE_GATHER = 12

# Only explicit ``prange`` loops run on the pool (see evjax/primitives/csr/numba.py).
_PARALLEL = prange_only()


def _bytes(x):
    """A bool array as its uint8 bytes (Numba's bool loads are slow); others unchanged."""
    return x


@overload(_bytes)
def _bytes_overload(x):
    if isinstance(x, types.Array) and isinstance(x.dtype, types.Boolean):
        return lambda x: x.view(np.uint8)
    return lambda x: x


def _value(xf, f, like):
    """The value of the active event at flat index ``f``: 1 for bytes (binary), else the event's."""
    return xf[f]


@overload(_value)
def _value_overload(xf, f, like):
    dtype = like.dtype
    if isinstance(xf.dtype, types.Integer):  # a bool event's byte: the value is 1, w * 1 == w exactly
        return lambda xf, f, like: dtype(1)
    return lambda xf, f, like: dtype(xf[f])


def _zero_of(arr):
    """A zero scalar of ``arr``'s dtype (an accumulator)."""
    return arr.dtype.type(0)


@overload(_zero_of)
def _zero_of_overload(arr):
    dtype = arr.dtype
    return lambda arr: dtype(0)


# ---------------------------------------------------------------------------
# the active events, once
# ---------------------------------------------------------------------------
def _active(xf):
    """Flat indices of the nonzero entries of the 1-d ``xf``, ascending: ``(idx, count)``."""
    idx = np.nonzero(xf)[0]
    return idx, idx.size


@overload(_active)
def _active_overload(xf):
    if isinstance(xf.dtype, types.Integer) and xf.dtype.bitwidth == 8:
        def by_words(xf):  # bytes: eight at a time, zero words skipped; branch-free inside the others
            size = xf.size
            idx = np.empty(size, np.int64)
            words = size // 8
            wv = xf[:words * 8].view(np.uint64)
            total = 0
            for i in range(words):
                if wv[i] != 0:
                    base = i * 8
                    for b in range(8):
                        idx[total] = base + b
                        total += xf[base + b] != 0
            for f in range(words * 8, size):
                idx[total] = f
                total += xf[f] != 0
            return idx, total
        return by_words

    def by_entries(xf):  # graded events: x != 0 (nan is active, as in the reference)
        size = xf.size
        idx = np.empty(size, np.int64)
        total = 0
        for f in range(size):
            idx[total] = f
            total += xf[f] != 0
        return idx, total
    return by_entries


@numba.njit(cache=True, nogil=True, inline="always")
def _by_sample(idx, total, n):
    """Active events grouped by sample ``c``: sample c's event rows are ``rows[ptr[c]:ptr[c + 1]]``."""
    ptr = np.zeros(n + 1, np.int64)
    for p in range(total):
        ptr[idx[p] % n + 1] += 1
    for c in range(n):
        ptr[c + 1] += ptr[c]
    fill = ptr[:n].copy()
    rows = np.empty(total, np.int64)
    for p in range(total):
        f = idx[p]
        j = f // n
        c = f - j * n
        rows[fill[c]] = j
        fill[c] += 1
    return ptr, rows


@numba.njit(cache=True, nogil=True, inline="always")
def _by_row(idx, total, n, k):
    """Active events by event row ``j``: row j's are ``idx[ptr[j]:ptr[j + 1]]``; ``rows[:n_rows]``
    lists the rows with any."""
    ptr = np.zeros(k + 1, np.int64)
    rows = np.empty(min(k, total), np.int64)
    n_rows = 0
    for p in range(total):
        j = idx[p] // n
        if ptr[j + 1] == 0:
            rows[n_rows] = j
            n_rows += 1
        ptr[j + 1] += 1
    for j in range(k):
        ptr[j + 1] += ptr[j]
    return ptr, rows, n_rows


@numba.njit(cache=True, nogil=True, inline="always")
def _zero_rows(out, lo, hi, c_lo, c_hi):
    for i in range(lo, hi):
        row = out[i]
        for c in range(c_lo, c_hi):
            row[c] = 0


# ---------------------------------------------------------------------------
# forward kernels
# ---------------------------------------------------------------------------
@numba.njit(cache=True, nogil=True, inline="always")
def _scatter_block(w, xf, idx, total, out_t, s_lo, s_hi, lo, hi):
    """Samples ``[s_lo, s_hi)``, columns ``[lo, hi)`` of ``out_t[c] = sum_j v_jc W[j]`` over the active events
    (j, c), in order."""
    n = out_t.shape[0]
    _zero_rows(out_t, s_lo, s_hi, lo, hi)
    c_lo, c_hi = np.uint64(lo), np.uint64(hi)
    j = 0
    row_end = 0
    for p in range(total):
        f = idx[p]
        if f >= row_end:  # a new event row (idx ascends): one division per row
            j = f // n
            row_end = (j + 1) * n
        c = f - j * n
        if c < s_lo or c >= s_hi:  # another thread's sample
            continue
        o = out_t[c]
        w_j = w[j]
        v = _value(xf, f, out_t)
        for col in range(c_lo, c_hi):  # unsigned bounds: LLVM vectorises this loop
            o[col] += w_j[col] * v


@numba.njit(cache=True, nogil=True, inline="always")
def _scatter_vector(w, xf, idx, total, o, lo, hi):
    """Columns ``[lo, hi)`` of ``o = sum_j v_j W[j]`` for one sample (``n == 1``: ``idx`` are the rows j),
    four rows a pass: ``o = (((o + a) + b) + c) + d``, the order of one row at a time, a quarter of the
    loads and stores of ``o``."""
    c_lo, c_hi = np.uint64(lo), np.uint64(hi)
    for col in range(c_lo, c_hi):
        o[col] = 0
    p = 0
    while p + 4 <= total:
        j0, j1, j2, j3 = idx[p], idx[p + 1], idx[p + 2], idx[p + 3]
        w0, w1, w2, w3 = w[j0], w[j1], w[j2], w[j3]
        v0, v1, v2, v3 = _value(xf, j0, o), _value(xf, j1, o), _value(xf, j2, o), _value(xf, j3, o)
        for col in range(c_lo, c_hi):
            o[col] = (((o[col] + w0[col] * v0) + w1[col] * v1) + w2[col] * v2) + w3[col] * v3
        p += 4
    while p < total:
        w0 = w[idx[p]]
        v0 = _value(xf, idx[p], o)
        for col in range(c_lo, c_hi):
            o[col] += w0[col] * v0
        p += 1


@numba.njit(parallel=_PARALLEL, cache=True, nogil=True)
def scatter(threads, w, x, out_t):
    """``out_t (n, m) = (e(x).T @ w)``: w (k, m), x (k, n) events; only active events visited."""
    xf = _bytes(x).reshape(x.size)
    idx, total = _active(xf)
    m = out_t.shape[1]
    parts = numba.int64(_parts_of(threads, total * m))
    n = out_t.shape[0]
    if parts == 1:
        if n == 1:
            _scatter_vector(w, xf, idx, total, out_t[0], 0, m)
        else:
            _scatter_block(w, xf, idx, total, out_t, 0, n, 0, m)
        return
    blocks = (m + _BLOCK - 1) // _BLOCK
    ends, t0 = start_region(parts)
    for t in prange(parts):
        if n == 1:  # one sample: column blocks
            lo = min(((blocks * t) // parts) * _BLOCK, m)
            hi = min(((blocks * (t + 1)) // parts) * _BLOCK, m)
            if hi > lo:
                _scatter_vector(w, xf, idx, total, out_t[0], lo, hi)
        elif (n * (t + 1)) // parts > (n * t) // parts:  # a batch: each thread its samples (its own rows)
            _scatter_block(w, xf, idx, total, out_t, (n * t) // parts, (n * (t + 1)) // parts, 0, m)
        part_done(ends, t)
    region_done(ends, t0)


@numba.njit(cache=True, nogil=True, inline="always")
def _gather_columns(w, xf, ptr, rows, out, lo, hi):
    """Rows ``[lo, hi)`` of ``out[i, c] = sum_{j active in c} v_jc W[i, j]`` for sparse events, a block
    of rows at a time: each active column is a constant-stride run (prefetched); four columns a pass."""
    n = out.shape[1]
    acc = np.empty(_ROWS, out.dtype)
    for b_lo in range(lo, hi, _ROWS):
        b_hi = min(b_lo + _ROWS, hi)
        size = b_hi - b_lo
        for c in range(n):
            for i in range(size):
                acc[i] = 0
            p, end = ptr[c], ptr[c + 1]
            while p + 4 <= end:
                j0, j1, j2, j3 = rows[p], rows[p + 1], rows[p + 2], rows[p + 3]
                v0 = _value(xf, j0 * n + c, out)
                v1 = _value(xf, j1 * n + c, out)
                v2 = _value(xf, j2 * n + c, out)
                v3 = _value(xf, j3 * n + c, out)
                for i in range(size):
                    w_i = w[b_lo + i]
                    acc[i] = (((acc[i] + w_i[j0] * v0) + w_i[j1] * v1) + w_i[j2] * v2) + w_i[j3] * v3
                p += 4
            while p < end:
                j0 = rows[p]
                v0 = _value(xf, j0 * n + c, out)
                for i in range(size):
                    acc[i] += w[b_lo + i, j0] * v0
                p += 1
            for i in range(size):
                out[b_lo + i, c] = acc[i]


@numba.njit(cache=True, nogil=True, inline="always")
def _gather_row_dots(w, xf, ptr, rows, out, lo, hi):
    """Rows ``[lo, hi)`` of ``out[i, c] = sum_{j active in c} v_jc W[i, j]`` for denser events, a row at a
    time (ascending addresses, streamed by the hardware), four partial sums."""
    n = out.shape[1]
    for i in range(lo, hi):
        w_i = w[i]
        o = out[i]
        for c in range(n):
            a, b = ptr[c], ptr[c + 1]
            acc0 = _zero_of(out)
            acc1 = acc0
            acc2 = acc0
            acc3 = acc0
            p = a
            while p + 4 <= b:
                j0, j1, j2, j3 = rows[p], rows[p + 1], rows[p + 2], rows[p + 3]
                acc0 += w_i[j0] * _value(xf, j0 * n + c, out)
                acc1 += w_i[j1] * _value(xf, j1 * n + c, out)
                acc2 += w_i[j2] * _value(xf, j2 * n + c, out)
                acc3 += w_i[j3] * _value(xf, j3 * n + c, out)
                p += 4
            while p < b:
                acc0 += w_i[rows[p]] * _value(xf, rows[p] * n + c, out)
                p += 1
            o[c] = (acc0 + acc1) + (acc2 + acc3)


@numba.njit(parallel=_PARALLEL, cache=True, nogil=True)
def gather(threads, w, x, out):
    """``out (m, n) = w @ e(x)``: w (m, k), x (k, n) events; each row sums only the active columns."""
    xf = _bytes(x).reshape(x.size)
    idx, total = _active(xf)
    ptr, rows = _by_sample(idx, total, x.shape[1])
    m = out.shape[0]
    parts = numba.int64(_parts_of(threads, total * m * _GATHER_COST))
    # sparse (under one active event in _DENSE_GATHER): strided columns; else row dots
    by_columns = total * _DENSE_GATHER < x.shape[0] * x.shape[1]
    if parts == 1:
        if by_columns:
            _gather_columns(w, xf, ptr, rows, out, 0, m)
        else:
            _gather_row_dots(w, xf, ptr, rows, out, 0, m)
        return
    blocks = (m + _ROWS - 1) // _ROWS
    ends, t0 = start_region(parts)
    for t in prange(parts):
        lo = min(((blocks * t) // parts) * _ROWS, m)
        hi = min(((blocks * (t + 1)) // parts) * _ROWS, m)
        if hi > lo and by_columns:
            _gather_columns(w, xf, ptr, rows, out, lo, hi)
        elif hi > lo:
            _gather_row_dots(w, xf, ptr, rows, out, lo, hi)
        part_done(ends, t)
    region_done(ends, t0)


# ---------------------------------------------------------------------------
# weight gradient kernels: outer(e(s), g), written once
# ---------------------------------------------------------------------------
@numba.njit(cache=True, nogil=True, inline="always")
def _outer_rows_block(xf, idx, ptr, n, g_t, out, lo, hi):
    """Rows ``[lo, hi)`` of ``out[j] = sum_{c active in j} v_jc g_t[c]``; inactive rows 0."""
    m = out.shape[1]
    for j in range(lo, hi):
        row = out[j]
        a, b = ptr[j], ptr[j + 1]
        if a == b:
            for col in range(m):
                row[col] = 0
            continue
        g0 = g_t[idx[a] - j * n]
        v0 = _value(xf, idx[a], out)
        for col in range(m):
            row[col] = g0[col] * v0
        for p in range(a + 1, b):
            gc = g_t[idx[p] - j * n]
            v = _value(xf, idx[p], out)
            for col in range(m):
                row[col] += gc[col] * v


@numba.njit(parallel=_PARALLEL, cache=True, nogil=True)
def outer_rows(threads, x, g_t, out):
    """``out (k, m) = e(x) @ g_t``: x (k, n) events, g_t (n, m); the rows of inactive events are zeros."""
    xf = _bytes(x).reshape(x.size)
    idx, total = _active(xf)
    k, n = x.shape
    ptr, _, _ = _by_row(idx, total, n, k)
    parts = numba.int64(_parts_of(threads, k * out.shape[1]))
    if parts == 1:
        _outer_rows_block(xf, idx, ptr, n, g_t, out, 0, k)
        return
    ends, t0 = start_region(parts)
    for t in prange(parts):
        _outer_rows_block(xf, idx, ptr, n, g_t, out, (k * t) // parts, (k * (t + 1)) // parts)
        part_done(ends, t)
    region_done(ends, t0)


@numba.njit(cache=True, nogil=True, inline="always")
def _outer_cols_block(xf, idx, ptr, rows, n_rows, n, g, out, lo, hi):
    """Rows ``[lo, hi)`` of ``out[i, j] = sum_{c active in j} g[i, c] v_jc``; inactive columns 0."""
    k = out.shape[1]
    for i in range(lo, hi):
        row = out[i]
        g_i = g[i]
        for col in range(k):
            row[col] = 0
        for r in range(n_rows):
            j = rows[r]
            a = ptr[j]
            acc = g_i[idx[a] - j * n] * _value(xf, idx[a], out)
            for p in range(a + 1, ptr[j + 1]):
                acc += g_i[idx[p] - j * n] * _value(xf, idx[p], out)
            row[j] = acc


@numba.njit(parallel=_PARALLEL, cache=True, nogil=True)
def outer_cols(threads, x, g, out):
    """``out (m, k) = g @ e(x).T``: x (k, n) events, g (m, n); the columns of inactive events are zeros."""
    xf = _bytes(x).reshape(x.size)
    idx, total = _active(xf)
    k, n = x.shape
    ptr, rows, n_rows = _by_row(idx, total, n, k)
    m = out.shape[0]
    parts = numba.int64(_parts_of(threads, m * out.shape[1]))
    if parts == 1:
        _outer_cols_block(xf, idx, ptr, rows, n_rows, n, g, out, 0, m)
        return
    ends, t0 = start_region(parts)
    for t in prange(parts):
        _outer_cols_block(xf, idx, ptr, rows, n_rows, n, g, out, (m * t) // parts, (m * (t + 1)) // parts)
        part_done(ends, t)
    region_done(ends, t0)


@numba.njit(cache=True, nogil=True, inline="always")
def _parts_of(threads, work):
    """Threads to split ``work`` over: 1 below ``PARALLEL_MIN_WORK``."""
    return 1 if threads < 2 or work < PARALLEL_MIN_WORK else threads


# (kind, transpose) -> kernel
KERNELS = {("matmul", True): scatter, ("matmul", False): gather,
           ("outer", True): outer_rows, ("outer", False): outer_cols}


# ---------------------------------------------------------------------------
# generators (the ops' backend slot)
# ---------------------------------------------------------------------------


def events_for_kernel(x, weighted: bool, dtype):
    """Events as a kernel reads them: bool (binary) or values in the compute dtype (weighted)."""
    if not weighted:
        return as_bool_events(x)
    return x if x.dtype == dtype else x.astype(dtype)


def matmul_generator(outs, ins, transpose: bool, weighted: bool):
    """Numba kernel for ``binary_densemv_p`` / ``binary_densemm_p`` (a vector is a ``(k, 1)`` matrix)."""
    out = outs[0]
    dtype = compute_dtype(out.dtype)
    kernel_fn = KERNELS[("matmul", bool(transpose))]

    def kernel(weights, spikes):
        w = weights if weights.dtype == dtype else weights.astype(dtype)
        x = events_for_kernel(spikes, weighted, dtype)
        x2 = x if x.ndim == 2 else x.reshape(x.shape[0], 1)
        m, n = (w.shape[1] if transpose else w.shape[0]), x2.shape[1]
        if transpose:  # batch-major inside; the transposes cancel with callers' ``S (n, k) @ W``
            y = numba_cpu.call(kernel_fn, (w, x2), (n, m), dtype).T
        else:
            y = numba_cpu.call(kernel_fn, (w, x2), (m, n), dtype)
        return [y.reshape(out.shape).astype(out.dtype)]

    return kernel


def outer_generator(outs, ins, transpose: bool, weighted: bool):
    """Numba kernel for ``binary_dense_outer_p``: ``outer(e(s), g)``, only active events computed."""
    out = outs[0]
    dtype = compute_dtype(out.dtype)
    kernel_fn = KERNELS[("outer", bool(transpose))]

    def kernel(spikes, g):
        x = events_for_kernel(spikes, weighted, dtype)
        g = g if g.dtype == dtype else g.astype(dtype)
        x2 = x if x.ndim == 2 else x.reshape(x.shape[0], 1)
        g2 = g if g.ndim == 2 else g.reshape(g.shape[0], 1)
        y = numba_cpu.call(kernel_fn, (x2, g2.T if transpose else g2), out.shape, dtype)
        return [y.astype(out.dtype)]

    return kernel


for _op in (ops.binary_densemv_p, ops.binary_densemm_p):
    _op.def_numba_kernel(matmul_generator)
ops.binary_dense_outer_p.def_numba_kernel(outer_generator)

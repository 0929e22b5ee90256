"""Numba CPU backend of the dense event ops in :mod:`evjax.primitives.dense.ops`.

Imported by the ops the first time they lower with ``backend="numba"``; it
registers its generators on them.  Four kernels, chosen by a table
(:data:`KERNELS`), serve vectors and matrices of events alike: a vector is a
``(k, 1)`` matrix (a free reshape), so one compiled kernel per dtype signature
covers ``binary_densemv`` and ``binary_densemm``.  Every kernel first lists
the active events (``s != 0``) in one pass over the events (:func:`_active`:
their flat indices ``j * n + c`` in order, runs of eight silent events skipped
with one test), then visits only them:

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

Each kernel lists the active events, decides how many parts its work is split
into and runs its part loop (``_*_part``: part ``t`` of ``parts``) either once
on the calling thread (one part) or in a ``prange`` over the parts: the
serial and the parallel path call one compiled loop.  The kernels hold only
these few lines (Numba's parallel passes analyse the whole function around a
``prange``; a parallel function of its own below the kernel would have LLVM
optimise the loop it calls once more, which measured slower to compile).
Which part computes an output never changes its sum: every output is summed
in event order by one part, so any split gives the same bits.  The part loops
are called, not inlined at Numba's IR level (LLVM inlines what pays off), and
take positions as ``np.int64`` values, never literals, so each is compiled
once per signature.  The two row additions that the one-vector scatter and
its serial tier share (:func:`_add_four_rows`, :func:`_add_row`) are inlined
at the IR level: called, they ran the forward 15-20 % slower.

Events select (``docs/semantics.md``): only active events are visited, so an
inactive one contributes nothing whatever its weights hold.  Bool events reach
the kernels as their uint8 bytes (the handler reads the buffer so:
``numba_cpu.call(..., bool_as_bytes=True)``) and their value is 1, not read
(``w * 1`` is ``w`` exactly, nan and inf included; :func:`_value`); graded
(weighted) events arrive as floats and scale.  float16 and bfloat16 are computed in float32.
Each kernel takes the thread count first: its handler passes the one in force
at each call (:mod:`evjax.backends.threads`).
"""
from __future__ import annotations

import numba
import numpy as np
from numba import prange, types
from numba.extending import overload

from ..._kernel_compat import COMPILED_CODE_ONLY, prange_only, stack_array_intrinsic
from ...backends import numba_cpu
from ...backends.threads import part_done, region_done, start_region
from ...dtypes import as_dtype, compute_dtype
from ..event_scan import eight_zero
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
I0, I1 = np.int64(0), np.int64(1)
U0 = np.uint64(0)
DONE, SPLITTABLE = numba_cpu.DONE, numba_cpu.SPLITTABLE
stack_array = stack_array_intrinsic()  # small fixed scratch on the stack (no allocator to compile)
# The helpers below the kernels are only called from compiled code: no Python entry point is built for them.
_HELPER = dict(cache=True, nogil=True, **COMPILED_CODE_ONLY)


def _value(xf, f, one):
    """The value of the active event at flat index ``f`` in ``one``'s type: ``one`` for a bool event or its
    byte (nothing is read: ``w * 1`` is ``w`` exactly), the event's value for a graded one."""
    raise NotImplementedError("compiled by Numba only")


@overload(_value, jit_options=dict(nogil=True, **COMPILED_CODE_ONLY))
def _value_overload(xf, f, one):
    if isinstance(xf.dtype, (types.Integer, types.Boolean)):
        return lambda xf, f, one: one
    return lambda xf, f, one: one * xf[f]


# ---------------------------------------------------------------------------
# the active events, once
# ---------------------------------------------------------------------------
@numba.njit(**_HELPER)
def _active(x):
    """Flat indices ``j * n + c`` of the nonzero entries of the events ``x`` (k, n), ascending:
    ``(idx, count)``.

    Eight entries at a time: a run of eight zeros is skipped with one test; inside the others the
    indices are written branch-free (nan is nonzero: active, as in the reference)."""
    xf = x.reshape(x.size)
    size = xf.shape[0]
    idx = np.empty(size, np.int64)
    total = 0
    end = size - size % 8
    for base in range(0, end, 8):
        if (xf[base] != 0) | (xf[base + 1] != 0) | (xf[base + 2] != 0) | (xf[base + 3] != 0) | \
                (xf[base + 4] != 0) | (xf[base + 5] != 0) | (xf[base + 6] != 0) | (xf[base + 7] != 0):
            for b in range(base, base + 8):
                idx[total] = b
                total += xf[b] != 0
    for f in range(end, size):
        idx[total] = f
        total += xf[f] != 0
    return idx, np.int64(total)


@numba.njit(**_HELPER)
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


@numba.njit(**_HELPER)
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
    return ptr, rows, np.int64(n_rows)


# ---------------------------------------------------------------------------
# forward kernels
# ---------------------------------------------------------------------------
@numba.njit(inline="always", **_HELPER)
def _add_four_rows(o, w, xf, j0, j1, j2, j3, one, lo, hi):
    """``o[lo:hi] = (((o + v0 W[j0]) + v1 W[j1]) + v2 W[j2]) + v3 W[j3]``: the additions of one row at a time,
    in the same order, with a quarter of the loads and stores of ``o`` (``lo``, ``hi`` unsigned: LLVM
    vectorises the loop)."""
    w0, w1, w2, w3 = w[j0], w[j1], w[j2], w[j3]
    v0, v1, v2, v3 = _value(xf, j0, one), _value(xf, j1, one), _value(xf, j2, one), _value(xf, j3, one)
    for col in range(lo, hi):
        o[col] = (((o[col] + w0[col] * v0) + w1[col] * v1) + w2[col] * v2) + w3[col] * v3


@numba.njit(inline="always", **_HELPER)
def _add_row(o, w, xf, j, one, lo, hi):
    """``o[lo:hi] += v_j W[j]`` (``lo``, ``hi`` unsigned)."""
    w0 = w[j]
    v0 = _value(xf, j, one)
    for col in range(lo, hi):
        o[col] += w0[col] * v0


@numba.njit(parallel=_PARALLEL, cache=True, nogil=True)
def scatter(threads, w, x, out_t):
    """``out_t (n, m) = (e(x).T @ w)``: w (k, m), x (k, n) events; only active events visited."""
    idx, total = _active(x)
    if threads < 2 or total * out_t.shape[1] < PARALLEL_MIN_WORK:
        _scatter_part(w, x, idx, total, out_t, I0, I1)
        return
    parts = np.int64(threads)
    ends, t0 = start_region(parts)
    for t in prange(parts):
        _scatter_part(w, x, idx, total, out_t, np.int64(t), parts)
        part_done(ends, t)
    region_done(ends, t0)


@numba.njit(**_HELPER)
def _scatter_part(w, x, idx, total, out_t, t, parts):
    """Part ``t`` of ``parts`` of ``out_t[c] = sum_j v_jc W[j]`` over the active events (j, c), in order.

    A batch (``n > 1``): the part's samples, every active event of the others skipped.  One sample
    (``idx`` are then the rows j): the part's block of columns, four rows a pass,
    ``o = (((o + a) + b) + c) + d``, the order of one row at a time, a quarter of the loads and stores
    of ``o``."""
    xf = x.reshape(x.size)
    n, m = out_t.shape
    one = out_t.dtype.type(1)
    if n == 1:
        blocks = (m + _BLOCK - 1) // _BLOCK
        lo = min(((blocks * t) // parts) * _BLOCK, m)
        hi = min(((blocks * (t + 1)) // parts) * _BLOCK, m)
        if hi <= lo:
            return
        c_lo, c_hi = np.uint64(lo), np.uint64(hi)  # unsigned bounds: LLVM vectorises these loops
        o = out_t[0]
        for col in range(c_lo, c_hi):
            o[col] = 0
        p = 0
        while p + 4 <= total:
            _add_four_rows(o, w, xf, idx[p], idx[p + 1], idx[p + 2], idx[p + 3], one, c_lo, c_hi)
            p += 4
        while p < total:
            _add_row(o, w, xf, idx[p], one, c_lo, c_hi)
            p += 1
        return
    s_lo, s_hi = (n * t) // parts, (n * (t + 1)) // parts
    if s_hi <= s_lo:
        return
    for c in range(s_lo, s_hi):
        row = out_t[c]
        for col in range(m):
            row[col] = 0
    m_end = np.uint64(m)
    j = 0
    row_end = 0
    for p in range(total):
        f = idx[p]
        if f >= row_end:  # a new event row (idx ascends): one division per row
            j = f // n
            row_end = (j + 1) * n
        c = f - j * n
        if c < s_lo or c >= s_hi:  # another part's sample
            continue
        o = out_t[c]
        w_j = w[j]
        v = _value(xf, f, one)
        for col in range(m_end):  # unsigned bounds: LLVM vectorises this loop
            o[col] += w_j[col] * v


@numba.njit(parallel=_PARALLEL, cache=True, nogil=True)
def gather(threads, w, x, out):
    """``out (m, n) = w @ e(x)``: w (m, k), x (k, n) events; each row sums only the active columns."""
    idx, total = _active(x)
    ptr, rows = _by_sample(idx, total, np.int64(x.shape[1]))
    # sparse (under one active event in _DENSE_GATHER): strided columns; else row dots
    by_columns = total * _DENSE_GATHER < x.size
    if threads < 2 or total * out.shape[0] * _GATHER_COST < PARALLEL_MIN_WORK:
        _gather_part(w, x, ptr, rows, out, by_columns, I0, I1)
        return
    parts = np.int64(threads)
    ends, t0 = start_region(parts)
    for t in prange(parts):
        _gather_part(w, x, ptr, rows, out, by_columns, np.int64(t), parts)
        part_done(ends, t)
    region_done(ends, t0)


@numba.njit(**_HELPER)
def _gather_part(w, x, ptr, rows, out, by_columns, t, parts):
    """Part ``t`` of ``parts`` (whole blocks of ``_ROWS`` rows) of ``out[i, c] = sum_{j active in c} v_jc
    W[i, j]``.

    ``by_columns`` (sparse events): a block of rows at a time, each active column a constant-stride
    run (prefetched), four columns a pass.  Else (denser events) a row at a time (ascending
    addresses, streamed by the hardware), four partial sums."""
    xf = x.reshape(x.size)
    m, n = out.shape
    blocks = (m + _ROWS - 1) // _ROWS
    lo = min(((blocks * t) // parts) * _ROWS, m)
    hi = min(((blocks * (t + 1)) // parts) * _ROWS, m)
    one = out.dtype.type(1)
    if by_columns:
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
                    v0 = _value(xf, j0 * n + c, one)
                    v1 = _value(xf, j1 * n + c, one)
                    v2 = _value(xf, j2 * n + c, one)
                    v3 = _value(xf, j3 * n + c, one)
                    for i in range(size):
                        w_i = w[b_lo + i]
                        acc[i] = (((acc[i] + w_i[j0] * v0) + w_i[j1] * v1) + w_i[j2] * v2) + w_i[j3] * v3
                    p += 4
                while p < end:
                    j0 = rows[p]
                    v0 = _value(xf, j0 * n + c, one)
                    for i in range(size):
                        acc[i] += w[b_lo + i, j0] * v0
                    p += 1
                for i in range(size):
                    out[b_lo + i, c] = acc[i]
        return
    for i in range(lo, hi):
        w_i = w[i]
        o = out[i]
        for c in range(n):
            a, b = ptr[c], ptr[c + 1]
            acc0 = out.dtype.type(0)
            acc1 = acc0
            acc2 = acc0
            acc3 = acc0
            p = a
            while p + 4 <= b:
                j0, j1, j2, j3 = rows[p], rows[p + 1], rows[p + 2], rows[p + 3]
                acc0 += w_i[j0] * _value(xf, j0 * n + c, one)
                acc1 += w_i[j1] * _value(xf, j1 * n + c, one)
                acc2 += w_i[j2] * _value(xf, j2 * n + c, one)
                acc3 += w_i[j3] * _value(xf, j3 * n + c, one)
                p += 4
            while p < b:
                acc0 += w_i[rows[p]] * _value(xf, rows[p] * n + c, one)
                p += 1
            o[c] = (acc0 + acc1) + (acc2 + acc3)


# ---------------------------------------------------------------------------
# weight gradient kernels: outer(e(s), g), written once
# ---------------------------------------------------------------------------
@numba.njit(parallel=_PARALLEL, cache=True, nogil=True)
def outer_rows(threads, x, g_t, out):
    """``out (k, m) = e(x) @ g_t``: x (k, n) events, g_t (n, m); the rows of inactive events are zeros."""
    idx, total = _active(x)
    ptr, _, _ = _by_row(idx, total, np.int64(x.shape[1]), np.int64(x.shape[0]))
    if threads < 2 or out.size < PARALLEL_MIN_WORK:
        _outer_rows_part(x, idx, ptr, g_t, out, I0, I1)
        return
    parts = np.int64(threads)
    ends, t0 = start_region(parts)
    for t in prange(parts):
        _outer_rows_part(x, idx, ptr, g_t, out, np.int64(t), parts)
        part_done(ends, t)
    region_done(ends, t0)


@numba.njit(**_HELPER)
def _outer_rows_part(x, idx, ptr, g_t, out, t, parts):
    """Part ``t`` of ``parts`` (a range of rows ``j``) of ``out[j] = sum_{c active in j} v_jc g_t[c]``;
    inactive rows 0."""
    xf = x.reshape(x.size)
    k, m = out.shape
    n = g_t.shape[0]
    one = out.dtype.type(1)
    for j in range((k * t) // parts, (k * (t + 1)) // parts):
        row = out[j]
        a, b = ptr[j], ptr[j + 1]
        if a == b:
            for col in range(m):
                row[col] = 0
            continue
        g0 = g_t[idx[a] - j * n]
        v0 = _value(xf, idx[a], one)
        for col in range(m):
            row[col] = g0[col] * v0
        for p in range(a + 1, b):
            gc = g_t[idx[p] - j * n]
            v = _value(xf, idx[p], one)
            for col in range(m):
                row[col] += gc[col] * v


@numba.njit(parallel=_PARALLEL, cache=True, nogil=True)
def outer_cols(threads, x, g, out):
    """``out (m, k) = g @ e(x).T``: x (k, n) events, g (m, n); the columns of inactive events are zeros."""
    idx, total = _active(x)
    ptr, rows, n_rows = _by_row(idx, total, np.int64(x.shape[1]), np.int64(x.shape[0]))
    if threads < 2 or out.size < PARALLEL_MIN_WORK:
        _outer_cols_part(x, idx, ptr, rows, n_rows, g, out, I0, I1)
        return
    parts = np.int64(threads)
    ends, t0 = start_region(parts)
    for t in prange(parts):
        _outer_cols_part(x, idx, ptr, rows, n_rows, g, out, np.int64(t), parts)
        part_done(ends, t)
    region_done(ends, t0)


@numba.njit(**_HELPER)
def _outer_cols_part(x, idx, ptr, rows, n_rows, g, out, t, parts):
    """Part ``t`` of ``parts`` (a range of rows ``i``) of ``out[i, j] = sum_{c active in j} g[i, c] v_jc``;
    inactive columns 0."""
    xf = x.reshape(x.size)
    m, k = out.shape
    n = g.shape[1]
    one = out.dtype.type(1)
    for i in range((m * t) // parts, (m * (t + 1)) // parts):
        row = out[i]
        g_i = g[i]
        for col in range(k):
            row[col] = 0
        for r in range(n_rows):
            j = rows[r]
            a = ptr[j]
            acc = g_i[idx[a] - j * n] * _value(xf, idx[a], one)
            for p in range(a + 1, ptr[j + 1]):
                acc += g_i[idx[p] - j * n] * _value(xf, idx[p], one)
            row[j] = acc


# ---------------------------------------------------------------------------
# serial tiers (numba_cpu.call's ``serial``): each kernel's one-part path alone, what a first call
# compiles; the kernel's parallel function is compiled at the third call it would split
# (SPLITTABLE: any split gives the same bits here)
# ---------------------------------------------------------------------------
@numba.njit(cache=True, nogil=True)
def serial_scatter(threads, w, x, out_t):
    """The serial tier of :func:`scatter` (a batch: one vector has :func:`serial_scatter_vector`): the
    one-part path of :func:`_scatter_part`, the active events found as the scan goes (eight silent
    ones skipped with one test), not listed first (no list: less for a first call to compile).  Each
    output row ``c`` adds its active events' rows ``v_jc W[j]`` in event-row order, one at a time, as
    the kernel does (its four-row pass for one sample adds in that order too): the same bits."""
    xf = x.reshape(x.size)
    n, m = out_t.shape
    one = out_t.dtype.type(1)
    m_end = np.uint64(m)
    for c in range(n):
        row = out_t[c]
        for col in range(m_end):
            row[col] = 0
    size = xf.shape[0]
    total = 0
    base = 0
    while base < size:
        hi = base + 8 if base + 8 < size else size  # (min(): a compile of its own)
        if hi - base == 8 and eight_zero(xf, base):
            base = hi
            continue
        for f in range(base, hi):
            if xf[f] != 0:
                total += 1
                j = f // n
                o = out_t[f - j * n]
                w_j = w[j]
                v = _value(xf, f, one)
                for col in range(m_end):  # unsigned bounds: LLVM vectorises this loop
                    o[col] += w_j[col] * v
        base = hi
    return SPLITTABLE if threads >= 2 and total * m >= PARALLEL_MIN_WORK else DONE


@numba.njit(cache=True, nogil=True)
def serial_gather(threads, w, x, out):
    """The serial tier of :func:`gather`."""
    idx, total = _active(x)
    ptr, rows = _by_sample(idx, total, np.int64(x.shape[1]))
    _gather_part(w, x, ptr, rows, out, total * _DENSE_GATHER < x.size, I0, I1)
    return SPLITTABLE if threads >= 2 and total * out.shape[0] * _GATHER_COST >= PARALLEL_MIN_WORK else DONE


@numba.njit(cache=True, nogil=True)
def serial_outer_rows(threads, x, g_t, out):
    """The serial tier of :func:`outer_rows` (a batch: one vector has :func:`serial_outer_rows_vector`):
    the one-part path of :func:`_outer_rows_part` with no list of the active events (nothing
    allocated): row ``j`` is its first active sample's ``v_jc g_t[c]``, then the others' added in
    sample order, zeros where none is active: the same bits."""
    xf = x.reshape(x.size)
    k, m = out.shape
    n = np.int64(g_t.shape[0])
    one = out.dtype.type(1)
    for j in range(k):
        row = out[j]
        first = True
        for c in range(n):
            f = j * n + c
            if xf[f] != 0:
                gc = g_t[c]
                v = _value(xf, f, one)
                if first:
                    for col in range(m):
                        row[col] = gc[col] * v
                    first = False
                else:
                    for col in range(m):
                        row[col] += gc[col] * v
        if first:
            for col in range(m):
                row[col] = 0
    return SPLITTABLE if threads >= 2 and out.size >= PARALLEL_MIN_WORK else DONE


@numba.njit(cache=True, nogil=True)
def serial_outer_cols(threads, x, g, out):
    """The serial tier of :func:`outer_cols`."""
    idx, total = _active(x)
    ptr, rows, n_rows = _by_row(idx, total, np.int64(x.shape[1]), np.int64(x.shape[0]))
    _outer_cols_part(x, idx, ptr, rows, n_rows, g, out, I0, I1)
    return SPLITTABLE if threads >= 2 and out.size >= PARALLEL_MIN_WORK else DONE


@numba.njit(cache=True, nogil=True)
def serial_scatter_vector(threads, w, x, out_t):
    """The serial tier of :func:`scatter` for one vector of events (``x`` of shape ``(k, 1)``): the one-part
    path of :func:`_scatter_part`, its active rows found as the scan goes (eight zero rows skipped with
    one test), four at a time, instead of listed first (no list, no row grouping: less for a first call
    to compile); the same additions in the same order, so the same bits."""
    xf = x.reshape(x.size)
    o = out_t[0]
    m = np.uint64(o.shape[0])
    one = out_t.dtype.type(1)
    for col in range(m):
        o[col] = 0
    size = xf.shape[0]
    four = stack_array(4, numba.int64)  # the active rows not yet added (np.empty: a compile of its own)
    pending = 0
    total = 0
    base = 0
    while base < size:
        hi = base + 8 if base + 8 < size else size  # (min(): a compile of its own)
        if hi - base == 8 and eight_zero(xf, base):
            base = hi
            continue
        for j in range(base, hi):
            if xf[j] != 0:
                four[pending] = j
                pending += 1
                if pending == 4:
                    _add_four_rows(o, w, xf, four[0], four[1], four[2], four[3], one, U0, m)
                    pending = 0
                    total += 4
        base = hi
    total += pending
    for t in range(pending):  # the last active rows, fewer than four, one at a time
        _add_row(o, w, xf, four[t], one, U0, m)
    return SPLITTABLE if threads >= 2 and total * out_t.shape[1] >= PARALLEL_MIN_WORK else DONE


@numba.njit(cache=True, nogil=True)
def serial_outer_rows_vector(threads, x, g_t, out):
    """The serial tier of :func:`outer_rows` for one vector of events (``x`` of shape ``(k, 1)``): row ``j``
    is ``g_t[0] * v_j`` where event ``j`` is active, zeros elsewhere, as :func:`_outer_rows_part` writes
    it, with no list of the active events (nothing allocated)."""
    xf = x.reshape(x.size)
    k, m = out.shape
    g0 = g_t[0]
    one = out.dtype.type(1)
    for j in range(k):
        row = out[j]
        if xf[j] == 0:
            for col in range(m):
                row[col] = 0
            continue
        v0 = _value(xf, j, one)
        for col in range(m):
            row[col] = g0[col] * v0
    return SPLITTABLE if threads >= 2 and out.size >= PARALLEL_MIN_WORK else DONE


# (kind, transpose) -> kernel
KERNELS = {("matmul", True): scatter, ("matmul", False): gather,
           ("outer", True): outer_rows, ("outer", False): outer_cols}
# kernel -> its serial tier
SERIAL_TIERS = {scatter: serial_scatter, gather: serial_gather, outer_rows: serial_outer_rows,
                outer_cols: serial_outer_cols}
# kernel -> its serial tier for one vector of events (the static shape decides: x of shape (k, 1))
VECTOR_TIERS = {scatter: serial_scatter_vector, outer_rows: serial_outer_rows_vector}


def _serial_tier(kernel_fn, x2):
    """The serial tier a first call of ``kernel_fn`` compiles for the events ``x2`` (static shape)."""
    if x2.shape[1] == 1 and kernel_fn in VECTOR_TIERS:
        return VECTOR_TIERS[kernel_fn]
    return SERIAL_TIERS[kernel_fn]


# ---------------------------------------------------------------------------
# generators (the ops' backend slot)
# ---------------------------------------------------------------------------


def matmul_generator(outs, ins, transpose: bool, weighted: bool):
    """Numba kernel for ``binary_densemv_p`` / ``binary_densemm_p`` (a vector is a ``(k, 1)`` matrix)."""
    out = outs[0]
    dtype = compute_dtype(out.dtype)
    kernel_fn = KERNELS[("matmul", bool(transpose))]

    def kernel(weights, spikes):
        w = as_dtype(weights, dtype)
        x2 = ops.kernel_events(spikes, weighted, dtype)  # bool: the handler hands the kernel their bytes
        m, n = (w.shape[1] if transpose else w.shape[0]), x2.shape[1]
        if transpose:  # batch-major inside; the transposes cancel with callers' ``S (n, k) @ W``
            y = numba_cpu.call(kernel_fn, (w, x2), (n, m), dtype, bool_as_bytes=True,
                               serial=_serial_tier(kernel_fn, x2)).T
        else:
            y = numba_cpu.call(kernel_fn, (w, x2), (m, n), dtype, bool_as_bytes=True,
                               serial=_serial_tier(kernel_fn, x2))
        return [y.reshape(out.shape).astype(out.dtype)]

    return kernel


def outer_generator(outs, ins, transpose: bool, weighted: bool):
    """Numba kernel for ``binary_dense_outer_p``: ``outer(e(s), g)``, only active events computed."""
    out = outs[0]
    dtype = compute_dtype(out.dtype)
    kernel_fn = KERNELS[("outer", bool(transpose))]

    def kernel(spikes, g):
        x2, g2 = ops.outer_operands(spikes, g, weighted, dtype)
        y = numba_cpu.call(kernel_fn, (x2, g2.T if transpose else g2), out.shape, dtype,
                           bool_as_bytes=True, serial=_serial_tier(kernel_fn, x2))
        return [y.astype(out.dtype)]

    return kernel


for _op in (ops.binary_densemv_p, ops.binary_densemm_p):
    _op.def_numba_kernel(matmul_generator)
ops.binary_dense_outer_p.def_numba_kernel(outer_generator)

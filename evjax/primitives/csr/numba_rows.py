"""Row-level loops of the Numba CSR kernels in :mod:`evjax.primitives.csr.numba`.

Small ``@numba.njit(inline="always")`` helpers (and five ``@overload``-dispatched
ones), inlined into every kernel specialisation: clamped row spans, unsigned
column reads, the NaN rules (``_visits``: which rows a scatter visits;
``_product``: one term, where an event selects and a value multiplies), the
gather dot product of one row, the scatter of one row or a range of active
rows, and the work counts that decide how a scatter is split over threads;
the thresholds above which the kernels (here and in ``numba_weighted``) go
parallel.  Nothing here is called from Python.

The kernels of ``numba.py`` and ``numba_weighted.py`` inline this file; their
disk cache is fresh only while every file of this folder is unchanged
(:func:`evjax._kernel_compat.stamp_kernel_caches`), so an edit here rebuilds them.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import prange, types
from numba.extending import overload

from ..._kernel_compat import prange_only
from ...backends.threads import add_parts, part_done, pool_chunks, region_done, start_region

# Below this many synapses visited a kernel stays on one thread: waking the
# pool, splitting the work and (scatter) summing per-thread outputs would cost
# about as much as it saves.
PARALLEL_MIN_WORK = 65536
# A vector scatter on several threads zero-fills and sums a private copy of its
# output per extra thread, O(n_out) each: it goes parallel from this many
# synapses *and* at least VECTOR_SCATTER_WORK_PER_OUTPUT per output.  Measured
# on 2 cores (fan-out 40-200, kernel called directly, fresh cache): 33k
# synapses into 4000 outputs 0.86x the serial time, 80k into 4000 0.62x,
# 80k into 20000 0.83x, 158k into 20000 0.69x; 39k into 20000 1.13x (slower).
# Through the op (benchmarks/fixed_fan.py) 46k into 4000 was slower on two
# threads (42 -> 54 us), so the floor is 65536, not 32768.
VECTOR_SCATTER_PARALLEL_MIN_WORK = 65536
VECTOR_SCATTER_WORK_PER_OUTPUT = 4


@numba.njit(cache=True, nogil=True, inline="always")
def _vector_scatter_serial(work, n_out):
    """Whether a vector scatter of ``work`` synapses into ``n_out`` outputs stays on one thread."""
    return work < VECTOR_SCATTER_PARALLEL_MIN_WORK or work < VECTOR_SCATTER_WORK_PER_OUTPUT * n_out


@numba.njit(cache=True, nogil=True, inline="always")
def _vector_scatter_parts(work, n_out):
    """How many parts a vector scatter's sum is split into: 1 (one pass, no private copy) below the
    thresholds, else up to Numba's pool size, each part beyond the first with at least
    ``VECTOR_SCATTER_WORK_PER_OUTPUT`` synapses per output.

    A function of the inputs and the pool size only, never of how many threads run the parts
    (:func:`evjax.backends.threads.threads_now`): one thread runs the same parts in turn, so the
    sum is the same bits either way.
    """
    pool = np.int64(pool_chunks())
    if pool < 2 or _vector_scatter_serial(work, n_out):
        return np.int64(1)
    return min(pool, max(np.int64(2), work // (VECTOR_SCATTER_WORK_PER_OUTPUT * n_out)))

# A batch scatter splits whole samples between threads: no private copies, so
# the pool pays off much earlier than for a vector.  Its cost is the synapses
# visited plus the zero-fill of the (K, n_out) output (a memset, counted a
# quarter per element).  Measured on 2 cores (kernel called directly, 2 threads
# over serial, batch 32 unless said): 4000 x 40 at 0.2 % (12k synapses) 0.63x,
# at 1 % (49k) 0.85x; 4000 x 200 at 0.2 % (53k) 0.57x; 10000 x 10 at 0.1 %
# (3k synapses, 320k outputs) 0.65x; 500 x 10 at 5 % (8k, 16k outputs) 0.89x;
# 1000 x 10 at 1 % (3k, 32k outputs) 1.01x; 200 x 20 at 10 %, batch 8 (3k, 2k
# outputs) 0.97x.  (It was PARALLEL_MIN_WORK = 65536 synapses: the 49k case ran
# serial, 1.4x the hand-written prange loop of benchmarks/fixed_fan.py.)
BATCH_SCATTER_PARALLEL_MIN_COST = 8192


@numba.njit(cache=True, nogil=True, inline="always")
def _batch_scatter_serial(synapses, n_outputs):
    """Whether a batch scatter visiting ``synapses`` into ``n_outputs`` output entries stays on one thread."""
    return synapses + n_outputs // 4 < BATCH_SCATTER_PARALLEL_MIN_COST

# The weight gradient (SDDMM) computes some entries and zero-fills the rest: its
# cost is the computed entries plus a quarter of all of them.  Measured on 2
# cores (kernel called directly, 2 threads over serial, event rows at 5 %
# unless said): 20000 x 200 (4M entries, 200k computed) 0.37x, at 1 % 0.62x,
# at 20 % 0.40x; 4000 x 40 (160k entries, 8k computed) 0.59x; 2000 x 40 (80k,
# 3k) 0.68x; 1000 x 40 (40k, 2k) 0.76x; 1000 x 10 (10k, 500) 0.91x.  (It was
# 262144 computed entries, the zero-fill uncounted: the gradient at 20000 x 200,
# 5 % ran serial.)
SDDMM_PARALLEL_MIN_COST = 16384


@numba.njit(cache=True, nogil=True, inline="always")
def _sddmm_serial(computed, entries):
    """Whether a weight gradient computing ``computed`` of its ``entries`` (the rest zero-filled)
    stays on one thread."""
    return computed + entries // 4 < SDDMM_PARALLEL_MIN_COST

# Only explicit ``prange`` loops run on the pool: with plain ``parallel=True``
# Numba also turns array expressions (``out[:] = 0``, ``np.zeros``) into
# parallel regions, which would wake every thread even on the serial path.
_PARALLEL = prange_only()

# inline="always" gives every kernel specialisation the same, fully optimised loop.
#
# Synapse positions are unsigned (uint64): indexing with them skips Numba's
# wrap-around of negative indices, which otherwise costs a compare per access
# and keeps LLVM from turning zero-fills into memsets.  (uint64 + int64 is
# float64 in Numba, hence the U1..U8 constants.)
U0, U1, U2, U3, U4 = np.uint64(0), np.uint64(1), np.uint64(2), np.uint64(3), np.uint64(4)
U5, U6, U7, U8 = np.uint64(5), np.uint64(6), np.uint64(7), np.uint64(8)


@numba.njit(cache=True, nogil=True, inline="always")
def _span(indptr, i, nnz):
    """Synapses ``[a, b)`` of row ``i``, unsigned, both ends clamped to ``[0, nnz]``."""
    a = min(max(np.int64(indptr[i]), np.int64(0)), np.int64(nnz))
    b = min(max(np.int64(indptr[i + 1]), np.int64(0)), np.int64(nnz))
    return np.uint64(a), np.uint64(b)


@numba.njit(cache=True, nogil=True, inline="always")
def _zero(arr, lo, hi):
    """``arr[lo:hi] = 0`` for a 1-d array, as a plain unsigned loop (LLVM makes it a
    memset; Numba's slice assignment and signed loops are several times slower)."""
    for k in range(np.uint64(lo), np.uint64(hi)):
        arr[k] = 0


@numba.njit(cache=True, nogil=True, inline="always")
def _column(indices, k):
    """Column of synapse ``k`` as unsigned: one compare ``< n`` also rejects negatives."""
    return np.uint64(np.int64(indices[k]))


@numba.njit(cache=True, nogil=True)
def _balanced_rows(indptr, n_rows, nnz, parts):
    """``parts + 1`` row boundaries that split the synapses evenly."""
    bounds = np.empty(parts + 1, np.int64)
    bounds[0] = 0
    row = 0
    for p in range(1, parts):
        target = (nnz * p) // parts
        while row < n_rows and indptr[row] < target:
            row += 1
        bounds[p] = row
    bounds[parts] = n_rows
    return bounds


def _numeric(x):
    """A bool array as its uint8 bytes (Numba's bool loads are slow); others unchanged."""
    return x


@overload(_numeric)
def _numeric_overload(x):
    if isinstance(x, types.Array) and isinstance(x.dtype, types.Boolean):
        return lambda x: x.view(np.uint8)
    return lambda x: x


def _zero_of(arr):
    """A zero scalar of ``arr``'s dtype (the accumulator type)."""
    return arr.dtype.type(0)


@overload(_zero_of)
def _zero_of_overload(arr):
    dtype = arr.dtype
    # (``np.zeros(1, arr.dtype)[0]`` compiles to a slow loop in later
    # specialisations of a kernel, Numba 0.68)
    return lambda arr: dtype(0)


def _is_event_type(ty) -> bool:
    """Events reach the kernels as bool or as their uint8 bytes (see ``_numeric``); values as floats."""
    return isinstance(ty, (types.Boolean, types.Integer))


def _visits(s):
    """Whether a scatter visits a row whose input is ``s``.

    Events: only active rows (a silent event contributes nothing, whatever its
    weights hold).  Values: every row, as IEEE arithmetic does (``0 * nan`` is nan).
    """
    raise NotImplementedError("compiled by Numba only")


@overload(_visits)
def _visits_overload(s):
    if _is_event_type(s):
        return lambda s: s != 0
    return lambda s: True


def _product(a, b):
    """One term of a sum: ``a * b`` for two values (IEEE); an event operand selects the other
    (``b if a else 0``), never multiplies it, so a silent event hides a nan or inf weight."""
    raise NotImplementedError("compiled by Numba only")


@overload(_product)
def _product_overload(a, b):
    if _is_event_type(a) and _is_event_type(b):
        return lambda a, b: 1 if (a != 0 and b != 0) else 0
    if _is_event_type(a):
        value = b  # the value's Numba type, for its zero
        return lambda a, b: b if a != 0 else value(0)
    if _is_event_type(b):
        value = a
        return lambda a, b: a if b != 0 else value(0)
    return lambda a, b: a * b


def _skips_zero_rows(r, q):
    """Whether an SDDMM ``g[k] = <r[i], q[j]>`` may skip the rows where ``r`` is zero: only
    where an operand is events (every term of such a row is then 0, see ``_product``); two
    value operands give the IEEE product on every row (``0 * inf`` is nan)."""
    raise NotImplementedError("compiled by Numba only")


@overload(_skips_zero_rows)
def _skips_zero_rows_overload(r, q):
    skips = _is_event_type(r.dtype) or _is_event_type(q.dtype)
    return lambda r, q: skips


@numba.njit(cache=True, nogil=True, inline="always")
def _gather_row(data, indices, a, b, x, homogeneous, zero):
    """``sum_k _product(data[k], x[indices[k]])`` over ``k in [a, b)`` (``data[0]``
    for every k when homogeneous): four independent accumulators (of ``zero``'s
    type) hide the latency of the additions.

    Term by term, never ``w * sum(x)``: a row with no active event (or no
    synapse) is 0 even for a nan or inf weight, and ``inf * 0`` terms stay nan.
    """
    n = np.uint64(x.shape[0])
    a0 = zero
    a1 = zero
    a2 = zero
    a3 = zero
    k = a
    if homogeneous:
        w = data[0]
        while k + U3 < b:
            j0, j1, j2, j3 = _column(indices, k), _column(indices, k + U1), _column(indices, k + U2), \
                _column(indices, k + U3)
            if j0 < n:
                a0 += _product(w, x[j0])
            if j1 < n:
                a1 += _product(w, x[j1])
            if j2 < n:
                a2 += _product(w, x[j2])
            if j3 < n:
                a3 += _product(w, x[j3])
            k += U4
        while k < b:
            j0 = _column(indices, k)
            if j0 < n:
                a0 += _product(w, x[j0])
            k += U1
        return (a0 + a1) + (a2 + a3)
    while k + U3 < b:
        j0, j1, j2, j3 = _column(indices, k), _column(indices, k + U1), _column(indices, k + U2), \
            _column(indices, k + U3)
        if j0 < n:
            a0 += _product(data[k], x[j0])
        if j1 < n:
            a1 += _product(data[k + U1], x[j1])
        if j2 < n:
            a2 += _product(data[k + U2], x[j2])
        if j3 < n:
            a3 += _product(data[k + U3], x[j3])
        k += U4
    while k < b:
        j0 = _column(indices, k)
        if j0 < n:
            a0 += _product(data[k], x[j0])
        k += U1
    return (a0 + a1) + (a2 + a3)


@numba.njit(cache=True, nogil=True, inline="always")
def _columns8(indices, k, n):
    """Columns of synapses ``k .. k+7`` (unsigned) and whether all eight are below ``n``."""
    j0 = _column(indices, k)
    j1 = _column(indices, k + U1)
    j2 = _column(indices, k + U2)
    j3 = _column(indices, k + U3)
    j4 = _column(indices, k + U4)
    j5 = _column(indices, k + U5)
    j6 = _column(indices, k + U6)
    j7 = _column(indices, k + U7)
    valid = (j0 < n) & (j1 < n) & (j2 < n) & (j3 < n) & (j4 < n) & (j5 < n) & (j6 < n) & (j7 < n)
    return valid, j0, j1, j2, j3, j4, j5, j6, j7


@numba.njit(cache=True, nogil=True, inline="always")
def _scatter_span(data, indices, a, b, s, target, homogeneous):
    """``target[indices[k]] += data[k] * s`` for ``k in [a, b)``, one synapse at a time."""
    n = np.uint64(target.shape[0])
    w = data[0] * s if homogeneous else s  # (per-synapse data may be empty: no data[0] then)
    for k in range(a, b):
        j = _column(indices, k)
        if j < n:
            target[j] += w if homogeneous else data[k] * s


@numba.njit(cache=True, nogil=True, inline="always")
def _scatter_row(data, indices, indptr, i, s, target, homogeneous):
    """``target[indices[k]] += data[k] * s`` for the synapses ``k`` of row ``i``.

    Eight synapses per step, their columns checked together: the independent
    read-modify-writes overlap (20-30 % faster than one at a time at 5-20 %
    rates, n=4000).  A block with an out-of-range column goes one by one.
    """
    n = np.uint64(target.shape[0])
    a, b = _span(indptr, i, indices.shape[0])
    k = a
    if homogeneous:
        w = data[0] * s
        while k + U8 <= b:
            valid, j0, j1, j2, j3, j4, j5, j6, j7 = _columns8(indices, k, n)
            if valid:
                target[j0] += w
                target[j1] += w
                target[j2] += w
                target[j3] += w
                target[j4] += w
                target[j5] += w
                target[j6] += w
                target[j7] += w
            else:
                _scatter_span(data, indices, k, k + U8, s, target, True)
            k += U8
        _scatter_span(data, indices, k, b, s, target, True)
    else:
        while k + U8 <= b:
            valid, j0, j1, j2, j3, j4, j5, j6, j7 = _columns8(indices, k, n)
            if valid:
                target[j0] += data[k] * s
                target[j1] += data[k + U1] * s
                target[j2] += data[k + U2] * s
                target[j3] += data[k + U3] * s
                target[j4] += data[k + U4] * s
                target[j5] += data[k + U5] * s
                target[j6] += data[k + U6] * s
                target[j7] += data[k + U7] * s
            else:
                _scatter_span(data, indices, k, k + U8, s, target, False)
            k += U8
        _scatter_span(data, indices, k, b, s, target, False)


def _event_words(x):
    """Events (``x`` as uint8 bytes) as 64-bit words, eight rows each; any other ``x``: no words."""
    raise NotImplementedError("compiled by Numba only")


@overload(_event_words, inline="always")
def _event_words_overload(x):
    if isinstance(x, types.Array) and x.dtype == types.uint8 and x.layout == "C":
        return lambda x: x[:(x.shape[0] // 8) * 8].view(np.uint64)
    return lambda x: np.empty(0, np.uint64)


@numba.njit(cache=True, nogil=True, inline="always")
def _scatter_rows(data, indices, indptr, x, target, lo, hi, homogeneous):
    """``target[indices[k]] += data[k] * x[i]`` for the rows ``i`` in ``[lo, hi)`` that ``_visits``.

    Events: silent rows are skipped (eight rows aligned to a 64-bit word of the
    uint8 bytes, see ``_numeric``, are tested at once, so silent stretches cost
    an eighth of a per-row test); an active row adds its weights times 1, as
    IEEE arithmetic does.  Values: every row, ``x[i] == 0`` included (IEEE:
    a nan or inf weight times 0 is nan).

    One plain inlined function for events and values alike: ``_scatter_row`` is
    inlined once per call site, and Numba inlines this function before typing,
    once per site (an ``@overload(inline="always")`` here was re-inlined at
    every typing pass: about twice the compile time of a scatter kernel).
    """
    words = _event_words(x)
    wordwise = words.shape[0] > 0
    i = lo
    while i < hi:
        if wordwise and i % 8 == 0 and i + 8 <= hi and words[i // 8] == 0:
            i += 8
            continue
        s = x[i]
        if _visits(s):
            # (events: 1 in the weights' dtype; values already have that dtype)
            _scatter_row(data, indices, indptr, i, data.dtype.type(s), target, homogeneous)
        i += 1


@numba.njit(cache=True, nogil=True)
def _scatter_part(data, indices, indptr, x, out, private, bounds, part, homogeneous):
    """Part ``part`` of a split scatter (:func:`_split_scatter`): rows ``bounds[part] .. bounds[part + 1]``
    into ``out`` (part 0) or its private copy. Not inlined: the one compiled copy of the row loop
    serves both ways of running the parts."""
    target = out if part == 0 else private[part - 1]
    _scatter_rows(data, indices, indptr, x, target, bounds[part], bounds[part + 1], homogeneous)


@numba.njit(cache=True, nogil=True, inline="always")
def _split_scatter(threads, bounds, scatter_part, data, indices, indptr, x, out, homogeneous):
    """A vector scatter in ``bounds.shape[0] - 1`` parts (``scatter_part``: one part, e.g.
    :func:`_scatter_part`; a global function, which this inlined helper calls statically), each
    into its own copy of ``out``, summed in part order per output: on ``threads`` threads (parallel
    regions that report stalls, see :mod:`evjax.backends.threads`) or, with one thread, in turn;
    the same bits either way."""
    parts = bounds.shape[0] - 1
    n = out.shape[0]
    private = np.zeros((parts - 1, n), out.dtype)
    if threads > 1:
        ends, t0 = start_region(parts)
        for t in prange(parts):
            scatter_part(data, indices, indptr, x, out, private, bounds, t, homogeneous)
            part_done(ends, t)
        region_done(ends, t0)
        ends, t0 = start_region(parts)
        for t in prange(parts):
            add_parts(out, private, (n * t) // parts, (n * (t + 1)) // parts)
            part_done(ends, t)
        region_done(ends, t0)
    else:
        for t in range(parts):
            scatter_part(data, indices, indptr, x, out, private, bounds, t, homogeneous)
        add_parts(out, private, 0, n)


@numba.njit(cache=True, nogil=True, inline="always")
def _count_active(x):
    """Rows a scatter visits (see ``_visits``): the active events, or every row of values."""
    count = 0
    for i in range(x.shape[0]):
        count += _visits(x[i])
    return count


@numba.njit(cache=True, nogil=True, inline="always")
def _count_nonzero(x):
    count = 0
    for i in range(x.shape[0]):
        count += x[i] != 0
    return count


@numba.njit(cache=True, nogil=True, inline="always")
def _row_work(indptr, x, i):
    """Synapses of row ``i`` if a scatter visits it, else 0 (branch-free, unclamped: only used to split work)."""
    return _visits(x[i]) * (np.int64(indptr[i + 1]) - np.int64(indptr[i]))


@numba.njit(cache=True, nogil=True, inline="always")
def _active_work(indptr, x):
    """Synapses of the active rows."""
    work = 0
    for i in range(x.shape[0]):
        work += _row_work(indptr, x, i)
    return work


@numba.njit(cache=True, nogil=True)
def _split_active_work(indptr, x, work, parts):
    """Row boundaries of ``parts`` ranges with equal active work."""
    n_rows = x.shape[0]
    bounds = np.empty(parts + 1, np.int64)
    bounds[0] = 0
    done = 0
    row = 0
    for t in range(1, parts):
        target = (work * t) // parts
        while row < n_rows and done < target:
            done += _row_work(indptr, x, row)
            row += 1
        bounds[t] = row
    bounds[parts] = n_rows
    return bounds

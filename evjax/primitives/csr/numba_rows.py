"""Row loops of the Numba CSR kernels in :mod:`evjax.primitives.csr.numba`, and their thresholds.

One plain ``@numba.njit`` loop per kind of work, shared by every kernel that
does it: the gather of rows (a vector or a batch), the scatter of rows, the
weight gradient (SDDMM) of rows; the work counts and splits that decide how a
sum is divided into parts; the thresholds above which the kernels go
parallel.  Nothing here is called from Python.

Each loop is compiled once per argument signature and called (not inlined at
Numba's IR level: LLVM inlines what pays off), so a kernel's first compile
costs its own few lines plus the loops it calls, and the serial and parallel
paths of a kernel share one compiled loop.  Loops take positions and flags as
variables (``np.int64``, ``bool``): a literal argument would compile another
specialisation.

``selects`` (a loop's last arguments) is the NaN rule of ``docs/semantics.md``:
an operand that selects (events, bool as their uint8 bytes, or weighted
events) contributes nothing where it is zero, whatever the other operand
holds; a value operand multiplies (IEEE: ``0 * nan`` is nan).  Every term is
``w * s`` in the weights' dtype (an event is 1), replaced by 0 where a
selecting operand is 0.

Every loop tolerates a malformed structure passed under ``jit``: row spans
are clamped to ``[0, nnz]`` and columns outside ``[0, n)`` are ignored.

The kernels' disk cache is fresh only while every file of this folder is
unchanged (:func:`evjax._kernel_compat.stamp_kernel_caches`), so an edit here
rebuilds them.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic, overload

from ..._kernel_compat import COMPILED_CODE_ONLY, prange_only, stack_array_intrinsic
from ...backends.intrinsics import prefetch
from ...backends.threads import pool_chunks
from ..event_scan import eight_zero
from ..spans import row_span

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


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _vector_scatter_serial(work, n_out):
    """Whether a vector scatter of ``work`` synapses into ``n_out`` outputs stays on one thread."""
    return work < VECTOR_SCATTER_PARALLEL_MIN_WORK or work < VECTOR_SCATTER_WORK_PER_OUTPUT * n_out


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
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


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
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


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _sddmm_serial(computed, entries):
    """Whether a weight gradient computing ``computed`` of its ``entries`` (the rest zero-filled)
    stays on one thread."""
    return computed + entries // 4 < SDDMM_PARALLEL_MIN_COST

# Only explicit ``prange`` loops run on the pool: with plain ``parallel=True``
# Numba also turns array expressions (``out[:] = 0``, ``np.zeros``) into
# parallel regions, which would wake every thread even on the serial path.
_PARALLEL = prange_only()

# Synapse positions are unsigned (uint64): indexing with them skips Numba's
# wrap-around of negative indices, which otherwise costs a compare per access
# and keeps LLVM from turning zero-fills into memsets.  (uint64 + int64 is
# float64 in Numba, hence the U1..U8 constants.)
I0 = np.int64(0)
U0, U1, U2, U3, U4 = np.uint64(0), np.uint64(1), np.uint64(2), np.uint64(3), np.uint64(4)
U5, U6, U7, U8 = np.uint64(5), np.uint64(6), np.uint64(7), np.uint64(8)


@intrinsic
def _selects(typingctx, x):
    """Whether an operand selects by its type: events (bool or their uint8 bytes) do, floats do not.
    A constant in the caller's IR (an intrinsic: an ``@overload`` would compile a function of its
    own, 0.02-0.04 s per operand type)."""
    dtype = x.dtype if isinstance(x, types.Array) else x
    events = isinstance(dtype, (types.Boolean, types.Integer))

    def codegen(context, builder, signature, args):
        return context.get_constant(types.boolean, events)

    return types.literal(events)(x), codegen  # (a literal: callers specialise on it)


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _zero(arr, lo, hi):
    """``arr[lo:hi] = 0`` for a 1-d array, as a plain unsigned loop (LLVM makes it a memset)."""
    for k in range(np.uint64(lo), np.uint64(hi)):
        arr[k] = 0


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
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


# ---------------------------------------------------------------------------
# gather: out[i] = sum_{k in row i} w_k * x[indices[k]]
# ---------------------------------------------------------------------------
def _cast(zero, s):
    """``s`` in ``zero``'s type (an event: 1 or 0)."""
    raise NotImplementedError("compiled by Numba only")


@overload(_cast)
def _cast_overload(zero, s):
    kind = zero
    return lambda zero, s: kind(s)


@intrinsic
def _choose(typingctx, active, value, otherwise):
    """``value if active else otherwise`` as one LLVM ``select`` (no branch), which LLVM vectorises
    in the gather's loop; Numba's conditional expression leaves a branch there."""
    def codegen(context, builder, signature, args):
        flag, chosen, other = args
        other = context.cast(builder, other, signature.args[2], signature.args[1])
        flag = context.cast(builder, flag, signature.args[0], types.boolean)
        return builder.select(flag, chosen, other)

    return value(active, value, otherwise), codegen


def _term(w, v, zero, selects):
    """One term ``w * v`` in the accumulator's type; 0 where ``v`` selects and is 0."""
    raise NotImplementedError("compiled by Numba only")


@overload(_term)
def _term_overload(w, v, zero, selects):
    if isinstance(v, types.Float):  # (the full gathers' values): a select, the product computed either
        def chosen(w, v, zero, selects):  # way and dropped, so a silent nan or inf weight adds nothing
            if selects:
                return _choose(v != 0, w * _cast(zero, v), zero)
            return w * _cast(zero, v)
        return chosen

    def branched(w, v, zero, selects):  # (events as bytes: the serial tiers, cheaper to compile)
        if selects and v == 0:
            return zero
        return w * _cast(zero, v)
    return branched


def _gathered_values(x, out):
    """A vector ``x`` as values of ``out``'s dtype: ``x`` itself if it is float (or a batch), else a
    converted copy (events: 1 and 0; counts: their values, as :func:`_cast` gives them term by
    term).  The vector gather reads ``x`` at random columns: float values let LLVM vectorise those
    reads with the select of :func:`_term` (bytes do not): the event gather took 1.3-1.5x its time
    before.  A batch stays as it is: each column's row is read whole, and 4-byte values would
    quadruple that traffic.  The full gathers only: the serial tiers keep the bytes and
    :func:`_term`'s branch, whose loop compiles in less time (the same bits)."""
    raise NotImplementedError("compiled by Numba only")


@overload(_gathered_values)
def _gathered_values_overload(x, out):
    if isinstance(x.dtype, types.Float) or x.ndim != 1:  # a batch reads each column's row of bytes whole
        return lambda x, out: x

    def converted(x, out):
        values = np.empty(x.shape, out.dtype)
        flat, into = x.ravel(), values.ravel()
        for j in range(flat.shape[0]):
            into[j] = flat[j]
        return values
    return converted


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _gather_rows_mv(data, indices, indptr, x, out, lo, hi, selects):
    """Rows ``[lo, hi)`` of ``out[i] = sum_k term(data[k], x[indices[k]])`` (``data[0]`` for every k
    when homogeneous): four partial sums over blocks of four synapses, the rest into the first,
    ``(s0 + s1) + (s2 + s3)``; a column outside ``[0, n)`` adds nothing.

    Term by term, never ``w * sum(x)``: a row with no active event (or no synapse) is 0 even
    for a nan or inf weight, and ``inf * 0`` terms stay nan.
    """
    numba.literally(selects)  # a constant of each compiled loop: LLVM drops the unused rule
    n = np.uint64(x.shape[0])
    nnz = indices.shape[0]
    homogeneous = data.shape[0] != nnz
    zero = out.dtype.type(0)
    for i in range(lo, hi):
        a, b = row_span(indptr, i, nnz)
        s0 = zero
        s1 = zero
        s2 = zero
        s3 = zero
        k = a
        if homogeneous:
            w = data[0]
            while k + U3 < b:
                j0 = np.uint64(np.int64(indices[k]))
                j1 = np.uint64(np.int64(indices[k + U1]))
                j2 = np.uint64(np.int64(indices[k + U2]))
                j3 = np.uint64(np.int64(indices[k + U3]))
                if j0 < n:
                    s0 += _term(w, x[j0], zero, selects)
                if j1 < n:
                    s1 += _term(w, x[j1], zero, selects)
                if j2 < n:
                    s2 += _term(w, x[j2], zero, selects)
                if j3 < n:
                    s3 += _term(w, x[j3], zero, selects)
                k += U4
            while k < b:
                j0 = np.uint64(np.int64(indices[k]))
                if j0 < n:
                    s0 += _term(w, x[j0], zero, selects)
                k += U1
        else:
            while k + U3 < b:
                j0 = np.uint64(np.int64(indices[k]))
                j1 = np.uint64(np.int64(indices[k + U1]))
                j2 = np.uint64(np.int64(indices[k + U2]))
                j3 = np.uint64(np.int64(indices[k + U3]))
                if j0 < n:
                    s0 += _term(data[k], x[j0], zero, selects)
                if j1 < n:
                    s1 += _term(data[k + U1], x[j1], zero, selects)
                if j2 < n:
                    s2 += _term(data[k + U2], x[j2], zero, selects)
                if j3 < n:
                    s3 += _term(data[k + U3], x[j3], zero, selects)
                k += U4
            while k < b:
                j0 = np.uint64(np.int64(indices[k]))
                if j0 < n:
                    s0 += _term(data[k], x[j0], zero, selects)
                k += U1
        out[i] = (s0 + s1) + (s2 + s3)


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _gather_rows_mm(data, indices, indptr, x, out, lo, hi, selects):
    """Rows ``[lo, hi)`` of ``out[i, c] = sum_k term(data[k], x[indices[k], c])``, term by term."""
    numba.literally(selects)  # a constant of each compiled loop: LLVM drops the unused rule
    n = np.uint64(x.shape[0])
    width = x.shape[1]
    nnz = indices.shape[0]
    homogeneous = data.shape[0] != nnz
    zero = out.dtype.type(0)
    for i in range(lo, hi):
        row = out[i]
        for c in range(width):
            row[c] = zero
        a, b = row_span(indptr, i, nnz)
        for k in range(a, b):
            j = np.uint64(np.int64(indices[k]))
            if j < n:
                xj = x[j]
                w = data[0] if homogeneous else data[k]
                for c in range(width):
                    row[c] += _term(w, xj[c], zero, selects)


def _gather_rows(data, indices, indptr, x, out, lo, hi, selects):
    """Rows ``[lo, hi)`` of ``out = A @ x``: :func:`_gather_rows_mv` for a vector ``x``,
    :func:`_gather_rows_mm` for a batch."""
    raise NotImplementedError("compiled by Numba only")


@overload(_gather_rows)
def _gather_rows_overload(data, indices, indptr, x, out, lo, hi, selects):
    if x.ndim == 2:
        return lambda data, indices, indptr, x, out, lo, hi, selects: \
            _gather_rows_mm(data, indices, indptr, x, out, lo, hi, selects)
    return lambda data, indices, indptr, x, out, lo, hi, selects: \
        _gather_rows_mv(data, indices, indptr, x, out, lo, hi, selects)


def _width(x):
    """Columns of a row-major batch; 1 for a vector."""
    raise NotImplementedError("compiled by Numba only")


@overload(_width)
def _width_overload(x):
    if x.ndim == 2:
        return lambda x: x.shape[1]
    return lambda x: 1


# ---------------------------------------------------------------------------
# scatter: target[indices[k]] += w_k * x[i]
# ---------------------------------------------------------------------------
# The event scatter reads the synapses of rows spread over the whole matrix: where it is larger
# than the caches (and the active rows change from call to call, as a network's spikes do), each
# row's first column indices and weights are a cache miss, and one row's misses wait for the row
# before to be added.  So the scatter finds the rows it visits SCATTER_LOOKAHEAD visits ahead (the
# scan of a selecting operand into a ring of that many rows; a list is read ahead) and prefetches
# the first PREFETCH_BYTES of their column indices and weights then, and the row pointers of the
# listed rows twice as far ahead.  The same rows, in the same order, add the same terms: the same
# bits.  Measured in benchmarks/results/ab_spikes.md (new spikes at each call) and ab_kernels.md (the
# same spikes at every call, the rows cached: 0.99x in the geometric mean with 128 bytes a row; 256
# bytes cost cached single vectors at n = 4000 up to 1.82x, ab_kernels_earlier_runs.md; see
# docs/performance.md, "Matrices larger than the caches").
SCATTER_LOOKAHEAD = 4
_RING = 8  # the ring's size: a power of two, at least SCATTER_LOOKAHEAD
PREFETCH_BYTES = 128  # of each array, per row: two cache lines (the hardware prefetcher follows a longer row)
stack_array = stack_array_intrinsic()


@numba.njit(cache=True, nogil=True, inline="always", **COMPILED_CODE_ONLY)
def _prefetch_span(array, a, b):
    """Prefetch the cache lines of ``array[a:b]`` (its first ``PREFETCH_BYTES``); ``a <= b``."""
    size = np.int64(array.itemsize)
    address = np.int64(array.ctypes.data) + a * size
    stop = address + min((b - a) * size, np.int64(PREFETCH_BYTES))
    while address < stop:
        prefetch(address)
        address += 64


@numba.njit(cache=True, nogil=True, inline="always", **COMPILED_CODE_ONLY)
def _prefetch_row(data, indices, indptr, i, nnz, homogeneous):
    """Prefetch the first column indices and weights of row ``i`` (its span clamped to ``[0, nnz]``)."""
    a = min(max(np.int64(indptr[i]), np.int64(0)), nnz)
    b = min(max(np.int64(indptr[i + 1]), a), nnz)
    _prefetch_span(indices, a, b)
    if not homogeneous:
        _prefetch_span(data, a, b)


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _scatter_rows(data, indices, indptr, x, target, lo, hi, selects, ids=None):
    """``target[indices[k]] += data[k] * s_i`` for the synapses ``k`` of the visited rows ``i``
    (``data[0] * s_i`` when homogeneous): the rows ``[lo, hi)`` with ``s_i = x[i]``, or, given
    ``ids``, the listed rows ``ids[lo:hi]`` (events as the list of their active rows, ascending;
    ``s_i = 1``; ``x`` unused; a row outside the matrix adds nothing).

    Selecting operands (events, weighted events): rows with ``x[i] == 0`` are
    skipped, eight aligned rows tested at once where all are zero, so the cost
    follows the synapses of the active rows.  Values: every row, ``x[i] == 0``
    included (IEEE).  A listed row adds what its row adds in the range form, in
    the same order: the same bits.  Per row, eight synapses per step, their
    columns checked together (the independent read-modify-writes overlap); a
    block with a column out of range goes one by one.  The rows to visit are
    found ``SCATTER_LOOKAHEAD`` visits ahead and their synapses prefetched (see
    above).

    One function, no helpers but the eight-zero test and the inlined prefetches:
    it is the whole serial tier of the vector scatter, and a first call compiles
    it in about a third of a second (nested helpers cost Numba a compile and a
    link each).
    """
    n = np.uint64(target.shape[0])
    nnz = np.int64(indices.shape[0])
    n_rows = np.int64(indptr.shape[0] - 1)
    homogeneous = data.shape[0] != nnz
    ring = stack_array(_RING, numba.int64)  # a selecting scan's rows found and not yet visited
    found = np.int64(0)  # rows put in the ring so far; `taken` of them taken out
    taken = np.int64(0)
    q = np.int64(lo)  # where the look-ahead of a selecting scan is
    p = lo
    while True:
        if ids is None:
            if selects:
                while q < hi and found - taken < SCATTER_LOOKAHEAD:
                    if q % 8 == 0 and q + 8 <= hi and eight_zero(x, q):
                        q += 8
                        continue
                    if x[q] != 0:
                        ring[found & (_RING - 1)] = q
                        found += 1
                        _prefetch_row(data, indices, indptr, q, nnz, homogeneous)
                    q += 1
                if taken == found:
                    break
                i = ring[taken & (_RING - 1)]
                taken += 1
                s = data.dtype.type(x[i])
                if s == 0:  # (x[i] != 0 may still convert to 0 in the weights' dtype)
                    continue
            else:
                if p >= hi:
                    break
                i = np.int64(p)
                p += 1
                s = data.dtype.type(x[i])
        else:
            if p >= hi:
                break
            if p + 2 * SCATTER_LOOKAHEAD < hi:
                r = np.int64(ids[p + 2 * SCATTER_LOOKAHEAD])
                if 0 <= r < n_rows:
                    _prefetch_span(indptr, r, r + 1)
            if p + SCATTER_LOOKAHEAD < hi:
                r = np.int64(ids[p + SCATTER_LOOKAHEAD])
                if 0 <= r < n_rows:
                    _prefetch_row(data, indices, indptr, r, nnz, homogeneous)
            i = np.int64(ids[p])
            p += 1
            if i < 0 or i >= n_rows:
                continue
            s = data.dtype.type(1)
        a = np.uint64(min(max(np.int64(indptr[i]), np.int64(0)), nnz))
        b = np.uint64(min(max(np.int64(indptr[i + 1]), np.int64(0)), nnz))
        w = data[0] * s if homogeneous else s  # (per-synapse data may be empty: no data[0] then)
        k = a
        while k + U8 <= b:
            j0 = np.uint64(np.int64(indices[k]))
            j1 = np.uint64(np.int64(indices[k + U1]))
            j2 = np.uint64(np.int64(indices[k + U2]))
            j3 = np.uint64(np.int64(indices[k + U3]))
            j4 = np.uint64(np.int64(indices[k + U4]))
            j5 = np.uint64(np.int64(indices[k + U5]))
            j6 = np.uint64(np.int64(indices[k + U6]))
            j7 = np.uint64(np.int64(indices[k + U7]))
            if not ((j0 < n) & (j1 < n) & (j2 < n) & (j3 < n) & (j4 < n) & (j5 < n) & (j6 < n) & (j7 < n)):
                break  # one by one from here
            if homogeneous:
                target[j0] += w
                target[j1] += w
                target[j2] += w
                target[j3] += w
                target[j4] += w
                target[j5] += w
                target[j6] += w
                target[j7] += w
            else:
                target[j0] += data[k] * s
                target[j1] += data[k + U1] * s
                target[j2] += data[k + U2] * s
                target[j3] += data[k + U3] * s
                target[j4] += data[k + U4] * s
                target[j5] += data[k + U5] * s
                target[j6] += data[k + U6] * s
                target[j7] += data[k + U7] * s
            k += U8
        while k < b:
            j = np.uint64(np.int64(indices[k]))
            if j < n:
                target[j] += w if homogeneous else data[k] * s
            k += U1


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _scatter_part(data, indices, indptr, x, out, private, bounds, part, selects):
    """Part ``part`` of a split vector scatter: rows ``bounds[part] .. bounds[part + 1]`` into
    ``out`` (part 0) or its private copy ``private[part - 1]`` (zeroed by the caller)."""
    target = out if part == 0 else private[part - 1]
    _scatter_rows(data, indices, indptr, x, target, bounds[part], bounds[part + 1], selects)


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _scatter_samples(data, indices, indptr, xt, out_t, lo, hi, selects):
    """``out_t[c] = A.T @ xt[c]`` for the samples ``c`` in ``[lo, hi)``, one after the other."""
    for c in range(lo, hi):
        row = out_t[c]
        _zero(row, 0, row.shape[0])
        _scatter_rows(data, indices, indptr, xt[c], row, np.int64(0), np.int64(xt.shape[1]), selects)


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _count_visited(x, selects):
    """Rows a scatter visits: the nonzero rows of a selecting operand, else every row."""
    if not selects:
        return np.int64(x.shape[0])
    count = 0
    for i in range(x.shape[0]):
        count += x[i] != 0
    return np.int64(count)


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _active_work(indptr, x, selects):
    """Synapses of the rows a scatter visits (unclamped: only used to split work)."""
    work = 0
    for i in range(x.shape[0]):
        if not selects or x[i] != 0:
            work += np.int64(indptr[i + 1]) - np.int64(indptr[i])
    return work


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _split_active_work(indptr, x, work, parts, selects):
    """Row boundaries of ``parts`` ranges with equal active work."""
    n_rows = x.shape[0]
    bounds = np.empty(parts + 1, np.int64)
    bounds[0] = 0
    done = 0
    row = 0
    for t in range(1, parts):
        target = (work * t) // parts
        while row < n_rows and done < target:
            if not selects or x[row] != 0:
                done += np.int64(indptr[row + 1]) - np.int64(indptr[row])
            row += 1
        bounds[t] = row
    bounds[parts] = n_rows
    return bounds



@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _listed_count(ids, count):
    """How many rows a list holds: ``count[0]`` clamped to ``[0, len(ids)]``."""
    return min(max(np.int64(count[0]), np.int64(0)), np.int64(ids.shape[0]))


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _listed_work(indptr, ids, m):
    """Synapses of the listed rows ``ids[:m]`` (unclamped, as :func:`_active_work`: only splits work)."""
    n_rows = np.int64(indptr.shape[0] - 1)
    work = 0
    for a in range(m):
        i = np.int64(ids[a])
        if 0 <= i < n_rows:
            work += np.int64(indptr[i + 1]) - np.int64(indptr[i])
    return work


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _split_listed_work(indptr, ids, m, work, parts):
    """Positions in ``ids[:m]`` of ``parts`` ranges of equal work: the same rows in each part as
    :func:`_split_active_work` puts there for the same events (so the parts sum the same bits)."""
    n_rows = np.int64(indptr.shape[0] - 1)
    bounds = np.empty(parts + 1, np.int64)
    bounds[0] = 0
    done = 0
    pos = 0
    for t in range(1, parts):
        target = (work * t) // parts
        while pos < m and done < target:
            i = np.int64(ids[pos])
            if 0 <= i < n_rows:
                done += np.int64(indptr[i + 1]) - np.int64(indptr[i])
            pos += 1
        bounds[t] = pos
    bounds[parts] = m
    return bounds


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _scatter_listed_part(data, indices, indptr, ids, out, private, bounds, part):
    """Part ``part`` of a split listed scatter, as :func:`_scatter_part`."""
    target = out if part == 0 else private[part - 1]
    _scatter_rows(data, indices, indptr, ids, target, bounds[part], bounds[part + 1], True, ids)

# ---------------------------------------------------------------------------
# the weight gradient (SDDMM): g[k] = <r[row k], q[indices[k]]>
# ---------------------------------------------------------------------------
@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _dot(u, v, zero, u_selects, v_selects):
    """``sum_c term(u[c], v[c])``, each term in ``zero``'s type, accumulated in float64
    (reassociated: LLVM vectorises it, once the flags are constants of the compiled loop)."""
    numba.literally(u_selects)
    numba.literally(v_selects)
    acc = 0.0
    for c in range(u.shape[0]):
        a = _cast(zero, u[c])
        b = _cast(zero, v[c])
        acc += zero if ((u_selects and a == 0) or (v_selects and b == 0)) else a * b
    return acc


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _sddmm_rows(indices, indptr, r, q, g, lo, hi, r_selects, q_selects):
    """Rows ``[lo, hi)`` of ``g[k] = term(r[i], q[indices[k]])`` (``r``, ``q`` vectors) or
    ``<r[i, :], q[indices[k], :]>`` (matrices, :func:`_dot`).  Where ``r`` selects or ``q`` is
    events (which never multiply), the rows where ``r`` is all zero give zeros: they are not
    computed but zero-filled, in runs.  Spans and zero-fills are written out here, not called
    (each called function costs a first call a compile of its own)."""
    skips = r_selects or _selects(q)
    n = np.uint64(q.shape[0])
    nnz = np.int64(indices.shape[0])
    zero = g.dtype.type(0)
    zero_from = np.uint64(min(max(np.int64(indptr[lo]), I0), nnz))
    for i in range(lo, hi):
        ri = r[i]
        if not skips or _any(ri):
            a = np.uint64(min(max(np.int64(indptr[i]), I0), nnz))
            b = np.uint64(min(max(np.int64(indptr[i + 1]), I0), nnz))
            for k in range(zero_from, a):
                g[k] = zero
            for k in range(a, b):
                j = np.uint64(np.int64(indices[k]))
                g[k] = _sddmm_term(ri, q, j, n, zero, r_selects, q_selects)
            zero_from = max(zero_from, b)
    end = np.uint64(min(max(np.int64(indptr[hi]), I0), nnz)) if hi > lo else zero_from
    for k in range(zero_from, end):
        g[k] = zero


def _any(u):
    """Whether a scalar or a row is nonzero anywhere."""
    raise NotImplementedError("compiled by Numba only")


@overload(_any)
def _any_overload(u):
    if isinstance(u, types.Array):
        def any_row(u):
            for c in range(u.shape[0]):
                if u[c] != 0:
                    return True
            return False
        return any_row
    return lambda u: u != 0


def _sddmm_term(ri, q, j, n, zero, r_selects, q_selects):
    """One entry of the SDDMM: ``term(ri, q[j])`` (vectors) or ``_dot(ri, q[j])`` (matrices); 0 for
    a column ``j`` outside ``[0, n)``."""
    raise NotImplementedError("compiled by Numba only")


@overload(_sddmm_term)
def _sddmm_term_overload(ri, q, j, n, zero, r_selects, q_selects):
    if isinstance(ri, types.Array):
        return lambda ri, q, j, n, zero, r_selects, q_selects: \
            zero if j >= n else _cast(zero, _dot(ri, q[j], zero, r_selects, q_selects))

    def term(ri, q, j, n, zero, r_selects, q_selects):
        if j >= n:
            return zero
        a = _cast(zero, ri)
        b = _cast(zero, q[j])
        return zero if ((r_selects and a == 0) or (q_selects and b == 0)) else a * b
    return term

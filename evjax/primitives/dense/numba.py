"""Numba CPU backend of the dense event ops in :mod:`evjax.primitives.dense.ops`.

Imported by the ops the first time they lower with ``backend="numba"``; it
registers its generators on them.  Four kernels, chosen by a table
(:data:`KERNELS`), serve vectors and matrices of events alike: a vector is a
``(k, 1)`` matrix (a free reshape), so one compiled kernel per dtype signature
covers ``binary_densemv`` and ``binary_densemm``.  Every kernel first compacts
the active events (``s != 0``) in one pass over the events, then visits only
them:

* ``scatter`` (``transpose=True``, ``W`` of shape ``(k, m)``): for each event
  row ``j``, each active sample ``c`` adds ``v * W[j, :]`` to its output row;
  the output is computed batch-major (``(n, m)``, transposed by XLA around the
  call).  Cost ``active x m``; the inner loop is a contiguous multiply-add.
  Parallel over column blocks of ``W`` above ``PARALLEL_MIN_WORK``.
* ``gather`` (``transpose=False``, ``W`` of shape ``(m, k)``): the active
  events of each sample ``c`` are listed once; ``out[i, c]`` sums
  ``v * W[i, j]`` over that list (four partial sums).  Cost ``m x active``.
  Parallel over rows.
* ``outer_rows`` / ``outer_cols``: the weight gradient ``outer(e(s), g)``
  (``(k, m)`` for ``transpose=True``, ``(m, k)`` otherwise), written once: the
  zeros everywhere, then only the entries of active events.

Events select (``docs/semantics.md``): only active events are visited, so an
inactive one contributes nothing whatever its weights hold.  Bool events are
read as their bytes and their value is 1 (``w * 1`` is ``w`` exactly, nan and
inf included); graded (weighted) events arrive as floats and scale.  float16
and bfloat16 are computed in float32.  Each kernel takes the pool size as a
first, one-element operand (see :func:`pool_size`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numba
import numpy as np
from numba import prange, types
from numba.extending import overload

from ..._kernel_compat import prange_only
from ...backends import numba_cpu
from ...dtypes import compute_dtype
from ...events import as_bool_events
from . import ops

__all__ = ["matmul_generator", "outer_generator", "KERNELS", "PARALLEL_MIN_WORK", "pool_size"]

# Below this many multiply-adds (or written entries; about 0.3 ms of serial work) a kernel stays on
# the calling thread: waking the pool costs more than it saves, and on a busy machine a descheduled
# worker stalls the whole call.
PARALLEL_MIN_WORK = 1 << 21
_BLOCK = 16  # column blocks of a parallel scatter are multiples of one cache line of float32

# Only explicit ``prange`` loops run on the pool (see evjax/primitives/csr/numba.py).
_PARALLEL = prange_only()
U0 = np.uint64(0)


def _bytes(x):
    """A bool array as its uint8 bytes (Numba's bool loads are slow); others unchanged."""
    return x


@overload(_bytes)
def _bytes_overload(x):
    if isinstance(x, types.Array) and isinstance(x.dtype, types.Boolean):
        return lambda x: x.view(np.uint8)
    return lambda x: x


def _zero_of(arr):
    """A zero scalar of ``arr``'s dtype (an accumulator)."""
    return arr.dtype.type(0)


@overload(_zero_of)
def _zero_of_overload(arr):
    dtype = arr.dtype
    return lambda arr: dtype(0)


# ---------------------------------------------------------------------------
# compaction: the active events, once
# ---------------------------------------------------------------------------
@numba.njit(cache=True, nogil=True, inline="always")
def _compact_rows(x, dtype_like):
    """Active events of ``x`` (k, n) by event row: row j's are ``cols/vals[ptr[j]:ptr[j + 1]]``;
    ``rows[:n_rows]`` lists the rows with any.  Values: the event's (1 for bytes)."""
    k, n = x.shape
    ptr = np.empty(k + 1, np.int64)
    cols = np.empty(k * n, np.int64)
    vals = np.empty(k * n, dtype_like.dtype)
    rows = np.empty(k, np.int64)
    total = 0
    n_rows = 0
    ptr[0] = 0
    for j in range(k):
        xj = x[j]
        start = total
        for c in range(n):
            if xj[c] != 0:
                cols[total] = c
                vals[total] = xj[c]
                total += 1
        if total > start:
            rows[n_rows] = j
            n_rows += 1
        ptr[j + 1] = total
    return ptr, cols, vals, rows, n_rows


@numba.njit(cache=True, nogil=True, inline="always")
def _compact_columns(x, dtype_like):
    """Active events of ``x`` (k, n) by sample: column c's are ``rows/vals[ptr[c]:ptr[c + 1]]``."""
    k, n = x.shape
    ptr = np.zeros(n + 1, np.int64)
    for j in range(k):
        xj = x[j]
        for c in range(n):
            if xj[c] != 0:
                ptr[c + 1] += 1
    for c in range(n):
        ptr[c + 1] += ptr[c]
    fill = ptr[:n].copy()
    rows = np.empty(ptr[n], np.int64)
    vals = np.empty(ptr[n], dtype_like.dtype)
    for j in range(k):
        xj = x[j]
        for c in range(n):
            if xj[c] != 0:
                rows[fill[c]] = j
                vals[fill[c]] = xj[c]
                fill[c] += 1
    return ptr, rows, vals


@numba.njit(cache=True, nogil=True, inline="always")
def _zero_rows(out, lo, hi, c_lo, c_hi):
    for i in range(lo, hi):
        row = out[i]
        for c in range(np.uint64(c_lo), np.uint64(c_hi)):
            row[c] = 0


# ---------------------------------------------------------------------------
# forward kernels
# ---------------------------------------------------------------------------
@numba.njit(cache=True, nogil=True, inline="always")
def _scatter_block(w, ptr, cols, vals, rows, n_rows, out_t, lo, hi):
    """Columns ``[lo, hi)`` of ``out_t[c] = sum_j v_jc W[j]`` over the active events (j, c)."""
    _zero_rows(out_t, 0, out_t.shape[0], lo, hi)
    lo, hi = np.uint64(lo), np.uint64(hi)
    for r in range(n_rows):
        j = rows[r]
        w_j = w[j]
        for p in range(ptr[j], ptr[j + 1]):
            o = out_t[cols[p]]
            v = vals[p]
            for col in range(lo, hi):
                o[col] += w_j[col] * v


@numba.njit(parallel=_PARALLEL, cache=True, nogil=True)
def scatter(pool, w, x, out_t):
    """``out_t (n, m) = (e(x).T @ w)``: w (k, m), x (k, n) events; only active events visited."""
    x = _bytes(x)
    ptr, cols, vals, rows, n_rows = _compact_rows(x, out_t)
    m = out_t.shape[1]
    parts = numba.int64(_parts_of(pool[0], ptr[x.shape[0]] * m))
    if parts == 1:
        _scatter_block(w, ptr, cols, vals, rows, n_rows, out_t, 0, m)
        return
    blocks = (m + _BLOCK - 1) // _BLOCK
    for t in prange(parts):
        lo = min(((blocks * t) // parts) * _BLOCK, m)
        hi = min(((blocks * (t + 1)) // parts) * _BLOCK, m)
        if hi > lo:
            _scatter_block(w, ptr, cols, vals, rows, n_rows, out_t, lo, hi)


@numba.njit(cache=True, nogil=True, inline="always")
def _gather_rows(w, ptr, rows, vals, out, lo, hi):
    """Rows ``[lo, hi)`` of ``out[i, c] = sum_{j active in c} v_jc W[i, j]`` (four partial sums)."""
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
                acc0 += w_i[rows[p]] * vals[p]
                acc1 += w_i[rows[p + 1]] * vals[p + 1]
                acc2 += w_i[rows[p + 2]] * vals[p + 2]
                acc3 += w_i[rows[p + 3]] * vals[p + 3]
                p += 4
            while p < b:
                acc0 += w_i[rows[p]] * vals[p]
                p += 1
            o[c] = (acc0 + acc1) + (acc2 + acc3)


@numba.njit(parallel=_PARALLEL, cache=True, nogil=True)
def gather(pool, w, x, out):
    """``out (m, n) = w @ e(x)``: w (m, k), x (k, n) events; each row sums only the active columns."""
    x = _bytes(x)
    ptr, rows, vals = _compact_columns(x, out)
    m = out.shape[0]
    parts = numba.int64(_parts_of(pool[0], ptr[x.shape[1]] * m))
    if parts == 1:
        _gather_rows(w, ptr, rows, vals, out, 0, m)
        return
    for t in prange(parts):
        _gather_rows(w, ptr, rows, vals, out, (m * t) // parts, (m * (t + 1)) // parts)


# ---------------------------------------------------------------------------
# weight gradient kernels: outer(e(s), g), written once
# ---------------------------------------------------------------------------
@numba.njit(cache=True, nogil=True, inline="always")
def _outer_rows_block(ptr, cols, vals, g_t, out, lo, hi):
    """Rows ``[lo, hi)`` of ``out[j] = sum_{c active in j} v_jc g_t[c]``; inactive rows 0."""
    m = np.uint64(out.shape[1])
    for j in range(lo, hi):
        row = out[j]
        a, b = ptr[j], ptr[j + 1]
        if a == b:
            for col in range(U0, m):
                row[col] = 0
            continue
        g0 = g_t[cols[a]]
        v0 = vals[a]
        for col in range(U0, m):
            row[col] = g0[col] * v0
        for p in range(a + 1, b):
            gc = g_t[cols[p]]
            v = vals[p]
            for col in range(U0, m):
                row[col] += gc[col] * v


@numba.njit(parallel=_PARALLEL, cache=True, nogil=True)
def outer_rows(pool, x, g_t, out):
    """``out (k, m) = e(x) @ g_t``: x (k, n) events, g_t (n, m); the rows of inactive events are zeros."""
    x = _bytes(x)
    ptr, cols, vals, _, _ = _compact_rows(x, out)
    k = out.shape[0]
    parts = numba.int64(_parts_of(pool[0], k * out.shape[1]))
    if parts == 1:
        _outer_rows_block(ptr, cols, vals, g_t, out, 0, k)
        return
    for t in prange(parts):
        _outer_rows_block(ptr, cols, vals, g_t, out, (k * t) // parts, (k * (t + 1)) // parts)


@numba.njit(cache=True, nogil=True, inline="always")
def _outer_cols_block(ptr, cols, vals, rows, n_rows, g, out, lo, hi):
    """Rows ``[lo, hi)`` of ``out[i, j] = sum_{c active in j} g[i, c] v_jc``; inactive columns 0."""
    k = np.uint64(out.shape[1])
    for i in range(lo, hi):
        row = out[i]
        g_i = g[i]
        for col in range(U0, k):
            row[col] = 0
        for r in range(n_rows):
            j = rows[r]
            acc = g_i[cols[ptr[j]]] * vals[ptr[j]]
            for p in range(ptr[j] + 1, ptr[j + 1]):
                acc += g_i[cols[p]] * vals[p]
            row[j] = acc


@numba.njit(parallel=_PARALLEL, cache=True, nogil=True)
def outer_cols(pool, x, g, out):
    """``out (m, k) = g @ e(x).T``: x (k, n) events, g (m, n); the columns of inactive events are zeros."""
    x = _bytes(x)
    ptr, cols, vals, rows, n_rows = _compact_rows(x, out)
    m = out.shape[0]
    parts = numba.int64(_parts_of(pool[0], m * out.shape[1]))
    if parts == 1:
        _outer_cols_block(ptr, cols, vals, rows, n_rows, g, out, 0, m)
        return
    for t in prange(parts):
        _outer_cols_block(ptr, cols, vals, rows, n_rows, g, out, (m * t) // parts, (m * (t + 1)) // parts)


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
def pool_size() -> int:
    """Threads the kernels split their work into: Numba's pool size (an operand, so kernels cache)."""
    return max(int(numba.config.NUMBA_NUM_THREADS), 1)


def _ffi(kernel, args, out_shape, out_dtype):
    """Call a kernel through its compiled FFI handler (no Python per call)."""
    args = (jnp.asarray(np.array([pool_size()], np.int32)),) + tuple(args)
    in_types = [(np.dtype(a.dtype), a.ndim) for a in args]
    handler = numba_cpu.get_handler(kernel, in_types, [(np.dtype(out_dtype), len(out_shape))])
    call = jax.ffi.ffi_call(handler.target_name, [jax.ShapeDtypeStruct(tuple(out_shape), out_dtype)])
    return call(*args)[0]


def events_for_kernel(x, weighted: bool, dtype):
    """Events as a kernel reads them: bool (binary) or values in the compute dtype (weighted)."""
    if not weighted:
        return as_bool_events(x)
    return x if x.dtype == dtype else x.astype(dtype)


def matmul_generator(outs, transpose: bool, weighted: bool):
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
            y = _ffi(kernel_fn, (w, x2), (n, m), dtype).T
        else:
            y = _ffi(kernel_fn, (w, x2), (m, n), dtype)
        return [y.reshape(out.shape).astype(out.dtype)]

    return kernel


def outer_generator(outs, transpose: bool, weighted: bool):
    """Numba kernel for ``binary_dense_outer_p``: ``outer(e(s), g)``, only active events computed."""
    out = outs[0]
    dtype = compute_dtype(out.dtype)
    kernel_fn = KERNELS[("outer", bool(transpose))]

    def kernel(spikes, g):
        x = events_for_kernel(spikes, weighted, dtype)
        g = g if g.dtype == dtype else g.astype(dtype)
        x2 = x if x.ndim == 2 else x.reshape(x.shape[0], 1)
        g2 = g if g.ndim == 2 else g.reshape(g.shape[0], 1)
        y = _ffi(kernel_fn, (x2, g2.T if transpose else g2), out.shape, dtype)
        return [y.astype(out.dtype)]

    return kernel


for _op in (ops.binary_densemv_p, ops.binary_densemm_p):
    _op.def_numba_kernel(matmul_generator)
ops.binary_dense_outer_p.def_numba_kernel(outer_generator)

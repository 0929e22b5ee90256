"""Numba CPU backend of the sparse-backward family: both paths of each product, chosen per row at run time.

Each kernel takes a small int32 ``flags`` array: the op's static choices and
``path`` (-1: choose from the count of nonzero entries; 0: the path over the
whole structure; 1: the path over the nonzero entries).  The ops pass -1;
tests pass 0 and 1 to check that the two paths give the same bits.

Imported (through the family's ``BACKEND_LOADERS``) the first time an op lowers with ``backend="numba"``.
"""
from __future__ import annotations

import jax.numpy as jnp
import numba
import numpy as np

from ..._kernel_compat import COMPILED_CODE_ONLY
from ...backends import numba_cpu
from ..spans import row_span
from . import ops

__all__ = ["csrmv_nonzero_kernel", "csr_sddmm_nonzero_kernel", "densemv_nonzero_kernel",
           "dense_outer_nonzero_kernel", "AUTO", "WHOLE", "NONZERO"]

AUTO, WHOLE, NONZERO = -1, 0, 1


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _list_nonzero(x, listed) -> int:
    """The positions of the nonzero entries of ``x`` into ``listed`` (ascending); their number."""
    k = 0
    for c in range(x.shape[0]):  # branch-free: each position is written, kept only if nonzero
        listed[k] = c
        k += x[c] != 0
    return k


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _take_nonzero_path(path, k, n) -> bool:
    return path == 1 or (path == -1 and k <= ops.SPARSE_DENSITY * n)


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _count_nonzero(v) -> int:
    k = 0
    for b in range(v.shape[0]):
        for c in range(v.shape[1]):
            if v[b, c] != 0:
                k += 1
    return k


@numba.njit(cache=True, nogil=True)
def csrmv_nonzero_kernel(data, indices, indptr, t_indices, t_indptr, perm, v, flags, out):
    """``out[b] = A v[b]`` (``flags[0] == 0``) or ``A.T v[b]``, zero entries of ``v[b]`` skipped.

    ``flags = (transpose, sorted_rows, path)``.  The nonzero path scatters, for
    each ``b``, the synapses of the nonzero entries of ``v[b]`` (the rows of
    ``A`` for ``A.T v``, its columns through the column view for ``A v``).  The
    whole path gathers each output over its synapses, for the whole batch at
    once (``v`` transposed: one index read serves every ``b``), adding ``-0.0``
    (the exact identity of IEEE addition) for a zero entry.  Per output entry
    both add the terms of its synapses in the order (column, stored position)
    for ``A v`` and (row, stored position) for ``A.T v``, starting from 0: the
    same bits (``A v`` by rows only when ``sorted_rows``: a row's stored order
    is then its column order; unsorted rows always take the nonzero path).
    The path is chosen once per call from the count of nonzero entries.
    """
    transpose, sorted_rows, path = flags[0] != 0, flags[1] != 0, flags[2]
    nnz = indices.shape[0]
    nnz_t = min(t_indices.shape[0], perm.shape[0])
    shared = data.shape[0] == 1 and nnz != 1
    n_data = np.uint64(data.shape[0])
    n_batch = v.shape[0]
    n_in, n_out = np.uint64(v.shape[1]), np.uint64(out.shape[1])
    nonzero_path = (_take_nonzero_path(path, _count_nonzero(v), v.size) if path == -1 else path == 1) \
        or not (transpose or sorted_rows)
    # a malformed traced structure (evjax.primitives.spans): spans clamped, out-of-range indices skipped
    if nonzero_path:
        listed = np.empty(v.shape[1], np.int64)
        for b in range(n_batch):
            x, y = v[b], out[b]
            y[:] = 0
            k = _list_nonzero(x, listed)
            if transpose:  # the rows of the nonzero entries
                for t in range(k):
                    i = listed[t]
                    lo, hi = row_span(indptr, i, nnz)
                    for e in range(lo, hi):
                        j = np.uint64(np.int64(indices[e]))
                        if j < n_out:
                            y[j] += data[np.uint64(0) if shared else e] * x[i]
            else:  # the columns of the nonzero entries, through the column view
                for t in range(k):
                    j = listed[t]
                    lo, hi = row_span(t_indptr, j, nnz_t)
                    for p in range(lo, hi):
                        i = np.uint64(np.int64(t_indices[p]))
                        q = np.uint64(0) if shared else np.uint64(np.int64(perm[p]))
                        if i < n_out and q < n_data:
                            y[i] += data[q] * x[j]
        return
    vt = np.ascontiguousarray(v.T)  # (n_in, B): the batch of one input entry together
    acc = np.empty(n_batch, out.dtype)
    nothing = out.dtype.type(-0.0)  # of the output's dtype: a bare -0.0 would make each sum a float64 one
    for o in range(out.shape[1]):
        acc[:] = 0
        if transpose:  # column o through the column view
            lo, hi = row_span(t_indptr, o, nnz_t)
            for p in range(lo, hi):
                i = np.uint64(np.int64(t_indices[p]))
                q = np.uint64(0) if shared else np.uint64(np.int64(perm[p]))
                if i >= n_in or q >= n_data:
                    continue
                w = data[q]
                xs = vt[i]
                for b in range(n_batch):
                    acc[b] += w * xs[b] if xs[b] != 0 else nothing
        else:  # row o
            lo, hi = row_span(indptr, o, nnz)
            for e in range(lo, hi):
                j = np.uint64(np.int64(indices[e]))
                if j >= n_in:
                    continue
                w = data[np.uint64(0) if shared else e]
                xs = vt[j]
                for b in range(n_batch):
                    acc[b] += w * xs[b] if xs[b] != 0 else nothing
        for b in range(n_batch):
            out[b, o] = acc[b]


@numba.njit(cache=True, nogil=True)
def csr_sddmm_nonzero_kernel(indices, indptr, t_indices, t_indptr, perm, r, q, flags, out):
    """``out[G, k] = sum_b r[G, b, i_k] q[G, b, j_k]`` over the pairs where both are nonzero.

    ``flags = (path,)``: for each ``b``, 0 walks the synapses of the nonzero
    entries of ``r[G, b]``, 1 those of the nonzero entries of ``q[G, b]``
    (column view); -1 walks the rows unless their synapses outnumber the entries of ``q[G, b]``
    (the cost of listing its nonzero ones), and then the fewer synapses.  Each synapse gets one
    term per ``b``, added in the order of ``b``: the paths give the same bits.
    """
    path = flags[0]
    rows = np.empty(r.shape[2], np.int64)
    columns = np.empty(q.shape[2], np.int64)
    # a malformed traced structure (evjax.primitives.spans): spans clamped, out-of-range indices skipped
    nnz = indices.shape[0]
    nnz_t = min(t_indices.shape[0], perm.shape[0])
    n_r, n_q, n_g = np.uint64(r.shape[2]), np.uint64(q.shape[2]), np.uint64(out.shape[1])
    for grp in range(r.shape[0]):
        g = out[grp]
        g[:] = 0
        for b in range(r.shape[1]):
            rb, qb = r[grp, b], q[grp, b]
            by_columns = path == 1
            n_rows = n_columns = 0
            if path != 1:
                n_rows = _list_nonzero(rb, rows)
            if path == -1:
                row_work = 0
                for t in range(n_rows):
                    lo, hi = row_span(indptr, rows[t], nnz)
                    row_work += hi - lo
                # the columns cost their listing (len(qb)) before any synapse: worth counting only past it
                if row_work > qb.shape[0]:
                    n_columns = _list_nonzero(qb, columns)
                    column_work = 0
                    for t in range(n_columns):
                        lo, hi = row_span(t_indptr, columns[t], nnz_t)
                        column_work += hi - lo
                    by_columns = column_work < row_work
            elif path == 1:
                n_columns = _list_nonzero(qb, columns)
            if by_columns:
                for t in range(n_columns):
                    j = columns[t]
                    lo, hi = row_span(t_indptr, j, nnz_t)
                    for p in range(lo, hi):
                        i = np.uint64(np.int64(t_indices[p]))
                        k = np.uint64(np.int64(perm[p]))
                        if i < n_r and k < n_g:
                            ri = rb[i]
                            if ri != 0:
                                g[k] += ri * qb[j]
            else:
                for t in range(n_rows):
                    i = rows[t]
                    lo, hi = row_span(indptr, i, nnz)
                    for e in range(lo, hi):
                        j = np.uint64(np.int64(indices[e]))
                        if j < n_q:
                            qj = qb[j]
                            if qj != 0:
                                g[e] += rb[i] * qj


@numba.njit(cache=True, nogil=True)
def densemv_nonzero_kernel(w, v, flags, out):
    """``out[b] = W v[b]`` (``flags[0] == 0``) or ``W.T v[b]``, zero entries of ``v[b]`` skipped.

    ``flags = (transpose, path)``: both paths add the terms of each output in
    the order of the contracted index, the nonzero path over the list of the
    nonzero entries, the whole path over every index with a test.
    """
    transpose, path = flags[0] != 0, flags[1]
    listed = np.empty(v.shape[1], np.int64)
    for b in range(v.shape[0]):
        x, y = v[b], out[b]
        k = _list_nonzero(x, listed)
        nonzero_path = _take_nonzero_path(path, k, x.shape[0])
        if transpose:  # y = sum over the nonzero i of x_i W[i, :]
            y[:] = 0
            if nonzero_path:
                for t in range(k):
                    i = listed[t]
                    for j in range(y.shape[0]):
                        y[j] += w[i, j] * x[i]
            else:
                for i in range(x.shape[0]):
                    if x[i] != 0:
                        for j in range(y.shape[0]):
                            y[j] += w[i, j] * x[i]
        else:  # y_i = sum over the nonzero j of W[i, j] x_j
            for i in range(y.shape[0]):
                y[i] = 0
                if nonzero_path:
                    for t in range(k):
                        y[i] += w[i, listed[t]] * x[listed[t]]
                else:
                    for j in range(x.shape[0]):
                        if x[j] != 0:
                            y[i] += w[i, j] * x[j]


@numba.njit(cache=True, nogil=True)
def dense_outer_nonzero_kernel(r, q, flags, out):
    """``out[G, i, j] = sum_b r[G, b, i] q[G, b, j]`` over the pairs where both are nonzero, in the
    order of ``b`` (``flags = (path,)``: 1 walks a list of the nonzero ``q[G, b, j]``, 0 tests each)."""
    path = flags[0]
    listed = np.empty(q.shape[2], np.int64)
    for grp in range(r.shape[0]):
        g = out[grp]
        g[:] = 0
        for b in range(r.shape[1]):
            rb, qb = r[grp, b], q[grp, b]
            k = _list_nonzero(qb, listed)
            nonzero_path = _take_nonzero_path(path, k, qb.shape[0])
            for i in range(rb.shape[0]):
                if rb[i] == 0:
                    continue
                if nonzero_path:
                    for t in range(k):
                        g[i, listed[t]] += rb[i] * qb[listed[t]]
                else:
                    for j in range(qb.shape[0]):
                        if qb[j] != 0:
                            g[i, j] += rb[i] * qb[j]


def _flags(*values) -> jnp.ndarray:
    return jnp.asarray(np.asarray(values, np.int32))


def _call(kernel, args, out):
    return numba_cpu.call_outputs(kernel, args, [(out.shape, out.dtype)], threads=False)


def csrmv_nonzero_generator(outs, ins, *, shape, transpose, sorted_rows):
    (out,) = outs
    flags = (int(transpose), int(sorted_rows), AUTO)
    if out.size == 0:
        return ops.empty_result(out)
    return lambda *args: _call(csrmv_nonzero_kernel, (*args, _flags(*flags)), out)


def csr_sddmm_nonzero_generator(outs, ins, *, shape):
    (out,) = outs
    if out.size == 0:
        return ops.empty_result(out)
    return lambda *args: _call(csr_sddmm_nonzero_kernel, (*args, _flags(AUTO)), out)


def densemv_nonzero_generator(outs, ins, *, transpose):
    (out,) = outs
    if out.size == 0:
        return ops.empty_result(out)
    return lambda *args: _call(densemv_nonzero_kernel, (*args, _flags(int(transpose), AUTO)), out)


def dense_outer_nonzero_generator(outs, ins):
    (out,) = outs
    if out.size == 0:
        return ops.empty_result(out)
    return lambda *args: _call(dense_outer_nonzero_kernel, (*args, _flags(AUTO)), out)


ops.csrmv_nonzero_p.def_numba_kernel(csrmv_nonzero_generator)
ops.csr_sddmm_nonzero_p.def_numba_kernel(csr_sddmm_nonzero_generator)
ops.densemv_nonzero_p.def_numba_kernel(densemv_nonzero_generator)
ops.dense_outer_nonzero_p.def_numba_kernel(dense_outer_nonzero_generator)

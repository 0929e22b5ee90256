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

from ...backends import numba_cpu
from . import ops

__all__ = ["csrmv_nonzero_kernel", "csr_sddmm_nonzero_kernel", "densemv_nonzero_kernel",
           "dense_outer_nonzero_kernel", "AUTO", "WHOLE", "NONZERO"]

AUTO, WHOLE, NONZERO = -1, 0, 1


@numba.njit(cache=True, nogil=True)
def _list_nonzero(x, listed) -> int:
    """The positions of the nonzero entries of ``x`` into ``listed`` (ascending); their number."""
    k = 0
    for c in range(x.shape[0]):
        if x[c] != 0:
            listed[k] = c
            k += 1
    return k


@numba.njit(cache=True, nogil=True)
def _take_nonzero_path(path, k, n) -> bool:
    return path == 1 or (path == -1 and k <= ops.SPARSE_DENSITY * n)


@numba.njit(cache=True, nogil=True)
def csrmv_nonzero_kernel(data, indices, indptr, t_indices, t_indptr, perm, v, flags, out):
    """``out[b] = A v[b]`` (``flags[0] == 0``) or ``A.T v[b]``, zero entries of ``v[b]`` skipped.

    ``flags = (transpose, sorted_rows, path)``.  Per output entry, both paths
    add the terms of its synapses in the order (column, stored position) for
    ``A v`` and (row, stored position) for ``A.T v``, starting from 0: the
    same bits (``A v`` by rows only when ``sorted_rows``: a row's stored
    order is then its column order).
    """
    transpose, sorted_rows, path = flags[0] != 0, flags[1] != 0, flags[2]
    nnz = indices.shape[0]
    shared = data.shape[0] == 1 and nnz != 1
    listed = np.empty(v.shape[1], np.int64)
    for b in range(v.shape[0]):
        x, y = v[b], out[b]
        k = _list_nonzero(x, listed)
        nonzero_path = _take_nonzero_path(path, k, x.shape[0]) or not (transpose or sorted_rows)
        if transpose and nonzero_path:  # scatter the rows of the nonzero entries
            y[:] = 0
            for t in range(k):
                i = listed[t]
                for e in range(indptr[i], indptr[i + 1]):
                    y[indices[e]] += data[0 if shared else e] * x[i]
        elif transpose:  # gather each column through the column view
            for j in range(y.shape[0]):
                y[j] = 0
                for p in range(t_indptr[j], t_indptr[j + 1]):
                    xi = x[t_indices[p]]
                    if xi != 0:
                        y[j] += data[0 if shared else perm[p]] * xi
        elif nonzero_path:  # scatter the columns of the nonzero entries through the column view
            y[:] = 0
            for t in range(k):
                j = listed[t]
                for p in range(t_indptr[j], t_indptr[j + 1]):
                    y[t_indices[p]] += data[0 if shared else perm[p]] * x[j]
        else:  # gather each row
            for i in range(y.shape[0]):
                y[i] = 0
                for e in range(indptr[i], indptr[i + 1]):
                    xj = x[indices[e]]
                    if xj != 0:
                        y[i] += data[0 if shared else e] * xj


@numba.njit(cache=True, nogil=True)
def csr_sddmm_nonzero_kernel(indices, indptr, t_indices, t_indptr, perm, r, q, flags, out):
    """``out[b, k] = r[b, i_k] q[b, j_k]`` where both are nonzero, else 0.

    ``flags = (path,)``: 0 walks the synapses of the nonzero rows of ``r``,
    1 those of the nonzero columns of ``q``; -1 counts both and walks fewer.
    Each entry is one product, so the paths give the same bits.
    """
    path = flags[0]
    for b in range(r.shape[0]):
        rb, qb, g = r[b], q[b], out[b]
        g[:] = 0
        by_columns = path == 1
        if path == -1:
            row_work = 0
            for i in range(rb.shape[0]):
                if rb[i] != 0:
                    row_work += indptr[i + 1] - indptr[i]
            column_work = 0
            for j in range(qb.shape[0]):
                if qb[j] != 0:
                    column_work += t_indptr[j + 1] - t_indptr[j]
            by_columns = column_work < row_work
        if by_columns:
            for j in range(qb.shape[0]):
                if qb[j] != 0:
                    for p in range(t_indptr[j], t_indptr[j + 1]):
                        ri = rb[t_indices[p]]
                        if ri != 0:
                            g[perm[p]] = ri * qb[j]
        else:
            for i in range(rb.shape[0]):
                if rb[i] != 0:
                    for e in range(indptr[i], indptr[i + 1]):
                        qj = qb[indices[e]]
                        if qj != 0:
                            g[e] = rb[i] * qj


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
    """``out[b, i, j] = r[b, i] q[b, j]`` where both are nonzero, else 0 (``flags = (path,)``)."""
    path = flags[0]
    listed = np.empty(q.shape[1], np.int64)
    for b in range(r.shape[0]):
        rb, qb, g = r[b], q[b], out[b]
        k = _list_nonzero(qb, listed)
        nonzero_path = _take_nonzero_path(path, k, qb.shape[0])
        for i in range(rb.shape[0]):
            g[i, :] = 0
            if rb[i] == 0:
                continue
            if nonzero_path:
                for t in range(k):
                    g[i, listed[t]] = rb[i] * qb[listed[t]]
            else:
                for j in range(qb.shape[0]):
                    if qb[j] != 0:
                        g[i, j] = rb[i] * qb[j]


def _flags(*values) -> jnp.ndarray:
    return jnp.asarray(np.asarray(values, np.int32))


def _call(kernel, args, out):
    return numba_cpu.call_outputs(kernel, args, [(out.shape, out.dtype)], threads=False)


def csrmv_nonzero_generator(outs, ins, *, shape, transpose, sorted_rows):
    (out,) = outs
    flags = (int(transpose), int(sorted_rows), AUTO)
    if out.size == 0:
        return lambda *args: [jnp.zeros(out.shape, out.dtype)]
    return lambda *args: _call(csrmv_nonzero_kernel, (*args, _flags(*flags)), out)


def csr_sddmm_nonzero_generator(outs, ins, *, shape):
    (out,) = outs
    if out.size == 0:
        return lambda *args: [jnp.zeros(out.shape, out.dtype)]
    return lambda *args: _call(csr_sddmm_nonzero_kernel, (*args, _flags(AUTO)), out)


def densemv_nonzero_generator(outs, ins, *, transpose):
    (out,) = outs
    if out.size == 0:
        return lambda *args: [jnp.zeros(out.shape, out.dtype)]
    return lambda *args: _call(densemv_nonzero_kernel, (*args, _flags(int(transpose), AUTO)), out)


def dense_outer_nonzero_generator(outs, ins):
    (out,) = outs
    if out.size == 0:
        return lambda *args: [jnp.zeros(out.shape, out.dtype)]
    return lambda *args: _call(dense_outer_nonzero_kernel, (*args, _flags(AUTO)), out)


ops.csrmv_nonzero_p.def_numba_kernel(csrmv_nonzero_generator)
ops.csr_sddmm_nonzero_p.def_numba_kernel(csr_sddmm_nonzero_generator)
ops.densemv_nonzero_p.def_numba_kernel(densemv_nonzero_generator)
ops.dense_outer_nonzero_p.def_numba_kernel(dense_outer_nonzero_generator)

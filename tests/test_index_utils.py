"""The index utilities (brainevent's names) against scipy.sparse: csr_to_coo_index, coo_to_csc_index,
csr_to_csc_index, csc_to_csr_index, coo2csr; NumPy and JAX inputs, under jit, empty rows, duplicates, nnz 0."""
from __future__ import annotations

import numpy as np
import jax
import jax.numpy as jnp
import pytest
import scipy.sparse as sp

import evjax


def _structure(m, n, nnz, seed, duplicates=False):
    """A CSR structure with sorted columns per row (duplicates allowed), rows possibly empty."""
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.integers(0, m, nnz)) if m else np.zeros(0, np.int64)
    cols = rng.integers(0, n, nnz) if n else np.zeros(0, np.int64)
    if duplicates and nnz >= 2:
        rows[1], cols[1] = rows[0], cols[0]
    order = np.lexsort((cols, rows))
    rows, cols = rows[order], cols[order]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=m))]).astype(np.int32)
    return indptr, cols.astype(np.int32), rows.astype(np.int32)


CASES = [  # (m, n, nnz, duplicates)
    (6, 5, 12, False),
    (6, 5, 12, True),
    (7, 4, 3, False),   # empty rows and columns
    (3, 4, 0, False),   # nnz 0
    (1, 1, 1, False),
    (4, 9, 30, True),   # many duplicates
]


def _scipy(indptr, indices, shape, data):
    return sp.csr_matrix((data, indices, indptr), shape=shape)


@pytest.mark.parametrize("m,n,nnz,dup", CASES)
@pytest.mark.parametrize("kind", ["numpy", "jax", "jit"])
def test_csr_to_csc_and_back_match_scipy(m, n, nnz, dup, kind):
    indptr, indices, rows = _structure(m, n, nnz, seed=m * 31 + nnz, duplicates=dup)
    data = np.arange(1, nnz + 1, dtype=np.float64)  # distinct values tell entries apart
    ref = _scipy(indptr, indices, (m, n), data).tocsc()  # keeps duplicates, rows in order per column

    def run(fn, *arrays, **kw):
        if kind == "numpy":
            out = fn(*arrays, **kw)
            assert all(isinstance(o, np.ndarray) for o in out if o is not None)
            return out
        arrays = [jnp.asarray(a) for a in arrays]
        if kind == "jit":
            return jax.jit(lambda *a: fn(*a, **kw))(*arrays)
        out = fn(*arrays, **kw)
        assert all(isinstance(o, jax.Array) for o in out if o is not None)
        return out

    coo_rows, coo_cols = run(evjax.csr_to_coo_index, indptr, indices)
    np.testing.assert_array_equal(coo_rows, rows)
    np.testing.assert_array_equal(coo_cols, indices)
    coo = _scipy(indptr, indices, (m, n), data).tocoo()
    np.testing.assert_array_equal(coo_rows, coo.row)
    for method in ("coo", "numpy", "gpu_column_block"):
        csc_indptr, csc_indices, perm = run(evjax.csr_to_csc_index, indptr, indices, shape=(m, n), method=method)
        np.testing.assert_array_equal(csc_indptr, ref.indptr)
        np.testing.assert_array_equal(csc_indices, ref.indices)
        np.testing.assert_array_equal(data[np.asarray(perm)], ref.data)
    assert run(evjax.csr_to_csc_index, indptr, indices, shape=(m, n), include_perm=False)[2] is None
    back_indptr, back_indices, back_perm = run(evjax.csc_to_csr_index, csc_indptr, csc_indices, shape=(m, n))
    np.testing.assert_array_equal(back_indptr, indptr)
    np.testing.assert_array_equal(back_indices, indices)
    np.testing.assert_array_equal(np.asarray(perm)[np.asarray(back_perm)], np.arange(nnz))  # inverses
    csc_indptr2, csc_rows2, perm2 = run(evjax.coo_to_csc_index, rows, indices, shape=(m, n))
    np.testing.assert_array_equal(csc_indptr2, ref.indptr)
    np.testing.assert_array_equal(csc_rows2, ref.indices)
    np.testing.assert_array_equal(perm2, perm)


@pytest.mark.parametrize("m,n,nnz,dup", CASES)
@pytest.mark.parametrize("kind", ["numpy", "jit"])
def test_coo2csr_matches_scipy(m, n, nnz, dup, kind):
    _, cols, rows = _structure(m, n, nnz, seed=nnz + 7, duplicates=dup)
    shuffle = np.random.default_rng(nnz).permutation(nnz)  # COO in any order
    rows, cols = rows[shuffle], cols[shuffle]
    data = np.arange(1, nnz + 1, dtype=np.float64)
    if kind == "numpy":
        indptr, indices, order = evjax.coo2csr(rows, cols, shape=(m, n))
    else:
        indptr, indices, order = jax.jit(lambda r, c: evjax.coo2csr(r, c, shape=(m, n)))(rows, cols)
    ref = sp.coo_matrix((data, (rows, cols)), shape=(m, n))
    np.testing.assert_array_equal(indptr, np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=m))]))
    np.testing.assert_array_equal(indices, cols[np.asarray(order)])
    got = sp.csr_matrix((data[np.asarray(order)], np.asarray(indices), np.asarray(indptr)), shape=(m, n))
    np.testing.assert_array_equal(got.toarray(), ref.toarray())  # duplicates add up in both
    order = np.asarray(order)
    for r in range(m):  # stable: each row keeps its COO order
        part = order[indptr[r]:indptr[r + 1]]
        assert (np.diff(part) > 0).all() and (rows[part] == r).all()


def test_dtypes_and_errors():
    indptr, indices = np.array([0, 2, 2, 3], np.int64), np.array([0, 2, 1], np.int32)
    csc_indptr, csc_indices, perm = evjax.csr_to_csc_index(indptr, indices, shape=(3, 3))
    assert csc_indptr.dtype == perm.dtype == np.int64 and csc_indices.dtype == np.int32
    rows, _ = evjax.csr_to_coo_index(indptr, indices)
    assert rows.dtype == np.int32
    indptr2, _, order = evjax.coo2csr(np.array([1, 0]), np.array([0, 0]), shape=(2, 1))
    assert indptr2.dtype == order.dtype == np.int32
    empty = evjax.csr_to_coo_index([0, 0], [])
    assert [a.shape for a in empty] == [(0,), (0,)]
    with pytest.raises(ValueError, match="unknown method"):
        evjax.csr_to_csc_index(indptr, indices, shape=(3, 3), method="fast")
    with pytest.raises(ValueError, match="column_block_size"):
        evjax.csr_to_csc_index(indptr, indices, shape=(3, 3), column_block_size=0)
    with pytest.raises(ValueError, match="4 entries"):
        evjax.csr_to_csc_index(indptr[:-1], indices, shape=(3, 3))
    with pytest.raises(ValueError, match="end at the number of indices"):
        evjax.csr_to_csc_index(np.array([0, 1, 1, 1]), indices, shape=(3, 3))
    with pytest.raises(ValueError, match=r"outside \[0, 2\)"):
        evjax.csr_to_csc_index(indptr, indices, shape=(3, 2))
    with pytest.raises(ValueError, match="same length"):
        evjax.coo2csr(np.array([0, 1]), np.array([0]), shape=(2, 2))
    with pytest.raises(ValueError, match="row_ids holds 5"):
        evjax.coo2csr(np.array([5]), np.array([0]), shape=(2, 2))
    with pytest.raises(ValueError, match="indices holds -1"):
        evjax.coo_to_csc_index(np.array([0]), np.array([-1]), shape=(2, 2))
    with pytest.raises(TypeError, match="must be integers"):
        evjax.csr_to_coo_index(np.array([0.0, 1.0]), np.array([0.5]))
    with pytest.raises(ValueError, match="1-d"):
        evjax.csr_to_coo_index(np.zeros((2, 2), int), indices)
    with pytest.raises(TypeError, match="shape"):
        evjax.coo2csr(np.array([0]), np.array([0]), shape=(4.7, 5))

"""CSR/CSC row indexing (``W[rows]``) and evjax.csr_slice_rows, against scipy.sparse (issue 31)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

import evjax

SHAPE = (6, 5)
INDICES = [0, 3, -1, -2, 2, slice(None), slice(1, 5, 2), slice(None, None, -1), [4, 1, 4], np.array([0, 5]),
           np.array([True, False, True, False, False, True]), []]


def scipy_matrix(seed=0):
    dense = sp.random(*SHAPE, density=0.4, random_state=seed, dtype=np.float32).toarray()
    dense[2] = 0.0  # an empty row
    return sp.csr_matrix(dense)


def expected(m, index):
    dense = m.toarray()
    if isinstance(index, list) and not index:
        return dense[np.zeros(0, int)]
    return dense[index]


@pytest.mark.parametrize("kind", ["csr", "csc"])
@pytest.mark.parametrize("index", INDICES, ids=repr)
def test_getitem_matches_scipy_rows(kind, index):
    m = scipy_matrix()
    w = evjax.CSR.from_scipy(m) if kind == "csr" else evjax.CSC.from_scipy(m.tocsc())
    out = w[index]
    assert isinstance(out, jax.Array)
    np.testing.assert_allclose(np.asarray(out), expected(m, index), rtol=1e-6)
    if not isinstance(index, np.ndarray) or index.dtype != bool:
        np.testing.assert_allclose(np.asarray(w[index, :]), expected(m, index), rtol=1e-6)


def test_getitem_of_a_homogeneous_matrix_and_under_jit_with_traced_rows_and_structure():
    m = scipy_matrix(1)
    pattern = m.copy()
    pattern.data[:] = 1.0
    w = evjax.CSR((jnp.array([2.5], jnp.float32), m.indices, m.indptr), shape=SHAPE)
    np.testing.assert_allclose(np.asarray(w[[1, 3]]), 2.5 * pattern.toarray()[[1, 3]])

    f = jax.jit(lambda w, rows: w[rows])
    for rows in ([0, 5, 5], [-1, 2, 3]):
        np.testing.assert_allclose(np.asarray(f(w, jnp.array(rows))), 2.5 * pattern.toarray()[rows])
    np.testing.assert_allclose(np.asarray(jax.jit(lambda w, r: w[r])(w, jnp.int32(4))), 2.5 * pattern.toarray()[4])
    wc = evjax.CSC.from_scipy(m.tocsc())
    np.testing.assert_allclose(np.asarray(f(wc, jnp.array([1, 4]))), m.toarray()[[1, 4]], rtol=1e-6)


def test_getitem_gradient_in_the_weights():
    m = scipy_matrix(2)
    w = evjax.CSR.from_scipy(m)
    g = jax.grad(lambda data: w.with_data(data)[[1, 1, 4]].sum())(w.data)
    rows = np.repeat(np.arange(SHAPE[0]), np.diff(m.indptr))
    np.testing.assert_allclose(np.asarray(g), np.select([rows == 1, rows == 4], [2.0, 1.0], 0.0))


def test_csr_slice_rows_function_matches_scipy():
    m = scipy_matrix(3)
    dense = m.toarray()
    out = evjax.csr_slice_rows(m.data, m.indices, m.indptr, np.array([5, 0, 2]), shape=SHAPE, backend="numba")
    np.testing.assert_allclose(np.asarray(out), dense[[5, 0, 2]], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(evjax.csr_slice_rows(m.data, m.indices, m.indptr, 1, shape=SHAPE)),
                               dense[1], rtol=1e-6)
    vm = jax.vmap(lambda r: evjax.csr_slice_rows(m.data, m.indices, m.indptr, r, shape=SHAPE))(jnp.arange(6))
    np.testing.assert_allclose(np.asarray(vm), dense, rtol=1e-6)
    # a traced row out of range gives zeros
    out = jax.jit(lambda r: evjax.csr_slice_rows(m.data, m.indices, m.indptr, r, shape=SHAPE))(jnp.array([9, 1]))
    np.testing.assert_allclose(np.asarray(out), np.stack([np.zeros(5), dense[1]]), rtol=1e-6)


def test_getitem_errors():
    w = evjax.CSR.from_scipy(scipy_matrix())
    with pytest.raises(IndexError, match=r"CSR\.__getitem__: row 6 is out of range for 6 rows"):
        w[6]
    with pytest.raises(IndexError, match=r"only rows can be selected"):
        w[1, 2]
    with pytest.raises(TypeError, match="rows must be given by ints"):
        w[np.array([0.5])]
    with pytest.raises(TypeError, match="traced row index must be integers"):
        jax.jit(lambda r: w[r])(jnp.array([1.0]))
    with pytest.raises(IndexError, match=r"csr_slice_rows: row -7 is out of range"):
        evjax.csr_slice_rows(w.data, w.indices, w.indptr, [-7], shape=SHAPE)


def test_tocsc_and_slice_rows_agree_with_getitem():
    m = scipy_matrix(4)
    w = evjax.CSR.from_scipy(m)
    assert isinstance(w.tocsc(), evjax.CSC)
    np.testing.assert_allclose(np.asarray(w.tocsc()[[0, 3]]), m.toarray()[[0, 3]], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(w.slice_rows([0, 3]).todense()), np.asarray(w[[0, 3]]), rtol=1e-6)

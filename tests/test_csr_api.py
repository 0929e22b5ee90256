"""The everyday CSR/CSC API of brainevent: sums, conversions, weight arithmetic, diag_add, slice_rows.

Every result is checked against SciPy or a dense NumPy/jax.numpy reference;
the methods that are differentiable go through the property harness (jit,
jvp, vjp, grad, vmap), with the structure passed as traced arguments where
the method allows it.
"""
from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

import evjax
from evjax.primitives.csr import row_ids
from evjax.testing import OpSpec, check_all, csr_resampler
from tests.helpers import csr_or_csc_dense, dense_matrix, equations, seeded_csr

SHAPE = (6, 5)  # seeded_csr's default shape


def make(kind, data, indices, indptr, shape):
    """A CSR of ``shape``, or a CSC of ``shape`` whose arrays are the CSR of its transpose."""
    cls = evjax.CSR if kind == "csr" else evjax.CSC
    return cls((data, indices, indptr), shape=shape)


def scipy_of(kind, data, indices, indptr, shape):
    w = np.broadcast_to(np.asarray(data), indices.shape)
    if kind == "csr":
        return sp.csr_matrix((w, indices, indptr), shape=shape)
    return sp.csc_matrix((w, indices, indptr), shape=shape)


def stored_shape(kind, shape):
    return shape if kind == "csr" else shape[::-1]


KINDS = ("csr", "csc")


def scatter_coo(coo):
    """Dense from a BCOO's fields (BCOO.todense itself has no vmap rule for a batch axis 1 of data)."""
    return jnp.zeros(coo.shape, coo.data.dtype).at[coo.indices[:, 0], coo.indices[:, 1]].add(coo.data)


# ---------------------------------------------------------------------------
# sum, todense/toarray, through the harness (structure traced under jit and vmap)
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("homogeneous", [False, True])
def test_sum_matches_scipy_for_every_axis(kind, homogeneous):
    data, indices, indptr = seeded_csr(1, stored_shape(kind, SHAPE))
    data = data[:1] if homogeneous else data
    w = make(kind, data, indices, indptr, SHAPE)
    ref = scipy_of(kind, data, indices, indptr, SHAPE).toarray()  # scipy sums duplicates
    np.testing.assert_allclose(w.sum(), ref.sum(), rtol=1e-5)
    np.testing.assert_allclose(w.sum((0, 1)), ref.sum(), rtol=1e-5)
    for axis in (0, 1, -1, -2, (0,), [1]):
        np.testing.assert_allclose(w.sum(axis), ref.sum(axis=axis if isinstance(axis, int) else axis[0]),
                                   rtol=1e-5, err_msg=f"axis={axis}")
    assert w.sum().dtype == w.dtype and w.sum(0).shape == (SHAPE[1],) and w.sum(1).shape == (SHAPE[0],)
    np.testing.assert_array_equal(np.asarray(w.toarray()), np.asarray(w.todense()))
    for bad in (2, -3, (), (0, 2), "rows", True):
        with pytest.raises(ValueError, match=r"\.sum: axis must be"):
            w.sum(bad)


def test_low_precision_sum_accumulates_in_float32():
    n = 4096  # float16 would lose the ones past 2048
    w = evjax.CSR((np.ones(n, np.float16), np.zeros(n, np.int32), np.array([0, n], np.int32)), shape=(1, 1))
    assert w.sum().dtype == np.float16 and float(w.sum()) == n and float(w.sum(0)[0]) == n


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("group", ["sums", "conversions"])
def test_differentiable_methods_through_harness(kind, group):
    data, indices, indptr = seeded_csr(2, stored_shape(kind, SHAPE))
    if group == "sums":
        def method(w):
            return w.sum(), w.sum(0), w.sum(1)

        def dense_method(a):
            return jnp.sum(a), jnp.sum(a, axis=0), jnp.sum(a, axis=1)
    else:
        def method(w):
            return w.todense(), scatter_coo(w.tocoo()), (w.tocsc() if kind == "csr" else w.tocsr()).todense()

        def dense_method(a):
            return a, a, a
    spec = OpSpec(
        fn=lambda d, i, p: method(make(kind, d, i, p, SHAPE)),
        reference=lambda d, i, p: dense_method(csr_or_csc_dense(kind, d, i, p, SHAPE)),
        diff_argnums=(0,), name=f"{kind}.{group}",
        resample=csr_resampler(indices=1, indptr=2, shape=stored_shape(kind, SHAPE)),
    )
    check_all(spec, (data, indices, indptr))  # vmap over indices/indptr: a batch of traced structures


def test_vmap_over_a_batch_of_matrices():
    mats = [sp.random(*SHAPE, density=0.4, format="csr", random_state=s, dtype=np.float32) for s in range(3)]
    batch = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *[evjax.CSR.from_scipy(m) for m in mats])
    assert batch.data.shape == (3, mats[0].nnz)  # the same nnz, different structures
    sums, dense, by_col = jax.vmap(lambda w: (w.sum(1), w.todense(), w.tocsc().sum(0)))(batch)
    for k, m in enumerate(mats):
        np.testing.assert_allclose(sums[k], m.toarray().sum(1), rtol=1e-5)
        np.testing.assert_allclose(dense[k], m.toarray(), rtol=1e-6)
        np.testing.assert_allclose(by_col[k], m.toarray().sum(0), rtol=1e-5)


# ---------------------------------------------------------------------------
# conversions: tocsc / tocsr / tocoo / transpose / CSC.fromdense
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("traced", [False, True])
def test_tocsc_and_tocsr_storage_equals_scipy(traced):
    data, indices, indptr = seeded_csr(3)
    w = make("csr", data, indices, indptr, SHAPE)
    ref = scipy_of("csr", data, indices, indptr, SHAPE).tocsc()  # keeps duplicates, rows in order per column
    to_csc = jax.jit(lambda w: w.tocsc()) if traced else (lambda w: w.tocsc())
    c = to_csc(w)
    assert isinstance(c, evjax.CSC) and c.shape == SHAPE
    np.testing.assert_array_equal(np.asarray(c.indptr), ref.indptr)
    np.testing.assert_array_equal(np.asarray(c.indices), ref.indices)
    np.testing.assert_array_equal(np.asarray(c.data), ref.data)
    assert c.indices.dtype == w.indices.dtype and c.indptr.dtype == w.indptr.dtype
    back = (jax.jit(lambda c: c.tocsr()) if traced else (lambda c: c.tocsr()))(c)
    ref_back = ref.tocsr()
    assert isinstance(back, evjax.CSR) and back.shape == SHAPE
    np.testing.assert_array_equal(np.asarray(back.indptr), ref_back.indptr)
    np.testing.assert_array_equal(np.asarray(back.indices), ref_back.indices)
    np.testing.assert_array_equal(np.asarray(back.data), ref_back.data)
    assert w.tocsr() is w and c.tocsc() is c
    hom = make("csr", data[:1], indices, indptr, SHAPE).tocsc()
    assert hom.homogeneous
    np.testing.assert_allclose(hom.todense(), scipy_of("csr", data[:1], indices, indptr, SHAPE).toarray(), rtol=1e-6)


def test_conversions_of_empty_and_degenerate_shapes():
    for shape in ((0, 3), (3, 0), (2, 2)):
        w = evjax.CSR((np.ones(1, np.float32), np.zeros(0, np.int32), np.zeros(shape[0] + 1, np.int32)),
                      shape=shape)
        for out in (w.tocsc(), w.tocsc().tocsr(), jax.jit(lambda w: w.tocsc())(w)):
            np.testing.assert_array_equal(np.asarray(out.todense()), np.zeros(shape, np.float32))
        np.testing.assert_array_equal(np.asarray(w.sum(0)), np.zeros(shape[1]))
        np.testing.assert_array_equal(np.asarray(w.sum(1)), np.zeros(shape[0]))


@pytest.mark.parametrize("kind", KINDS)
def test_tocoo_is_a_bcoo_in_storage_order(kind):
    from jax.experimental import sparse as jax_sparse

    data, indices, indptr = seeded_csr(4, stored_shape(kind, SHAPE))
    w = make(kind, data, indices, indptr, SHAPE)
    ref = scipy_of(kind, data, indices, indptr, SHAPE).tocoo()  # storage order, duplicates kept
    for coo in (w.tocoo(), jax.jit(lambda w: w.tocoo())(w)):
        assert isinstance(coo, jax_sparse.BCOO) and coo.shape == SHAPE
        np.testing.assert_array_equal(np.asarray(coo.indices[:, 0]), ref.row)
        np.testing.assert_array_equal(np.asarray(coo.indices[:, 1]), ref.col)
        np.testing.assert_array_equal(np.asarray(coo.data), ref.data)
    hom = make(kind, data[:1], indices, indptr, SHAPE).tocoo()
    np.testing.assert_array_equal(np.asarray(hom.data), np.full(indices.shape, data[0]))


def test_transpose_is_the_view_and_checks_axes():
    data, indices, indptr = seeded_csr(5)
    w = make("csr", data, indices, indptr, SHAPE)
    for t in (w.transpose(), w.transpose((1, 0)), w.T):
        assert isinstance(t, evjax.CSC) and t.shape == SHAPE[::-1] and t.indices is w.indices
        np.testing.assert_array_equal(np.asarray(t.todense()), np.asarray(w.todense()).T)
    assert isinstance(w.T.transpose(), evjax.CSR) and w.T.transpose().data is w.data
    with pytest.raises(ValueError, match=r"CSR\.transpose: axes must be None or \(1, 0\)"):
        w.transpose((0, 1))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_csc_fromdense_matches_scipy(dtype):
    dense = sp.random(5, 7, density=0.4, random_state=6, dtype=np.float32).toarray().astype(dtype)
    c = evjax.CSC.fromdense(dense)
    ref = sp.csc_matrix(dense.astype(np.float32))
    assert isinstance(c, evjax.CSC) and c.shape == dense.shape and c.dtype == dtype
    np.testing.assert_array_equal(np.asarray(c.indptr), ref.indptr)
    np.testing.assert_array_equal(np.asarray(c.indices), ref.indices)
    np.testing.assert_array_equal(np.asarray(c.todense()), dense)
    assert evjax.CSC.from_dense is not None
    with pytest.raises(ValueError, match="expected a matrix"):
        evjax.CSC.fromdense(np.ones(3))


# ---------------------------------------------------------------------------
# weights: apply, *, /, unary -
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_weight_arithmetic_matches_scipy(kind):
    data, indices, indptr = seeded_csr(7, stored_shape(kind, SHAPE))
    w = make(kind, data, indices, indptr, SHAPE)
    stored = lambda values: scipy_of(kind, values, indices, indptr, SHAPE).toarray()  # noqa: E731
    dense = stored(data)
    m = np.random.default_rng(7).uniform(1.0, 2.0, SHAPE).astype(np.float32)
    cases = {
        "w * 2": (w * 2, 2 * dense),
        "3 * w": (3 * w, 3 * dense),
        "w / 4": (w / 4, dense / 4),
        "2 / w": (2 / w, stored(2 / data)),  # on the stored entries only
        "-w": (-w, -dense),
        "+w": (+w, dense),
        "abs(-w)": (abs(-w), dense),
        "w * M": (w * m, dense * m),
        "M * w": (m * w, dense * m),
        "jnp M * w": (jnp.asarray(m) * w, dense * m),
        "w / M": (w / m, dense / m),
        "w * w": (w * w, stored(data * data)),
        "w / with_data": (w / w.with_data(2 * data), stored(0.5 * np.ones_like(data))),
        "apply(tanh)": (w.apply(jnp.tanh), stored(np.tanh(data))),
        "w * jnp scalar": (w * jnp.float32(1.5), 1.5 * dense),
    }
    for name, (got, want) in cases.items():
        assert type(got) is type(w) and got.shape == SHAPE and got.indices is w.indices, name
        np.testing.assert_allclose(np.asarray(got.todense()), want, rtol=1e-5, atol=1e-6, err_msg=name)
        assert got.dtype == np.float32, name
    hom = make(kind, data[:1], indices, indptr, SHAPE)
    assert (hom * 2).homogeneous and (-hom).homogeneous and hom.apply(jnp.exp).homogeneous
    assert not (hom * m).homogeneous


def test_weight_arithmetic_errors_name_the_fix():
    data, indices, indptr = seeded_csr(8)
    w = make("csr", data, indices, indptr, SHAPE)
    other = make("csr", data, indices.copy(), indptr.copy(), SHAPE)
    with pytest.raises(TypeError, match=r"CSR \*: two sparse matrices must share one structure.*todense"):
        w * other
    with pytest.raises(TypeError, match="share one structure"):
        w * w.T
    with pytest.raises(ValueError, match=r"CSR /: the other operand must be a scalar or a dense matrix of shape"):
        w / np.ones(SHAPE[1], np.float32)
    with pytest.raises(TypeError, match=r"CSR\.apply: weights must be floating point"):
        w.apply(lambda d: d > 1)
    with pytest.raises(ValueError, match=r"CSR\.apply: data must have shape"):
        w.apply(lambda d: d[:2])


@pytest.mark.parametrize("kind", KINDS)
def test_weight_arithmetic_through_harness(kind):
    data, indices, indptr = seeded_csr(9, stored_shape(kind, SHAPE))
    m = np.random.default_rng(9).uniform(1.0, 2.0, SHAPE).astype(np.float32)

    def fn(d, i, p, m):
        w = make(kind, d, i, p, SHAPE)
        return (-(w * m[0, 0]) / 2).todense(), (w * m).todense(), (w / m).todense(), w.apply(jnp.sin).todense()

    def reference(d, i, p, m):
        a = csr_or_csc_dense(kind, d, i, p, SHAPE)
        # structural and IEEE per stored entry: each weight is divided by m at its own position
        r = row_ids(p, i.shape[0])
        m_at = m[r, i] if kind == "csr" else m[i, r]
        return (-(a * m[0, 0]) / 2, a * m, csr_or_csc_dense(kind, d / m_at, i, p, SHAPE),
                csr_or_csc_dense(kind, jnp.sin(d), i, p, SHAPE))

    spec = OpSpec(fn=fn, reference=reference, diff_argnums=(0, 3), vmap_argnums=(0, 1, 3),
                  name=f"{kind}.arithmetic",
                  resample=csr_resampler(indices=1, indptr=2, shape=stored_shape(kind, SHAPE)))
    check_all(spec, (data, indices, indptr, m))


# ---------------------------------------------------------------------------
# diag_add
# ---------------------------------------------------------------------------
def with_diagonal(dense, diag):
    k = len(diag)
    out = np.array(dense, np.float64)
    out[np.arange(k), np.arange(k)] += diag
    return out


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", [(6, 6), (6, 4), (4, 6)])
def test_diag_add_inserts_missing_diagonal_entries(kind, shape):
    data, indices, indptr = seeded_csr(10, stored_shape(kind, shape))
    indices[indptr[1]:indptr[2]][indices[indptr[1]:indptr[2]] == 1] = 0  # row 1 lacks its diagonal
    indices[indptr[3]:indptr[4]] = 3  # row 3 holds only diagonal entries (duplicates, if any)
    for r in range(len(indptr) - 1):
        indices[indptr[r]:indptr[r + 1]].sort()
    w = make(kind, data, indices, indptr, shape)
    ref = scipy_of(kind, data, indices, indptr, shape)
    k = min(shape)
    diag = np.arange(1, k + 1, dtype=np.float32)
    coo = ref.tocoo()
    present = len(set(coo.row[coo.row == coo.col]))  # diagonal elements stored (maybe more than once)
    assert 0 < present < k  # the structure has some and lacks some
    out = w.diag_add(diag)
    assert type(out) is type(w) and out.shape == shape
    assert out.nnz == w.nnz + (k - present)  # one entry per missing diagonal element
    np.testing.assert_allclose(np.asarray(out.todense()), with_diagonal(ref.toarray(), diag), rtol=1e-6)
    assert out.to_scipy().has_sorted_indices  # inserted in sorted position
    again = out.diag_add(diag)  # nothing missing now: the same structure arrays
    assert again.indices is out.indices and again.indptr is out.indptr
    np.testing.assert_allclose(np.asarray(again.todense()), with_diagonal(ref.toarray(), 2 * diag), rtol=1e-6)
    # traced structure: the diagonal is appended to each row (duplicates add up)
    traced = jax.jit(lambda w, d: w.diag_add(d))(w, diag)
    assert traced.nnz == w.nnz + k
    np.testing.assert_allclose(np.asarray(traced.todense()), with_diagonal(ref.toarray(), diag), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(w.diag_add(0.5).todense()),
                               with_diagonal(ref.toarray(), np.full(k, 0.5)), rtol=1e-6)
    hom = make(kind, data[:1], indices, indptr, shape).diag_add(diag)
    np.testing.assert_allclose(np.asarray(hom.todense()),
                               with_diagonal(scipy_of(kind, data[:1], indices, indptr, shape).toarray(), diag),
                               rtol=1e-6)


def test_diag_add_errors():
    w = make("csr", *seeded_csr(11), SHAPE)
    with pytest.raises(ValueError, match=r"CSR\.diag_add: expected a scalar or min\(shape\) = 5 values"):
        w.diag_add(np.ones(6, np.float32))
    with pytest.raises(TypeError, match="not a sparse matrix"):
        w.diag_add(w)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("traced_structure", [False, True])
def test_diag_add_through_harness(kind, traced_structure):
    shape = (5, 5)
    data, indices, indptr = seeded_csr(12, stored_shape(kind, shape))
    diag = np.linspace(0.5, 2.0, 5).astype(np.float32)

    def reference(d, g, i=indices, p=indptr):
        return csr_or_csc_dense(kind, d, i, p, shape).at[jnp.arange(5), jnp.arange(5)].add(g)

    if traced_structure:  # passed in: traced under jit and vmap, the diagonal is appended
        fn = lambda d, g, i, p: make(kind, d, i, p, shape).diag_add(g).todense()  # noqa: E731
        args = (data, diag, indices, indptr)
    else:  # a matrix closed over: its structure is concrete and the missing entries are inserted
        w = make(kind, data, indices, indptr, shape)
        fn = lambda d, g: w.with_data(d).diag_add(g).todense()  # noqa: E731
        args = (data, diag)
        inserted = jax.jit(lambda d, g: w.with_data(d).diag_add(g))(data, diag)
        assert inserted.nnz == w.diag_add(diag).nnz < w.nnz + 5  # not appended
    resample = csr_resampler(indices=2, indptr=3, shape=stored_shape(kind, shape)) if traced_structure else None
    check_all(OpSpec(fn=fn, reference=reference, diff_argnums=(0, 1), name=f"{kind}.diag_add", resample=resample),
              args)


# ---------------------------------------------------------------------------
# slice_rows
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_slice_rows_matches_dense_rows(kind):
    data, indices, indptr = seeded_csr(13, stored_shape(kind, SHAPE))
    w = make(kind, data, indices, indptr, SHAPE)
    dense = scipy_of(kind, data, indices, indptr, SHAPE).toarray()
    mask = np.array([True, False, True, False, False, True])
    for index in (2, -1, [4, 0, 4], np.array([5, 1]), slice(1, 5, 2), slice(None), mask, []):
        out = w.slice_rows(index)
        want = dense[np.atleast_1d(np.arange(SHAPE[0])[index])]
        assert type(out) is type(w) and out.shape == want.shape, index
        np.testing.assert_allclose(np.asarray(out.todense()), want, rtol=1e-6, err_msg=str(index))
        assert (out.to_scipy() != sp.csr_matrix(want)).nnz == 0
    hom = make(kind, data[:1], indices, indptr, SHAPE).slice_rows([0, 3])
    assert hom.data.shape == (1,) and hom.nnz > 1  # still one shared weight
    spikes = np.array([True, False, True])
    np.testing.assert_allclose(np.asarray(spikes @ w.slice_rows([1, 2, 3])), spikes @ dense[[1, 2, 3]], rtol=1e-5)


def test_slice_rows_errors_and_jit():
    w = make("csr", *seeded_csr(14), SHAPE)
    with pytest.raises(IndexError, match=r"CSR\.slice_rows: row 6 is out of range for 6 rows"):
        w.slice_rows([0, 6])
    with pytest.raises(IndexError, match="bool mask must have shape"):
        w.slice_rows(np.ones(3, bool))
    with pytest.raises(TypeError, match="rows must be given by ints"):
        w.slice_rows(np.array([0.5]))
    with pytest.raises(TypeError, match=r"CSC\.slice_rows: the structure \(indices, indptr\) is traced"):
        jax.jit(lambda c: c.slice_rows([0]).todense())(w.T)
    with pytest.raises(TypeError, match="the row index must be concrete"):
        jax.jit(lambda r: w.slice_rows(r).todense())(jnp.array([0]))
    # closed over, the structure is concrete inside jit; the weights may be traced
    got = jax.jit(lambda d: w.with_data(d).slice_rows([3, 1]).todense())(2 * w.data)
    np.testing.assert_allclose(np.asarray(got), 2 * np.asarray(w.todense())[[3, 1]], rtol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_slice_rows_through_harness(kind):
    data, indices, indptr = seeded_csr(15, stored_shape(kind, SHAPE))
    rows = [4, 0, 4, 2]

    def reference(d):
        return csr_or_csc_dense(kind, d, indices, indptr, SHAPE)[jnp.array(rows)]

    w = make(kind, data, indices, indptr, SHAPE)  # closed over: a concrete structure inside jit and vmap
    spec = OpSpec(fn=lambda d: w.with_data(d).slice_rows(rows).todense(),
                  reference=reference, diff_argnums=(0,), name=f"{kind}.slice_rows")
    check_all(spec, (data,))


# ---------------------------------------------------------------------------
# no implicit dense conversion; constructor forms; workspace=
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_implicit_dense_conversion_is_a_clear_type_error(kind):
    data, indices, indptr = seeded_csr(16, stored_shape(kind, SHAPE))
    w = make(kind, data, indices, indptr, SHAPE)
    for convert in (np.asarray, np.array, jnp.asarray, jnp.array):
        with pytest.raises(TypeError, match=rf"{kind.upper()} is a sparse matrix .* call \.todense\(\)"):
            convert(w)
    x = np.random.default_rng(16).standard_normal(SHAPE[0]).astype(np.float32)
    dense = np.asarray(w.todense())
    # operators of jax and NumPy arrays still defer to the matrix
    np.testing.assert_allclose(np.asarray(jnp.asarray(x) @ w), x @ dense, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(x @ w), x @ dense, rtol=1e-5, atol=1e-6)


def test_shape_given_positionally_or_errors_naming_the_class():
    data, indices, indptr = seeded_csr(17)
    ref = np.asarray(make("csr", data, indices, indptr, SHAPE).todense())
    for w in (evjax.CSR((data, indices, indptr), SHAPE), evjax.CSR(data, indices, indptr, SHAPE),
              evjax.CSR(data, indices, indptr, shape=SHAPE)):
        np.testing.assert_array_equal(np.asarray(w.todense()), ref)
    c = evjax.CSC((data, indices, indptr), SHAPE[::-1])
    np.testing.assert_array_equal(np.asarray(c.todense()), ref.T)
    bad_calls = {
        "CSR: shape=(n_rows, n_cols) is required": lambda: evjax.CSR((data, indices, indptr)),
        "CSC: shape=(n_rows, n_cols) is required": lambda: evjax.CSC(data, indices, indptr),
        "CSR: too many arguments": lambda: evjax.CSR((data, indices, indptr), SHAPE, shape=SHAPE),
        "CSC: too many arguments": lambda: evjax.CSC(data, indices, indptr, SHAPE, 1),
        "CSR: give data, indices and indptr": lambda: evjax.CSR(data, indices, shape=SHAPE),
        "CSR: unexpected keyword argument": lambda: evjax.CSR(data, indices, indptr, shape=SHAPE, buffers={}),
    }
    for message, call in bad_calls.items():
        with pytest.raises(TypeError) as info:
            call()
        assert str(info.value).startswith(message) and "_Compressed" not in str(info.value), str(info.value)
    with pytest.raises(ValueError, match=r"CSR: expected \(data, indices, indptr\), got a sequence of 2"):
        evjax.CSR((data, indices), shape=SHAPE)


@pytest.mark.parametrize("transpose", [False, True])
def test_workspace_keyword_is_accepted_and_ignored(transpose):
    data, indices, indptr = seeded_csr(18)
    rng = np.random.default_rng(18)
    n_in = SHAPE[0] if transpose else SHAPE[1]
    spikes = rng.random(n_in) < 0.5
    batch = rng.random((n_in, 3)) < 0.5
    args = (data, indices, indptr)
    kw = dict(shape=SHAPE, transpose=transpose)
    for op, x in ((evjax.binary_csrmv, spikes), (evjax.binary_csrmm, batch)):
        assert inspect.signature(op).parameters["workspace"].default is None
        np.testing.assert_array_equal(np.asarray(op(*args, x, workspace=object(), **kw)),
                                      np.asarray(op(*args, x, **kw)))
    a = scipy_of("csr", data, indices, indptr, SHAPE).toarray()
    a = a.T if transpose else a

    def reference(d, s):
        return dense_matrix(d, indices, indptr, SHAPE).T @ s.astype(d.dtype) if transpose else \
            dense_matrix(d, indices, indptr, SHAPE) @ s.astype(d.dtype)

    spec = OpSpec(fn=lambda d, s: evjax.binary_csrmv(d, indices, indptr, s, workspace=None, **kw),
                  reference=reference, diff_argnums=(0,), name="binary_csrmv(workspace=None)")
    check_all(spec, (data, spikes), skip=("check_grads",))
    np.testing.assert_allclose(np.asarray(spec.fn(data, spikes)), a @ spikes, rtol=1e-5)


def test_names_and_arguments_follow_brainevent():
    brainevent = pytest.importorskip("brainevent")

    def names(fn):
        return [p for p in inspect.signature(fn).parameters if p != "self"]

    for cls in ("CSR", "CSC"):
        ours, theirs = getattr(evjax, cls), getattr(brainevent, cls)
        for method in ("sum", "tocoo", "tocsr", "tocsc", "todense", "apply", "diag_add", "slice_rows",
                       "transpose", "with_data", "__mul__", "__rmul__", "__truediv__", "__rtruediv__", "__neg__"):
            assert names(getattr(ours, method)) == names(getattr(theirs, method)), f"{cls}.{method}"
    assert names(evjax.defjvp) == names(brainevent.defjvp)
    assert names(evjax.general_batching_rule) == names(brainevent.general_batching_rule)
    # brainevent's arguments, in its order; evjax adds one keyword at the end,
    # ``weighted`` (graded events, see docs/dense_events.md), so their calls run here
    for op in ("binary_csrmv", "binary_csrmm", "binary_fcnmv", "binary_fcnmm", "binary_densemv", "binary_densemm"):
        ours, theirs = names(getattr(evjax, op)), names(getattr(brainevent, op))
        assert ours == theirs + ["weighted"], op
        assert inspect.signature(getattr(evjax, op)).parameters["weighted"].kind is inspect.Parameter.KEYWORD_ONLY


def test_matrix_with_numpy_leaves_multiplies():
    """``jax.device_get(W)`` rebuilds the matrix with NumPy leaves (no validation): ``@`` still runs the op
    (the brainunit branch of ``@`` is for quantities only; it once recursed on any non-JAX array)."""
    dense = np.array([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]], np.float32)
    W = jax.device_get(evjax.CSR.fromdense(dense))
    assert isinstance(W.data, np.ndarray)
    x = np.array([1.0, 2.0, 3.0], np.float32)
    np.testing.assert_allclose(np.asarray(W @ x), dense @ x)
    np.testing.assert_allclose(np.asarray(np.array([True, False]) @ W), dense[0])


# ---------------------------------------------------------------------------
# brainevent's constructor options: backend=, fromdense(nse=, backend=, precompute_weight_indices=); solve
# ---------------------------------------------------------------------------
def _backends_bound(fn, *args):
    """The ``backend`` parameter of every evjax op in ``fn``'s jaxpr (nested jaxprs included)."""
    return [(eqn.primitive.name, eqn.params["backend"].per_call) for eqn in equations(jax.make_jaxpr(fn)(*args))
            if eqn.primitive.name.startswith("evjax_")]


@pytest.mark.parametrize("kind", KINDS)
def test_backend_keyword_reaches_every_op_and_is_kept(kind):
    data, indices, indptr = seeded_csr(14, stored_shape(kind, SHAPE), sort=True)
    cls = evjax.CSR if kind == "csr" else evjax.CSC
    W = cls((data, indices, indptr), shape=SHAPE, backend="reference")
    s_rows, s_cols = np.arange(SHAPE[0]) % 2 == 0, np.arange(SHAPE[1]) % 3 == 0
    x = np.linspace(-1, 1, SHAPE[1]).astype(np.float32)
    kept = [W.T.T, W.with_data(W.data * 2), W * 2.0, -W, W.apply(jnp.abs), W.tocsr(), W.tocsc(),
            W.slice_rows([0, 2]), W.diag_add(1.0), W.build_weight_indices(),
            jax.tree_util.tree_map(lambda a: a, W)]
    assert all(m.backend == "reference" for m in kept)
    flows = [
        lambda W: evjax.BinaryArray(s_rows) @ W, lambda W: W @ x, lambda W: W @ evjax.BinaryArray(s_cols),
        lambda W: jax.grad(lambda d: jnp.sum(evjax.BinaryArray(s_rows) @ W.with_data(d)))(W.data),
        lambda W: jax.vmap(lambda s: evjax.BinaryArray(s) @ W)(np.stack([s_rows, ~s_rows])),
        lambda W: W.update_on_pre(s_rows, x, 0.0, 1.0).data, lambda W: W.update_on_post(np.ones(SHAPE[0]), s_cols).data,
    ]
    for flow in flows:
        bound = _backends_bound(flow, W)
        assert bound and all(name_backend[1] == "reference" for name_backend in bound), bound
    got = jax.jit(lambda W: evjax.BinaryArray(s_rows) @ W)(W)
    want = s_rows.astype(np.float32) @ csr_or_csc_dense(kind, data, indices, indptr, SHAPE)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    # the backend is static: another one is another treedef (a new trace), new weights are not
    assert jax.tree_util.tree_structure(W) != jax.tree_util.tree_structure(cls((data, indices, indptr), shape=SHAPE))
    assert jax.tree_util.tree_structure(W) == jax.tree_util.tree_structure(W.with_data(W.data + 1))


def test_backend_keyword_errors():
    data, indices, indptr = seeded_csr(15)
    with pytest.raises(TypeError, match="backend must be a backend's name"):
        evjax.CSR((data, indices, indptr), shape=SHAPE, backend=3)
    W = evjax.CSR((data, indices, indptr), shape=SHAPE, backend="no_such_backend")
    with pytest.raises(evjax.KernelNotAvailableError, match="no_such_backend"):
        evjax.BinaryArray(np.ones(SHAPE[0], bool)) @ W


@pytest.mark.parametrize("kind", KINDS)
def test_fromdense_options_follow_brainevent(kind):
    cls = evjax.CSR if kind == "csr" else evjax.CSC
    dense = np.asarray(csr_or_csc_dense("csr", *seeded_csr(16, SHAPE, sort=True), SHAPE))
    nnz = int((dense != 0).sum())
    W = cls.fromdense(dense, nse=nnz, backend="reference", precompute_weight_indices=True)
    np.testing.assert_array_equal(np.asarray(W.todense()), dense)
    assert W.backend == "reference" and W.nnz == nnz and W.other_view is not None
    for got, want in zip(W.other_view, cls.fromdense(dense).build_weight_indices().other_view):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert cls.fromdense(dense).other_view is None
    with pytest.raises(ValueError, match=f"nse = {nnz + 1} but the matrix has {nnz} nonzero entries"):
        cls.fromdense(dense, nse=nnz + 1)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("homogeneous", [False, True])
def test_solve_matches_numpy_under_jit_and_grad(kind, homogeneous):
    rng = np.random.default_rng(17)
    n = 7
    a = np.where(rng.random((n, n)) < 0.4, rng.uniform(-1, 1, (n, n)), 0.0) + 4 * np.eye(n)
    if homogeneous:  # one weight on an upper bidiagonal pattern: nonsingular
        a = np.eye(n) + np.eye(n, k=1)
    a = a.astype(np.float32)
    W = (evjax.CSR if kind == "csr" else evjax.CSC).fromdense(a)
    if homogeneous:
        W = W.with_data(jnp.float32(2.0))
        a = np.asarray(W.todense())
        assert W.homogeneous
    b = rng.standard_normal(n).astype(np.float32)
    want = np.linalg.solve(a.astype(np.float64), b)
    np.testing.assert_allclose(np.asarray(W.solve(b)), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(jax.jit(lambda W, b: W.solve(b))(W, b)), want, rtol=1e-4, atol=1e-5)
    # gradients in the weights and b, against the dense solve's at the stored entries
    g_data, g_b = jax.grad(lambda d, b: jnp.sum(W.with_data(d).solve(b) ** 2), argnums=(0, 1))(W.data, b)
    dense_of = (lambda d: W.with_data(d).todense())
    r_data, r_b = jax.grad(lambda d, b: jnp.sum(jnp.linalg.solve(dense_of(d), b) ** 2), argnums=(0, 1))(W.data, b)
    np.testing.assert_allclose(np.asarray(g_data), np.asarray(r_data), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(np.asarray(g_b), np.asarray(r_b), rtol=1e-3, atol=1e-4)


def test_solve_errors_name_the_argument():
    data, indices, indptr = seeded_csr(18)
    with pytest.raises(ValueError, match=r"must be square, got shape \(6, 5\)"):
        evjax.CSR((data, indices, indptr), shape=SHAPE).solve(np.ones(6, np.float32))
    W = evjax.CSR.fromdense(np.eye(4, dtype=np.float32))
    with pytest.raises(ValueError, match=r"b must have shape \(4,\), got \(3,\)"):
        W.solve(np.ones(3, np.float32))


@pytest.mark.parametrize("kind", KINDS)
def test_add_and_sub_give_the_dense_array_and_apply2_follows_brainevent(kind):
    import operator

    data, indices, indptr = seeded_csr(19, stored_shape(kind, SHAPE))
    W = make(kind, data, indices, indptr, SHAPE)
    dense = np.asarray(csr_or_csc_dense(kind, data, indices, indptr, SHAPE))
    m = np.random.default_rng(19).uniform(1.0, 2.0, SHAPE).astype(np.float32)
    row = m[0]
    for got, want in [(W + 1.0, dense + 1.0), (1.0 + W, 1.0 + dense), (W - m, dense - m), (m - W, m - dense),
                      (W + row, dense + row), (W + W, 2 * dense), (W.apply2(m, operator.sub, reverse=True), m - dense)]:
        assert isinstance(got, jax.Array)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    scaled = W.apply2(3.0, operator.mul)
    assert type(scaled) is type(W)
    np.testing.assert_allclose(np.asarray(scaled.todense()), 3 * dense, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(W.apply2(m, operator.truediv).todense()),
                               np.asarray((W / m).todense()), rtol=1e-6)
    with pytest.raises(ValueError, match=r"broadcast to \(6, 5\), got shape \(5, 6\)"):
        W + m.T
    np.testing.assert_allclose(np.asarray(jax.jit(lambda W, m: W - m)(W, m)), dense - m, rtol=1e-6)

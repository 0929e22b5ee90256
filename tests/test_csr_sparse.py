"""CSR / CSC / BinaryArray pytrees, matmul dispatch, errors, batching and gradient structure."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

import evjax
from evjax.primitives.csr import numba as csr_numba

from tests.helpers import handler_count, random_structure, small_scipy_csr


def primitives_of(jaxpr) -> set[str]:
    """Names of the primitives in a jaxpr, sub-jaxprs included."""
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for value in eqn.params.values():
            for item in value if isinstance(value, (list, tuple)) else [value]:
                inner = getattr(item, "jaxpr", item)
                if hasattr(inner, "eqns"):
                    names |= primitives_of(inner)
    return names


# ---------------------------------------------------------------------------
# construction and conversion
# ---------------------------------------------------------------------------
def test_construction_forms_and_conversions():
    a = small_scipy_csr()
    w1 = evjax.CSR((a.data, a.indices, a.indptr), shape=a.shape)
    w2 = evjax.CSR(a.data, a.indices, a.indptr, shape=a.shape)
    w3 = evjax.CSR.from_scipy(a)
    w4 = evjax.CSR.fromdense(a.toarray())
    for w in (w1, w2, w3, w4):
        np.testing.assert_array_equal(np.asarray(w.todense()), a.toarray())
        assert (w.to_scipy() != a).nnz == 0
        assert w.nnz == a.nnz and w.shape == a.shape and w.dtype == jnp.float32
    hom = evjax.CSR((np.float32(2.0), a.indices, a.indptr), shape=a.shape)
    assert hom.homogeneous and hom.data.shape == (1,)
    np.testing.assert_array_equal(np.asarray(hom.todense()), 2.0 * (a.toarray() != 0))
    # CSC from scipy and back; the transposed view shares the arrays
    c = evjax.CSC.from_scipy(a.tocsc())
    np.testing.assert_array_equal(np.asarray(c.todense()), a.toarray())
    t = w1.T
    assert isinstance(t, evjax.CSC) and t.shape == (a.shape[1], a.shape[0])
    assert t.data is w1.data and t.indices is w1.indices and t.indptr is w1.indptr
    np.testing.assert_array_equal(np.asarray(t.todense()), a.toarray().T)
    assert (t.to_scipy() != a.T).nnz == 0
    assert t.T.shape == w1.shape and t.T.data is w1.data
    # with_data keeps the structure
    w5 = w1.with_data(jnp.ones(a.nnz))
    assert w5.indices is w1.indices
    np.testing.assert_array_equal(np.asarray(w5.todense()), (a.toarray() != 0).astype(np.float32))


def test_duplicate_columns_are_summed():
    w = evjax.CSR((np.array([1.0, 2.0, 4.0], np.float32), np.array([1, 1, 0]), np.array([0, 3, 3])), shape=(2, 2))
    np.testing.assert_array_equal(np.asarray(w.todense()), [[4.0, 3.0], [0.0, 0.0]])
    np.testing.assert_array_equal(np.asarray(w @ jnp.array([1.0, 10.0])), [34.0, 0.0])
    np.testing.assert_array_equal(np.asarray(jnp.array([True, False]) @ w), [4.0, 3.0])
    np.testing.assert_array_equal(np.asarray(w.to_scipy().toarray()), [[4.0, 3.0], [0.0, 0.0]])


def test_int64_indices_with_x64():
    a = small_scipy_csr()
    with jax.enable_x64(True):
        w = evjax.CSR((a.data, a.indices.astype(np.int64), a.indptr.astype(np.int64)), shape=a.shape)
        assert w.indices.dtype == jnp.int64 and w.indptr.dtype == jnp.int64
        s = np.arange(6) % 2 == 0
        w64 = w.with_data(a.data.astype(np.float64))
        np.testing.assert_allclose(np.asarray(s @ w64), a.T @ s, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(w @ np.ones(5)), a @ np.ones(5), rtol=1e-6)
        assert (w @ np.ones(5)).dtype == jnp.float64  # float32 weights, float64 operand


# ---------------------------------------------------------------------------
# matmul dispatch on both sides
# ---------------------------------------------------------------------------
def test_matmul_both_sides_vectors_and_batches():
    a = small_scipy_csr(1, m=7, n=4)
    w = evjax.CSR.from_scipy(a)
    rng = np.random.default_rng(0)
    s, S = rng.random(7) < 0.5, rng.random((3, 7)) < 0.5
    r, R = rng.random(4) < 0.5, rng.random((4, 2)) < 0.5
    x, X = rng.standard_normal(7).astype(np.float32), rng.standard_normal((3, 7)).astype(np.float32)
    y, Y = rng.standard_normal(4).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)
    d = a.toarray()
    cases = [
        (s @ w, s @ d), (S @ w, S @ d), (jnp.asarray(s) @ w, s @ d),
        (evjax.BinaryArray(s) @ w, s @ d), (evjax.EventArray(S.astype(np.float32)) @ w, S @ d),
        (w @ r, d @ r), (w @ R, d @ R), (w @ evjax.BinaryArray(r), d @ r),
        (x @ w, x @ d), (X @ w, X @ d), (jnp.asarray(X) @ w, X @ d),
        (w @ y, d @ y), (w @ Y, d @ Y),
        (w.T @ x, d.T @ x), (w.T @ X.T, d.T @ X.T), (y @ w.T, y @ d.T), (Y.T @ w.T, Y.T @ d.T),
        (w.T @ s, d.T @ s), (r @ w.T, r @ d.T),
    ]
    for k, (got, want) in enumerate(cases):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6, err_msg=f"case {k}")
    with pytest.raises(ValueError, match="not aligned"):
        w @ np.ones(7)
    with pytest.raises(ValueError, match="not aligned"):
        np.ones((2, 4)) @ w


def test_event_ops_ignore_spike_values_but_pass_straight_through_gradient():
    a = small_scipy_csr(2)
    w = evjax.CSR.from_scipy(a)
    s = jnp.array([0.0, 2.5, 0.0, -1.0, 1.0, 0.0], jnp.float32)
    out = evjax.BinaryArray(s) @ w
    np.testing.assert_allclose(np.asarray(out), (np.asarray(s) != 0) @ a.toarray(), rtol=1e-6)
    ct = jnp.arange(5, dtype=jnp.float32)
    g = jax.grad(lambda s: jnp.vdot(ct, evjax.BinaryArray(s) @ w))(s)
    np.testing.assert_allclose(np.asarray(g), a.toarray() @ np.asarray(ct), rtol=1e-6)  # d out / d s = W


# ---------------------------------------------------------------------------
# pytree: structure is data, so no retrace
# ---------------------------------------------------------------------------
def test_new_structure_same_shape_and_nnz_does_not_retrace():
    traces = []

    @jax.jit
    def f(w, s):
        traces.append(1)
        return s @ w

    rng = np.random.default_rng(0)
    s = rng.random(8) < 0.5
    a1 = sp.random(8, 6, density=0.5, format="csr", random_state=1, dtype=np.float32)
    idx, ptr = random_structure(rng, 8, 6)
    while idx.shape[0] != a1.nnz:
        idx, ptr = random_structure(rng, 8, 6)
    w1 = evjax.CSR.from_scipy(a1)
    w2 = evjax.CSR((a1.data, idx, ptr), shape=(8, 6))
    np.testing.assert_allclose(np.asarray(f(w1, s)), a1.T @ s, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(f(w2, s)), np.asarray(w2.todense()).T @ s, rtol=1e-6)
    assert len(traces) == 1
    assert f._cache_size() == 1


def test_pytree_round_trip_placeholders_and_rebuilt_structure_checks():
    a = small_scipy_csr(3)
    for W in (evjax.CSR.from_scipy(a), evjax.CSR.from_scipy(a).T):
        leaves, tree = jax.tree_util.tree_flatten(W)
        assert [x.shape for x in leaves] == [(a.nnz,), (a.nnz,), (a.shape[0] + 1,)]
        rebuilt = jax.tree_util.tree_unflatten(tree, leaves)
        assert type(rebuilt) is type(W) and rebuilt.shape == W.shape
        np.testing.assert_array_equal(np.asarray(rebuilt.todense()), np.asarray(W.todense()))
        # JAX rebuilds pytrees from placeholders (vmap's in_axes, tree_map): no validation then
        placeholders = jax.tree_util.tree_map(lambda x: object(), W)
        assert type(placeholders) is type(W) and placeholders.shape == W.shape
    W = evjax.CSR.from_scipy(a)
    s = np.random.default_rng(0).random(a.shape[0]) < 0.5
    # per-sample weights with a shared structure, the in_axes given as a CSR prefix
    Ws = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(W), [jnp.stack([W.data, 2 * W.data]),
                                                                          W.indices, W.indptr])
    axes = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(W), [0, None, None])
    out = jax.vmap(lambda W, s: s @ W, in_axes=(axes, None))(Ws, s)
    np.testing.assert_allclose(np.asarray(out), np.stack([a.T @ s, 2 * (a.T @ s)]), rtol=1e-6)
    # a structure that no longer describes a CSR (indices batched but declared shared) is refused
    Wb = jax.vmap(lambda d: W.with_data(d))(jnp.stack([W.data, W.data]))  # vmap batches every leaf
    with pytest.raises(ValueError, match="indices must be 1-d"):
        jax.vmap(lambda W, s: s @ W, in_axes=(axes, None))(Wb, s)


def test_kernels_compile_per_signature_not_per_shape():
    rng = np.random.default_rng(5)
    f = lambda w, s: s @ w  # noqa: E731
    f(evjax.CSR.from_scipy(small_scipy_csr(3, 9, 7)), rng.random(9) < 0.5)  # compile this signature
    before = handler_count()
    for m, n in [(3, 11), (12, 2), (1, 1)]:
        a = small_scipy_csr(4, m, n)
        np.testing.assert_allclose(np.asarray(f(evjax.CSR.from_scipy(a), np.ones(m, bool))),
                                   a.T @ np.ones(m), rtol=1e-5)
    assert handler_count() == before


# ---------------------------------------------------------------------------
# bad input: clear errors
# ---------------------------------------------------------------------------
def test_bad_input_errors_name_the_problem():
    a = small_scipy_csr()
    d, i, p = a.data, a.indices, a.indptr
    with pytest.raises(ValueError, match="indptr has length"):
        evjax.CSR((d, i, p[:-1]), shape=a.shape)
    with pytest.raises(ValueError, match="non-decreasing"):
        bad = p.copy()
        bad[2], bad[3] = bad[3] + 1, bad[2]
        evjax.CSR((d, i, bad), shape=a.shape)
    with pytest.raises(ValueError, match=r"indptr\[-1\]"):
        evjax.CSR((d[:-1], i[:-1], p), shape=a.shape)
    with pytest.raises(ValueError, match="out of range"):
        evjax.CSR((d, np.where(np.arange(len(i)) == 1, 5, i), p), shape=a.shape)
    with pytest.raises(ValueError, match="out of range"):
        evjax.csrmv(d, np.where(np.arange(len(i)) == 0, -1, i), p, np.ones(5), shape=a.shape)
    with pytest.raises(ValueError, match="data has length"):
        evjax.CSR((d[:3], i, p), shape=a.shape)
    with pytest.raises(TypeError, match="floating point"):
        evjax.CSR((np.ones(len(i), np.int32), i, p), shape=a.shape)
    with pytest.raises(TypeError, match="integer"):
        evjax.CSR((d, i.astype(np.float32), p), shape=a.shape)
    with pytest.raises(ValueError, match="needs"):
        evjax.csrmv(d, i, p, np.ones(6), shape=a.shape)
    with pytest.raises(ValueError, match="needs"):
        evjax.binary_csrmv(d, i, p, np.ones(5, bool), shape=a.shape, transpose=True)
    with pytest.raises(ValueError, match="needs"):
        evjax.csrmm(d, i, p, np.ones((6, 2)), shape=a.shape)
    with pytest.raises(ValueError, match="needs"):
        evjax.binary_csrmm(d, i, p, np.ones(5, bool), shape=a.shape)
    with pytest.raises(TypeError, match="floating point"):
        evjax.CSR.from_scipy(a).with_data(np.ones(a.nnz, np.int32))
    with pytest.raises(ValueError, match="shape"):
        evjax.CSR((d, i, p), shape=(6,))


@pytest.mark.parametrize("backend", ["numba", "reference"])
def test_malformed_traced_structure_stays_in_bounds(backend):
    """Under jit the structure cannot be validated; kernels clamp spans and drop bad columns."""
    rng = np.random.default_rng(0)
    n_rows, n_cols, nnz = 5, 4, 12
    data = rng.uniform(0.5, 1.5, nnz).astype(np.float32)
    good_ptr = np.array([0, 3, 3, 7, 9, 12], np.int32)
    wild_idx = np.array([0, 9, -3, 1, 2, 3, 100000, -100000, 1, 2, 3, 4], np.int32)
    wild_ptr = np.array([5, -7, 30, 2, 1000, -4], np.int32)
    s = np.ones(n_rows, bool)
    v = np.ones(n_cols, np.float32)
    ops = {
        "scatter": jax.jit(lambda d, i, p: evjax.binary_csrmv(d, i, p, s, shape=(n_rows, n_cols), transpose=True,
                                                              backend=backend)),
        "gather": jax.jit(lambda d, i, p: evjax.csrmv(d, i, p, v, shape=(n_rows, n_cols), backend=backend)),
        "grad": jax.jit(jax.grad(lambda d, i, p: jnp.sum(evjax.binary_csrmv(
            d, i, p, s, shape=(n_rows, n_cols), transpose=True, backend=backend) ** 2))),
        "mm": jax.jit(lambda d, i, p: evjax.binary_csrmm(d, i, p, np.ones((n_rows, 33), bool),
                                                         shape=(n_rows, n_cols), transpose=True, backend=backend)),
    }
    for name, fn in ops.items():
        out = np.asarray(fn(data, wild_idx, wild_ptr))
        assert np.all(np.isfinite(out)), name
    # with a valid indptr, out-of-range columns are dropped, exactly as in a matrix without them
    keep = (wild_idx >= 0) & (wild_idx < n_cols)
    clean = np.where(keep, data, 0).astype(np.float32)
    for name, fn in ops.items():
        wild = np.asarray(fn(data, wild_idx, good_ptr))
        tame = np.asarray(fn(clean, np.where(keep, wild_idx, 0), good_ptr))
        if name == "grad":  # a dropped synapse has no gradient
            assert np.all(wild[~keep] == 0)
            wild, tame = wild[keep], tame[keep]
        np.testing.assert_allclose(wild, tame, rtol=1e-6, err_msg=name)


def test_gradient_wrt_structure_is_a_clear_error_or_float0():
    a = small_scipy_csr()
    w = evjax.CSR.from_scipy(a)
    s = np.ones(6, bool)
    f = lambda i: jnp.sum(evjax.binary_csrmv(w.data, i, w.indptr, s, shape=w.shape, transpose=True))  # noqa: E731
    with pytest.raises(TypeError, match="integer"):
        jax.grad(f)(w.indices)
    g = jax.grad(f, allow_int=True)(w.indices)
    assert g.dtype == jax.dtypes.float0 and g.shape == w.indices.shape
    gw = jax.grad(lambda w: jnp.sum(s @ w), allow_int=True)(w)
    assert gw.indptr.dtype == jax.dtypes.float0
    np.testing.assert_allclose(np.asarray(gw.data), np.ones(a.nnz))


# ---------------------------------------------------------------------------
# gradient structure: event-driven, no dense work
# ---------------------------------------------------------------------------
def test_weight_gradient_is_event_driven():
    a = small_scipy_csr(6, m=40, n=30, density=0.3)
    w = evjax.CSR.from_scipy(a)
    rng = np.random.default_rng(1)
    s = rng.random(40) < 0.2
    loss = lambda d: jnp.sum((s @ w.with_data(d)) ** 2)  # noqa: E731
    names = primitives_of(jax.make_jaxpr(jax.grad(loss))(w.data).jaxpr)
    assert "evjax_csr_sddmm" in names and "evjax_binary_csrmv" in names
    assert not names & {"scatter-add", "scatter_add", "gather", "dot_general", "while", "scan"}, names
    g = np.asarray(jax.grad(loss)(w.data))
    rows = np.repeat(np.arange(40), np.diff(a.indptr))
    assert np.all(g[~s[rows]] == 0)  # synapses of silent rows get no gradient
    out = a.T @ s
    np.testing.assert_allclose(g, (2 * out[a.indices]) * s[rows], rtol=1e-5)
    # homogeneous weight: a scalar gradient from one more event-driven pass
    wh = evjax.CSR((np.float32(0.5), a.indices, a.indptr), shape=a.shape)
    gh = jax.grad(lambda d: jnp.sum((s @ wh.with_data(d)) ** 2))(wh.data)
    counts = (a != 0).astype(np.float32).T @ s.astype(np.float32)  # active synapses per target
    np.testing.assert_allclose(np.asarray(gh), [np.sum(2 * (0.5 * counts) * counts)], rtol=1e-5)


def test_direct_kernels_with_any_pool_size():
    """The Numba kernels split work by their thread-count argument; every split gives the same result."""
    a = sp.random(1000, 400, density=1.0, format="csr", random_state=2, dtype=np.float32)
    d, i, p = a.data, a.indices.astype(np.int32), a.indptr.astype(np.int32)
    rng = np.random.default_rng(0)
    s = rng.random(1000) < 0.8
    S = rng.random((5, 1000)) < 0.5
    assert np.diff(p)[s].sum() > csr_numba.PARALLEL_MIN_WORK  # the parallel paths run (the highest threshold)
    x = rng.standard_normal(400).astype(np.float32)
    X = rng.standard_normal((400, 3)).astype(np.float32)
    rows = np.repeat(np.arange(1000), np.diff(p))
    ct = rng.standard_normal(400).astype(np.float32)
    CT = rng.standard_normal((400, 5)).astype(np.float32)
    for pool in (1, 2, 3, 8):
        out = np.empty(400, np.float32)
        csr_numba.scatter_mv(pool, d, i, p, s, out)
        np.testing.assert_allclose(out, a.T @ s, rtol=1e-5, atol=1e-5)
        out = np.empty((5, 400), np.float32)
        csr_numba.scatter_mm_batch_major(pool, d, i, p, S, out)
        np.testing.assert_allclose(out, (a.T @ S.T).T, rtol=1e-5, atol=1e-5)
        out = np.empty(1000, np.float32)
        csr_numba.gather_mv(pool, d, i, p, x, out)
        np.testing.assert_allclose(out, a @ x, rtol=1e-5, atol=1e-5)
        out = np.empty((1000, 3), np.float32)
        csr_numba.gather_mm(pool, d, i, p, X, out)
        np.testing.assert_allclose(out, a @ X, rtol=1e-5, atol=1e-5)
        g = np.empty(a.nnz, np.float32)
        csr_numba.sddmm_mv(pool, i, p, s, ct, g)
        np.testing.assert_allclose(g, s[rows] * ct[i], rtol=1e-6)
        csr_numba.sddmm_mm(pool, i, p, S.T.copy(), CT, g)
        np.testing.assert_allclose(g, np.sum(S.T[rows] * CT[i], axis=1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("active_rows", [3, 200])  # batch scatter and gradient below / above their thresholds
def test_batch_scatter_and_gradient_kernels_with_any_pool_size(active_rows):
    """Batch scatters (plain and weighted) and weight gradients near their parallel thresholds, on a
    fixed-width table with duplicate targets: every pool size gives the dense answer, and the NaN
    weights of silent rows never reach an output."""
    from evjax.primitives.csr import numba_rows

    rng = np.random.default_rng(active_rows)
    n_rows, n_out, k, width = 600, 300, 20, 5
    indices = rng.integers(0, n_out, n_rows * k).astype(np.int32)  # duplicates within rows
    indptr = (np.arange(n_rows + 1) * k).astype(np.int32)
    data = rng.standard_normal(n_rows * k).astype(np.float32)
    live = np.zeros(n_rows, bool)
    live[rng.choice(n_rows, active_rows, replace=False)] = True
    data.reshape(n_rows, k)[~live] = np.nan  # rows no sample activates
    S = (rng.random((width, n_rows)) < 0.5) & live
    V = np.where(S, rng.standard_normal(S.shape), 0).astype(np.float32)  # graded events
    rows = np.repeat(np.arange(n_rows), k)
    dense = np.zeros((n_rows, n_out))
    np.add.at(dense, (rows, indices), np.nan_to_num(data.astype(np.float64)))
    synapses = int(S.sum()) * k
    serial = numba_rows._batch_scatter_serial.py_func(synapses, width * n_out)
    assert serial == (active_rows == 3)  # the two cases sit on either side of the threshold
    CT = rng.standard_normal((n_out, width)).astype(np.float32)
    want_g = np.sum(np.where(V.T[rows] != 0, V.T[rows] * CT[indices], 0), axis=1)
    assert numba_rows._sddmm_serial.py_func(n_rows * k * width, n_rows * k) is False  # the weighted gradient
    for pool in (1, 2, 3, 8):
        out = np.full((width, n_out), np.nan, np.float32)
        csr_numba.scatter_mm_batch_major(pool, data, indices, indptr, S, out)
        np.testing.assert_allclose(out, S @ dense, rtol=1e-5, atol=1e-5)
        out = np.full((width, n_out), np.nan, np.float32)
        csr_numba.weighted_scatter_mm_batch_major(pool, data, indices, indptr, V, out)
        np.testing.assert_allclose(out, V @ dense, rtol=1e-5, atol=1e-5)
        g = np.full(n_rows * k, np.nan, np.float32)
        csr_numba.sddmm_mm(pool, indices, indptr, S.T.copy(), CT, g)
        np.testing.assert_allclose(g, np.sum(S.T[rows] * CT[indices], axis=1), rtol=1e-5, atol=1e-5)
        g = np.full(n_rows * k, np.nan, np.float32)
        csr_numba.sddmm_r_weighted(pool, indices, indptr, V.T.copy(), CT, g)
        np.testing.assert_allclose(g, want_g, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------
# batching
# ---------------------------------------------------------------------------
def test_vmap_over_vector_is_one_matmat_call():
    w = evjax.CSR.from_scipy(small_scipy_csr(7, m=9, n=6))
    S = np.random.default_rng(0).random((4, 9)) < 0.5
    names = primitives_of(jax.make_jaxpr(jax.vmap(lambda s: s @ w))(S).jaxpr)
    assert "evjax_binary_csrmm" in names and "evjax_binary_csrmv" not in names
    assert not names & {"while", "scan"}
    X = np.random.default_rng(1).standard_normal((6, 4)).astype(np.float32)
    names = primitives_of(jax.make_jaxpr(jax.vmap(lambda x: w @ x, in_axes=1))(X).jaxpr)
    assert "evjax_csrmm" in names and not names & {"while", "scan"}
    np.testing.assert_allclose(np.asarray(jax.vmap(lambda x: w @ x, in_axes=1, out_axes=1)(X)),
                               np.asarray(w.todense()) @ X, rtol=1e-5)


def test_vmap_over_weights_both_and_nested():
    a = small_scipy_csr(8, m=7, n=5)
    w = evjax.CSR.from_scipy(a)
    rng = np.random.default_rng(2)
    D = rng.uniform(0.5, 1.5, (3, a.nnz)).astype(np.float32)
    S = rng.random((3, 7)) < 0.5
    dense = lambda d: np.asarray(w.with_data(d).todense())  # noqa: E731
    got = jax.vmap(lambda d: S[0] @ w.with_data(d))(D)
    np.testing.assert_allclose(np.asarray(got), [S[0] @ dense(d) for d in D], rtol=1e-5)
    got = jax.vmap(lambda d, s: s @ w.with_data(d))(D, S)
    np.testing.assert_allclose(np.asarray(got), [s @ dense(d) for d, s in zip(D, S)], rtol=1e-5)
    # homogeneous weights batched: one call, scaled
    H = np.array([[0.5], [2.0], [-1.0]], np.float32)
    wh = evjax.CSR((np.float32(1.0), a.indices, a.indptr), shape=a.shape)
    fn = jax.vmap(lambda h, s: s @ wh.with_data(h), in_axes=(0, 1))
    pattern = (a.toarray() != 0).astype(np.float32)
    np.testing.assert_allclose(np.asarray(fn(H, S.T)), [h[0] * (s @ pattern) for h, s in zip(H, S)],
                               rtol=1e-5)
    assert not primitives_of(jax.make_jaxpr(fn)(H, S.T).jaxpr) & {"while", "scan"}
    # nested: outer over weights, inner over spikes (in_axes=1)
    SS = rng.random((7, 4)) < 0.5
    got = jax.vmap(lambda d: jax.vmap(lambda s: s @ w.with_data(d), in_axes=1)(SS))(D)
    np.testing.assert_allclose(np.asarray(got), [SS.T @ dense(d) for d in D], rtol=1e-5)


def test_jit_grad_vmap_and_hessian_of_float_ops():
    a = small_scipy_csr(9, m=6, n=5)
    w = evjax.CSR.from_scipy(a)
    dense = jnp.asarray(a.toarray())
    rng = np.random.default_rng(3)
    X = jnp.asarray(rng.standard_normal((4, 6)), jnp.float32)
    rows = np.repeat(np.arange(6), np.diff(a.indptr))

    def loss(d):
        return jnp.sum(jax.vmap(lambda x: x @ w.with_data(d))(X) ** 3)

    def loss_dense(dd):
        return jnp.sum((X @ dd) ** 3)

    g = jax.jit(jax.grad(loss))(w.data)
    gd = jax.grad(loss_dense)(dense)
    np.testing.assert_allclose(np.asarray(g), np.asarray(gd)[rows, a.indices], rtol=1e-4)
    h = jax.hessian(loss)(w.data)
    hd = jax.hessian(loss_dense)(dense)[rows, a.indices][:, rows, a.indices]
    np.testing.assert_allclose(np.asarray(h), np.asarray(hd), rtol=1e-4, atol=1e-4)
    x0 = X[0]
    hv = jax.hessian(lambda x: jnp.sum((w @ (x[:5] ** 2)) ** 2) + jnp.sum((x @ w) ** 3))(x0)
    hvd = jax.hessian(lambda x: jnp.sum((dense @ (x[:5] ** 2)) ** 2) + jnp.sum((x @ dense) ** 3))(x0)
    np.testing.assert_allclose(np.asarray(hv), np.asarray(hvd), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------
# docs
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("page", ["docs/sparse_events.md", "docs/csr_backend_contract.md"])
def test_docs_code_blocks_run(page):
    from .doc_runner import run_markdown

    run_markdown(page)

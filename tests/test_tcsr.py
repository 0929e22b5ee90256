"""``evjax.TCSR``, brainevent's row-sorted CSR with a CSR transposed view.

Every product goes through the property harness (eager, jit, jvp, vjp, grad,
vmap over weights, events and structures) against a dense jax.numpy
reference, on both views and with both backward algorithms; the storage of
the views is checked against SciPy's, the methods against NumPy.
"""
from __future__ import annotations

import operator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

import evjax
from evjax.testing import OpSpec, check_all, csr_resampler
from tests.helpers import dense_matrix, equations, events_01, pp_prop_product, seeded_csr

SHAPE = (6, 5)


def tcsr(data, indices, indptr, shape=SHAPE, **kwargs):
    return evjax.TCSR.from_sorted_csr(evjax.CSR((data, indices, indptr), shape=shape), **kwargs)


def view_of(W, transposed: bool):
    return W.T if transposed else W


def dense_view(data, indices, indptr, transposed: bool):
    a = dense_matrix(data, indices, indptr, SHAPE)
    return a.T if transposed else a


# ---------------------------------------------------------------------------
# products through the harness
# ---------------------------------------------------------------------------
OPERANDS = ("float", "bool", "spikes_bptt", "spikes_pp_prop", "weighted")


def _operand(kind, rng, n, batch):
    shape = (n,) if batch is None else (batch, n)
    if kind == "bool":
        return rng.random(shape) < 0.5
    x = rng.uniform(0.5, 1.5, shape).astype(np.float32)
    return np.where(rng.random(shape) < 0.5, x, 0).astype(np.float32) if kind != "float" else x


def _wrap(kind, x):
    if kind == "float":
        return x
    if kind == "weighted":
        return evjax.WeightedArray(x)
    return evjax.BinaryArray(x)


def _dense_product(kind, a, x, left):
    if kind == "spikes_pp_prop":
        return pp_prop_product(a, x, left)
    if kind == "weighted":
        xv = x
    elif kind == "float":
        xv = x
    else:
        xv = events_01(x).astype(a.dtype)
    return a @ xv if left else xv @ a


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("kind,left,rank", [(k, False, 1) for k in OPERANDS] + [
    ("float", True, 2), ("spikes_pp_prop", True, 2), ("spikes_pp_prop", False, 2), ("bool", True, 1)])
def test_products_through_harness(transposed, kind, left, rank):
    data, indices, indptr = seeded_csr(1, SHAPE, sort=True)
    view_shape = SHAPE[::-1] if transposed else SHAPE
    n = view_shape[1] if left else view_shape[0]
    x = _operand(kind, np.random.default_rng(2), n, None if rank == 1 else 3)
    if left and rank == 2:
        x = x.T  # W @ X: X of shape (n, batch)
    algorithm = "pp_prop" if kind == "spikes_pp_prop" else "bptt"

    def fn(d, i, p, x):
        W = view_of(tcsr(d, i, p, backward_algorithm=algorithm), transposed)
        return W @ _wrap(kind, x) if left else _wrap(kind, x) @ W

    def reference(d, i, p, x):
        return _dense_product(kind, dense_view(d, i, p, transposed), x, left)

    float_x = kind != "bool"
    spec = OpSpec(fn=fn, reference=reference, diff_argnums=(0, 3) if float_x else (0,),
                  smooth=kind in ("float", "weighted"), name=f"TCSR[{kind}, {'W.T' if transposed else 'W'}]",
                  resample=csr_resampler(indices=1, indptr=2, shape=SHAPE))
    check_all(spec, (data, indices, indptr, x))


def test_pp_prop_weight_gradient_is_the_event_values_and_bptt_the_true_one():
    data, indices, indptr = seeded_csr(3, SHAPE, sort=True)
    a = np.asarray(dense_matrix(data, indices, indptr, SHAPE))
    s = np.array([0.0, 2.0, 0.0, 0.5, 1.5, 0.0], np.float32)
    cot = np.linspace(1, 2, SHAPE[1]).astype(np.float32)
    rows = np.repeat(np.arange(SHAPE[0]), np.diff(indptr))
    for algorithm, scale in (("bptt", (s != 0).astype(np.float32)), ("pp_prop", s)):
        W = tcsr(data, indices, indptr, backward_algorithm=algorithm)
        y, vjp = jax.vjp(lambda d: evjax.BinaryArray(s) @ W.with_data(d), W.data)
        np.testing.assert_allclose(y, (s != 0).astype(np.float32) @ a, rtol=1e-6)  # the forward counts 1 per event
        np.testing.assert_allclose(vjp(cot)[0], scale[rows] * cot[indices], rtol=1e-6, err_msg=algorithm)
        assert W.backward_algorithm == algorithm == W.T.backward_algorithm


def test_silent_events_contribute_nothing_whatever_their_weights_hold():
    data, indices, indptr = seeded_csr(4, SHAPE, sort=True)
    s = np.array([0.0, 2.0, 0.0, 0.5, 1.5, 0.0], np.float32)
    rows = np.repeat(np.arange(SHAPE[0]), np.diff(indptr))
    data = np.where(s[rows] == 0, np.nan, data).astype(np.float32)  # NaN on every silent row's synapses
    for algorithm in ("bptt", "pp_prop"):
        W = tcsr(data, indices, indptr, backward_algorithm=algorithm)
        y, g = jax.value_and_grad(lambda d: jnp.sum(evjax.BinaryArray(s) @ W.with_data(d)))(W.data)
        assert np.isfinite(y) and np.all(np.isfinite(g)), algorithm
        assert np.all(np.asarray(g)[s[rows] == 0] == 0), algorithm


# ---------------------------------------------------------------------------
# storage: the views, the mirror, the factories
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("traced", [False, True])
def test_transposed_view_stores_the_transposes_csr_as_scipy(traced):
    data, indices, indptr = seeded_csr(5, SHAPE)  # duplicates and empty rows included
    W = tcsr(data, indices, indptr)
    ref = sp.csr_matrix((data, indices, indptr), shape=SHAPE).T.tocsr()  # a stable conversion, duplicates kept
    parts = jax.jit(lambda W: (W.T.data, W.T.indices, W.T.indptr)) if traced else (
        lambda W: (W.T.data, W.T.indices, W.T.indptr))
    got = parts(W)
    for g, r in zip(got, (ref.data, ref.indices, ref.indptr)):
        np.testing.assert_array_equal(np.asarray(g), r)
    assert W.T.shape == SHAPE[::-1] and W.T.T.shape == SHAPE and isinstance(W.T, evjax.TCSR)
    np.testing.assert_array_equal(np.asarray(W.T.T.data), data)
    np.testing.assert_allclose(W.T.todense(), np.asarray(dense_matrix(data, indices, indptr, SHAPE)).T)
    c = W.tocsc()
    assert isinstance(c, evjax.CSC) and c.shape == SHAPE
    np.testing.assert_allclose(c.todense(), W.todense())
    assert isinstance(W.T.tocsr(), evjax.CSR) and isinstance(W.T.tocsc(), evjax.CSC)
    np.testing.assert_allclose(W.T.tocsr().todense(), W.T.todense())
    np.testing.assert_allclose(W.T.tocsc().todense(), W.T.todense())
    assert W.tocsr().shape == SHAPE


def test_mirror_is_computed_once_and_carried_by_the_pytree():
    data, indices, indptr = seeded_csr(6, SHAPE, sort=True)
    W = tcsr(data, indices, indptr)
    assert not W.has_tcsc_mirror
    assert W.materialize_tcsc_mirror() is W and W.has_tcsc_mirror
    assert W.T.has_tcsc_mirror and W.with_data(W.data * 2).has_tcsc_mirror
    leaves = jax.tree_util.tree_leaves(W)
    assert len(leaves) == 6  # data, indices, indptr and the mirror's three arrays
    carried = jax.jit(lambda W: W.T.indices)(W)
    np.testing.assert_array_equal(np.asarray(carried), np.asarray(W.T.indices))
    fresh = tcsr(data, indices, indptr)
    kept = jax.jit(lambda W: W.materialize_tcsc_mirror())(fresh)  # a traced structure: a new object carries it
    assert kept.has_tcsc_mirror
    np.testing.assert_array_equal(np.asarray(kept.T.indices), np.asarray(W.T.indices))


def test_fromcsr_sorts_each_row_and_keeps_its_pairs():
    rng = np.random.default_rng(7)
    indptr = np.array([0, 3, 3, 7, 9], np.int32)
    indices = np.array([4, 0, 2, 3, 3, 1, 0, 2, 1], np.int32)
    data = rng.uniform(0.5, 1.5, 9).astype(np.float32)
    source = evjax.CSR((data, indices, indptr), shape=(4, 5))
    for make in (evjax.TCSR.fromcsr, jax.jit(evjax.TCSR.fromcsr)):
        W = make(source)
        got_i, got_d = np.asarray(W.indices), np.asarray(W.data)
        for r in range(4):
            lo, hi = indptr[r], indptr[r + 1]
            assert np.all(np.diff(got_i[lo:hi]) >= 0)
            want = sorted(zip(indices[lo:hi], data[lo:hi]), key=lambda p: p[0])  # stable: duplicates in order
            assert list(zip(got_i[lo:hi], got_d[lo:hi])) == want
        np.testing.assert_allclose(W.todense(), source.todense(), rtol=1e-6)
    kept = evjax.TCSR.from_sorted_csr(source)
    np.testing.assert_array_equal(np.asarray(kept.indices), indices)  # trusted: no reordering
    np.testing.assert_allclose(evjax.TCSR.fromcsc(source.tocsc()).todense(), source.todense(), rtol=1e-6)
    dense = np.asarray(source.todense())
    W = evjax.TCSR.fromdense(dense, binary_backend="reference", backward_algorithm="pp_prop")
    assert W.nse == np.count_nonzero(dense) and W.binary_backend == "reference" and W.backend is None
    np.testing.assert_array_equal(np.asarray(W.todense()), dense)
    with pytest.raises(ValueError, match="nse"):
        evjax.TCSR.fromdense(dense, nse=3)
    hom = evjax.TCSR.fromcsr(evjax.CSR((np.float32(2.0), indices, indptr), shape=(4, 5)))
    assert hom.homogeneous and hom.data.shape == (1,) and hom.T.data.shape == (1,)


def test_constructor_errors_name_the_argument():
    data, indices, indptr = seeded_csr(8, SHAPE, sort=True)
    csr = evjax.CSR((data, indices, indptr), shape=SHAPE)
    with pytest.raises(TypeError, match="source must be an evjax.CSR"):
        evjax.TCSR(csr.T)
    with pytest.raises(TypeError, match="source must be an evjax.CSR"):
        evjax.TCSR((data, indices, indptr))
    with pytest.raises(ValueError, match="backward_algorithm must be 'bptt'"):
        evjax.TCSR(csr, backward_algorithm="bpt")
    with pytest.raises(TypeError, match="binary_backend must be a backend's name"):
        evjax.TCSR(csr, binary_backend=1)
    with pytest.raises(TypeError, match="fromcsc: source must be an evjax.CSC"):
        evjax.TCSR.fromcsc(csr)
    with pytest.raises(evjax.UnsupportedOperationError, match="sparse @ sparse"):
        evjax.TCSR(csr) @ evjax.TCSR(csr)
    with pytest.raises(TypeError, match="todense"):
        np.asarray(evjax.TCSR(csr))
    for W in (evjax.TCSR(csr), evjax.TCSR(csr).T):  # the methods it shares with CSR name TCSR
        with pytest.raises(TypeError, match=r"^TCSR.__getitem__: rows must be given by ints"):
            W["a"]
        with pytest.raises(IndexError, match=r"^TCSR.__getitem__: only rows can be selected"):
            W[0, 1]
        with pytest.raises(ValueError, match=r"^TCSR.sum: axis must be None, 0, 1"):
            W.sum(axis=5)
        with pytest.raises(ValueError, match=r"^TCSR.solve: the matrix must be square"):
            W.solve(jnp.ones(W.shape[0], jnp.float32))
        with pytest.raises(ValueError, match=r"^TCSR.update_on_pre: this matrix has one weight shared"):
            W.with_data(jnp.ones(1, jnp.float32)).update_on_pre(jnp.ones(W.shape[0]), jnp.ones(W.shape[1]))
        with pytest.raises(IndexError, match=r"^TCSR.slice_rows: row 9 is out of range"):
            W.slice_rows(9)
    other = evjax.TCSR(evjax.CSR.fromdense(np.ones(SHAPE, np.float32)))  # another structure
    with pytest.raises(TypeError, match=r"^TCSR \*: two sparse matrices must share one structure"):
        evjax.TCSR(csr) * other
    # the conversions the user gets back keep their own names
    with pytest.raises(ValueError, match=r"^CSR.sum: axis"):
        evjax.TCSR(csr).tocsr().sum(axis=5)
    with pytest.raises(ValueError, match=r"^CSC.sum: axis"):
        evjax.TCSR(csr).T.tocsc().sum(axis=5)


def test_backends_reach_the_ops_and_a_new_structure_does_not_retrace():
    data, indices, indptr = seeded_csr(9, SHAPE, sort=True)
    W = tcsr(data, indices, indptr, backend="reference", binary_backend="numba")
    s, x = np.arange(SHAPE[0]) % 2 == 0, np.linspace(-1, 1, SHAPE[1]).astype(np.float32)
    for fn, want in ((lambda W: evjax.BinaryArray(s) @ W, "numba"), (lambda W: W @ x, "reference"),
                     (lambda W: x @ W.T, "reference"), (lambda W: evjax.BinaryArray(s) @ W.T.T, "numba")):
        bound = [e.params["backend"].per_call for e in equations(jax.make_jaxpr(fn)(W))
                 if e.primitive.name.startswith("evjax_")]
        assert bound and set(bound) == {want}, bound
    traces = []

    @jax.jit
    def step(W):
        traces.append(1)
        return evjax.BinaryArray(s) @ W.T.T, W.T.data

    other = seeded_csr(10, SHAPE, sort=True)
    for d, i, p in ((data, indices, indptr), other):
        if i.shape != indices.shape:
            continue
        y, t_data = step(tcsr(d, i, p, backend="reference", binary_backend="numba"))
        np.testing.assert_allclose(y, s.astype(np.float32) @ np.asarray(dense_matrix(d, i, p, SHAPE)), rtol=1e-6)
    same_nnz = (data[::-1].copy(), np.roll(indices, 1), indptr)  # another structure of the same shapes
    step(tcsr(*same_nnz, backend="reference", binary_backend="numba"))
    assert len(traces) == 1


# ---------------------------------------------------------------------------
# weights, arithmetic, rows, per-synapse products, plasticity, solve
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("transposed", [False, True])
def test_with_data_takes_values_in_the_views_order(transposed):
    data, indices, indptr = seeded_csr(11, SHAPE)
    V = view_of(tcsr(data, indices, indptr), transposed)
    values = np.arange(1, V.nse + 1, dtype=np.float32)
    new = V.with_data(values)
    np.testing.assert_array_equal(np.asarray(new.data), values)
    ref = sp.csr_matrix((values, np.asarray(V.indices), np.asarray(V.indptr)), shape=V.shape).toarray()
    np.testing.assert_allclose(new.todense(), ref)
    g = jax.grad(lambda v: jnp.sum(V.with_data(v).todense() * jnp.asarray(ref)))(values)
    np.testing.assert_allclose(g, ref[np.repeat(np.arange(V.shape[0]), np.diff(np.asarray(V.indptr))),
                                       np.asarray(V.indices)], rtol=1e-6)
    with pytest.raises(ValueError, match=r"data must have shape \(1,\) or \(nnz,\)"):
        V.with_data(np.ones(V.nse + 1, np.float32))
    assert V.with_data(np.float32(3.0)).homogeneous


@pytest.mark.parametrize("transposed", [False, True])
def test_arithmetic_reductions_and_rows_match_numpy(transposed):
    data, indices, indptr = seeded_csr(12, SHAPE)
    V = view_of(tcsr(data, indices, indptr), transposed)
    a = np.asarray(V.todense())
    pattern = np.asarray(V.with_data(np.ones(V.nse, np.float32)).todense()) != 0
    other = np.random.default_rng(0).uniform(1, 2, V.shape).astype(np.float32)
    np.testing.assert_allclose((V * 2.0).todense(), 2 * a, rtol=1e-6)
    np.testing.assert_allclose((2.0 * V).todense(), 2 * a, rtol=1e-6)
    np.testing.assert_allclose((V / 2.0).todense(), a / 2, rtol=1e-6)
    np.testing.assert_allclose((-V).todense(), -a)
    np.testing.assert_allclose(abs(-V).todense(), a)
    np.testing.assert_allclose(V.apply(jnp.square).data, np.asarray(V.data) ** 2, rtol=1e-6)
    single = V.with_data(np.ones(V.nse, np.float32))  # no duplicate sums: entrywise products are exact
    np.testing.assert_allclose((single * other).todense(), np.where(pattern, other, 0) * np.asarray(
        single.todense()), rtol=1e-6)
    np.testing.assert_allclose((V * V).data, np.asarray(V.data) ** 2, rtol=1e-6)
    np.testing.assert_allclose(V.apply2(V, operator.mul).data, np.asarray(V.data) ** 2, rtol=1e-6)
    np.testing.assert_allclose(V + other, a + other, rtol=1e-6)
    np.testing.assert_allclose(other - V, other - a, rtol=1e-6)
    np.testing.assert_allclose(V.apply2(1.0, operator.add), a + 1, rtol=1e-6)
    with pytest.raises(TypeError, match="same orientation"):
        V * V.T.T.T
    np.testing.assert_allclose(V.sum(), a.sum(), rtol=1e-5)
    for axis in (0, 1):
        np.testing.assert_allclose(V.sum(axis), a.sum(axis), rtol=1e-5)
    np.testing.assert_allclose(V[1], a[1], rtol=1e-6)
    np.testing.assert_allclose(V[[0, 2, 2]], a[[0, 2, 2]], rtol=1e-6)
    np.testing.assert_allclose(jax.jit(lambda V, r: V[r])(V, 3), a[3], rtol=1e-6)
    rows = V.slice_rows([2, 0])
    assert isinstance(rows, evjax.TCSR) and rows.shape == (2, V.shape[1]) and not rows._transposed
    np.testing.assert_allclose(rows.todense(), a[[2, 0]], rtol=1e-6)
    coo = V.tocoo()
    np.testing.assert_allclose(jnp.zeros(V.shape).at[coo.indices[:, 0], coo.indices[:, 1]].add(coo.data), a,
                               rtol=1e-6)


@pytest.mark.parametrize("transposed", [False, True])
def test_dt2t_gives_each_entry_its_rows_or_columns_value_in_the_views_order(transposed):
    data, indices, indptr = seeded_csr(13, SHAPE)
    V = view_of(tcsr(data, indices, indptr), transposed)
    rows = np.repeat(np.arange(V.shape[0]), np.diff(np.asarray(V.indptr)))
    cols = np.asarray(V.indices)
    w = np.asarray(V.data)
    y_rows = np.linspace(-1, 1, V.shape[0]).astype(np.float32)
    y_cols = np.linspace(2, 3, V.shape[1]).astype(np.float32)
    np.testing.assert_allclose(V.dt2t(y_rows, w), w * y_rows[rows], rtol=1e-6)
    np.testing.assert_allclose(V.dt2t_transposed(y_cols, w), w * y_cols[cols], rtol=1e-6)


@pytest.mark.parametrize("transposed", [False, True])
def test_plasticity_updates_the_views_rows_and_columns(transposed):
    data, indices, indptr = seeded_csr(14, SHAPE, sort=True)
    V = view_of(tcsr(data, indices, indptr), transposed)
    single = V.with_data(np.asarray(V.data))  # (the view's order round-trips)
    pattern = np.asarray(V.with_data(np.ones(V.nse, np.float32)).todense())
    unique = np.all(pattern <= 1)
    a = np.asarray(single.todense())
    m, n = V.shape
    pre_spike, post_trace = np.arange(m) % 2 == 0, np.linspace(0.1, 0.5, n).astype(np.float32)
    got = np.asarray(V.update_on_pre(pre_spike, post_trace).todense())
    want = a + np.where(pre_spike[:, None], pattern * post_trace[None, :], 0)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    pre_trace, post_spike = np.linspace(0.2, 0.4, m).astype(np.float32), np.arange(n) % 3 == 0
    got = np.asarray(V.update_on_post(pre_trace, post_spike, w_max=1.2).todense())
    if unique:  # clipping is per synapse; with duplicates the dense sums are compared without it
        want = np.where(pattern * post_spike[None, :] > 0, np.minimum(a + pre_trace[:, None], 1.2), a)
        np.testing.assert_allclose(got, want, rtol=1e-5)
    assert isinstance(V.update_on_pre(pre_spike, post_trace), evjax.TCSR)


def test_solve_and_units():
    import brainunit as u

    dense = (np.eye(4) * 3 + np.diag(np.ones(3), 1)).astype(np.float32)
    W = evjax.TCSR.fromdense(dense)
    b = np.arange(1, 5, dtype=np.float32)
    np.testing.assert_allclose(W.solve(b), np.linalg.solve(dense, b), rtol=1e-5)
    np.testing.assert_allclose(W.T.solve(b), np.linalg.solve(dense.T, b), rtol=1e-5)
    Wq = evjax.TCSR.fromdense(dense * u.mS)
    y = evjax.BinaryArray(np.array([True, False, True, False])) @ Wq.T
    assert u.get_unit(y) == u.mS
    np.testing.assert_allclose(u.get_mantissa(y), np.array([1, 0, 1, 0], np.float32) @ dense.T, rtol=1e-6)

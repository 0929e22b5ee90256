"""FixedPostNumConn / FixedPreNumConn: construction, @ in every orientation, edge cases, malformed tables.

Every result is compared with a dense NumPy matrix built from the table
(A[i, j] = sum_{l: indices[i, l] = j} w[i, l]; FixedPreNumConn is its
transpose), or with scipy / brainevent where those are the point.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import evjax
from evjax.primitives.fixed import fcn_sddmm
from evjax.primitives.fixed import ops as fixed_ops
from tests.helpers import primitive_names

BACKENDS = ("numba", "warp", "reference")


def dense_table(weights, indices, n_cols):
    """NumPy A (n_rows, n_cols) of a table; out-of-range targets dropped."""
    indices = np.asarray(indices)
    n, k = indices.shape
    w = np.broadcast_to(np.asarray(weights, np.float64).reshape(-1) if np.ndim(weights) <= 1 else
                        np.asarray(weights, np.float64), (n, k))
    a = np.zeros((n, n_cols))
    for i in range(n):
        for l in range(k):
            if 0 <= indices[i, l] < n_cols:
                a[i, indices[i, l]] += w[i, l]
    return a


def table(rng, n, n_cols, k, homogeneous=False):
    indices = rng.integers(0, n_cols, (n, k)).astype(np.int32)
    weights = np.float32(0.75) if homogeneous else rng.standard_normal((n, k)).astype(np.float32)
    return weights, indices


# ---------------------------------------------------------------------------
# the two classes: @ on both sides, vectors, matrices, events, weighted events
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [evjax.FixedPostNumConn, evjax.FixedPreNumConn])
@pytest.mark.parametrize("homogeneous", [False, True])
def test_matmul_both_sides_against_dense(cls, homogeneous):
    rng = np.random.default_rng(0)
    n_pre, n_post, k = 6, 5, 3
    rows, cols = (n_pre, n_post) if cls is evjax.FixedPostNumConn else (n_post, n_pre)
    weights, indices = table(rng, rows, cols, k, homogeneous)
    W = cls((weights, indices), shape=(n_pre, n_post))
    a = dense_table(weights, indices, cols)
    a = a if cls is evjax.FixedPostNumConn else a.T  # (n_pre, n_post)
    np.testing.assert_allclose(W.todense(), a, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(W.tocsr().todense(), a, rtol=1e-6, atol=1e-6)
    assert isinstance(W.tocsr(), evjax.CSR) and W.tocsr().shape == (n_pre, n_post)
    np.testing.assert_allclose(W.T.todense(), a.T, rtol=1e-6, atol=1e-6)
    pre, post = rng.standard_normal(n_pre).astype(np.float32), rng.standard_normal(n_post).astype(np.float32)
    spikes_pre, spikes_post = rng.random(n_pre) < 0.5, rng.random(n_post) < 0.5
    batch_pre, batch_post = rng.random((4, n_pre)) < 0.5, rng.random((n_post, 4)) < 0.5
    graded = (rng.random(n_pre) < 0.5) * rng.uniform(0.5, 2, n_pre).astype(np.float32)
    cases = [
        (W @ post, a @ post), (pre @ W, pre @ a), (W @ post[:, None], a @ post[:, None]),
        (pre[None] @ W, pre[None] @ a),
        (spikes_pre @ W, spikes_pre @ a), (W @ spikes_post, a @ spikes_post),
        (evjax.BinaryArray(batch_pre) @ W, batch_pre @ a), (W @ evjax.BinaryArray(batch_post), a @ batch_post),
        (evjax.WeightedArray(graded) @ W, graded @ a), (W.T @ evjax.WeightedArray(graded), a.T @ graded),
        (W.T @ spikes_pre, a.T @ spikes_pre),
    ]
    for got, want in cases:
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_transpose_matches_brainevent():
    """The meaning of ``transpose`` and of both classes' shapes is brainevent's."""
    be = pytest.importorskip("brainevent")
    import warnings

    rng = np.random.default_rng(1)
    weights, indices = table(rng, 4, 6, 3)
    x6, x4 = rng.standard_normal(6).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    for transpose, x in ((False, x6), (True, x4)):
        np.testing.assert_allclose(evjax.fcnmv(weights, indices, x, shape=(4, 6), transpose=transpose),
                                   be.fcnmv(weights, indices, x, shape=(4, 6), transpose=transpose), rtol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for cls in ("FixedPostNumConn", "FixedPreNumConn", "FixedNumPerPre", "FixedNumPerPost"):
            shape = (4, 6) if cls in ("FixedPostNumConn", "FixedNumPerPre") else (6, 4)
            ours, theirs = getattr(evjax, cls)((weights, indices), shape=shape), \
                getattr(be, cls)((weights, indices), shape=shape)
            np.testing.assert_allclose(ours.todense(), theirs.todense(), rtol=1e-6)


def test_brainevents_newer_class_names_are_the_same_classes():
    assert evjax.FixedNumPerPre is evjax.FixedPostNumConn and evjax.FixedNumPerPost is evjax.FixedPreNumConn
    W = evjax.FixedNumPerPre.random(0, 5, 4, 2)
    assert isinstance(W.T, evjax.FixedNumPerPost)


def test_pytree_rewiring_does_not_retrace():
    rng = np.random.default_rng(2)
    traces = []

    @jax.jit
    def f(W, s):
        traces.append(1)
        return s @ W

    s = rng.random(5) < 0.5
    for seed in range(3):
        weights, indices = table(np.random.default_rng(seed), 5, 7, 2)
        W = evjax.FixedPostNumConn((weights, indices), shape=(5, 7))
        np.testing.assert_allclose(f(W, s), s @ dense_table(weights, indices, 7), rtol=1e-5, atol=1e-6)
    assert len(traces) == 1
    structs = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), W)  # rebuilt unvalidated
    assert structs.shape == W.shape and structs.indices.shape == W.indices.shape
    assert "custom_call" in jax.jit(lambda W, s: s @ W).lower(W, s).as_text()
    W2 = W.with_data(np.float32(2.0))
    assert W2.homogeneous and W2.indices is W.indices
    np.testing.assert_allclose(W2.todense(), dense_table(2.0, indices, 7))


@pytest.mark.parametrize("cls", [evjax.FixedPostNumConn, evjax.FixedPreNumConn])
def test_random_constructor(cls):
    n_pre, n_post, k = 30, 12, 8
    W = cls.random(jax.random.key(3), n_pre, n_post, k, weight=0.5)
    rows, cols = (n_pre, n_post) if cls is evjax.FixedPostNumConn else (n_post, n_pre)
    idx = np.asarray(W.indices)
    assert idx.shape == (rows, k) and W.shape == (n_pre, n_post) and W.homogeneous
    assert idx.min() >= 0 and idx.max() < cols
    assert all(len(set(row)) == k for row in idx)  # replace=False: distinct targets per row
    np.testing.assert_array_equal(np.asarray(cls.random(jax.random.key(3), n_pre, n_post, k).indices), idx)
    dup = cls.random(4, n_pre, n_post, cols, replace=True)
    assert any(len(set(row)) < cols for row in np.asarray(dup.indices))  # duplicates happen with replacement
    full = cls.random(5, n_pre, n_post, cols)  # k = n: every target once
    assert all(sorted(row) == list(range(cols)) for row in np.asarray(full.indices))
    with pytest.raises(ValueError, match="replace=True"):
        cls.random(6, n_pre, n_post, cols + 1)


@pytest.mark.parametrize("cls", [evjax.FixedPostNumConn, evjax.FixedPreNumConn])
def test_random_and_shape_errors_name_the_argument(cls):
    """NumPy's "expected non-negative integer" (key=-3) and "negative dimensions are not allowed"
    (k=-1) named nothing; k=2.5, n_pre=4.5 and shape=(4.7, 5) were truncated by ``int()``."""
    name = cls.__name__
    with pytest.raises(ValueError, match=rf"{name}\.random: key = -3 is negative.*jax\.random\.key\(-3\)"):
        cls.random(-3, 4, 5, 2)
    for key in ("a", 1.5, True, jnp.ones(2, jnp.float32)):
        with pytest.raises(TypeError, match=rf"{name}\.random: key must be a JAX random key or an integer seed"):
            cls.random(key, 4, 5, 2)
    with pytest.raises(ValueError, match=rf"{name}\.random: k must be a non-negative integer, got -1: -1 is negative"):
        cls.random(0, 4, 5, -1)
    with pytest.raises(TypeError, match=rf"{name}\.random: k must be a non-negative integer, got 2\.5: 2\.5 is not"):
        cls.random(0, 4, 5, 2.5)
    with pytest.raises(TypeError, match=rf"{name}\.random: n_pre must be a non-negative integer.*4\.5 is not a whole"):
        cls.random(0, 4.5, 5, 2)
    with pytest.raises(ValueError, match=rf"{name}\.random: n_post must be a non-negative integer.*-5 is negative"):
        cls.random(0, 4, -5, 2)
    with pytest.raises(ValueError, match=rf"{name}\.random: k = 2 targets per row, but there is no neuron"):
        cls.random(0, 4, 0, 2, replace=True) if cls is evjax.FixedPostNumConn else cls.random(0, 0, 4, 2, replace=True)
    # the accepted forms: ints of any kind, whole floats, a raw uint32 key; the same table for the same seed
    W = cls.random(np.int64(7), np.int32(4), 5.0, np.uint8(2))
    assert W.shape == (4, 5) and all(type(d) is int for d in W.shape) and W.num_conn == 2
    np.testing.assert_array_equal(np.asarray(cls.random(7, 4, 5, 2).indices), np.asarray(W.indices))
    raw = jax.random.key_data(jax.random.key(1))
    np.testing.assert_array_equal(np.asarray(cls.random(raw, 4, 5, 2).indices),
                                  np.asarray(cls.random(jax.random.key(1), 4, 5, 2).indices))
    table = np.zeros((4, 1), np.int32) if cls is evjax.FixedPostNumConn else np.zeros((5, 1), np.int32)
    with pytest.raises(TypeError, match=rf"{name}: shape must be a pair \(n_pre, n_post\).*4\.7 is not a whole"):
        cls((0.5, table), shape=(4.7, 5))
    with pytest.raises(TypeError, match=rf"{name}: shape must be a pair \(n_pre, n_post\).*got str 'ab'"):
        cls((0.5, table), shape="ab")


# ---------------------------------------------------------------------------
# edge cases on every backend: k = 0, k = n, duplicates, one row, no events
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_edge_cases(backend):
    rng = np.random.default_rng(4)
    cases = [
        (np.zeros((3, 0), np.int32), 4),                              # k = 0
        (np.tile(np.arange(4, dtype=np.int32), (3, 1)), 4),           # k = n: dense rows
        (np.array([[1, 1, 1], [0, 2, 0]], np.int32), 3),              # duplicate targets
        (np.array([[2, 0]], np.int32), 3),                            # one row
    ]
    for indices, n_cols in cases:
        n, k = indices.shape
        weights = rng.standard_normal((n, k)).astype(np.float32)
        a = dense_table(weights, indices, n_cols)
        kw = dict(shape=(n, n_cols), backend=backend)
        for spikes in (np.zeros(n, bool), np.ones(n, bool), rng.random(n) < 0.5):  # no events, all, some
            np.testing.assert_allclose(evjax.binary_fcnmv(weights, indices, spikes, transpose=True, **kw),
                                       spikes @ a, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(evjax.binary_fcnmm(weights, indices, spikes[:, None], transpose=True, **kw),
                                       (spikes @ a)[:, None], rtol=1e-5, atol=1e-6)
        x = rng.standard_normal(n_cols).astype(np.float32)
        np.testing.assert_allclose(evjax.fcnmv(weights, indices, x, **kw), a @ x, rtol=1e-5, atol=1e-6)
        g = jax.grad(lambda w: jnp.sum(evjax.binary_fcnmv(w, indices, np.ones(n, bool), transpose=True, **kw)))
        counts = (indices >= 0).astype(np.float32)
        np.testing.assert_allclose(g(weights), counts)


@pytest.mark.parametrize("backend", ("numba", "warp"))
def test_duplicates_sum_on_parallel_paths(backend):
    """Many duplicate targets and enough work for the parallel (per-thread copies) paths."""
    rng = np.random.default_rng(5)
    n, n_cols, k = 3000, 50, 120
    indices = rng.integers(0, n_cols, (n, k)).astype(np.int32)  # ~2.4 hits per target per row
    weights = rng.standard_normal((n, k)).astype(np.float32)
    a = dense_table(weights, indices, n_cols)
    spikes = rng.random(n) < 0.9
    batch = rng.random((n, 6)) < 0.5
    kw = dict(shape=(n, n_cols), backend=backend)
    np.testing.assert_allclose(evjax.binary_fcnmv(weights, indices, spikes, transpose=True, **kw), spikes @ a,
                               rtol=1e-4, atol=2e-3)
    np.testing.assert_allclose(evjax.binary_fcnmm(weights, indices, batch, transpose=True, **kw), a.T @ batch,
                               rtol=1e-4, atol=2e-3)
    x = rng.standard_normal(n_cols).astype(np.float32)
    np.testing.assert_allclose(evjax.fcnmv(weights, indices, x, **kw), a @ x, rtol=1e-4, atol=2e-3)


# ---------------------------------------------------------------------------
# gradients: weights (event-driven), indices (float0 zero), values of weighted events
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_weight_gradient_and_index_gradient(backend):
    rng = np.random.default_rng(6)
    n, n_cols, k = 7, 5, 3
    weights, indices = table(rng, n, n_cols, k)
    spikes = rng.random(n) < 0.4
    ct = rng.standard_normal(n_cols).astype(np.float32)

    def loss(w, idx):
        return jnp.vdot(ct, evjax.binary_fcnmv(w, idx, spikes, shape=(n, n_cols), transpose=True, backend=backend))

    g_w, g_idx = jax.grad(loss, argnums=(0, 1), allow_int=True)(weights, indices)
    # w_bar[i, l] = ct[indices[i, l]] on active rows, 0 on silent ones
    np.testing.assert_allclose(g_w, np.where(spikes[:, None], ct[indices], 0), rtol=1e-6)
    assert g_idx.dtype == jax.dtypes.float0 and g_idx.shape == indices.shape
    # the sddmm itself, with float operands (gather orientation, matrices)
    r, q = rng.standard_normal((n, 2)).astype(np.float32), rng.standard_normal((n_cols, 2)).astype(np.float32)
    np.testing.assert_allclose(fcn_sddmm(indices, r, q, shape=(n, n_cols), backend=backend),
                               np.einsum("ic,ilc->il", r, q[indices]), rtol=1e-5, atol=1e-6)


def test_weighted_events_select_and_have_true_gradient():
    rng = np.random.default_rng(7)
    n, n_cols, k = 6, 4, 3
    weights, indices = table(rng, n, n_cols, k)
    weights[0, 0] = np.nan  # row 0 is silent below: its NaN weight must stay out
    weights[1, 1] = np.inf
    values = np.array([0.0, -2.0, 0.5, 0.0, 1.5, 3.0], np.float32)
    got = evjax.binary_fcnmv(weights, indices, values, shape=(n, n_cols), transpose=True, weighted=True)
    terms = np.where(values[:, None] != 0, weights * values[:, None], 0)
    want = np.zeros(n_cols)
    np.add.at(want, indices, terms)
    assert np.isnan(want).any() or np.isinf(want).any()  # the case tests something
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-5)  # NaN and inf at the same places
    finite = np.where(np.isfinite(weights), weights, 1.0).astype(np.float32)
    ct = rng.standard_normal(n_cols).astype(np.float32)
    g = jax.grad(lambda v: jnp.vdot(ct, evjax.binary_fcnmv(finite, indices, v, shape=(n, n_cols), transpose=True,
                                                            weighted=True)))(values)
    np.testing.assert_allclose(g, dense_table(finite, indices, n_cols) @ ct, rtol=1e-5)  # true: zeros too


# ---------------------------------------------------------------------------
# malformed tables: concrete -> ValueError; traced -> skipped, never out of bounds
# ---------------------------------------------------------------------------
def test_concrete_malformed_input_raises():
    w = np.ones((2, 2), np.float32)
    with pytest.raises(ValueError, match=r"indices out of range: indices\[1, 0\] = 3"):
        evjax.fcnmv(w, np.array([[0, 1], [3, 0]]), np.ones(3, np.float32), shape=(2, 3))
    with pytest.raises(ValueError, match="out of range"):
        evjax.FixedPostNumConn((w, np.array([[0, -1], [1, 0]])), shape=(2, 3))
    with pytest.raises(ValueError, match=r"must be a scalar or \(1,\)"):
        evjax.fcnmv(np.ones((2, 3), np.float32), np.zeros((2, 2), np.int32), np.ones(3, np.float32), shape=(2, 3))
    with pytest.raises(ValueError, match=r"\(n_rows, k\)"):
        evjax.fcnmv(w, np.zeros((3, 2), np.int32), np.ones(3, np.float32), shape=(2, 3))
    with pytest.raises(TypeError, match="integer"):
        evjax.fcnmv(w, np.zeros((2, 2), np.float32), np.ones(3, np.float32), shape=(2, 3))
    with pytest.raises(ValueError, match="not aligned"):
        np.ones(4, np.float32) @ evjax.FixedPostNumConn((w, np.zeros((2, 2), np.int32)), shape=(2, 3))


@pytest.mark.parametrize("backend", BACKENDS)
def test_traced_out_of_range_indices_are_skipped(backend):
    rng = np.random.default_rng(8)
    n, n_cols = 5, 4
    indices = np.array([[0, 4, 1], [-1, 2, 2], [3, 100, -7], [1, 1, 0], [2, 3, 4]], np.int32)
    weights = rng.standard_normal((n, 3)).astype(np.float32)
    a = dense_table(weights, indices, n_cols)  # drops the out-of-range synapses
    spikes, x = rng.random(n) < 0.7, rng.standard_normal(n_cols).astype(np.float32)
    kw = dict(shape=(n, n_cols), backend=backend)
    scatter = jax.jit(lambda i: evjax.binary_fcnmv(weights, i, spikes, transpose=True, **kw))
    gather = jax.jit(lambda i: evjax.fcnmm(weights, i, x[:, None], **kw))
    np.testing.assert_allclose(scatter(indices), spikes @ a, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gather(indices)[:, 0], a @ x, rtol=1e-5, atol=1e-6)
    grad = jax.jit(jax.grad(lambda w, i: jnp.sum(evjax.binary_fcnmv(w, i, spikes, transpose=True, **kw))))
    valid = (indices >= 0) & (indices < n_cols)
    np.testing.assert_allclose(grad(weights, indices), spikes[:, None] & valid)


@pytest.mark.parametrize("backend", BACKENDS)
def test_traced_out_of_range_indices_are_skipped_in_every_path(backend):
    """The paths the test above leaves out: binary gather, float scatter, weighted events, and vmap
    over bad tables (each batch element its own)."""
    rng = np.random.default_rng(18)
    n, n_cols = 5, 4
    indices = np.array([[0, 4, 1], [-1, 2, 2], [3, 100, -7], [1, 1, 0], [2, 3, 4]], np.int32)
    weights = rng.standard_normal((n, 3)).astype(np.float32)
    a = dense_table(weights, indices, n_cols)
    spikes = rng.random(n) < 0.7
    x_rows, x_cols = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n_cols).astype(np.float32)
    values = (rng.integers(0, 3, n) * spikes).astype(np.float32)
    kw = dict(shape=(n, n_cols), backend=backend)
    binary_gather = jax.jit(lambda i: evjax.binary_fcnmv(weights, i, x_cols > 0, **kw))
    float_scatter = jax.jit(lambda i: evjax.fcnmv(weights, i, x_rows, transpose=True, **kw))
    weighted = jax.jit(lambda i: evjax.binary_fcnmv(weights, i, values, transpose=True, weighted=True, **kw))
    np.testing.assert_allclose(binary_gather(indices), a @ (x_cols > 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float_scatter(indices), x_rows @ a, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(weighted(indices), values @ a, rtol=1e-5, atol=1e-6)
    tables = np.stack([indices, np.roll(indices, 1, axis=0), np.where(indices > 1, -indices, indices)])
    batched = jax.jit(jax.vmap(lambda i: evjax.binary_fcnmv(weights, i, spikes, transpose=True, **kw)))
    want = np.stack([spikes @ dense_table(weights, t, n_cols) for t in tables])
    np.testing.assert_allclose(batched(tables), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["fcnmv", "fcnmm", "weighted"])
@pytest.mark.parametrize("transpose", [False, True])
def test_index_gradient_is_float0_or_a_clear_error(op, transpose):
    rng = np.random.default_rng(19)
    n, n_cols, k = 6, 5, 2
    weights, indices = table(rng, n, n_cols, k)
    size = n if transpose else n_cols
    x = rng.standard_normal(size).astype(np.float32)
    kw = dict(shape=(n, n_cols), transpose=transpose)
    if op == "fcnmv":
        fn = lambda idx: jnp.sum(evjax.fcnmv(weights, idx, x, **kw))  # noqa: E731
    elif op == "fcnmm":
        fn = lambda idx: jnp.sum(evjax.fcnmm(weights, idx, x[:, None], **kw))  # noqa: E731
    else:
        fn = lambda idx: jnp.sum(evjax.binary_fcnmv(weights, idx, np.abs(x), weighted=True, **kw))  # noqa: E731
    g = jax.grad(fn, allow_int=True)(indices)
    assert g.dtype == jax.dtypes.float0 and g.shape == indices.shape
    with pytest.raises(TypeError, match="integer"):
        jax.grad(fn)(indices)


@pytest.mark.parametrize("transpose", [True, False])
def test_vmap_over_events_is_one_matrix_kernel(transpose):
    rng = np.random.default_rng(20)
    n, n_cols, k = 6, 5, 2
    weights, indices = table(rng, n, n_cols, k)
    S = rng.random((3, n if transpose else n_cols)) < 0.5
    fn = jax.vmap(lambda s: evjax.binary_fcnmv(weights, indices, s, shape=(n, n_cols), transpose=transpose))
    names = [e.primitive.name for e in jax.make_jaxpr(fn)(S).eqns if e.primitive.name.startswith("evjax_")]
    assert names == ["evjax_binary_csrmm"]  # CSR's matrix op on the flat table
    a = dense_table(weights, indices, n_cols)
    np.testing.assert_allclose(fn(S), S @ a if transpose else S @ a.T, rtol=1e-5, atol=1e-6)


def test_docs_page_runs():
    from tests.doc_runner import run_markdown

    run_markdown("docs/fixed_fan.md")


@pytest.mark.parametrize("backend", ("numba", "warp"))
def test_float64_int64_and_float16(backend):
    rng = np.random.default_rng(10)
    n, n_cols, k = 9, 6, 4
    indices = rng.integers(0, n_cols, (n, k))
    spikes = rng.random(n) < 0.5
    with jax.enable_x64(True):
        weights = rng.standard_normal((n, k))
        y = evjax.binary_fcnmv(weights, indices.astype(np.int64), spikes, shape=(n, n_cols), transpose=True,
                               backend=backend)
        assert y.dtype == np.float64
        np.testing.assert_allclose(y, spikes @ dense_table(weights, indices, n_cols), rtol=1e-12)
    half = jnp.asarray(rng.uniform(0.5, 1.5, (n, k)), jnp.float16)
    y = evjax.binary_fcnmv(half, indices, spikes, shape=(n, n_cols), transpose=True, backend=backend)
    assert y.dtype == jnp.float16
    np.testing.assert_allclose(np.asarray(y, np.float32), spikes @ dense_table(np.asarray(half, np.float32),
                                                                                indices, n_cols), rtol=2e-3)


def test_a_table_is_checked_once():
    from evjax.primitives.fixed import validation as fixed_validation

    W = evjax.FixedPostNumConn.random(11, 50, 40, 5)
    assert fixed_validation._checked.get(id(W.indices)) == 40  # checked when built
    s = np.ones(50, bool)
    np.testing.assert_allclose(s @ W, np.ones(50) @ np.asarray(W.todense()), rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_vmap_over_tables_weights_and_events(backend):
    """Each batch element its own table, weights and events (per-synapse and homogeneous
    weights, a non-finite shared weight among them), forward and weight gradient."""
    rng = np.random.default_rng(12)
    tables = rng.integers(0, 4, (3, 5, 2)).astype(np.int32)
    tables[1, 0] = [1, 1]  # duplicates
    weights = rng.standard_normal((3, 5, 2)).astype(np.float32)
    spikes = rng.random((3, 5)) < 0.5
    spikes[2] = False
    f = jax.jit(jax.vmap(lambda w, i, s: evjax.binary_fcnmv(w, i, s, shape=(5, 4), transpose=True,
                                                            backend=backend)))
    want = np.stack([spikes[b] @ dense_table(weights[b], tables[b], 4) for b in range(3)])
    np.testing.assert_allclose(f(weights, tables, spikes), want, rtol=1e-5, atol=1e-6)
    shared = np.array([0.5, -2.0, np.nan], np.float32)  # element 2 is silent: nan contributes nothing
    want = np.stack([spikes[b] @ dense_table(shared[b] if b < 2 else 0.0, tables[b], 4) for b in range(3)])
    np.testing.assert_allclose(f(shared, tables, spikes), want, rtol=1e-5, atol=1e-6)
    ct = rng.standard_normal((3, 4)).astype(np.float32)
    g = jax.jit(jax.vmap(jax.grad(lambda w, i, s, c: jnp.vdot(c, evjax.binary_fcnmv(
        w, i, s, shape=(5, 4), transpose=True, backend=backend)))))(weights, tables, spikes, ct)
    np.testing.assert_allclose(g, np.where(spikes[:, :, None], np.take_along_axis(
        ct[:, None, :], tables.reshape(3, 1, 10), axis=2).reshape(3, 5, 2), 0), rtol=1e-6)


def test_every_function_binds_csrs_op_on_the_flat_table():
    """The fixed family has no primitive: each function is one CSR op on (indices.ravel(),
    k * arange(n + 1)); a new table of the same shape does not retrace."""
    rng = np.random.default_rng(13)
    n, n_cols, k = 6, 5, 3
    weights, indices = table(rng, n, n_cols, k)
    v, m = rng.standard_normal(n_cols).astype(np.float32), rng.standard_normal((n_cols, 2)).astype(np.float32)
    kw = dict(shape=(n, n_cols))
    calls = {
        "evjax_csrmv": lambda w, i: evjax.fcnmv(w, i, v, **kw),
        "evjax_csrmm": lambda w, i: evjax.fcnmm(w, i, m, **kw),
        "evjax_binary_csrmv": lambda w, i: evjax.binary_fcnmv(w, i, v > 0, **kw),
        "evjax_binary_csrmm": lambda w, i: evjax.binary_fcnmm(w, i, m > 0, **kw),
        "evjax_csr_sddmm": lambda w, i: fcn_sddmm(i, np.ones(n, np.float32), v, **kw),
    }
    for name, fn in calls.items():
        jaxpr = jax.make_jaxpr(fn)(weights, indices).jaxpr
        ops = [e for e in jaxpr.eqns if e.primitive.name.startswith("evjax_")]
        assert [e.primitive.name for e in ops] == [name], jaxpr
        flat_indices, indptr = ops[0].invars[1 if name != "evjax_csr_sddmm" else 0:][:2]
        assert flat_indices.aval.shape == (n * k,) and indptr.aval.shape == (n + 1,)
        assert indptr.aval.dtype == np.int32
    from evjax.primitives import csr, fixed

    assert (fixed.fcnmv_p, fixed.binary_fcnmv_p, fixed.fcn_sddmm_p) == (csr.csrmv_p, csr.binary_csrmv_p,
                                                                         csr.csr_sddmm_p)
    traces = []

    @jax.jit
    def f(w, i):
        traces.append(1)
        return evjax.fcnmv(w, i, v, **kw)

    for seed in range(3):
        w, i = table(np.random.default_rng(seed), n, n_cols, k)
        np.testing.assert_allclose(f(w, i), dense_table(w, i, n_cols) @ v, rtol=1e-5, atol=1e-6)
    assert len(traces) == 1


def test_pointer_dtype_follows_the_indices():
    """int64 tables (64-bit mode) get int64 row pointers, as a CSR built from the same arrays."""
    rng = np.random.default_rng(14)
    n, n_cols, k = 5, 4, 2
    indices = rng.integers(0, n_cols, (n, k))
    x = rng.standard_normal(n_cols)
    with jax.enable_x64(True):
        flat, indptr = fixed_ops.csr_structure(jnp.asarray(indices, jnp.int64))
        assert flat.dtype == indptr.dtype == jnp.int64
        np.testing.assert_array_equal(indptr, np.arange(n + 1) * k)
        y = evjax.fcnmv(rng.standard_normal((n, k)), indices.astype(np.int64), x, shape=(n, n_cols))
        assert y.dtype == np.float64
    flat, indptr = fixed_ops.csr_structure(jnp.asarray(indices, jnp.int32))
    assert flat.dtype == indptr.dtype == jnp.int32


def _bound_backends(fn):
    """The ``backend`` parameter (a BackendChoice) of every evjax op ``fn()`` binds, sub-jaxprs included."""
    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name.startswith("evjax_"):
                found.append(eqn.params["backend"])
            for value in eqn.params.values():
                inner = getattr(value, "jaxpr", None)
                if hasattr(inner, "eqns"):
                    walk(inner)

    walk(jax.make_jaxpr(fn)().jaxpr)
    return found


def test_backend_choice_travels_to_the_csr_op_eager_and_traced():
    """backend= and evjax.use_backend reach the CSR op the function binds, whether its arrays are
    concrete (one jitted program, whose cache knows the choice in force) or traced."""
    rng = np.random.default_rng(15)
    weights, indices = table(rng, 6, 5, 3)
    x = rng.standard_normal(5).astype(np.float32)
    kw = dict(shape=(6, 5))
    concrete = lambda **more: evjax.fcnmv(weights, indices, x, **kw, **more)  # noqa: E731
    traced = lambda w: evjax.fcnmv(w, indices, x, **kw)  # noqa: E731
    assert [c.per_call for c in _bound_backends(lambda: concrete(backend="reference"))] == ["reference"]
    assert [c.in_force for c in _bound_backends(concrete)] == [()]
    with evjax.use_backend("reference"):
        (eager,) = _bound_backends(concrete)
        (inside,) = _bound_backends(lambda: jax.jit(traced)(weights))
        np.testing.assert_allclose(concrete(), dense_table(weights, indices, 5) @ x, rtol=1e-5, atol=1e-6)
    assert ("cpu", "reference") in eager.in_force and ("cpu", "reference") in inside.in_force
    assert [c.in_force for c in _bound_backends(concrete)] == [()]  # after the block: the default again


@pytest.mark.parametrize("transpose", [True, False])
def test_vmap_over_tables_grad_binds_csr_sddmm_once(transpose):
    """vmap over tables (and weights, events) of the weight gradient: CSR's batching rules put the
    batch into one block-diagonal structure, one csr_sddmm and one matmul, no loop."""
    rng = np.random.default_rng(14)
    size, n, n_cols, k = 3, 5, 4, 2
    tables = rng.integers(0, n_cols, (size, n, k)).astype(np.int32)
    weights = rng.standard_normal((size, n, k)).astype(np.float32)
    spikes = rng.random((size, n if transpose else n_cols)) < 0.5
    ct = rng.standard_normal((size, n_cols if transpose else n)).astype(np.float32)
    grad = jax.vmap(jax.grad(lambda w, i, s, c: jnp.vdot(c, evjax.binary_fcnmv(
        w, i, s, shape=(n, n_cols), transpose=transpose))))
    names = primitive_names(jax.make_jaxpr(grad)(weights, tables, spikes, ct).jaxpr)
    assert names.count("evjax_csr_sddmm") == 1, names
    assert not {"scan", "while"} & set(names), names
    g = jax.jit(grad)(weights, tables, spikes, ct)
    rows = np.arange(n)[:, None]
    for b in range(size):
        want = (np.where(spikes[b][rows], ct[b][tables[b]], 0) if transpose
                else np.where(spikes[b][tables[b]], ct[b][rows], 0))
        np.testing.assert_allclose(g[b], want, rtol=1e-6)


@pytest.mark.parametrize("cls", [evjax.FixedPostNumConn, evjax.FixedPreNumConn])
def test_brainevents_everyday_methods_match_the_dense_matrix(cls):
    rng = np.random.default_rng(61)
    n, n_targets, k = 5, 6, 3
    table = np.stack([rng.choice(n_targets, k, replace=False) for _ in range(n)]).astype(np.int32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    shape = (n, n_targets) if cls is evjax.FixedPostNumConn else (n_targets, n)
    C = cls((w, table), shape=shape, backend="reference")
    dense = np.asarray(C.todense())
    assert (C.num_pre, C.num_post) == shape
    for conversion in (C.tocsc(), C.tocsr(), C.tocoo()):
        np.testing.assert_allclose(np.asarray(conversion.todense()), dense, rtol=1e-6)
    assert type(C.tocsc()) is evjax.CSC
    for axis in (None, 0, 1):
        np.testing.assert_allclose(np.asarray(C.sum(axis)), dense.sum(axis), rtol=1e-5, atol=1e-6)
    same_table = C.with_data(np.abs(w))
    for got, want in [(2 * C, 2 * dense), (C / 4, dense / 4), (-C, -dense), (C.apply(jnp.exp), None),
                      (C * same_table, None), (C.transpose((1, 0)), dense.T)]:
        assert isinstance(got, evjax.FixedNumConn) and got.backend == "reference"
        if want is not None:
            np.testing.assert_allclose(np.asarray(got.todense()), want, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(C.apply(jnp.exp).data), np.exp(w), rtol=1e-6)
    np.testing.assert_allclose(np.asarray((C * same_table).data), w * np.abs(w), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(C + 1.0), dense + 1.0, rtol=1e-6)  # + and -: the dense array
    np.testing.assert_allclose(np.asarray(np.ones(shape, np.float32) - C), 1.0 - dense, rtol=1e-6)
    with pytest.raises(ValueError, match="a scalar or a table of the same structure"):
        C * np.ones(shape, np.float32)
    with pytest.raises(TypeError, match="share one structure"):
        C * cls((w, table.copy()), shape=shape)
    with pytest.raises(ValueError, match="broadcast to"):
        C + np.ones((2, 2), np.float32)
    with pytest.raises(ValueError, match="axes must be None"):
        C.transpose((0, 1))
    # differentiable in the weights, under jit
    grad = jax.jit(jax.grad(lambda d: jnp.sum((2 * C.with_data(d)).sum(0) ** 2)))(C.data)
    want = jax.grad(lambda d: jnp.sum((2 * cls((d, table), shape=shape).todense()).sum(0) ** 2))(C.data)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(want), rtol=1e-5)


def test_rows_of_a_table_as_brainevent_selects_them():
    rng = np.random.default_rng(62)
    n_pre, n_post, k = 6, 7, 3
    table = np.stack([rng.choice(n_post, k, replace=False) for _ in range(n_pre)]).astype(np.int32)
    w = rng.standard_normal((n_pre, k)).astype(np.float32)
    C = evjax.FixedPostNumConn((w, table), shape=(n_pre, n_post), backend="reference")
    dense = np.asarray(C.todense())
    mask = np.arange(n_pre) % 2 == 0
    for index, want in [(2, dense[2:3]), ([4, 0, 4], dense[[4, 0, 4]]), (slice(1, 5), dense[1:5]), (mask, dense[mask]),
                        (-1, dense[-1:])]:
        got = C.slice_rows(index)
        assert type(got) is evjax.FixedPostNumConn and got.backend == "reference" and got.shape == want.shape
        np.testing.assert_allclose(np.asarray(got.todense()), want, rtol=1e-6)
    homogeneous = evjax.FixedPostNumConn((0.5, table), shape=(n_pre, n_post)).slice_rows([1, 3])
    np.testing.assert_allclose(np.asarray(homogeneous.todense()), 0.5 * (dense[[1, 3]] != 0), rtol=1e-6)
    # the table traced, the rows concrete: a gather under jit
    got = jax.jit(lambda C: C.slice_rows([3, 1]).todense())(C)
    np.testing.assert_allclose(np.asarray(got), dense[[3, 1]], rtol=1e-6)
    with pytest.raises(IndexError, match="row 6 is out of range for 6 rows"):
        C.slice_rows([6])
    fan_in = C.T  # a FixedPreNumConn of shape (n_post, n_pre)
    for M, full in ((C, dense), (fan_in, dense.T)):
        np.testing.assert_allclose(np.asarray(M[1]), full[1], rtol=1e-6)
        np.testing.assert_allclose(np.asarray(M[[2, 0]]), full[[2, 0]], rtol=1e-6)
    with pytest.raises(evjax.UnsupportedOperationError, match=r"W.tocsr\(\).slice_rows"):
        fan_in.slice_rows([0])

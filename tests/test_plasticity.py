"""update_csr_on_binary_pre / _post on every backend against tests/helpers.py's oracle, under every transform."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import strategies as st

import evjax
from evjax.testing import OpSpec, check_all, property_test, random_csr
from tests.helpers import (
    apply_rule_reference,
    csc_pre_update_reference,
    dense_update_reference,
    line_update_reference,
    line_update_resampler,
)

BACKENDS = ("numba", "warp", "reference")


def csc_view(indices, indptr, shape):
    """``(csc_indices, csc_indptr, weight_indices)`` of a CSR structure (scipy, stable within a column)."""
    nnz = len(indices)
    order = sp.csr_matrix((np.arange(1, nnz + 1), indices, indptr), shape=shape).tocsc()
    order.sort_indices()
    weight_indices = (order.data - 1).astype(indices.dtype)
    return order.indices.astype(indices.dtype), order.indptr.astype(indices.dtype), weight_indices


# ---------------------------------------------------------------------------
# specs: argument order (weight, structure..., trace/spikes, w_min, w_max, shape)
# ---------------------------------------------------------------------------
def pre_spec(backend, *, nonfinite=False):
    def fn(weight, indices, indptr, spikes, trace, w_min, w_max, shape):
        return evjax.update_csr_on_binary_pre(weight, indices, indptr, spikes, trace, w_min, w_max, shape=shape,
                                              backend=backend)

    def reference(weight, indices, indptr, spikes, trace, w_min, w_max, shape):
        return line_update_reference(weight, indices, indptr, None, trace, spikes, w_min, w_max)

    return OpSpec(fn, reference, diff_argnums=(0, 4, 5, 6), static_argnums=(7,), backend=backend, smooth=False,
                  nonfinite=nonfinite, nonfinite_argnums=(0, 4), name=f"update_csr_on_binary_pre[{backend}]",
                  resample=line_update_resampler(indices=1, indptr=2, positions=None, shape=7, other_axis=1))


def post_spec(backend, *, nonfinite=False):
    def fn(weight, indices, indptr, weight_indices, trace, spikes, w_min, w_max, shape):
        return evjax.update_csr_on_binary_post(weight, indices, indptr, weight_indices, trace, spikes, w_min, w_max,
                                               shape=shape, backend=backend)

    def reference(weight, indices, indptr, weight_indices, trace, spikes, w_min, w_max, shape):
        return line_update_reference(weight, indices, indptr, weight_indices, trace, spikes, w_min, w_max)

    return OpSpec(fn, reference, diff_argnums=(0, 4, 6, 7), static_argnums=(8,), backend=backend, smooth=False,
                  nonfinite=nonfinite, nonfinite_argnums=(0, 4), name=f"update_csr_on_binary_post[{backend}]",
                  resample=line_update_resampler(indices=1, indptr=2, positions=3, shape=8, other_axis=0))


def _example(rng, n_pre, n_post, nnz, dtype=np.float32, spike_dtype=np.bool_):
    indices, indptr = random_csr(rng, n_pre, n_post, nnz)
    nnz = len(indices)
    weight = rng.uniform(-1, 1, nnz).astype(dtype)
    spikes = (rng.random(n_pre) < 0.5).astype(spike_dtype)
    post_spikes = (rng.random(n_post) < 0.5).astype(spike_dtype)
    pre_trace, post_trace = (rng.uniform(-0.6, 0.6, n).astype(dtype) for n in (n_pre, n_post))
    return indices, indptr, weight, spikes, post_spikes, pre_trace, post_trace


# A few shapes, edges included, and a few synapse counts: every example reuses the programs (and XLA
# compiles) of the examples of its shape; the values, spikes, structure and bounds vary freely.
SHAPES = st.sampled_from([(0, 3), (4, 0), (1, 1), (5, 4), (7, 6)])
NNZ_COUNTS = st.sampled_from([0, 7, 13])


@st.composite
def pre_args(draw):
    n_pre, n_post = draw(SHAPES)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    indices, indptr, weight, spikes, _, _, post_trace = _example(rng, n_pre, n_post, draw(NNZ_COUNTS))
    bounds = draw(st.sampled_from([(-0.5, 0.5), (-2.0, 2.0), (0.0, 0.3)]))
    return (weight, indices, indptr, spikes, post_trace, np.float32(bounds[0]), np.float32(bounds[1]), (n_pre, n_post))


@st.composite
def post_args(draw):
    n_pre, n_post = draw(SHAPES)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    indices, indptr, weight, _, post_spikes, pre_trace, _ = _example(rng, n_pre, n_post, draw(NNZ_COUNTS))
    c_indices, c_indptr, weight_indices = csc_view(indices, indptr, (n_pre, n_post))
    bounds = draw(st.sampled_from([(-0.5, 0.5), (-2.0, 2.0), (0.0, 0.3)]))
    return (weight, c_indices, c_indptr, weight_indices, pre_trace, post_spikes, np.float32(bounds[0]),
            np.float32(bounds[1]), (n_pre, n_post))


test_pre_properties = property_test(pre_spec, pre_args(), backends=BACKENDS, skip=("check_grads",))
test_post_properties = property_test(post_spec, post_args(), backends=BACKENDS, skip=("check_grads",))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("side", ["pre", "post"])
def test_nonfinite_weights_and_traces_follow_ieee_and_inactive_lines_keep_theirs(backend, side):
    rng = np.random.default_rng(5)
    indices, indptr, weight, spikes, post_spikes, pre_trace, post_trace = _example(rng, 6, 5, 12)
    if side == "pre":
        args = (weight, indices, indptr, spikes, post_trace, np.float32(-0.5), np.float32(0.5), (6, 5))
        spec = pre_spec(backend, nonfinite=True)
    else:
        args = (weight, *csc_view(indices, indptr, (6, 5)), pre_trace, post_spikes, np.float32(-0.5),
                np.float32(0.5), (6, 5))
        spec = post_spec(backend, nonfinite=True)
    check_all(spec, args, skip=("check_grads", "vmap", "nested_vmap", "jit_grad_vmap"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_inactive_row_keeps_its_weights_bit_for_bit(backend):
    weight = np.array([np.nan, 0.25, -np.inf, 3.0], np.float32)
    indices, indptr = np.array([0, 1, 0, 1], np.int32), np.array([0, 2, 4], np.int32)
    trace = np.array([np.nan, np.inf], np.float32)  # would poison any synapse it touched
    out = evjax.update_csr_on_binary_pre(weight, indices, indptr, np.array([False, True]), trace, 0.0, 1.0,
                                         shape=(2, 2), backend=backend)
    np.testing.assert_array_equal(np.asarray(out)[:2].view(np.uint32), weight[:2].view(np.uint32))
    np.testing.assert_array_equal(np.asarray(out)[2:], [np.nan, 1.0])  # -inf + nan; 3 + inf clipped to 1
    grad = jax.grad(lambda t: evjax.update_csr_on_binary_pre(weight, indices, indptr, np.array([False, True]), t,
                                                             shape=(2, 2), backend=backend)[3])(trace)
    np.testing.assert_array_equal(np.asarray(grad), [0.0, 1.0])


@pytest.mark.parametrize("backend", ["numba", "warp"])
@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_float16_and_float64_weights_match_the_reference(backend, dtype):
    rng = np.random.default_rng(7)
    indices, indptr, weight, spikes, post_spikes, pre_trace, post_trace = _example(rng, 9, 8, 30, dtype=dtype)
    with jax.enable_x64(dtype == np.float64):
        calls = [lambda be: evjax.update_csr_on_binary_pre(weight, indices, indptr, spikes, post_trace, -0.4, 0.4,
                                                           shape=(9, 8), backend=be),
                 lambda be: evjax.update_csr_on_binary_post(weight, *csc_view(indices, indptr, (9, 8)), pre_trace,
                                                            post_spikes, None, 0.7, shape=(9, 8), backend=be)]
        for call in calls:
            got, want = call(backend), call("reference")
            assert got.dtype == want.dtype == dtype
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_new_bounds_structure_and_spikes_do_not_retrace():
    traces = []

    @jax.jit
    def step(weight, indices, indptr, spikes, trace, lo, hi):
        traces.append(1)
        return evjax.update_csr_on_binary_pre(weight, indices, indptr, spikes, trace, lo, hi, shape=(6, 5))

    rng = np.random.default_rng(0)
    for _ in range(3):
        indices, indptr, weight, spikes, _, _, post_trace = _example(rng, 6, 5, 10)
        step(weight, indices, indptr, spikes, post_trace, rng.uniform(-1, 0), rng.uniform(0, 1))
    assert len(traces) == 1


def test_the_post_update_agrees_with_the_pre_update_on_the_transposed_problem():
    """A synapse (i, j) moves by pre_trace[i] when j fires: the same as update_csr_on_binary_pre on the
    transposed connection, whose rows are the postsynaptic neurons."""
    rng = np.random.default_rng(11)
    indices, indptr, weight, _, post_spikes, pre_trace, _ = _example(rng, 8, 6, 25)
    c_indices, c_indptr, weight_indices = csc_view(indices, indptr, (8, 6))
    post = evjax.update_csr_on_binary_post(weight, c_indices, c_indptr, weight_indices, pre_trace, post_spikes,
                                           -0.3, 0.3, shape=(8, 6))
    transposed = evjax.update_csr_on_binary_pre(weight[weight_indices], c_indices, c_indptr, post_spikes, pre_trace,
                                                -0.3, 0.3, shape=(6, 8))
    np.testing.assert_array_equal(np.asarray(post)[weight_indices], np.asarray(transposed))


@pytest.mark.parametrize("bad, match", [
    (dict(weight=np.ones((2, 2), np.float32)), "weight must be the 1-d float array"),
    (dict(weight=np.ones(3, np.int32)), "weight must be the 1-d float array"),
    (dict(indptr=np.array([0, 2, 2], np.int32)), "indptr must rise from 0 to nnz"),
    (dict(indices=np.array([0.0, 1.0, 0.0])), "indices must be a 1-d integer array"),
    (dict(pre_spike=np.ones(3, bool)), "pre_spike must be a vector of 2 entries"),
    (dict(post_trace=np.ones(2, np.int32)), "post_trace must be float"),
    (dict(w_min=np.ones(2)), "w_min must be a real scalar or None"),
])
def test_bad_arguments_are_named(bad, match):
    args = dict(weight=np.ones(3, np.float32), indices=np.array([0, 1, 0], np.int32),
                indptr=np.array([0, 2, 3], np.int32), pre_spike=np.ones(2, bool), post_trace=np.ones(2, np.float32))
    args.update(bad)
    with pytest.raises((TypeError, ValueError), match=match):
        evjax.update_csr_on_binary_pre(**args, shape=(2, 2))


def test_the_docs_page_runs_and_its_stdp_step_is_the_dense_rule():
    from tests.doc_runner import run_markdown

    ns = run_markdown("docs/plasticity.md")
    W, dense = ns["W"], ns["dense"].astype(np.float32)
    pre, post = np.asarray(ns["pre_spike"]), np.asarray(ns["post_spike"])
    mask = dense != 0
    want = dense.copy()
    want[pre] = np.where(mask[pre], np.clip(dense[pre] - 0.01, 0.0, 1.0), 0.0)  # ones(n_post) trace
    want[:, post] = np.where(mask[:, post], np.clip(want[:, post] + 0.01, 0.0, 1.0), 0.0)
    got = evjax.CSR((ns["w"], W.indices, W.indptr), shape=W.shape).todense()
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-7)
    # the rule-generic block: soft-bounded potentiation on the rows that fired
    rows = np.repeat(np.arange(W.shape[0]), np.diff(np.asarray(W.indptr)))
    fired = pre[rows]
    data = np.asarray(W.data)
    np.testing.assert_allclose(np.asarray(ns["state"]["w"]), np.where(fired, data + 0.1 * (1.0 - data), data),
                               rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(ns["state"]["elig"]), fired.astype(np.float32))
    # the delay block: the layout gives the plain op's ring; the scan's inputs are the delivered weights
    first = evjax.csr_delay_deliver(jnp.zeros((ns["L"], ns["n_post"])), ns["spikes"][0], ns["syn_w"], ns["indices"],
                                    ns["indptr"], ns["delays"], 0, shape=(ns["n_pre"], ns["n_post"]))
    np.testing.assert_array_equal(np.asarray(ns["ring2"]), np.asarray(first))
    # the dt2t block: eps = x_pre at each synapse's column
    np.testing.assert_array_equal(np.asarray(ns["eps"]), np.asarray(ns["x_pre"])[np.asarray(W.indices)])


# ---------------------------------------------------------------------------
# the same update on other storage: CSC columns, fixed-width tables
# ---------------------------------------------------------------------------
def _dense_rule(dense_w, mask, spikes, trace, axis, lo, hi):
    """NumPy: each synapse of an active row (axis 0) or column (axis 1) moves by the trace of its other end."""
    active = spikes[:, None] if axis == 0 else spikes[None, :]
    other = trace[None, :] if axis == 0 else trace[:, None]
    moved = np.clip(dense_w + other, -np.inf if lo is None else lo, np.inf if hi is None else hi)
    return np.where(mask & active, moved, dense_w)


@pytest.mark.parametrize("backend", BACKENDS)
def test_csc_post_update_is_the_dense_rule(backend):
    rng = np.random.default_rng(21)
    n_pre, n_post = 9, 7
    m = sp.random(n_pre, n_post, density=0.4, format="csc", random_state=3, dtype=np.float32)
    m.sort_indices()
    spikes, trace = rng.random(n_post) < 0.5, rng.uniform(-0.5, 0.5, n_pre).astype(np.float32)
    f = jax.jit(lambda w, s, t: evjax.update_csc_on_binary_post(w, m.indices, m.indptr, t, s, -0.2, 0.6,
                                                                 shape=(n_pre, n_post), backend=backend))
    got = sp.csc_matrix((np.asarray(f(m.data, spikes, trace)), m.indices, m.indptr), shape=m.shape).toarray()
    want = _dense_rule(m.toarray(), m.toarray() != 0, spikes, trace, 1, -0.2, 0.6)
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("side", ["fixed_post_pre", "fixed_pre_post"])
def test_fixed_table_updates_are_the_dense_rule_and_differentiate(backend, side):
    rng = np.random.default_rng(22)
    n_pre, n_post, k = 8, 6, 3
    rows = n_pre if side == "fixed_post_pre" else n_post
    others = n_post if side == "fixed_post_pre" else n_pre
    indices = np.stack([rng.choice(others, k, replace=False) for _ in range(rows)]).astype(np.int32)
    data = rng.uniform(0, 1, (rows, k)).astype(np.float32)
    spikes, trace = rng.random(rows) < 0.5, rng.uniform(-0.4, 0.4, others).astype(np.float32)
    if side == "fixed_post_pre":
        call = lambda d, t: evjax.update_fixed_post_conn_on_binary_pre(  # noqa: E731
            d, indices, spikes, t, 0.0, 1.0, shape=(n_pre, n_post), backend=backend)
    else:
        call = lambda d, t: evjax.update_fixed_pre_conn_on_binary_post(  # noqa: E731
            d, indices, t, spikes, 0.0, 1.0, shape=(n_pre, n_post), backend=backend)
    got = np.asarray(jax.jit(call)(data, trace))
    assert got.shape == (rows, k)
    dense, mask = np.zeros((rows, others), np.float32), np.zeros((rows, others), bool)
    dense[np.arange(rows)[:, None], indices], mask[np.arange(rows)[:, None], indices] = data, True
    want = _dense_rule(dense, mask, spikes, trace, 0, 0.0, 1.0)[np.arange(rows)[:, None], indices]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # the weight gradient: 1 off the active rows and inside the bounds, 0 where clipped
    g = np.asarray(jax.grad(lambda d: call(d, trace).sum())(data))
    raw = data + trace[indices]
    expected = np.where(spikes[:, None], ((raw > 0) & (raw < 1)).astype(np.float32), 1.0)
    np.testing.assert_array_equal(g, expected)
    # vmap over spikes-free arguments: a batch of tables
    batch = np.stack([data, data[::-1].copy()])
    np.testing.assert_allclose(np.asarray(jax.vmap(call, in_axes=(0, None))(batch, trace))[1],
                               np.asarray(call(batch[1], trace)), rtol=1e-6)


def test_fixed_table_errors_are_named():
    with pytest.raises(TypeError, match="data must be the \\(n, k\\) float table"):
        evjax.update_fixed_post_conn_on_binary_pre(np.ones(3, np.float32), np.zeros(3, np.int32), np.ones(3, bool),
                                                   np.ones(2, np.float32), shape=(3, 2))
    with pytest.raises(ValueError, match="indices must be an integer table of data's shape"):
        evjax.update_fixed_post_conn_on_binary_pre(np.ones((3, 2), np.float32), np.zeros((3, 1), np.int32),
                                                   np.ones(3, bool), np.ones(2, np.float32), shape=(3, 2))
    with pytest.raises(TypeError, match="update_fixed_post_conn_on_binary_pre: w_min must be a real scalar"):
        evjax.update_fixed_post_conn_on_binary_pre(np.ones((3, 2), np.float32), np.zeros((3, 2), np.int32),
                                                   np.ones(3, bool), np.ones(2, np.float32), np.ones(2), shape=(3, 2))
    with pytest.raises(ValueError, match="the table has 3 rows, but shape says 4"):
        evjax.update_fixed_post_conn_on_binary_pre(np.ones((3, 2), np.float32), np.zeros((3, 2), np.int32),
                                                   np.ones(4, bool), np.ones(2, np.float32), shape=(4, 2))


# ---------------------------------------------------------------------------
# dense weight matrices
# ---------------------------------------------------------------------------
def dense_spec(backend, axis, *, nonfinite=False):
    if axis == 0:
        def fn(weight, spikes, trace, w_min, w_max):
            return evjax.update_dense_on_binary_pre(weight, spikes, trace, w_min, w_max, backend=backend)

        def reference(weight, spikes, trace, w_min, w_max):
            return dense_update_reference(weight, spikes, trace, w_min, w_max, 0)
    else:
        def fn(weight, trace, spikes, w_min, w_max):
            return evjax.update_dense_on_binary_post(weight, trace, spikes, w_min, w_max, backend=backend)

        def reference(weight, trace, spikes, w_min, w_max):
            return dense_update_reference(weight, spikes, trace, w_min, w_max, 1)
    trace_at = 2 if axis == 0 else 1
    return OpSpec(fn, reference, diff_argnums=(0, trace_at, 3, 4), backend=backend, smooth=False, nonfinite=nonfinite,
                  nonfinite_argnums=(0, trace_at), name=f"update_dense_on_binary_{'pre' if axis == 0 else 'post'}"
                  f"[{backend}]")


@st.composite
def dense_args(draw, axis):
    n_pre, n_post = draw(SHAPES)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    weight = rng.uniform(-1, 1, (n_pre, n_post)).astype(np.float32)
    lines, others = (n_pre, n_post) if axis == 0 else (n_post, n_pre)
    spikes, trace = rng.random(lines) < 0.5, rng.uniform(-0.6, 0.6, others).astype(np.float32)
    lo, hi = draw(st.sampled_from([(-0.5, 0.5), (-2.0, 2.0), (0.0, 0.3)]))
    if axis == 0:
        return weight, spikes, trace, np.float32(lo), np.float32(hi)
    return weight, trace, spikes, np.float32(lo), np.float32(hi)


test_dense_pre_properties = property_test(lambda be: dense_spec(be, 0), dense_args(0), backends=BACKENDS,
                                          skip=("check_grads",))
test_dense_post_properties = property_test(lambda be: dense_spec(be, 1), dense_args(1), backends=BACKENDS,
                                           skip=("check_grads",))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("axis", [0, 1])
def test_dense_nonfinite_follow_ieee_and_silent_lines_keep_their_weights(backend, axis):
    rng = np.random.default_rng(31)
    weight = rng.uniform(-1, 1, (6, 5)).astype(np.float32)
    lines, others = (6, 5) if axis == 0 else (5, 6)
    spikes, trace = rng.random(lines) < 0.5, rng.uniform(-0.5, 0.5, others).astype(np.float32)
    args = (weight, spikes, trace) if axis == 0 else (weight, trace, spikes)
    check_all(dense_spec(backend, axis, nonfinite=True), (*args, np.float32(-0.4), np.float32(0.4)),
              skip=("check_grads", "vmap", "nested_vmap", "jit_grad_vmap"))


# ---------------------------------------------------------------------------
# update_csc_on_binary_pre: weights in CSC order, presynaptic spikes (through the row view)
# ---------------------------------------------------------------------------
def csc_pre_spec(backend):
    def fn(weight, indices, indptr, spikes, trace, w_min, w_max, shape):
        return evjax.update_csc_on_binary_pre(weight, indices, indptr, spikes, trace, w_min, w_max, shape=shape,
                                              backend=backend)

    def reference(weight, indices, indptr, spikes, trace, w_min, w_max, shape):
        return csc_pre_update_reference(weight, indices, indptr, spikes, trace, w_min, w_max)

    return OpSpec(fn, reference, diff_argnums=(0, 4, 5, 6), static_argnums=(7,), backend=backend, smooth=False,
                  name=f"update_csc_on_binary_pre[{backend}]",
                  resample=line_update_resampler(indices=1, indptr=2, positions=None, shape=7, other_axis=0))


@st.composite
def csc_pre_args(draw):
    n_pre, n_post = draw(SHAPES)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    indices, indptr, weight, spikes, _, _, post_trace = _example(rng, n_pre, n_post, draw(NNZ_COUNTS))
    c_indices, c_indptr, weight_indices = csc_view(indices, indptr, (n_pre, n_post))
    bounds = draw(st.sampled_from([(-0.5, 0.5), (-2.0, 2.0), (0.0, 0.3)]))
    return (weight[weight_indices], c_indices, c_indptr, spikes, post_trace, np.float32(bounds[0]),
            np.float32(bounds[1]), (n_pre, n_post))


test_csc_pre_properties = property_test(csc_pre_spec, csc_pre_args(), backends=BACKENDS, skip=("check_grads",))


@pytest.mark.parametrize("backend", BACKENDS)
def test_csc_pre_update_is_the_dense_rule_with_a_traced_structure_too(backend):
    rng = np.random.default_rng(23)
    n_pre, n_post = 9, 7
    m = sp.random(n_pre, n_post, density=0.4, format="csc", random_state=4, dtype=np.float32)
    m.sort_indices()
    spikes, trace = rng.random(n_pre) < 0.5, rng.uniform(-0.5, 0.5, n_post).astype(np.float32)
    want = _dense_rule(m.toarray(), m.toarray() != 0, spikes, trace, 0, -0.2, 0.6)
    closed = jax.jit(lambda w, s, t: evjax.update_csc_on_binary_pre(w, m.indices, m.indptr, s, t, -0.2, 0.6,
                                                                     shape=(n_pre, n_post), backend=backend))
    traced = jax.jit(lambda w, i, p, s, t: evjax.update_csc_on_binary_pre(w, i, p, s, t, -0.2, 0.6,
                                                                           shape=(n_pre, n_post), backend=backend))
    for got in (closed(m.data, spikes, trace), traced(m.data, m.indices, m.indptr, spikes, trace)):
        got = sp.csc_matrix((np.asarray(got), m.indices, m.indptr), shape=m.shape).toarray()
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_csc_pre_errors_are_named():
    with pytest.raises(ValueError, match="update_csc_on_binary_pre: indptr has 3 entries, expected 5"):
        evjax.update_csc_on_binary_pre(np.ones(2, np.float32), np.zeros(2, np.int32), np.array([0, 1, 2]),
                                       np.ones(3, bool), np.ones(4, np.float32), shape=(3, 4))
    with pytest.raises(ValueError, match="pre_spike must be a vector of 3 entries"):
        evjax.update_csc_on_binary_pre(np.ones(2, np.float32), np.zeros(2, np.int32), np.array([0, 1, 2, 2, 2]),
                                       np.ones(4, bool), np.ones(4, np.float32), shape=(3, 4))


# ---------------------------------------------------------------------------
# csr_apply_on_pre / csr_apply_on_post: a user's rule, under every transform
# ---------------------------------------------------------------------------
def _soft_rule(edge, pre, post, lr):
    # a nonlinear rule of every input: the weight moves by lr * tanh(pre) * post, the trace decays
    return {"w": edge["w"] + lr * jnp.tanh(pre) * post, "elig": 0.9 * edge["elig"] + post * edge["w"]}


def apply_spec(on_pre: bool):
    call = evjax.csr_apply_on_pre if on_pre else evjax.csr_apply_on_post

    def fn(w, elig, indices, indptr, spikes, pre, post, lr, shape):
        return call(_soft_rule, {"w": w, "elig": elig}, indices, indptr, spikes, pre_vals=pre, post_vals=post,
                    params=lr, shape=shape)

    def reference(w, elig, indices, indptr, spikes, pre, post, lr, shape):
        return apply_rule_reference(_soft_rule, {"w": w, "elig": elig}, indices, indptr, spikes, pre, post, lr,
                                    on_pre)

    name = "csr_apply_on_pre" if on_pre else "csr_apply_on_post"
    return OpSpec(fn, reference, diff_argnums=(0, 1, 5, 6, 7), static_argnums=(8,), name=name,
                  resample=line_update_resampler(indices=2, indptr=3, positions=None, shape=8, other_axis=1))


@st.composite
def apply_args(draw, on_pre: bool):
    n_pre, n_post = draw(SHAPES)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    indices, indptr, weight, pre_spikes, post_spikes, pre_trace, post_trace = _example(
        rng, n_pre, n_post, draw(NNZ_COUNTS))
    elig = rng.uniform(-1, 1, weight.shape[0]).astype(np.float32)
    spikes = pre_spikes if on_pre else post_spikes
    return weight, elig, indices, indptr, spikes, pre_trace, post_trace, np.float32(0.3), (n_pre, n_post)


test_apply_on_pre_properties = property_test(lambda be: apply_spec(True), apply_args(True), backends=("reference",))
test_apply_on_post_properties = property_test(lambda be: apply_spec(False), apply_args(False),
                                              backends=("reference",))


@pytest.mark.parametrize("on_pre", [True, False])
def test_apply_matches_a_dense_numpy_rule(on_pre):
    rng = np.random.default_rng(41)
    m = sp.random(8, 6, density=0.5, format="csr", random_state=5, dtype=np.float32)
    m.sort_indices()
    pre, post = rng.uniform(-1, 1, 8).astype(np.float32), rng.uniform(-1, 1, 6).astype(np.float32)
    spikes = rng.random(8 if on_pre else 6) < 0.5
    call = evjax.csr_apply_on_pre if on_pre else evjax.csr_apply_on_post
    got = call(lambda w, a, b, p: w * p + a * b, m.data, m.indices, m.indptr, spikes, pre_vals=pre, post_vals=post,
               params=np.float32(0.5), shape=m.shape)
    dense = m.toarray()
    fired = spikes[:, None] if on_pre else spikes[None, :]
    want = np.where((dense != 0) & fired, dense * 0.5 + pre[:, None] * post[None, :], dense)
    np.testing.assert_allclose(sp.csr_matrix((np.asarray(got), m.indices, m.indptr), shape=m.shape).toarray(),
                               want, rtol=1e-6)


@pytest.mark.parametrize("on_pre", [True, False])
def test_apply_a_silent_synapse_gives_no_gradient_whatever_the_rule_makes_of_it(on_pre):
    # log of a NaN or negative weight on silent synapses: the forward keeps them, and no gradient (of the
    # weights, the neuron values or the shared parameter) sees them; the active ones follow IEEE
    m = sp.random(8, 6, density=0.5, format="csr", random_state=6, dtype=np.float32)
    rng = np.random.default_rng(42)
    spikes = rng.random(8 if on_pre else 6) < 0.5
    rows = np.repeat(np.arange(8), np.diff(m.indptr))
    active = spikes[rows] if on_pre else spikes[m.indices]
    w = np.where(active, m.data + 0.5, np.where(rng.random(m.nnz) < 0.5, np.nan, -1.0)).astype(np.float32)
    post = rng.uniform(0.5, 1, 6).astype(np.float32)
    call = evjax.csr_apply_on_pre if on_pre else evjax.csr_apply_on_post

    def loss(w, post, lr):
        new = call(lambda e, a, b, p: p * jnp.log(e) * b, w, m.indices, m.indptr, spikes, post_vals=post,
                   params=lr, shape=m.shape)
        return jnp.where(active, new, 0.0).sum()

    gw, gpost, glr = jax.grad(loss, argnums=(0, 1, 2))(w, post, np.float32(2.0))
    assert np.all(np.isfinite(gw)) and np.all(np.isfinite(gpost)) and np.isfinite(glr)
    assert np.all(np.asarray(gw)[~active] == 0)
    np.testing.assert_allclose(np.asarray(gw)[active], (2.0 * post[m.indices] / w)[active], rtol=1e-5)
    np.testing.assert_allclose(glr, np.sum((np.log(w) * post[m.indices])[active]), rtol=1e-5)
    out = call(lambda e, a, b, p: p * jnp.log(e) * b, w, m.indices, m.indptr, spikes, post_vals=post, params=2.0,
               shape=m.shape)
    np.testing.assert_array_equal(np.asarray(out)[~active], w[~active])  # bit for bit, NaN included


def test_apply_errors_are_named():
    idx, ptr = np.array([0, 1], np.int32), np.array([0, 1, 2], np.int32)
    w, spikes = np.ones(2, np.float32), np.ones(2, bool)
    with pytest.raises(TypeError, match="rule must return a pytree of edge_state's structure"):
        evjax.csr_apply_on_pre(lambda e, a, b, p: (e, e), w, idx, ptr, spikes, shape=(2, 2))
    with pytest.raises(TypeError, match="rule returned leaf 0 as int32"):
        evjax.csr_apply_on_pre(lambda e, a, b, p: e.astype(jnp.int32), w, idx, ptr, spikes, shape=(2, 2))
    with pytest.raises(ValueError, match="every leaf of post_vals must have leading dimension 2"):
        evjax.csr_apply_on_pre(lambda e, a, b, p: e, w, idx, ptr, spikes, post_vals=np.ones(3), shape=(2, 2))
    with pytest.raises(ValueError, match="post_spike must be a vector of 2 entries"):
        evjax.csr_apply_on_post(lambda e, a, b, p: e, w, idx, ptr, np.ones(3, bool), shape=(2, 2))
    with pytest.raises(TypeError, match="rule must be a function"):
        evjax.csr_apply_on_pre(None, w, idx, ptr, spikes, shape=(2, 2))


# ---------------------------------------------------------------------------
# the sparse classes' update_on_pre / update_on_post / apply_on_* methods
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("jit_matrix", [False, True])
def test_matrix_methods_are_the_dense_rule(jit_matrix):
    rng = np.random.default_rng(51)
    n_pre, n_post = 9, 7
    dense = sp.random(n_pre, n_post, density=0.4, random_state=7, dtype=np.float32).toarray()
    mask = dense != 0
    pre_spikes, post_spikes = rng.random(n_pre) < 0.5, rng.random(n_post) < 0.5
    pre_trace, post_trace = rng.uniform(-0.5, 0.5, n_pre).astype(np.float32), \
        rng.uniform(-0.5, 0.5, n_post).astype(np.float32)
    want_pre = _dense_rule(dense, mask, pre_spikes, post_trace, 0, -0.2, 0.6)
    want_post = _dense_rule(dense, mask, post_spikes, pre_trace, 1, -0.2, 0.6)
    run = jax.jit if jit_matrix else (lambda f: f)  # jitted: the matrix is an argument, its structure traced
    for cls in (evjax.CSR, evjax.CSC):
        m = cls.fromdense(dense)
        got_pre = run(lambda m: m.update_on_pre(pre_spikes, post_trace, -0.2, 0.6))(m)
        got_post = run(lambda m: m.update_on_post(pre_trace, post_spikes, -0.2, 0.6))(m)
        assert type(got_pre) is cls and type(got_post) is cls
        np.testing.assert_allclose(np.asarray(got_pre.todense()), want_pre, rtol=1e-6, err_msg=cls.__name__)
        np.testing.assert_allclose(np.asarray(got_post.todense()), want_post, rtol=1e-6, err_msg=cls.__name__)
    m = evjax.CSR.fromdense(dense)
    new = m.apply_on_pre(lambda w, a, b, p: w + p * b, pre_spikes, post_vals=post_trace, params=np.float32(0.5))
    want = np.where(mask & pre_spikes[:, None], dense + 0.5 * post_trace[None, :], dense)
    np.testing.assert_allclose(np.asarray(m.with_data(new).todense()), want, rtol=1e-6)
    new = m.apply_on_post(lambda w, a, b, p: w * p + a, post_spikes, pre_vals=pre_trace, params=np.float32(2.0))
    want = np.where(mask & post_spikes[None, :], 2.0 * dense + pre_trace[:, None], dense)
    np.testing.assert_allclose(np.asarray(m.with_data(new).todense()), want, rtol=1e-6)


def test_fixed_table_methods_and_homogeneous_errors():
    rng = np.random.default_rng(52)
    n_pre, n_post, k = 8, 6, 3
    out_idx = np.stack([rng.choice(n_post, k, replace=False) for _ in range(n_pre)]).astype(np.int32)
    in_idx = np.stack([rng.choice(n_pre, k, replace=False) for _ in range(n_post)]).astype(np.int32)
    fan_out = evjax.FixedPostNumConn((rng.uniform(0, 1, (n_pre, k)).astype(np.float32), out_idx),
                                     shape=(n_pre, n_post))
    fan_in = evjax.FixedPreNumConn((rng.uniform(0, 1, (n_post, k)).astype(np.float32), in_idx),
                                   shape=(n_pre, n_post))
    pre_spikes, post_spikes = rng.random(n_pre) < 0.5, rng.random(n_post) < 0.5
    pre_trace, post_trace = rng.uniform(-0.4, 0.4, n_pre).astype(np.float32), \
        rng.uniform(-0.4, 0.4, n_post).astype(np.float32)
    got = fan_out.update_on_pre(pre_spikes, post_trace, 0.0, 1.0)
    np.testing.assert_array_equal(np.asarray(got.data), np.asarray(evjax.update_fixed_post_conn_on_binary_pre(
        fan_out.data, out_idx, pre_spikes, post_trace, 0.0, 1.0, shape=(n_pre, n_post))))
    assert not np.array_equal(np.asarray(got.data), np.asarray(fan_out.data))
    got = fan_in.update_on_post(pre_trace, post_spikes, 0.0, 1.0)
    np.testing.assert_array_equal(np.asarray(got.data), np.asarray(evjax.update_fixed_pre_conn_on_binary_post(
        fan_in.data, in_idx, pre_trace, post_spikes, 0.0, 1.0, shape=(n_pre, n_post))))
    with pytest.raises(ValueError, match="FixedPostNumConn.update_on_pre: this table has one weight shared"):
        evjax.FixedPostNumConn((0.5, out_idx), shape=(n_pre, n_post)).update_on_pre(pre_spikes, post_trace)
    with pytest.raises(ValueError, match="CSR.update_on_post: this matrix has one weight shared"):
        evjax.CSR((np.float32(0.5), np.array([0, 1]), np.array([0, 1, 2])), shape=(2, 2)).update_on_post(
            np.ones(2, np.float32), np.ones(2, bool))
    # the functions, given one shared weight: the message says why and how (it said "indices has 2 entries,
    # expected 1" before)
    one, idx, ptr = jnp.ones(1, jnp.float32), np.array([0, 1], np.int32), np.array([0, 1, 2], np.int32)
    calls = {
        "update_csr_on_binary_pre": lambda: evjax.update_csr_on_binary_pre(one, idx, ptr, np.ones(2, bool),
                                                                           np.ones(2, np.float32), shape=(2, 2)),
        "update_csr_on_binary_post": lambda: evjax.update_csr_on_binary_post(one, idx, ptr, idx, np.ones(2, np.float32),
                                                                             np.ones(2, bool), shape=(2, 2)),
        "update_csc_on_binary_pre": lambda: evjax.update_csc_on_binary_pre(one, idx, ptr, np.ones(2, bool),
                                                                           np.ones(2, np.float32), shape=(2, 2)),
    }
    for who, call in calls.items():
        with pytest.raises(ValueError, match=rf"{who}: weight has one value shared by all 2 synapses.*per-synapse.*"
                                             rf"jnp.full\(2, w\)"):
            call()


def test_build_weight_indices_caches_the_other_view_through_jit():
    rng = np.random.default_rng(53)
    dense = sp.random(9, 7, density=0.4, random_state=8, dtype=np.float32).toarray()
    mask = dense != 0
    pre_spikes, post_spikes = rng.random(9) < 0.5, rng.random(7) < 0.5
    pre_trace, post_trace = rng.uniform(-0.5, 0.5, 9).astype(np.float32), rng.uniform(-0.5, 0.5, 7).astype(np.float32)
    for cls, method, args, want in (
            (evjax.CSR, "update_on_post", (pre_trace, post_spikes), _dense_rule(dense, mask, post_spikes, pre_trace,
                                                                               1, -0.2, 0.6)),
            (evjax.CSC, "update_on_pre", (pre_spikes, post_trace), _dense_rule(dense, mask, pre_spikes, post_trace,
                                                                              0, -0.2, 0.6))):
        m = cls.fromdense(dense).build_weight_indices()
        assert m.other_view is not None and len(jax.tree_util.tree_leaves(m)) == 6
        step = jax.jit(lambda m: getattr(m, method)(*args, -0.2, 0.6))
        # the traced step sorts nothing: no sort in its program, as the view comes in as data
        assert "sort" not in str(jax.make_jaxpr(step)(m)), cls.__name__
        assert "sort" in str(jax.make_jaxpr(step)(cls.fromdense(dense))), cls.__name__
        got = step(m)
        assert got.other_view is not None  # kept by the update, for the next step
        np.testing.assert_allclose(np.asarray(got.todense()), want, rtol=1e-6, err_msg=cls.__name__)
        # the transposed view shares the arrays, and so the cached view
        assert m.T.other_view is m.other_view

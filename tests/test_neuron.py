"""Neuron primitives: spike, lif_step, exp_trace, detect_spikes."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st

import evjax
from evjax.errors import BackendNotAvailableError
from evjax.primitives import neuron
from evjax.surrogate import smooth_step
from evjax.testing import OpSpec, property_test

BACKENDS = (None, "reference")  # what backend= takes: both are the pure-JAX ops


# ---------------------------------------------------------------------------
# strategies: a shape and a seed; arrays drawn with numpy so values are generic
# ---------------------------------------------------------------------------
shapes = st.sampled_from([(0,), (1,), (5,), (3, 4), (2, 3, 2)])


def _arrays(draw_shape, seed, count, low=-1.0, high=2.0):
    rng = np.random.default_rng(seed)
    return [rng.uniform(low, high, draw_shape).astype(np.float32) for _ in range(count)]


@st.composite
def spike_args(draw, shapes=shapes):
    (x,) = _arrays(draw(shapes), draw(st.integers(0, 2**16)), 1)
    return (x,)


@st.composite
def lif_args(draw, shapes=shapes):
    v, i = _arrays(draw(shapes), draw(st.integers(0, 2**16)), 2, low=-0.5, high=1.5)
    return v, i


@st.composite
def trace_args(draw, shapes=shapes):
    shape = draw(shapes)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    trace = rng.uniform(0, 3, shape).astype(np.float32)
    spikes = (rng.random(shape) < 0.3).astype(np.float32)
    decay = np.float32(rng.uniform(0.1, 0.99)) if draw(st.booleans()) else rng.uniform(0.1, 0.99, shape).astype(
        np.float32)
    return trace, spikes, decay


@st.composite
def detect_args(draw, shapes=shapes):
    shape = draw(shapes)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    v = rng.uniform(-1, 2, shape).astype(np.float32)
    v_th = rng.uniform(0.2, 1.0, shape).astype(np.float32) if draw(st.booleans()) else np.float32(0.5)
    v_rest = np.float32(rng.uniform(-0.5, 0.0))
    return v, v_th, v_rest


# ---------------------------------------------------------------------------
# dense references (jax.numpy, surrogate via custom_jvp)
# ---------------------------------------------------------------------------
def _lif_dense(v, i, *, tau, dt, v_th, v_reset, v_rest, surrogate, detach_reset):
    u = v - (dt / tau) * (v - v_rest) + dt * i
    s = smooth_step(u - v_th, surrogate)
    r = jax.lax.stop_gradient(s) if detach_reset else s
    return u - r * (u - v_reset), s


def _detect_dense(v, v_th, v_rest, *, surrogate, detach_reset):
    s = smooth_step(v - v_th, surrogate)
    r = jax.lax.stop_gradient(s) if detach_reset else s
    return s, v + r * (v_rest - v)


# ---------------------------------------------------------------------------
# property tests through the harness (the ops are pure JAX: no backend to name)
# ---------------------------------------------------------------------------
def _spike_spec(surrogate="fast_sigmoid"):
    return OpSpec(
        fn=lambda x: evjax.spike(x, surrogate),
        reference=lambda x: smooth_step(x, surrogate),
        diff_argnums=(0,), smooth=False, name=f"spike[{surrogate}]",
    )


def _lif_spec(detach_reset=False):
    params = dict(tau=5.0, dt=1.0, v_th=1.0, v_reset=-0.2, v_rest=0.1, surrogate="arctan")
    return OpSpec(
        fn=lambda v, i: evjax.lif_step(v, i, detach_reset=detach_reset, **params),
        reference=lambda v, i: _lif_dense(v, i, detach_reset=detach_reset, **params),
        diff_argnums=(0, 1), smooth=False, name=f"lif_step[detach={detach_reset}]",
    )


def _trace_spec():
    return OpSpec(
        fn=lambda t, s, d: evjax.exp_trace(t, s, d),
        reference=lambda t, s, d: t * d + s,
        diff_argnums=(0, 1, 2), name="exp_trace",
    )


def _detect_spec(detach_reset=False):
    return OpSpec(
        fn=lambda v, th, r: evjax.detect_spikes(v, th, r, surrogate="sigmoid", detach_reset=detach_reset),
        reference=lambda v, th, r: _detect_dense(v, th, r, surrogate="sigmoid", detach_reset=detach_reset),
        diff_argnums=(0, 1, 2), smooth=False, name=f"detect_spikes[detach={detach_reset}]",
    )


test_spike_properties = property_test(_spike_spec(), spike_args())
test_lif_properties = property_test(_lif_spec(), lif_args())
test_trace_properties = property_test(_trace_spec(), trace_args())
test_detect_properties = property_test(_detect_spec(), detect_args())
test_lif_properties_detached = property_test(_lif_spec(True), lif_args())
test_detect_properties_detached = property_test(_detect_spec(True), detect_args())
# 0-d operands: every argument a scalar (vmap then batches scalars)
scalars = st.just(())
test_spike_properties_scalar = property_test(_spike_spec(), spike_args(scalars))
test_lif_properties_scalar = property_test(_lif_spec(), lif_args(scalars))
test_trace_properties_scalar = property_test(_trace_spec(), trace_args(scalars))
test_detect_properties_scalar = property_test(_detect_spec(), detect_args(scalars))
test_spike_properties_triangle = property_test(_spike_spec("triangle"), spike_args())


# ---------------------------------------------------------------------------
# spike: the JVP is the chosen surrogate
# ---------------------------------------------------------------------------
def _surrogate_closed_form(name, x, a):
    x = np.asarray(x, np.float64)
    if name == "sigmoid":
        s = 1.0 / (1.0 + np.exp(-a * x))
        return a * s * (1 - s)
    if name == "fast_sigmoid":
        return 1.0 / (1.0 + a * np.abs(x)) ** 2
    if name == "arctan":
        return a / 2.0 / (1.0 + (math.pi / 2.0 * a * x) ** 2)
    if name == "box":
        return np.where(a * np.abs(x) < 1.0, a / 2.0, 0.0)
    if name == "clipped_fast_sigmoid":  # default width 3 / alpha
        return np.where(np.abs(x) < 3.0 / a, 1.0 / (1.0 + a * np.abs(x)) ** 2, 0.0)
    return np.maximum(0.0, a - a * a * np.abs(x))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", evjax.SURROGATES)
@pytest.mark.parametrize("alpha", [None, 0.5, 7.0])
def test_spike_jvp_is_surrogate(name, alpha, backend):
    x = jnp.linspace(-3.0, 3.0, 97, dtype=jnp.float32)
    a = evjax.surrogate.DEFAULT_ALPHA[name] if alpha is None else alpha
    expected = _surrogate_closed_form(name, x, a)
    out, tangent = jax.jvp(lambda x: evjax.spike(x, name, alpha, backend=backend), (x,), (jnp.ones_like(x),))
    np.testing.assert_array_equal(out, (np.asarray(x) >= 0).astype(np.float32))
    np.testing.assert_allclose(tangent, expected, rtol=1e-5, atol=1e-6)
    grad = jax.grad(lambda x: jnp.sum(evjax.spike(x, name, alpha, backend=backend) * 2.0))(x)
    np.testing.assert_allclose(grad, 2.0 * expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["sigmoid", "arctan", "triangle", "box"])
def test_normalised_surrogates_integrate_to_one(name):
    x = np.linspace(-200.0, 200.0, 400_001)
    area = np.trapezoid(np.asarray(evjax.surrogate_grad(jnp.asarray(x), name)), x)
    assert abs(area - 1.0) < 5e-3, area


def test_surrogate_aliases_and_object():
    x = jnp.linspace(-1, 1, 9)
    by_alias = jax.grad(lambda x: evjax.spike(x, "superspike").sum())(x)
    by_object = jax.grad(lambda x: evjax.spike(x, evjax.Surrogate("fast_sigmoid", 10.0)).sum())(x)
    np.testing.assert_allclose(by_alias, by_object)
    sharper = jax.grad(lambda x: evjax.spike(x, "fast_sigmoid", 50.0).sum())(x)
    assert float(sharper[2]) < float(by_alias[2])


# ---------------------------------------------------------------------------
# forward semantics against plain numpy (seed 000 section 6 / seed 001 section 8)
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("size", [7, 100_003])  # large enough for XLA to split the loop over threads
def test_lif_forward_matches_numpy(size):
    rng = np.random.default_rng(size)
    v = rng.uniform(-75, -50, size).astype(np.float32)
    i = rng.uniform(0, 5, size).astype(np.float32)
    tau, dt, v_th, v_rest = 20.0, 0.1, -55.0, -70.0
    v_new, s = evjax.lif_step(v, i, tau=tau, dt=dt, v_th=v_th, v_reset=v_rest)
    u = v + np.float32(dt) * (-(v - np.float32(v_rest)) / np.float32(tau) + i)
    ref_s = u >= v_th
    assert (np.asarray(s) == ref_s).mean() > 0.9999
    np.testing.assert_allclose(np.asarray(v_new)[ref_s == np.asarray(s, bool)],
                               np.where(ref_s, v_rest, u)[ref_s == np.asarray(s, bool)], rtol=1e-5)
    assert s.dtype == jnp.float32 and set(np.unique(s)) <= {0.0, 1.0}


def test_lif_integrates_and_fires():
    v = jnp.zeros(3)
    counts = jnp.zeros(3)
    step = jax.jit(lambda v, i: evjax.lif_step(v, i, tau=10.0, dt=1.0, v_th=1.0))
    for _ in range(100):
        v, s = step(v, jnp.array([0.05, 0.2, 0.5]))
        counts = counts + s
    # 0.05 * tau = 0.5 < v_th never fires; stronger currents fire, and more often
    assert counts[0] == 0 and 0 < counts[1] < counts[2]


@pytest.mark.parametrize("size", [6, 100_001])
def test_detect_and_trace_match_numpy(size):
    rng = np.random.default_rng(1)
    v = rng.uniform(-75, -50, size).astype(np.float32)
    s, v_out = evjax.detect_spikes(v, -55.0, -70.0)
    np.testing.assert_array_equal(s, (v >= -55.0).astype(np.float32))
    np.testing.assert_array_equal(v_out, np.where(v >= -55.0, np.float32(-70.0), v))
    trace = rng.random(size).astype(np.float32)
    spikes = rng.random(size) < 0.1
    out = evjax.exp_trace(trace, spikes, math.exp(-1 / 20))
    np.testing.assert_allclose(out, trace * np.float32(math.exp(-1 / 20)) + spikes, rtol=1e-6)


def test_trace_steady_state():
    decay = math.exp(-1 / 20)
    trace = jnp.zeros(2000)
    update = jax.jit(evjax.exp_trace)
    key = jax.random.PRNGKey(0)
    for _ in range(300):
        key, sub = jax.random.split(key)
        trace = update(trace, jax.random.bernoulli(sub, 0.05, (2000,)), decay)
    assert abs(float(trace.mean()) - 0.05 / (1 - decay)) < 0.05


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision_dtypes(dtype):
    x = jnp.linspace(-1, 1, 8, dtype=dtype)
    out = evjax.spike(x)
    assert out.dtype == dtype
    np.testing.assert_array_equal(np.asarray(out, np.float32), (np.asarray(x, np.float32) >= 0))
    v_new, s = evjax.lif_step(x, x)
    assert v_new.dtype == s.dtype == dtype
    grad = jax.grad(lambda v: evjax.lif_step(v, x)[0].astype(jnp.float32).sum())(x)
    assert grad.dtype == dtype and bool(jnp.all(jnp.isfinite(grad)))


def test_nonfinite_forward():
    """IEEE semantics: NaN never spikes and passes through; +inf spikes and resets; -inf does not spike."""
    nan, inf = float("nan"), float("inf")
    x = np.array([nan, inf, -inf, 0.0, -0.0, 1.0, -1.0], np.float32)
    i = x[::-1].copy()
    fired = np.array([0, 1, 0, 1, 1, 1, 0], np.float32)
    np.testing.assert_array_equal(evjax.spike(x), fired)
    # lif_step (tau = 10, dt = 1, v_th = 1, v_reset = v_rest = 0): u = v - 0.1 (v - 0) + i, so v = +-inf
    # gives inf - inf = nan (as the Numba kernels did), not 0.9 v
    with np.errstate(invalid="ignore"):
        u = x - np.float32(0.1) * (x - np.float32(0.0)) + i
    v_new, s = evjax.lif_step(x, i)
    np.testing.assert_array_equal(s, (u >= 1.0).astype(np.float32))
    np.testing.assert_array_equal(v_new, np.where(u >= 1.0, np.float32(0.0), u))
    nan_at = np.isnan(np.asarray(v_new))
    assert list(np.flatnonzero(nan_at)) == [0, 1, 2, 6] and not np.asarray(s)[nan_at].any()
    # detect_spikes: a NaN threshold never fires; v_rest is what a firing neuron gets, NaN included
    th = np.array([0.5, nan, 0.5, -inf, inf, nan, 0.5], np.float32)
    s, v_out = evjax.detect_spikes(x, th, x[::-1].copy())
    with np.errstate(invalid="ignore"):
        want = x >= th
    np.testing.assert_array_equal(s, want.astype(np.float32))
    np.testing.assert_array_equal(v_out, np.where(want, x[::-1], x))
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(evjax.exp_trace(x, i, 0.5), x * np.float32(0.5) + i)


def test_detach_reset_changes_only_reset_term():
    v = jnp.array([0.95, 0.5])  # first neuron crosses, second does not
    i = jnp.array([0.2, 0.0])
    g_full = jax.grad(lambda v: evjax.lif_step(v, i, detach_reset=False)[0].sum())(v)
    g_det = jax.grad(lambda v: evjax.lif_step(v, i, detach_reset=True)[0].sum())(v)
    a = 1.0 - 1.0 / 10.0
    np.testing.assert_allclose(g_det, [0.0, a], rtol=1e-6)  # (1 - s) du / dv
    g = lambda x: 1.0 / (1.0 + 10.0 * abs(x)) ** 2  # fast_sigmoid, alpha 10
    u0, u1 = 0.95 - 0.1 * 0.95 + 0.2, 0.5 - 0.1 * 0.5
    np.testing.assert_allclose(g_full, [a * (0.0 - u0 * g(u0 - 1.0)), a * (1.0 - u1 * g(u1 - 1.0))], rtol=1e-5)


# ---------------------------------------------------------------------------
# vmap is one batched elementwise loop, not a loop over the batch
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("fn, args", [
    (lambda v, i: evjax.lif_step(v, i), (jnp.ones((4, 6)), jnp.ones((4, 6)))),
    (lambda x, _: evjax.spike(x), (jnp.ones((4, 6)), jnp.ones((4, 6)))),
    (lambda t, s: evjax.exp_trace(t, s, 0.9), (jnp.ones((4, 6)), jnp.ones((4, 6)))),
    (lambda v, th: evjax.detect_spikes(v, th), (jnp.ones((4, 6)), jnp.ones((4,)))),
])
def test_vmap_is_native(fn, args):
    jaxpr = jax.make_jaxpr(jax.vmap(fn))(*args)
    text = str(jaxpr)
    assert "while" not in text and "scan" not in text
    assert all(v.aval.shape == (4, 6) for v in jaxpr.jaxpr.outvars)


# ---------------------------------------------------------------------------
# no custom call: XLA sees (and fuses) the ops
# ---------------------------------------------------------------------------
def _lif_spike_update(v, i):
    v, s = evjax.lif_step(v, i, tau=10.0, v_th=1.0, dt=1.0, detach_reset=True)
    return evjax.spike(v - 0.5), s


def test_lif_spike_update_has_no_custom_call():
    v, i = jnp.linspace(-1.0, 2.0, 64), jnp.full(64, 0.3)
    assert "custom_call" not in jax.jit(_lif_spike_update).lower(v, i).as_text()
    assert "custom-call" not in jax.jit(_lif_spike_update).lower(v, i).compile().as_text()


def test_training_update_has_no_custom_call():
    """Forward and gradient of all four ops, in a time loop, under vmap: still no custom call."""
    def loss(v0, i, th):
        def step(carry, _):
            v, trace = carry
            v, s = evjax.lif_step(v, i, detach_reset=True)
            s2, v = evjax.detect_spikes(v, th, 0.0)
            trace = evjax.exp_trace(trace, s + s2, 0.9)
            return (v, trace), evjax.spike(trace - 1.0)
        _, out = jax.lax.scan(step, (v0, jnp.zeros_like(v0)), None, length=5)
        return out.sum()

    def batch_loss(v0, i, th):
        return jax.vmap(loss, in_axes=(0, 0, None))(v0, i, th).sum()

    args = (jnp.zeros((3, 16)), jnp.full((3, 16), 0.3), jnp.float32(0.8))
    f = jax.jit(jax.grad(batch_loss, argnums=(1, 2)))
    assert "custom_call" not in f.lower(*args).as_text()
    grads = f(*args)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)


# ---------------------------------------------------------------------------
# bad parameters
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    (dict(tau=-1.0), "tau must be positive"),
    (dict(tau=0.0), "tau must be positive"),
    (dict(dt=-0.1), "dt must be positive"),
    (dict(v_th=float("nan")), "v_th must be finite"),
    (dict(surrogate="relu"), "unknown surrogate 'relu'"),
    (dict(alpha=0.0), "alpha must be a finite positive"),
])
def test_lif_bad_parameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        evjax.lif_step(jnp.zeros(3), jnp.zeros(3), **kwargs)


def test_other_bad_parameters():
    with pytest.raises(ValueError, match="unknown surrogate 'heaviside'"):
        evjax.spike(jnp.zeros(3), "heaviside")
    with pytest.raises(ValueError, match="alpha must be a finite positive"):
        evjax.spike(jnp.zeros(3), "sigmoid", -2.0)
    with pytest.raises(TypeError, match="surrogate must be a name"):
        evjax.detect_spikes(jnp.zeros(3), surrogate=3)
    with pytest.raises(ValueError, match="decay must lie in"):
        evjax.exp_trace(jnp.zeros(3), jnp.zeros(3), 1.5)
    with pytest.raises(ValueError, match="do not broadcast"):
        evjax.exp_trace(jnp.zeros(3), jnp.zeros(4), 0.5)
    with pytest.raises(ValueError, match="must be scalars or broadcastable"):
        evjax.detect_spikes(jnp.zeros(3), jnp.zeros(2))
    with pytest.raises(TypeError, match="static Python number"):
        jax.jit(lambda tau: evjax.lif_step(jnp.zeros(3), jnp.zeros(3), tau=tau))(2.0)


def test_neurons_docs_run():
    from .doc_runner import run_markdown

    run_markdown("docs/neurons.md")


# ---------------------------------------------------------------------------
# backend=: kept for compatibility, None or "reference" only
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_none_and_reference_are_the_same(backend):
    x = jnp.linspace(-1.0, 2.0, 9)
    np.testing.assert_array_equal(evjax.spike(x, backend=backend), evjax.spike(x))
    for got, want in zip(evjax.lif_step(x, x, backend=backend), evjax.lif_step(x, x)):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(evjax.exp_trace(x, x, 0.5, backend=backend), evjax.exp_trace(x, x, 0.5))
    for got, want in zip(evjax.detect_spikes(x, backend=backend), evjax.detect_spikes(x)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("call", [
    lambda b: evjax.spike(jnp.zeros(3), backend=b),
    lambda b: evjax.lif_step(jnp.zeros(3), jnp.zeros(3), backend=b),
    lambda b: evjax.exp_trace(jnp.zeros(3), jnp.zeros(3), 0.5, backend=b),
    lambda b: evjax.detect_spikes(jnp.zeros(3), backend=b),
])
def test_removed_and_unknown_backends_name_the_fix(call):
    for removed in ("numba", "warp", "numba_cuda"):
        with pytest.raises(BackendNotAvailableError, match=f"backend='{removed}' no longer exists.*Drop the backend="):
            call(removed)
    with pytest.raises(BackendNotAvailableError, match="unknown backend 'cuda'.*backend=None or 'reference'"):
        call("cuda")
    with pytest.raises(ValueError):  # BackendNotAvailableError is a ValueError
        call("numba")
    with pytest.raises(TypeError, match="backend is None or 'reference'"):
        call(1)


def test_global_backend_choice_does_not_apply():
    """evjax.use_backend picks kernels of ops that have them; the neuron ops have none, so nothing changes."""
    x = jnp.linspace(-1.0, 2.0, 9)
    with evjax.use_backend("numba"):
        out = jax.jit(lambda x: evjax.lif_step(x, x))(x)
    for got, want in zip(out, evjax.lif_step(x, x)):
        np.testing.assert_array_equal(got, want)


def test_package_exports_only_the_ops():
    assert set(neuron.__all__) == {"spike", "lif_step", "exp_trace", "detect_spikes"}


@pytest.mark.parametrize("name", evjax.surrogate.COMPACT)
def test_compact_surrogates_give_exact_zeros_outside_their_band(name):
    width = 0.25
    choice = evjax.Surrogate(name, alpha=None if name != "clipped_fast_sigmoid" else 8.0, width=width)
    x = jnp.linspace(-1.0, 1.0, 201, dtype=jnp.float32)
    g = np.asarray(jax.grad(lambda x: evjax.spike(x, choice).sum())(x))
    outside = np.abs(np.asarray(x)) >= width
    assert np.all(g[outside] == 0.0) and np.all(g[~outside] > 0.0), g
    # box and triangle: the width is 1 / alpha
    if name != "clipped_fast_sigmoid":
        assert evjax.surrogate.resolve_surrogate(choice).alpha == pytest.approx(1.0 / width)


def test_surrogate_width_errors_are_named():
    with pytest.raises(ValueError, match="'arctan' has no band: width is for the compact surrogates"):
        evjax.surrogate.resolve_surrogate(evjax.Surrogate("arctan", width=0.5))
    with pytest.raises(ValueError, match="surrogate width must be a finite positive number"):
        evjax.surrogate.resolve_surrogate(evjax.Surrogate("box", width=-1.0))

"""csr_delay_deliver / csr_delay_deliver_layout on every backend against tests/helpers.py's dense oracle,
under every transform; validation, clamping, retracing, layouts, the event-driven weight gradient."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st

import evjax
from evjax.primitives.delay import (
    CSRDelayLayout, csr_delay_deliver, csr_delay_deliver_layout, csr_delay_deliver_layout_p, csr_delay_deliver_p,
    csr_delay_gather_p,
)
from evjax.testing import OpSpec, check_all, property_test, random_csr
from tests.helpers import delay_deliver_loop, delay_deliver_reference, delay_resampler

BACKENDS = ("numba", "warp", "reference")
RESAMPLE = delay_resampler(events=1, indices=3, indptr=4, delays=5, t=6, ring=0)


# ---------------------------------------------------------------------------
# specs: argument order (ring, events, data, indices, indptr, delays, t, shape)
# ---------------------------------------------------------------------------
def deliver_spec(backend, weighted=False, *, float_events=False, nonfinite=False, homogeneous=False):
    def fn(ring, events, data, indices, indptr, delays, t, shape):
        return csr_delay_deliver(ring, events, data, indices, indptr, delays, t, shape=shape, weighted=weighted,
                                 backend=backend)

    def reference(ring, events, data, indices, indptr, delays, t, shape):
        return delay_deliver_reference(ring, events, data, indices, indptr, delays, t, weighted)

    diff = (0, 1, 2) if weighted and float_events else (0, 2)
    return OpSpec(fn, reference, diff_argnums=diff, static_argnums=(7,), backend=backend, smooth=False,
                  nonfinite=nonfinite, nonfinite_argnums=(0, 2), resample=RESAMPLE,
                  name=f"csr_delay_deliver[{backend}, weighted={weighted}{', homogeneous' if homogeneous else ''}]")


def _example(rng, n_pre, n_post, nnz, n_slots, *, dtype=np.float32, event_dtype=np.bool_, homogeneous=False,
             index_dtype=np.int32, scalar_delay=False):
    indices, indptr = random_csr(rng, n_pre, n_post, nnz, index_dtype=index_dtype)
    nnz = len(indices)
    ring = rng.uniform(-1, 1, (n_slots, n_post)).astype(dtype)
    if event_dtype == np.bool_:
        events = rng.random(n_pre) < 0.5
    elif np.issubdtype(event_dtype, np.integer):
        events = rng.integers(0, 3, n_pre).astype(event_dtype)
    else:
        events = (rng.uniform(-2, 2, n_pre) * (rng.random(n_pre) < 0.6)).astype(event_dtype)
    data = rng.uniform(-1, 1, 1 if homogeneous else nnz).astype(dtype)
    delays = np.int32(rng.integers(0, n_slots)) if scalar_delay else rng.integers(0, n_slots, nnz).astype(np.int32)
    t = np.int32(rng.integers(-40, 40))
    return ring, events, data, indices, indptr, delays, t, (n_pre, n_post)


# A few shapes (edges included), synapse counts and ring lengths: examples of one shape reuse their programs.
SHAPES = st.sampled_from([(0, 3), (4, 0), (1, 1), (5, 4), (7, 6)])
NNZ_COUNTS = st.sampled_from([0, 7, 13])
SLOTS = st.sampled_from([1, 4])


@st.composite
def deliver_args(draw, event_dtype=np.bool_, homogeneous=False):
    n_pre, n_post = draw(SHAPES)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return _example(rng, n_pre, n_post, draw(NNZ_COUNTS), draw(SLOTS), event_dtype=event_dtype,
                    homogeneous=homogeneous)


test_binary_properties = property_test(lambda be: deliver_spec(be, False), deliver_args(), backends=BACKENDS,
                                       skip=("check_grads",))
test_weighted_properties = property_test(lambda be: deliver_spec(be, True, float_events=True),
                                         deliver_args(np.float32), backends=BACKENDS, skip=("check_grads",))
test_homogeneous_int_event_properties = property_test(
    lambda be: deliver_spec(be, False, homogeneous=True), deliver_args(np.int32, homogeneous=True),
    backends=BACKENDS, skip=("check_grads",))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("weighted", [False, True])
def test_nonfinite_ring_and_weights_follow_ieee_on_active_rows(backend, weighted):
    rng = np.random.default_rng(3)
    args = _example(rng, 6, 5, 14, 4, event_dtype=np.float32 if weighted else np.bool_)
    check_all(deliver_spec(backend, weighted, nonfinite=True), args,
              skip=("check_grads", "vmap", "nested_vmap", "jit_grad_vmap"))


# ---------------------------------------------------------------------------
# semantics by hand
# ---------------------------------------------------------------------------
def _numpy_deliver(ring, events, data, indices, indptr, delays, t, weighted):
    out = ring.astype(np.float64).copy()
    n_slots = ring.shape[0]
    d = np.broadcast_to(delays, indices.shape)
    w = np.broadcast_to(data, indices.shape)
    for i in range(len(indptr) - 1):
        if events[i] != 0:
            for e in range(indptr[i], indptr[i + 1]):
                s = (t % n_slots + min(max(int(d[e]), 0), n_slots - 1)) % n_slots
                out[s, indices[e]] += w[e] * (float(events[i]) if weighted else 1.0)
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_documented_example_and_delay_zero(backend):
    indices, indptr = np.array([0, 2, 1], np.int32), np.array([0, 2, 3], np.int32)
    ring = jnp.zeros((3, 3), jnp.float32)
    out = csr_delay_deliver(ring, jnp.array([True, False]), 0.5, indices, indptr, np.array([1, 2, 1]), 0,
                            shape=(2, 3), backend=backend)
    np.testing.assert_array_equal(np.asarray(out), [[0, 0, 0], [0.5, 0, 0], [0, 0, 0.5]])
    # delay 0 arrives in slot t itself; t is reduced with floor modulo (t = -1 -> slot 2)
    out = csr_delay_deliver(ring, jnp.array([False, True]), 2.0, indices, indptr, 0, -1, shape=(2, 3),
                            backend=backend)
    np.testing.assert_array_equal(np.asarray(out), [[0, 0, 0], [0, 0, 0], [0, 2, 0]])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("event_kind", ["bool", "int8", "float32", "binary_array", "weighted_array"])
def test_event_kinds(backend, event_kind):
    rng = np.random.default_rng(4)
    ring, _, data, indices, indptr, delays, t, shape = _example(rng, 9, 7, 30, 5)
    raw = (rng.integers(0, 3, 9) * (rng.random(9) < 0.6)).astype(np.float32)
    weighted = event_kind == "weighted_array"
    events = {"bool": raw != 0, "int8": raw.astype(np.int8), "float32": raw,
              "binary_array": evjax.BinaryArray(raw), "weighted_array": evjax.WeightedArray(raw)}[event_kind]
    got = csr_delay_deliver(ring, events, data, indices, indptr, delays, t, shape=shape, backend=backend)
    want = _numpy_deliver(ring, raw, data, indices, indptr, delays, int(t), weighted)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)
    if event_kind == "binary_array":
        with pytest.raises(ValueError, match="weighted=True contradicts the events, which are a BinaryArray"):
            csr_delay_deliver(ring, events, data, indices, indptr, delays, t, shape=shape, weighted=True)


@pytest.mark.parametrize("backend", ["numba", "warp"])
@pytest.mark.parametrize("dtype", [np.float16, jnp.bfloat16, np.float64])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_dtypes_match_the_reference(backend, dtype, index_dtype):
    rng = np.random.default_rng(7)
    with jax.enable_x64(dtype == np.float64 or index_dtype == np.int64):
        ring, events, data, indices, indptr, delays, t, shape = _example(
            rng, 9, 8, 30, 6, dtype=np.float32, event_dtype=np.float32, index_dtype=index_dtype)
        ring, data = jnp.asarray(ring).astype(dtype), jnp.asarray(data).astype(dtype)
        delays = delays.astype(index_dtype)
        for weighted in (False, True):
            got = csr_delay_deliver(ring, events, data, indices, indptr, delays, t, shape=shape, weighted=weighted,
                                    backend=backend)
            want = csr_delay_deliver(ring, events, data, indices, indptr, delays, t, shape=shape,
                                     weighted=weighted, backend="reference")
            assert got.dtype == want.dtype == jnp.dtype(dtype)
            np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                                       rtol=1e-2 if dtype != np.float64 else 1e-12, atol=1e-2)
            g = jax.grad(lambda w: csr_delay_deliver(ring, events, w, indices, indptr, delays, t, shape=shape,
                                                     weighted=weighted, backend=backend).astype(jnp.float32).sum())
            assert g(data).dtype == jnp.dtype(dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_weights_of_inactive_rows_reach_neither_the_ring_nor_the_weight_gradient(backend):
    indices, indptr = np.array([0, 1, 0, 1], np.int32), np.array([0, 2, 4], np.int32)
    data = np.array([np.nan, np.inf, 0.5, 2.0], np.float32)  # row 0's weights would poison what they touch
    events = np.array([0.0, 3.0], np.float32)
    ring = np.full((2, 2), -0.0, np.float32)
    delays = np.array([0, 1, 1, 0], np.int32)
    for weighted in (False, True):
        out = np.asarray(csr_delay_deliver(ring, events, data, indices, indptr, delays, 0, shape=(2, 2),
                                           weighted=weighted, backend=backend))
        f = 3.0 if weighted else 1.0
        np.testing.assert_array_equal(out, [[0.0, 2.0 * f], [0.5 * f, 0.0]])
        assert np.signbit(out[0, 0]) and np.signbit(out[1, 1])  # untouched cells keep their bits (-0.0)
        g = jax.grad(lambda w: (csr_delay_deliver(ring, events, w, indices, indptr, delays, 0, shape=(2, 2),
                                                  weighted=weighted, backend=backend) * 2.0).sum())(data)
        np.testing.assert_array_equal(np.asarray(g), [0.0, 0.0, 2.0 * f, 2.0 * f])


@pytest.mark.parametrize("backend", BACKENDS)
def test_binary_event_gradient_is_straight_through(backend):
    rng = np.random.default_rng(9)
    ring, _, data, indices, indptr, delays, t, shape = _example(rng, 6, 5, 20, 4)
    events = (rng.random(6) < 0.5).astype(np.float32)
    G = rng.standard_normal(ring.shape).astype(np.float32)
    got = jax.grad(lambda x: (csr_delay_deliver(ring, x, data, indices, indptr, delays, t, shape=shape,
                                                backend=backend) * G).sum())(events)
    # d x[i] = sum_{e in row i} w_e G[s_e, j_e], for every row, active or not
    want = np.zeros(6)
    for i in range(6):
        for e in range(indptr[i], indptr[i + 1]):
            want[i] += data[e] * G[(int(t) % 4 + delays[e]) % 4, indices[e]]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


def test_the_weight_gradient_is_a_kernel_that_visits_active_rows_only():
    """grad w.r.t. the weights binds csr_delay_gather_p (a kernel op, not a pure-JAX gather over nnz),
    with by_event=True: its kernels skip inactive rows (their terms are exactly 0, as checked above)."""
    rng = np.random.default_rng(10)
    ring, events, data, indices, indptr, delays, t, shape = _example(rng, 6, 5, 20, 4)
    jaxpr = jax.make_jaxpr(jax.grad(lambda w: csr_delay_deliver(ring, events, w, indices, indptr, delays, t,
                                                                shape=shape).sum()))(data)
    gathers = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == csr_delay_gather_p.name]
    assert len(gathers) == 1 and gathers[0].params["by_event"] and gathers[0].params["per_edge"]
    assert not any(e.primitive.name in ("gather", "scatter-add") for e in jaxpr.jaxpr.eqns)
    lowered = jax.jit(jax.grad(lambda w: csr_delay_deliver(ring, events, w, indices, indptr, delays, t,
                                                           shape=shape, backend="numba").sum())).lower(data)
    assert "evjax_numba" in lowered.as_text()


# ---------------------------------------------------------------------------
# validation, clamping, retracing
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [np.array([0, 3, 1]), np.array([0, -1, 1]), 3, -2])
def test_concrete_out_of_range_delays_raise_naming_delays(bad):
    indices, indptr = np.array([0, 2, 1], np.int32), np.array([0, 2, 3], np.int32)
    value = int(np.max(bad)) if np.max(bad) >= 3 else int(np.min(bad))
    with pytest.raises(ValueError, match=rf"delays must lie in \[0, L\) = \[0, 3\).*got {value}.*ring at least"):
        csr_delay_deliver(jnp.zeros((3, 3)), np.ones(2, bool), 1.0, indices, indptr, bad, 0, shape=(2, 3))


@pytest.mark.parametrize("backend", BACKENDS)
def test_traced_out_of_range_delays_clamp_to_the_ring(backend):
    indices, indptr = np.array([0, 1, 2], np.int32), np.array([0, 3], np.int32)
    f = jax.jit(lambda d: csr_delay_deliver(jnp.zeros((4, 3)), np.array([True]), np.array([1.0, 2.0, 3.0]),
                                            indices, indptr, d, 1, shape=(1, 3), backend=backend))
    out = np.asarray(f(np.array([-5, 7, 2**30], np.int32)))
    want = np.zeros((4, 3))
    want[1, 0] = 1.0  # -5 -> 0: slot t = 1
    want[(1 + 3) % 4, 1] = 2.0  # 7 -> L - 1 = 3
    want[(1 + 3) % 4, 2] = 3.0  # 2**30 -> 3
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_traced_out_of_range_columns_are_skipped_in_rows_of_every_length(backend):
    # rows of 0 to 40 edges in no order of length (the Numba kernel's per-row offset buffer grows and is
    # reused), columns outside [0, n_post) and delays outside [0, L) among them: the same bits as the oracle
    rng = np.random.default_rng(3)
    n_pre, n_post, n_slots = 12, 9, 5
    lengths = rng.permutation(np.arange(0, 48, 4))
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    nnz = int(indptr[-1])
    indices = rng.integers(-3, n_post + 3, nnz).astype(np.int32)
    delays = rng.integers(-2, n_slots + 3, nnz).astype(np.int32)
    ring = rng.uniform(-1, 1, (n_slots, n_post)).astype(np.float32)
    data = rng.uniform(-1, 1, nnz).astype(np.float32)
    events = rng.random(n_pre) < 0.7
    f = jax.jit(lambda idx, d: csr_delay_deliver(ring, events, data, idx, indptr, d, 3, shape=(n_pre, n_post),
                                                 backend=backend))
    want = delay_deliver_loop(ring, events, data, indices, indptr, delays, 3, False)
    np.testing.assert_array_equal(np.asarray(f(indices, delays)).view(np.int32), want.view(np.int32))


@pytest.mark.parametrize("bad, error, match", [
    (dict(ring=np.zeros((3, 3), np.int32)), TypeError, "ring must be the 2-d float"),
    (dict(ring=np.zeros((3, 4))), ValueError, "ring has 4 columns, but shape says n_post = 3"),
    (dict(ring=np.zeros((0, 3))), ValueError, "ring has no slot"),
    (dict(events=np.ones(3, bool)), ValueError, "events must be a vector of n_pre = 2"),
    (dict(delays=np.array([1.0, 1.0, 1.0])), TypeError, "delays must be integer steps"),
    (dict(delays=np.array([1, 1])), ValueError, "delays must be a scalar, shape"),
    (dict(t=1.5), TypeError, "t must be an integer time step"),
    (dict(t=np.array([1, 2])), ValueError, "t must be a scalar"),
    (dict(data=np.ones(2)), ValueError, "data must be a scalar, shape \\(1,\\)"),
    (dict(indptr=np.array([0, 2, 2])), ValueError, "indptr must rise from 0 to nnz = 3"),
    (dict(indices=np.array([0.0, 1.0, 0.0])), TypeError, "indices must be a 1-d integer array"),
])
def test_bad_arguments_are_named(bad, error, match):
    args = dict(ring=np.zeros((3, 3), np.float32), events=np.ones(2, bool), data=1.0,
                indices=np.array([0, 2, 1], np.int32), indptr=np.array([0, 2, 3], np.int32),
                delays=np.array([0, 1, 2]), t=0)
    args.update(bad)
    with pytest.raises(error, match=match):
        csr_delay_deliver(**args, shape=(2, 3))


def test_new_delays_t_indices_and_spikes_do_not_retrace():
    traces = []

    @jax.jit
    def step(ring, events, data, indices, indptr, delays, t):
        traces.append(1)
        return csr_delay_deliver(ring, events, data, indices, indptr, delays, t, shape=(6, 5))

    rng = np.random.default_rng(0)
    for k in range(4):
        args = _example(rng, 6, 5, 10, 4)[:7]
        step(*args[:6], np.int32(k * 13 - 7))
    assert len(traces) == 1


def test_delays_t_and_indices_are_operands_not_params():
    rng = np.random.default_rng(1)
    ring, events, data, indices, indptr, delays, t, shape = _example(rng, 6, 5, 10, 4)
    jaxpr = jax.make_jaxpr(lambda d, t, i: csr_delay_deliver(ring, events, data, i, indptr, d, t,
                                                             shape=shape))(delays, t, indices)
    (eqn,) = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == csr_delay_deliver_p.name]
    assert set(eqn.params) == {"outs", "shape", "weighted", "backend"}
    assert len(eqn.invars) == 7


# ---------------------------------------------------------------------------
# transforms beyond the harness: vmap over everything, batches whose structures differ, scan
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_vmap_over_structures_delays_and_t_with_nesting(backend):
    rng = np.random.default_rng(12)
    batch = [_example(rng, 5, 4, 11, 3) for _ in range(3)]
    stacked = [np.stack([b[k] for b in batch]) for k in range(7)]
    call = lambda r, x, w, i, p, d, t: csr_delay_deliver(r, x, w, i, p, d, t, shape=(5, 4),  # noqa: E731
                                                         backend=backend)
    got = jax.vmap(call)(*stacked)
    for b, out in zip(batch, got):
        np.testing.assert_allclose(np.asarray(out), _numpy_deliver(*b[:7], False), rtol=1e-6, atol=1e-6)
    # nested: outer over t, inner over the delays; ring and structure unbatched (in_axes None)
    ring, events, data, indices, indptr, _, _, _ = batch[0]
    ds, ts = stacked[5], np.array([0, 5, -3], np.int32)
    nested = jax.vmap(lambda t: jax.vmap(lambda d: call(ring, events, data, indices, indptr, d, t))(ds))(ts)
    for a, t in enumerate(ts):
        for b, d in enumerate(ds):
            np.testing.assert_allclose(np.asarray(nested[a, b]),
                                       _numpy_deliver(ring, events, data, indices, indptr, d, int(t), False),
                                       rtol=1e-6, atol=1e-6)
    # grad of a vmapped loss over differing structures
    g = jax.grad(lambda w: jax.vmap(call, in_axes=(None, 0, None, 0, 0, 0, 0))(
        ring, stacked[1], w, stacked[3], stacked[4], stacked[5], stacked[6]).sum())(data)
    want = sum(np.asarray(jax.grad(lambda w: call(ring, b[1], w, *b[3:7]).sum())(data)) for b in batch)
    np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5)


def test_a_scan_of_steps_matches_step_by_step_delivery():
    rng = np.random.default_rng(13)
    ring, _, data, indices, indptr, delays, _, shape = _example(rng, 8, 6, 25, 5)
    spikes = rng.random((12, 8)) < 0.3

    def step(r, xs):
        t, s = xs
        r = csr_delay_deliver(r, s, data, indices, indptr, delays, t, shape=shape)
        arrived = r[t % 5]
        return r.at[t % 5].set(0.0), arrived

    _, arrivals = jax.lax.scan(step, jnp.zeros_like(ring), (jnp.arange(12), spikes))
    r = np.zeros(ring.shape)
    for t in range(12):
        r = _numpy_deliver(r, spikes[t], data, indices, indptr, delays, t, False)
        np.testing.assert_allclose(np.asarray(arrivals[t]), r[t % 5], rtol=1e-5, atol=1e-6)
        r[t % 5] = 0.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_jvp_of_the_weight_gradient(backend):
    rng = np.random.default_rng(14)
    ring, events, data, indices, indptr, delays, t, shape = _example(rng, 6, 5, 20, 4, event_dtype=np.float32)
    G = rng.standard_normal(ring.shape).astype(np.float32)

    def loss(r, w, b):
        return (csr_delay_deliver(r, events, w, indices, indptr, delays, t, shape=shape, weighted=True,
                                  backend=b) * G).sum()

    def ref_loss(r, w):
        return (delay_deliver_reference(r, events, w, indices, indptr, delays, t, True) * G).sum()

    tangent = rng.standard_normal(data.shape).astype(np.float32)
    for argnum in (0, 1):  # d/dw of grad_r (mixed) and of grad_w (zero: linear)
        got = jax.jvp(lambda w: jax.grad(loss, argnum)(ring, w, backend), (data,), (tangent,))[1]
        want = jax.jvp(lambda w: jax.grad(ref_loss, argnum)(ring, w), (data,), (tangent,))[1]
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6)


# ---------------------------------------------------------------------------
# layouts
# ---------------------------------------------------------------------------
def test_layout_build_sorts_each_row_by_delay_stably():
    data, indices, indptr = np.array([1., 2., 3., 4.], np.float32), np.array([0, 2, 1, 3]), np.array([0, 3, 4])
    delays = np.array([2, 0, 2, 1])
    layout = CSRDelayLayout.build(data, indices, indptr, delays, n_slots=3, shape=(2, 4))
    np.testing.assert_array_equal(np.asarray(layout.perm), [1, 0, 2, 3])
    np.testing.assert_array_equal(np.asarray(layout.indices), [2, 0, 1, 3])
    np.testing.assert_array_equal(np.asarray(layout.delays), [0, 2, 2, 1])
    np.testing.assert_array_equal(np.asarray(layout.data), [2., 1., 3., 4.])
    np.testing.assert_array_equal(np.asarray(layout.delay_ptr), [[0, 1, 1], [3, 3, 4]])
    assert layout.delay_ptr.dtype == layout.indptr.dtype
    assert layout.n_slots == 3 and layout.nse == 4 and layout.shape == (2, 4)
    np.testing.assert_array_equal(np.asarray(layout.original_data()), data)
    new = np.array([10., 20., 30., 40.], np.float32)
    np.testing.assert_array_equal(np.asarray(layout.with_data(new).original_data()), new)
    np.testing.assert_array_equal(np.asarray(layout.with_data(new).data), [20., 10., 30., 40.])
    assert np.asarray(layout.with_data(5.0).original_data()).tolist() == [5.0]
    leaves, tree = jax.tree_util.tree_flatten(layout)
    assert len(leaves) == 6 and jax.tree_util.tree_unflatten(tree, leaves).shape == (2, 4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("weighted", [False, True])
def test_layout_delivers_what_the_plain_op_does(backend, weighted):
    rng = np.random.default_rng(15)
    n, L = 40, 7
    ring, events, data, indices, indptr, delays, t, shape = _example(rng, n, n, 400, L, event_dtype=np.float32)
    layout = CSRDelayLayout.build(data, indices, indptr, delays, n_slots=L, shape=shape)
    for step in (int(t), 3, 1000):
        plain = csr_delay_deliver(ring, events, data, indices, indptr, delays, step, shape=shape, weighted=weighted,
                                  backend=backend)
        laid = jax.jit(lambda r, x, lay, s: csr_delay_deliver_layout(r, x, lay, s, weighted=weighted,
                                                                     backend=backend))(ring, events, layout, step)
        if backend == "numba":  # serial: the same additions in the same order
            np.testing.assert_array_equal(np.asarray(laid), np.asarray(plain))
        else:
            np.testing.assert_allclose(np.asarray(laid), np.asarray(plain), rtol=1e-6, atol=1e-6)
    # the gradient w.r.t. layout.data is in layout order
    g = jax.grad(lambda lay: csr_delay_deliver_layout(ring, events, lay, 2, weighted=weighted,
                                                      backend=backend).sum(), allow_int=True)(layout)
    want = jax.grad(lambda w: csr_delay_deliver(ring, events, w, indices, indptr, delays, 2, shape=shape,
                                                weighted=weighted, backend=backend).sum())(data)
    np.testing.assert_allclose(np.asarray(g.data), np.asarray(want)[np.asarray(layout.perm)], rtol=1e-6)
    assert csr_delay_deliver_layout_p is csr_delay_deliver_p


def test_layout_errors_are_named():
    indices, indptr = np.array([0, 1]), np.array([0, 2])
    layout = CSRDelayLayout.build(1.0, indices, indptr, np.array([0, 3]), n_slots=4, shape=(1, 2))
    with pytest.raises(ValueError, match="ring must have layout.n_slots = 4 rows"):
        csr_delay_deliver_layout(jnp.zeros((3, 2)), np.array([True]), layout, 0)
    with pytest.raises(TypeError, match="layout must be a CSRDelayLayout"):
        csr_delay_deliver_layout(jnp.zeros((4, 2)), np.array([True]), "layout", 0)
    with pytest.raises(ValueError, match=r"delays must lie in \[0, L\) = \[0, 2\)"):
        CSRDelayLayout.build(1.0, indices, indptr, np.array([0, 3]), n_slots=2, shape=(1, 2))
    with pytest.raises(TypeError, match="indices must be concrete"):
        jax.jit(lambda i: CSRDelayLayout.build(1.0, i, indptr, 0, n_slots=2, shape=(1, 2)).data)(indices)
    with pytest.raises(ValueError, match="n_slots must be an integer >= 1"):
        CSRDelayLayout.build(1.0, indices, indptr, 0, n_slots=0, shape=(1, 2))


def test_csr_methods_deliver_as_the_functions():
    rng = np.random.default_rng(61)
    dense = ((rng.random((7, 5)) < 0.5) * rng.uniform(0.1, 1, (7, 5))).astype(np.float32)
    W = evjax.CSR.fromdense(dense)
    delays = rng.integers(0, 4, W.nnz).astype(np.int32)
    ring, events = jnp.asarray(rng.random((4, 5), dtype=np.float32)), rng.random(7) < 0.5
    want = evjax.csr_delay_deliver(ring, events, W.data, W.indices, W.indptr, delays, 5, shape=W.shape)
    np.testing.assert_array_equal(np.asarray(W.delay_deliver(ring, events, delays, 5)), np.asarray(want))
    layout = W.delay_layout(delays, n_slots=4)
    np.testing.assert_array_equal(np.asarray(evjax.csr_delay_deliver_layout(ring, events, layout, 5)),
                                  np.asarray(want))
    np.testing.assert_array_equal(np.asarray(layout.original_data()), np.asarray(W.data))
    # the dense meaning: each active row's synapse lands (t + d) % L steps ahead
    expected = np.asarray(ring).copy()
    rows = np.repeat(np.arange(7), np.diff(np.asarray(W.indptr)))
    for e in np.flatnonzero(events[rows]):
        expected[(5 + delays[e]) % 4, W.indices[e]] += W.data[e]
    np.testing.assert_allclose(np.asarray(want), expected, rtol=1e-6)


@pytest.mark.parametrize("backend", ["numba", "warp", "reference"])
def test_a_shared_weight_gradient_ignores_nan_cotangents_no_active_synapse_reaches(backend):
    # d data = sum over the active rows' synapses of g[slot, column]: a NaN cotangent on a ring cell that
    # no active synapse writes must not reach it (docs/semantics.md: weight gradients select)
    rng = np.random.default_rng(62)
    n_pre, n_post, L = 6, 5, 4
    dense = (rng.random((n_pre, n_post)) < 0.5).astype(np.float32)
    W = evjax.CSR.fromdense(dense)
    delays = rng.integers(0, L, W.nnz).astype(np.int32)
    events = rng.random(n_pre) < 0.5
    reached = np.zeros((L, n_post), bool)
    rows = np.repeat(np.arange(n_pre), np.diff(np.asarray(W.indptr)))
    for e in np.flatnonzero(events[rows]):
        reached[(2 + delays[e]) % L, W.indices[e]] = True
    g = np.where(reached, rng.uniform(0.5, 1.5, (L, n_post)), np.nan).astype(np.float32)

    got = jax.grad(lambda w: jnp.vdot(jnp.asarray(g), evjax.csr_delay_deliver(
        jnp.zeros((L, n_post)), events, w, W.indices, W.indptr, delays, 2, shape=W.shape, backend=backend)))(
        jnp.float32(0.7))
    want = sum(g[(2 + delays[e]) % L, W.indices[e]] for e in np.flatnonzero(events[rows]))
    assert np.isfinite(got), got
    np.testing.assert_allclose(got, want, rtol=1e-5)

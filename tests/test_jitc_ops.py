"""JITC ops under every transform (evjax.testing harness), on the CPU backends, against dense references.

The references build the generated matrix densely with the pure-JAX form of
the generation scheme (itself checked bit by bit against a pure-Python
implementation in tests/test_jitc_generation.py), then sum the structural
terms: ``y_o = sum_{i in structure} term(w_oi, x_i)``, where a float operand
multiplies (IEEE), a spike selects its weight (a silent one contributes
nothing, NaN weights included) with a straight-through gradient, and a
weighted event scales its weights by its value with the true gradient.
Sizes come from the harness's small buckets; the seed is a traced operand,
redrawn per vmap batch element (a sequential batch), and vmap over the
operand alone runs the mm op.
"""
from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st

import evjax
from evjax.primitives.jitc import MATMUL_OPS
from evjax.testing import SIZES, check_all, property_test
from tests.helpers import JITC_FUNCTIONS, JITC_LAWS, THOROUGH, jitc_spec_for

BACKENDS = ("numba", "reference")
# CI (default profile): a few shapes, so examples reuse compiled programs; thorough: every size bucket
SHAPES = [(a, b) for a in SIZES for b in SIZES] if THOROUGH else [(3, 4), (5, 2), (0, 3)]
PROBS = (0.15, 0.4, 0.7, 1.0) if THOROUGH else (0.5,)
# The dense references (jitc_structural), the laws and jitc_spec_for are in tests/helpers.py
# (tests/cudasim/test_sim_jitc.py uses them too).


@st.composite
def jitc_args(draw, law: str, rank: int, event: bool, x_float: bool = True):
    n_rows, n_cols = draw(st.sampled_from(SHAPES))
    transpose, corder = draw(st.booleans()), draw(st.booleans())
    prob = draw(st.sampled_from(PROBS))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    params = [rng.standard_normal(1).astype(np.float32) for _ in range(JITC_LAWS[law])]
    seed = rng.integers(0, 2**32, size=(1,), dtype=np.uint64).astype(np.uint32)
    n_in = n_rows if transpose else n_cols
    shape_x = (n_in,) if rank == 1 else (n_in, 2)
    if not event:
        x = rng.standard_normal(shape_x).astype(np.float32)
    elif x_float:
        x = (rng.standard_normal(shape_x) * (rng.random(shape_x) < 0.5)).astype(np.float32)
    else:
        x = rng.random(shape_x) < 0.5
    return (*params, seed, x, (n_rows, n_cols), prob, transpose, corder)


# Each law and kind on Numba, the reference (the GPU fallback) on one op; every op on both backends
# under the thorough profile (the CI budget keeps the default run to the cases below).
# float operand: every law, mv and mm
test_jitsmv = property_test(jitc_spec_for("scalar", 1, False), jitc_args("scalar", 1, False), backends=BACKENDS)
test_jitnmm = property_test(jitc_spec_for("normal", 2, False), jitc_args("normal", 2, False), backends=("numba",))
# events: bool spikes, float spikes (straight-through), weighted events (true gradient)
test_binary_jitsmv_bool = property_test(jitc_spec_for("scalar", 1, True, x_float=False),
                                        jitc_args("scalar", 1, True, x_float=False), backends=("numba",))
test_binary_jitnmv = property_test(jitc_spec_for("normal", 1, True), jitc_args("normal", 1, True), backends=("numba",))
test_binary_jitumm_weighted = property_test(jitc_spec_for("uniform", 2, True, weighted=True),
                                            jitc_args("uniform", 2, True), backends=("numba",))
if THOROUGH:
    test_jitumv = property_test(jitc_spec_for("uniform", 1, False), jitc_args("uniform", 1, False), backends=BACKENDS)
    test_binary_jitnmv_reference = property_test(jitc_spec_for("normal", 1, True), jitc_args("normal", 1, True),
                                                 backends=("reference",))
    test_jitnmv = property_test(jitc_spec_for("normal", 1, False), jitc_args("normal", 1, False), backends=BACKENDS)
    test_jitumm = property_test(jitc_spec_for("uniform", 2, False), jitc_args("uniform", 2, False), backends=BACKENDS)
    test_binary_jitsmm_bool = property_test(jitc_spec_for("scalar", 2, True, x_float=False),
                                            jitc_args("scalar", 2, True, x_float=False), backends=BACKENDS)
    test_binary_jitnmm_weighted = property_test(jitc_spec_for("normal", 2, True, weighted=True),
                                                jitc_args("normal", 2, True), backends=BACKENDS)


@pytest.mark.parametrize("backend", ["numba"] + (["reference"] if THOROUGH else []))
def test_events_select_nan_weights(backend):
    """A silent spike contributes nothing whatever the weights hold (NaN, inf): forward and gradients."""
    rng = np.random.default_rng(1)
    for law in ("scalar", "normal"):
        n = JITC_LAWS[law]
        make = jitc_spec_for(law, 1, True, x_float=False, nonfinite=True)
        params = [np.array([np.nan], np.float32)] + [np.array([np.inf], np.float32)] * (n - 1)
        x = np.array([True, False, False, True, False])
        for transpose, corder in ((True, False), (False, True)):  # a scatter and a gather
            args = (*params, np.array([7], np.uint32), x if transpose else x[:4], (5, 4), 0.6, transpose, corder)
            check_all(make(backend), args, seed=int(rng.integers(1 << 30)), skip=("vmap", "nested_vmap",
                                                                                  "jit_grad_vmap"))


def test_vmap_over_operand_is_one_mm_call():
    """vmap of an mv op over its operand binds the mm op (no loop); over the seed, a sequential loop."""
    v = jnp.ones((3, 6), jnp.float32)
    f = lambda x: evjax.jitsmv(1.0, 0.5, x, 3, shape=(4, 6), backend="reference")  # noqa: E731
    jaxpr = jax.make_jaxpr(jax.vmap(f))(v)
    names = [e.primitive.name for e in jaxpr.jaxpr.eqns]
    assert MATMUL_OPS[("scalar", 2, False)].name in names and MATMUL_OPS[("scalar", 1, False)].name not in names
    g = lambda s: evjax.jitsmv(1.0, 0.5, v[0], s, shape=(4, 6), backend="reference")  # noqa: E731
    seeds = jnp.arange(3, dtype=jnp.uint32)
    batched = jax.vmap(g)(seeds)
    for k in range(3):
        np.testing.assert_array_equal(batched[k], g(seeds[k]))


def test_seed_is_traced_no_recompile():
    """A new seed (or weight) reuses the compiled program: one trace for many seeds."""
    traces = []

    @jax.jit
    def f(w, seed):
        traces.append(1)
        return evjax.binary_jitsmv(w, 0.3, jnp.ones(20, bool), seed, shape=(20, 20), transpose=True, corder=False)

    outs = [np.asarray(f(0.5, jnp.uint32(s))) for s in range(4)]
    assert len(traces) == 1
    assert not all(np.array_equal(outs[0], o) for o in outs[1:])  # different seeds, different matrices


@pytest.mark.parametrize("law", list(JITC_LAWS))
def test_gradient_of_weights_is_event_driven(law):
    """The weight cotangent of an event op is computed by the event op itself (silent inputs skipped)."""
    n = JITC_LAWS[law]
    fn = JITC_FUNCTIONS[(law, 1, True)]
    spikes = jnp.asarray(np.random.default_rng(0).random(30) < 0.2)

    def loss(*params):
        return jnp.sum(fn(*params, 0.2, spikes, 5, shape=(30, 40), transpose=True, corder=False) ** 2)

    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=tuple(range(n))))(*([0.5] * n))
    bound = [e.primitive.name for e in jaxpr.jaxpr.eqns if "outs" in e.params]
    event_op = MATMUL_OPS[(law, 1, True)].name
    assert bound and all(b == event_op for b in bound), bound


def test_errors_name_the_problem():
    v = jnp.ones(6)
    with pytest.raises(ValueError, match="prob must be in"):
        evjax.jitsmv(1.0, 1.5, v, 0, shape=(4, 6))
    with pytest.raises(TypeError, match="static"):
        jax.jit(lambda p: evjax.jitsmv(1.0, p, v, 0, shape=(4, 6)))(0.5)
    with pytest.raises(ValueError, match=r"must have shape \(6,\)"):
        evjax.jitsmv(1.0, 0.5, jnp.ones(5), 0, shape=(4, 6))
    with pytest.raises(TypeError, match="binary_jitsmv"):
        evjax.jitsmv(1.0, 0.5, jnp.ones(6, bool), 0, shape=(4, 6))
    with pytest.raises(ValueError, match="scalar"):
        evjax.jitnmv(jnp.ones(2), 1.0, 0.5, v, 0, shape=(4, 6))
    with pytest.raises(TypeError, match="seed"):
        evjax.jitsmv(1.0, 0.5, v, 0.5, shape=(4, 6))


def test_seed_and_shape_errors_name_the_argument():
    """seed="7" gave JAX's "Value '7' with dtype <U1 is not a valid JAX array type"; shape=(4.7, 6) was
    truncated to (4, 6) by the classes and "ab" gave Python's "invalid literal for int()"."""
    v = jnp.ones(6)
    for call, who in [(lambda seed: evjax.jits(0.5, 0.1, seed, shape=(4, 6)), "jits"),
                      (lambda seed: evjax.jitnmv(0.5, 0.1, 0.1, v, seed, shape=(4, 6)), "jitnmv"),
                      (lambda seed: evjax.JITCScalarR(0.5, prob=0.1, seed=seed, shape=(4, 6)), "JITCScalarR"),
                      (lambda seed: evjax.JITCUniformC(0.0, 1.0, prob=0.1, seed=seed, shape=(4, 6)), "JITCUniformC")]:
        with pytest.raises(TypeError, match=rf"{who}: seed must be one integer, got str '7'; convert it: "
                                            rf"seed=int\('7'\)"):
            call("7")
        with pytest.raises(TypeError, match=rf"{who}: seed must be one integer, got str 'x'; pass an int"):
            call("x")
        with pytest.raises(TypeError, match=rf"{who}: seed must be one integer, got dict"):
            call({})
        with pytest.raises(TypeError, match=rf"{who}: seed must be one integer"):
            call(True)
    for cls in (evjax.JITCScalarR, evjax.JITCScalarC):
        with pytest.raises(TypeError, match=rf"{cls.__name__}: shape must be a pair .*4\.7 is not a whole number"):
            cls(0.5, prob=0.1, seed=1, shape=(4.7, 6))
        with pytest.raises(TypeError, match=rf"{cls.__name__}: shape must be a pair .*got str 'ab'"):
            cls(0.5, prob=0.1, seed=1, shape="ab")
        with pytest.raises(ValueError, match=rf"{cls.__name__}: shape must be a pair .*-1 is negative"):
            cls(0.5, prob=0.1, seed=1, shape=(4, -1))
        M = cls(0.5, prob=0.1, seed=np.int64(7), shape=(np.int64(4), 6.0), backend="reference")
        assert M.shape == (4, 6) and all(type(d) is int for d in M.shape)
        same = cls(0.5, prob=0.1, seed=7, shape=(4, 6), backend="reference")
        np.testing.assert_array_equal(np.asarray(M.todense()), np.asarray(same.todense()))


def test_prob_zero_is_an_empty_matrix():
    y = evjax.binary_jitnmv(np.nan, 1.0, 0.0, jnp.ones(6, bool), 1, shape=(4, 6))
    np.testing.assert_array_equal(y, np.zeros(4, np.float32))


def test_brainevents_older_homogeneous_names_are_the_same_classes():
    """Code written for brainevent's JITCHomoR/C (deprecated there, in favour of JITCScalarR/C) runs."""
    assert evjax.JITCHomoR is evjax.JITCScalarR and evjax.JITCHomoC is evjax.JITCScalarC
    W = evjax.JITCHomoR((1.5, 0.1, 123), shape=(10, 20))
    spikes = np.arange(10) % 3 == 0
    np.testing.assert_allclose(spikes @ W, spikes.astype(np.float32) @ np.asarray(W.todense()), rtol=1e-5)

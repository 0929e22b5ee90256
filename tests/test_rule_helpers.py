"""evjax.defjvp and evjax.general_batching_rule: brainevent's rule helpers, on small custom ops."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import evjax
from evjax import XLACustomKernel, numba_kernel
from evjax.testing import OpSpec, check_all
from tests import kernels_for_tests as K

S = jax.ShapeDtypeStruct


# --- y = (sin(x) * w, x * w): nonlinear in x, two outputs, rules with jax.numpy ---------
def wave_reference(x, w, **params):
    return [jnp.sin(x) * w, x * w]


def wave_rule_x(t, x, w, *, outs, **params):
    # d/dx (sin(x) w, x w) . t = (cos(x) w t, w t)
    return [jnp.cos(x) * w * t, w * t]


def wave_rule_w(t, x, w, *, outs, **params):
    # d/dw (sin(x) w, x w) . t = (sin(x) t, x t)
    return [jnp.sin(x) * t, x * t]


def make_wave_op(name, *, rules=(wave_rule_x, wave_rule_w)):
    op = XLACustomKernel(name)
    op.def_reference(wave_reference)
    evjax.defjvp(op, *rules)
    op.def_batching_rule(functools.partial(evjax.general_batching_rule, op))
    return op


WAVE = make_wave_op("wave_for_rule_helpers")


def wave(x, w):
    outs = [S(x.shape, x.dtype), S(x.shape, x.dtype)]
    return tuple(WAVE(x, w, outs=outs))


def wave_dense(x, w):
    return jnp.sin(x) * w, x * w


def args(n=7, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)


def test_defjvp_rules_under_jvp_grad_and_vmap():
    # jvp and grad from the per-input rules (JAX transposes the rules' jnp ops), vmap through
    # general_batching_rule, against the jnp reference
    check_all(OpSpec(fn=wave, reference=wave_dense, diff_argnums=(0, 1), name="wave"), args())


def test_defjvp_matches_jax_jvp_of_the_reference_exactly_per_input():
    x, w = map(jnp.asarray, args(5, seed=1))
    tx, tw = map(jnp.asarray, args(5, seed=2))
    for tangents in ((tx, jnp.zeros_like(tw)), (jnp.zeros_like(tx), tw), (tx, tw)):
        got = jax.jvp(wave, (x, w), tangents)
        want = jax.jvp(wave_dense, (x, w), tangents)
        for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_defjvp_none_marks_an_input_without_derivative():
    op = make_wave_op("wave_no_w_rule", rules=(wave_rule_x, None))
    x, w = map(jnp.asarray, args(4, seed=3))

    def f(x, w):
        return op(x, w, outs=[S(x.shape, x.dtype)] * 2)[0].sum()

    gx, gw = jax.grad(f, argnums=(0, 1))(x, w)
    np.testing.assert_allclose(np.asarray(gx), np.cos(np.asarray(x)) * np.asarray(w), rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(gw), np.zeros(4, np.float32))  # no rule: no derivative


def test_defjvp_errors_name_the_fix():
    with pytest.raises(TypeError, match=r"defjvp: expected an evjax\.XLACustomKernel or a JAX Primitive, got function"):
        evjax.defjvp(lambda x: x, wave_rule_x)
    with pytest.raises(TypeError, match="defjvp: rule 1 must be a function or None, got int"):
        evjax.defjvp(XLACustomKernel("wave_bad_rule"), wave_rule_x, 3)
    op = make_wave_op("wave_one_rule", rules=(wave_rule_x,))
    x, w = map(jnp.asarray, args(3))
    with pytest.raises(ValueError, match="has 1 per-input JVP rules but was called with 2 operands"):
        jax.jvp(lambda x: op(x, w, outs=[S(x.shape, x.dtype)] * 2)[0], (x,), (x,))


# --- general_batching_rule on a compiled Numba kernel (out = x + y) ------------------------
def add_generator(outs, ins, **params):
    return numba_kernel(K.add_kernel, outs=outs[0])


ADD = XLACustomKernel("add_for_rule_helpers")
ADD.def_numba_kernel(add_generator)
ADD.def_reference(lambda x, y, **params: [x + y])
evjax.defjvp(ADD, lambda t, x, y, **params: [t], lambda t, x, y, **params: [t])  # d(x + y) = dx + dy
ADD.def_batching_rule(functools.partial(evjax.general_batching_rule, ADD))


def add(x, y):
    return ADD(x, y, outs=[S(x.shape, x.dtype)])[0]


def test_general_batching_rule_with_a_numba_kernel_under_vmap_and_grad():
    x, y = args(6, seed=4)
    check_all(OpSpec(fn=add, reference=lambda x, y: x + y, diff_argnums=(0, 1), name="add"), (x, y))


def test_general_batching_rule_called_directly():
    x = jnp.arange(12.0, dtype=jnp.float32).reshape(3, 4)
    y = jnp.ones(4, jnp.float32)
    outs = [S((4,), jnp.float32)]
    # batch on axis 1 of x, y unbatched: the outputs carry the batch at axis 0
    got, out_axes = evjax.general_batching_rule(ADD, (x.T, y), (1, None), outs=outs)
    assert out_axes == [0]
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(x) + 1.0)
    # nothing batched: one call, unbatched outputs
    got, out_axes = evjax.general_batching_rule(ADD, (y, y), (None, None), outs=outs, backend="numba")
    assert out_axes == [None]
    np.testing.assert_allclose(np.asarray(got[0]), 2 * np.ones(4))
    # any function of the operands, with one result
    got, out_axes = evjax.general_batching_rule(lambda a, b: a * b, (x, y * 3), (0, None))
    assert out_axes == 0
    np.testing.assert_allclose(np.asarray(got), 3 * np.asarray(x))


# ---------------------------------------------------------------------------
# rules.partitioning: which mesh axes split which factor
# ---------------------------------------------------------------------------
def _shaped(shape, spec, mesh):
    import types

    from jax.sharding import NamedSharding

    return types.SimpleNamespace(shape=shape, sharding=NamedSharding(mesh, spec))


def test_partition_rule_strings_and_factors_kept_whole():
    from evjax.rules.partitioning import PartitionRule

    rule = PartitionRule(("w", "e", "r", "i c"), ("o c",), batch=("c",))
    assert rule.sharding_rule == "w, e, r, i c -> o c"
    assert rule.kept_whole == ("w", "e", "r", "i", "o")  # Shardy wants them in order of appearance
    sddmm = PartitionRule(("e", "r", "i c", "j c"), ("e",), reduced=("c",))
    assert sddmm.kept_whole == ("e", "r", "i", "j")


def test_factor_axes_follow_the_operands_and_refuse_uneven_splits():
    from jax.sharding import AbstractMesh, PartitionSpec as P

    from evjax.rules.partitioning import PartitionRule, factor_axes

    mesh = AbstractMesh((4, 2), ("data", "model"))
    rule = PartitionRule(("i o", "i c"), ("o c",), batch=("o", "c"))
    # the trials split 4 ways, the outputs 2 ways
    args = [_shaped((10, 6), P(None, "model"), mesh), _shaped((10, 8), P(None, "data"), mesh)]
    assert factor_axes(rule, mesh, args) == {"o": ("model",), "c": ("data",)}
    # a factor kept whole is never split, even where its operand is sharded along it
    args = [_shaped((8, 6), P("data", None), mesh), _shaped((8, 8), P(None, None), mesh)]
    assert factor_axes(rule, mesh, args) == {}
    # 6 trials do not divide among 4 devices: kept whole
    args = [_shaped((10, 6), P(), mesh), _shaped((10, 6), P(None, "data"), mesh)]
    assert factor_axes(rule, mesh, args) == {}
    # one mesh axis splits at most one factor
    args = [_shaped((10, 8), P(None, "data"), mesh), _shaped((10, 8), P(None, "data"), mesh)]
    assert factor_axes(rule, mesh, args) == {"o": ("data",)}

"""evjax.defjvp on a plain JAX primitive (brainevent's calling convention, issue 31)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import evjax
from evjax import _compat


def _mul_primitive():
    """y = x * s, elementwise: a primitive with one output."""
    p = _compat.Primitive("defjvp_test_mul")
    p.def_impl(lambda x, s, *, scale=1.0: x * s * scale)
    p.def_abstract_eval(lambda x, s, *, scale=1.0: _compat.ShapedArray(x.shape, x.dtype))
    return p


MUL = _mul_primitive()
evjax.defjvp(
    MUL,
    lambda dx, x, s, *, scale=1.0: MUL.bind(dx, s, scale=scale),
    lambda ds, x, s, *, scale=1.0: MUL.bind(x, ds, scale=scale),
)


def _two_out_primitive():
    """(x * s, x + s): a primitive with multiple results."""
    p = _compat.Primitive("defjvp_test_two")
    p.multiple_results = True
    p.def_impl(lambda x, s: [x * s, x + s])
    p.def_abstract_eval(lambda x, s: [_compat.ShapedArray(x.shape, x.dtype)] * 2)
    return p


TWO = _two_out_primitive()
evjax.defjvp(TWO, lambda dx, x, s: [dx * s, dx], lambda ds, x, s: [x * ds, ds])

X = jnp.array([1.0, 2.0, 3.0], jnp.float32)
S = jnp.array([0.5, -1.0, 4.0], jnp.float32)
DX = jnp.array([1.0, 0.0, 2.0], jnp.float32)
DS = jnp.array([0.0, 3.0, 1.0], jnp.float32)


def test_jvp_of_a_single_output_primitive_sums_the_per_input_rules():
    y, dy = jax.jvp(lambda x, s: MUL.bind(x, s, scale=2.0), (X, S), (DX, DS))
    np.testing.assert_allclose(y, 2.0 * X * S)
    np.testing.assert_allclose(dy, 2.0 * (DX * S + X * DS))


def test_jvp_with_one_input_constant_uses_only_the_other_rule():
    y, dy = jax.jvp(lambda x: MUL.bind(x, S), (X,), (DX,))
    np.testing.assert_allclose(dy, DX * S)


def test_grad_through_a_single_output_primitive_with_jax_differentiable_rules():
    # the rules bind MUL again, so reverse mode needs MUL to be linear-transposable: use jnp rules instead
    p = _mul_primitive()
    evjax.defjvp(p, lambda dx, x, s, *, scale=1.0: dx * s * scale, lambda ds, x, s, *, scale=1.0: x * ds * scale)
    gx, gs = jax.grad(lambda x, s: p.bind(x, s, scale=3.0).sum(), argnums=(0, 1))(X, S)
    np.testing.assert_allclose(gx, 3.0 * S)
    np.testing.assert_allclose(gs, 3.0 * X)
    np.testing.assert_allclose(jax.jit(jax.grad(lambda x: p.bind(x, S).sum()))(X), S)


def test_multiple_results_primitive_under_jvp_and_grad():
    (a, b), (da, db) = jax.jvp(lambda x, s: TWO.bind(x, s), (X, S), (DX, DS))
    np.testing.assert_allclose(a, X * S)
    np.testing.assert_allclose(b, X + S)
    np.testing.assert_allclose(da, DX * S + X * DS)
    np.testing.assert_allclose(db, DX + DS)

    def loss(x, s):
        a, b = TWO.bind(x, s)
        return (a + 2.0 * b).sum()

    gx, gs = jax.grad(loss, argnums=(0, 1))(X, S)
    np.testing.assert_allclose(gx, S + 2.0)
    np.testing.assert_allclose(gs, X + 2.0)


def test_a_none_rule_gives_no_tangent_for_that_input():
    p = _mul_primitive()
    evjax.defjvp(p, lambda dx, x, s, *, scale=1.0: dx * s * scale, None)
    _, dy = jax.jvp(lambda x, s: p.bind(x, s), (X, S), (DX, DS))
    np.testing.assert_allclose(dy, DX * S)
    _, dy = jax.jvp(lambda s: p.bind(X, s), (S,), (DS,))
    np.testing.assert_allclose(dy, np.zeros(3))


def test_defjvp_rejects_what_is_not_a_primitive_and_non_callable_rules():
    with pytest.raises(TypeError, match="XLACustomKernel or a JAX Primitive"):
        evjax.defjvp(object(), None)
    with pytest.raises(TypeError, match="rule 0 must be a function or None"):
        evjax.defjvp(_mul_primitive(), 3, None)


def test_the_wrong_number_of_rules_is_reported_when_differentiated():
    p = _mul_primitive()
    evjax.defjvp(p, lambda dx, x, s, **kw: dx * s)
    with pytest.raises(ValueError, match="1 per-input JVP rules but was bound with 2 operands"):
        jax.jvp(lambda x: p.bind(x, S), (X,), (DX,))

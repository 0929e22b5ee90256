"""XLACustomKernel: backend selection, generator caching, rules, subclass style."""
import jax
import jax.numpy as jnp
import numba
import numpy as np
import pytest
from hypothesis import strategies as st

import evjax
from evjax import XLACustomKernel, numba_kernel
from evjax.errors import KernelCompilationError
from evjax.rules import ad as ad_rules
from evjax.rules import batching as batching_rules
from evjax.testing import OpSpec, check_all, check_forward, check_jvp, check_vjp, property_test
from tests import kernels_for_tests as K

S = jax.ShapeDtypeStruct


# --- a scale op y = x * s[0], linear in x and in s ----------------------------
def scale_numba_generator(outs, **params):
    call = numba_kernel(K.parallel_scale_kernel, outs=outs[0])
    return lambda x, s: call(x, s)


def scale_reference(x, s, **params):
    return [x * s[0]]


def make_scale_op(name="scale_test"):
    op = XLACustomKernel(name)
    op.def_numba_kernel(scale_numba_generator)
    op.def_reference(scale_reference)
    op.def_jvp_rule2(*ad_rules.linear_jvp_rules(op, 2, linear_argnums=(0, 1)))

    def transpose_x(cts, x, s, *, outs, **params):
        # y = s x  =>  x_bar = s y_bar
        return op(cts[0], s, outs=[S(x.aval.shape, x.aval.dtype)], **params)[0]

    def transpose_s(cts, x, s, *, outs, **params):
        # y = s x  =>  s_bar = <x, y_bar>
        return jnp.sum(cts[0] * x).reshape(1).astype(s.aval.dtype)

    op.def_transpose_rule(ad_rules.linear_transpose_rule({0: transpose_x, 1: transpose_s}))
    return op


SCALE = make_scale_op()


def scale(x, s, **kw):
    return SCALE(x, s, outs=[S(x.shape, x.dtype)], **kw)[0]


def scale_dense(x, s):
    return x * s[0]


SCALE_SPEC = OpSpec(fn=scale, reference=scale_dense, diff_argnums=(0, 1), name="scale")

scale_args = st.integers(1, 9).flatmap(
    lambda n: st.tuples(
        st.lists(st.floats(-4, 4, width=32), min_size=n, max_size=n).map(lambda v: np.asarray(v, np.float32)),
        st.floats(-3, 3, width=32).map(lambda v: np.asarray([v], np.float32)),
    )
)
test_scale_properties = property_test(SCALE_SPEC, scale_args, max_examples=3)


def test_scale_two_dimensional_operand_under_every_check():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)

    @numba.njit
    def scale_nd(x, s, out):
        flat_x, flat_out = x.reshape(x.size), out.reshape(out.size)
        for i in range(flat_out.size):
            flat_out[i] = flat_x[i] * s[0]

    op = XLACustomKernel("scale_nd")
    op.def_numba_kernel(lambda outs, ins: numba_kernel(scale_nd, outs=outs[0]))
    op.def_reference(scale_reference)
    op.def_jvp_rule2(*ad_rules.linear_jvp_rules(op, 2, (0, 1)))
    op.def_transpose_rule(ad_rules.linear_transpose_rule({
        0: lambda cts, x, s, outs, **p: cts[0] * s[0],
        1: lambda cts, x, s, outs, **p: jnp.sum(cts[0] * x).reshape(1),
    }))
    spec = OpSpec(fn=lambda x, s: op(x, s, outs=[S(x.shape, x.dtype)])[0], reference=scale_dense,
                  diff_argnums=(0, 1), name="scale_nd")
    check_all(spec, (x, np.asarray([1.5], np.float32)))


# --- backend selection ----------------------------------------------------------
def scale_op_tagged_by_backend():
    op = XLACustomKernel("tagged")
    op.def_numba_kernel(scale_numba_generator)
    op.def_kernel("alt", "cpu", lambda outs, ins: (lambda x, s: [x * s[0] + 1000.0]), default=False)
    op.def_reference(lambda x, s, **kw: [x * s[0] - 1000.0])
    return op


def test_backend_selection_order():
    op = scale_op_tagged_by_backend()
    x, s = jnp.ones(3), jnp.array([2.0])
    run = lambda **kw: float(op(x, s, outs=[S((3,), jnp.float32)], **kw)[0][0])  # noqa: E731
    assert run() == 2.0  # the platform default (numba)
    assert run(backend="alt") == 1002.0  # per call
    assert run(backend="reference") == -998.0
    with evjax.use_backend("alt"):
        assert run() == 1002.0  # context
        assert run(backend="numba") == 2.0  # per call beats context
    with evjax.use_backend("warp"):  # this op has no warp: the context choice does not apply
        assert run() == 2.0
    evjax.set_backend("reference")
    try:
        assert run() == -998.0
    finally:
        evjax.set_backend(None)
    op.set_default("cpu", "alt")
    assert run() == 1002.0
    jitted = jax.jit(lambda x, s: op(x, s, outs=[S((3,), jnp.float32)], backend="reference")[0])
    assert float(jitted(x, s)[0]) == -998.0


def test_reference_is_the_fallback_and_missing_backend_errors():
    op = XLACustomKernel("only_reference")
    op.def_reference(scale_reference)
    np.testing.assert_allclose(op(jnp.ones(2), jnp.array([3.0]), outs=[S((2,), jnp.float32)])[0], [3, 3])
    bare = XLACustomKernel("bare_op")
    with pytest.raises(NotImplementedError, match="bare_op.*no backend for platform 'cpu'"):
        bare(jnp.ones(2), outs=[S((2,), jnp.float32)])
    with pytest.raises(ValueError, match="no backend 'warp'"):
        SCALE(jnp.ones(2), jnp.ones(1), outs=[S((2,), jnp.float32)], backend="warp")
    with pytest.raises(ValueError, match="platform"):
        bare.def_kernel("x", "tpu-ish", scale_numba_generator)


def test_generator_called_once_per_signature_and_receives_everything():
    calls = []

    def generator(outs, ins, factor):
        calls.append((outs, ins, factor))
        return lambda x: [x * factor]

    op = XLACustomKernel("counted")
    op.def_numba_kernel(generator)
    f = jax.jit(lambda x, factor: op(x, outs=[S(x.shape, x.dtype)], factor=factor)[0], static_argnums=1)
    f(jnp.ones(3), 2.0)
    f(jnp.ones(3) * 5, 2.0)
    assert len(calls) == 1
    outs, ins, factor = calls[0]
    assert outs == (S((3,), jnp.float32),) and ins == (S((3,), jnp.float32),) and factor == 2.0
    f(jnp.ones(4), 2.0)
    f(jnp.ones(3), 3.0)
    assert len(calls) == 3
    np.testing.assert_allclose(f(jnp.ones(4), 2.0), 2 * np.ones(4))
    assert len(calls) == 3


def test_a_misspelled_parameter_raises_in_the_generator_and_the_reference():
    """Generators and references get exactly the op's parameters: nothing is dropped on the way."""
    op = XLACustomKernel("spelled")
    op.def_numba_kernel(lambda outs, ins, factor: (lambda x: [x * factor]))
    op.def_reference(lambda x, *, outs, factor: [x * factor])
    out = [S((3,), jnp.float32)]
    np.testing.assert_array_equal(op(jnp.ones(3), outs=out, factor=2.0)[0], [2, 2, 2])
    with pytest.raises(KernelCompilationError, match="unexpected keyword argument 'facter'"):
        op(jnp.ones(3), outs=out, facter=2.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'facter'"):
        op(jnp.ones(3), outs=out, facter=2.0, backend="reference")


def test_bad_params_and_outs():
    with pytest.raises(TypeError, match="unhashable"):
        SCALE(jnp.ones(2), jnp.ones(1), outs=[S((2,), jnp.float32)], factors=[1, 2])
    with pytest.raises(TypeError, match="ShapeDtypeStruct"):
        SCALE(jnp.ones(2), jnp.ones(1), outs=[(2,)])
    op = XLACustomKernel("liar")
    op.def_numba_kernel(lambda outs, ins: (lambda x: [jnp.zeros(5)]))
    with pytest.raises(TypeError, match="promised"):
        op(jnp.ones(2), outs=[S((2,), jnp.float32)])


# --- rules ---------------------------------------------------------------------
def test_missing_rules_name_the_op_and_the_fix():
    op = XLACustomKernel("ruleless")
    op.def_reference(scale_reference)
    f = lambda x: op(x, jnp.array([2.0]), outs=[S(x.shape, x.dtype)])[0].sum()  # noqa: E731
    with pytest.raises(NotImplementedError, match="'ruleless' has no JVP rule.*def_jvp_rule"):
        jax.grad(f)(jnp.ones(3))
    op.def_jvp_rule2(*ad_rules.linear_jvp_rules(op, 2, (0, 1)))
    np.testing.assert_allclose(jax.jvp(f, (jnp.ones(3),), (jnp.ones(3),))[1], 6.0)
    with pytest.raises(NotImplementedError, match="'ruleless' has no transpose rule.*def_transpose_rule"):
        jax.grad(f)(jnp.ones(3))
    op.def_jvp_rule2(ad_rules.linear_jvp_rules(op, 2, (0,))[0])  # one rule for two operands
    with pytest.raises(ValueError, match="1 per-input JVP rules but was called with 2 operands"):
        jax.jvp(f, (jnp.ones(3),), (jnp.ones(3),))


def test_whole_op_jvp_rule_and_symbolic_zero_tangents():
    op = XLACustomKernel("square")
    op.def_reference(lambda x, **kw: [x * x])
    seen = []

    @op.def_jvp_rule
    def square_jvp(primals, tangents, *, outs, **params):
        # y = x^2  =>  dy = 2 x dx
        (x,), (dx,) = primals, tangents
        seen.append(ad_rules.is_zero(dx))
        return op(x, outs=outs, **params), [2 * x * ad_rules.instantiate(dx, outs[0])]

    f = lambda x: op(x, outs=[S(x.shape, x.dtype)])[0]  # noqa: E731
    np.testing.assert_allclose(jax.jvp(f, (jnp.arange(3.0),), (jnp.ones(3),))[1], [0, 2, 4])
    np.testing.assert_allclose(jax.jacfwd(f)(jnp.arange(2.0)), np.diag([0.0, 2.0]))
    assert seen and not any(seen)


def test_default_batching_is_a_correct_sequential_loop():
    op = XLACustomKernel("gather_op")
    op.def_numba_kernel(lambda outs, ins: numba_kernel(K.gather_kernel, outs=outs[0]))
    f = lambda x, i: op(x, i, outs=[S(i.shape, x.dtype)])[0]  # noqa: E731
    xs = jnp.arange(12.0, dtype=jnp.float32).reshape(3, 4)
    idx = jnp.array([[3, 0], [1, 1], [2, 3]], jnp.int32)
    np.testing.assert_array_equal(jax.vmap(f)(xs, idx), np.take_along_axis(np.asarray(xs), np.asarray(idx), 1))
    np.testing.assert_array_equal(jax.vmap(f, in_axes=(None, 0))(xs[0], idx), np.asarray(xs[0])[np.asarray(idx)])
    assert "scan" in str(jax.make_jaxpr(jax.vmap(f))(xs, idx))


def test_custom_batching_rule_replaces_the_loop():
    op = make_scale_op("scale_batched")

    @op.def_batching_rule
    def batch(args, axes, *, outs, **params):
        x, s = args
        size = batching_rules.batch_size(args, axes)
        x = batching_rules.broadcast_batch(x, axes[0], size)
        s = batching_rules.broadcast_batch(s, axes[1], size)  # (B, 1)
        return [x * s], [0]

    f = lambda x, s: op(x, s, outs=[S(x.shape, x.dtype)])[0]  # noqa: E731
    xs, ss = jnp.ones((4, 3)), jnp.arange(4.0).reshape(4, 1)
    np.testing.assert_allclose(jax.vmap(f)(xs, ss), np.arange(4.0)[:, None] * np.ones((4, 3)))
    assert "scan" not in str(jax.make_jaxpr(jax.vmap(f))(xs, ss))


class Affine(XLACustomKernel):
    """y = a * x + b written as a subclass: rules are methods."""

    def __init__(self):
        super().__init__("affine_subclass")

        @numba.njit
        def kernel(x, a, b, out):
            for i in range(out.size):
                out[i] = a[0] * x[i] + b[0]

        self.def_numba_kernel(lambda outs, ins: numba_kernel(kernel, outs=outs[0]))

    def reference(self, x, a, b, **params):
        return [a[0] * x + b[0]]

    def jvp_rule(self, primals, tangents, *, outs, **params):
        # y = a x + b  =>  dy = a dx + x da + db
        x, a, b = primals
        dx, da, db = (ad_rules.instantiate(t, ad_rules.aval_of(p)) for t, p in zip(tangents, primals))
        y = self(x, a, b, outs=outs, **params)
        return y, [a[0] * dx + x * da[0] + db[0]]

    def batching_rule(self, args, axes, *, outs, **params):
        size = batching_rules.batch_size(args, axes)
        x, a, b = (batching_rules.broadcast_batch(v, ax, size) for v, ax in zip(args, axes))
        return [a * x + b], [0]


def test_subclass_style_op_under_the_harness():
    op = Affine()
    fn = lambda x, a, b: op(x, a, b, outs=[S(x.shape, x.dtype)])[0]  # noqa: E731
    spec = OpSpec(fn=fn, reference=lambda x, a, b: a[0] * x + b[0], diff_argnums=(0, 1, 2), name="affine")
    args = (np.linspace(-1, 1, 5).astype(np.float32), np.asarray([2.0], np.float32), np.asarray([0.5], np.float32))
    check_forward(spec, args)
    check_jvp(spec, args)
    from evjax.testing import check_nested_vmap, check_vmap

    check_vmap(spec, args)
    check_nested_vmap(spec, args)


# --- the harness can fail ------------------------------------------------------
def test_harness_detects_a_wrong_forward():
    wrong = OpSpec(fn=scale, reference=lambda x, s: x * s[0] + 1e-2, name="wrong_forward")
    with pytest.raises(AssertionError, match="wrong_forward: eager forward"):
        check_forward(wrong, (np.ones(3, np.float32), np.ones(1, np.float32)))


def test_harness_detects_a_wrong_jvp_and_a_wrong_transpose():
    op = XLACustomKernel("bad_rules")
    op.def_reference(scale_reference)
    op.def_jvp_rule2(lambda t, x, s, outs, **p: [2.0 * t * s[0]], None)  # off by 2
    op.def_transpose_rule(ad_rules.linear_transpose_rule({0: lambda cts, x, s, outs, **p: cts[0]}))  # forgets s
    fn = lambda x, s: op(x, s, outs=[S(x.shape, x.dtype)])[0]  # noqa: E731
    spec = OpSpec(fn=fn, reference=scale_dense, diff_argnums=(0,), name="bad_rules")
    args = (np.ones(3, np.float32), np.asarray([3.0], np.float32))
    with pytest.raises(AssertionError, match="jvp"):
        check_jvp(spec, args)
    with pytest.raises(AssertionError, match="vjp"):
        check_vjp(spec, args)

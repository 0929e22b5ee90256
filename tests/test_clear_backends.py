"""XLACustomKernel.clear_backends and the warning on registering a backend twice (issue 31)."""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import evjax
from evjax import XLACustomKernel

S = jax.ShapeDtypeStruct


def adding(amount):
    """A generator whose kernel returns ``x + amount``: which kernel ran shows in the result."""
    return lambda outs, ins: (lambda x: [x + amount])


def make_op(name):
    op = XLACustomKernel(name)
    op.def_kernel("numba", "cpu", adding(1.0))
    op.def_reference(lambda x, outs: [x - 1.0])
    return op


def test_clear_backends_leaves_the_reference_and_keeps_old_compiled_functions_working():
    op = make_op("clear_backends_jit")
    x = jnp.zeros(3, jnp.float32)
    traces = []

    @jax.jit
    def f(x):
        traces.append(1)
        return op(x, outs=[S(x.shape, x.dtype)])[0]

    np.testing.assert_array_equal(f(x), 1.0)
    assert op.backends("cpu") == ["numba", "reference"]
    compiled = f.lower(x).compile()  # compiled before the clear: keeps its kernel

    op.clear_backends()
    assert op.backends("cpu") == ["reference"]
    assert op.backends("gpu") == ["reference"]
    assert op.default_backend("cpu") == "reference"
    np.testing.assert_array_equal(compiled(x), 1.0)
    n = len(traces)
    np.testing.assert_array_equal(f(x), -1.0)  # retraced: resolves to the reference
    assert len(traces) == n + 1
    with pytest.raises(evjax.KernelNotAvailableError):
        op(x, outs=[S(x.shape, x.dtype)], backend="numba")


def test_a_kernel_registered_after_clear_backends_is_used_by_the_next_trace():
    op = make_op("clear_backends_new")
    x = jnp.zeros(2, jnp.float32)
    f = jax.jit(lambda x: op(x, outs=[S(x.shape, x.dtype)])[0])
    np.testing.assert_array_equal(f(x), 1.0)
    op.clear_backends()
    np.testing.assert_array_equal(f(x), -1.0)
    op.def_kernel("numba", "cpu", adding(5.0))
    # registering a kernel changes no jit cache key: f keeps the program it traced (the same bits on
    # every call), and a new trace (a new jit, an eager call) resolves to the new kernel
    np.testing.assert_array_equal(f(x), -1.0)
    np.testing.assert_array_equal(jax.jit(lambda x: op(x, outs=[S(x.shape, x.dtype)])[0])(x), 5.0)
    np.testing.assert_array_equal(op(x, outs=[S(x.shape, x.dtype)])[0], 5.0)


def test_clear_backends_on_a_family_op_falls_back_to_the_reference():
    # a private op with a declared backend module, like the families' ops
    op = XLACustomKernel("clear_backends_declared")
    op.def_reference(lambda x, outs: [x * 2.0])
    op.declare_backends({"numba": lambda: None}, {"numba": {"cpu": True}})
    assert op.backends("cpu") == ["numba", "reference"]
    op.clear_backends()
    assert op.backends("cpu") == ["reference"]
    x = jnp.ones(2, jnp.float32)
    np.testing.assert_array_equal(op(x, outs=[S(x.shape, x.dtype)])[0], 2.0)


def test_registering_a_backend_twice_on_one_platform_warns():
    op = make_op("twice")
    with pytest.warns(UserWarning, match=r"op 'twice': backend 'numba' on cpu was already registered"):
        op.def_kernel("numba", "cpu", adding(2.0))
    x = jnp.zeros(2, jnp.float32)
    np.testing.assert_array_equal(op(x, outs=[S(x.shape, x.dtype)])[0], 2.0)  # the new one replaced it


def test_the_same_generator_again_or_another_platform_does_not_warn():
    op = XLACustomKernel("twice_quiet")
    generator = adding(1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        op.def_kernel("numba", "cpu", generator)
        op.def_kernel("numba", "cpu", generator)  # the identical generator: nothing changes
        op.def_kernel("alt", "cpu", adding(3.0), default=False)
        op.def_kernel("alt", "gpu", adding(3.0))
        op.clear_backends()
        op.def_kernel("numba", "cpu", adding(4.0))  # after a clear, not a second registration


def test_evjax_families_register_each_backend_once():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        W = evjax.CSR.fromdense(np.array([[1.0, 0.0], [2.0, 3.0]], np.float32))
        np.testing.assert_allclose(jnp.array([True, True]) @ W, [3.0, 3.0])

"""evjax.compat.jax_kernel runs code written for warp.jax_experimental.jax_kernel (Warp's CPU device)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("warp")

from evjax.compat import jax_kernel  # noqa: E402

from . import warp_compat_kernels as K  # noqa: E402


def test_output_dims_dict_pure_output():
    n = 1024
    x = jnp.linspace(-2.0, 2.0, n, dtype=jnp.float32)
    relu_fn = jax_kernel(K.relu_kernel, launch_dims=[n], num_outputs=1, output_dims={"out": (n,)})
    (result,) = relu_fn(x)
    np.testing.assert_array_equal(result, np.maximum(np.asarray(x), 0))
    (jitted,) = jax.jit(relu_fn)(x)
    np.testing.assert_array_equal(jitted, result)


def test_defaults_infer_launch_dims_from_first_array():
    x = jnp.array([-1.0, 3.0, -0.5], jnp.float32)
    (y,) = jax_kernel(K.relu_kernel)(x)
    np.testing.assert_array_equal(y, [0.0, 3.0, 0.0])


def test_in_out_accumulator_scatter_add():
    rng = np.random.default_rng(0)
    n_src, n_dst = 512, 128
    values = rng.random(n_src).astype(np.float32)
    targets = rng.integers(0, n_dst, n_src).astype(np.int32)
    scale = np.array([2.0], np.float32)
    fn = jax_kernel(K.scatter_add_kernel, launch_dims=[n_src], num_outputs=1, in_out_argnames=["acc"])
    init = jnp.ones(n_dst, jnp.float32)
    (result,) = fn(jnp.asarray(values), jnp.asarray(targets), jnp.asarray(scale), init)
    ref = np.ones(n_dst, np.float32)
    np.add.at(ref, targets, values * 2.0)
    np.testing.assert_allclose(result, ref, rtol=1e-5)


def test_generator_style_call_inside_jit_and_vmap():
    def scale_add(a, b, c):
        n = a.shape[0]
        return jax_kernel(K.scale_add_kernel, launch_dims=[n], num_outputs=1, output_dims={"out": (n,)})(a, b, c)

    a, b, c = (jnp.arange(6, dtype=jnp.float32).reshape(2, 3) + k for k in range(3))
    (out,) = jax.jit(jax.vmap(scale_add))(a, b, c)
    np.testing.assert_allclose(out, a * b + c)
    (out,) = scale_add(a[0], b[0], c[0])
    np.testing.assert_allclose(out, a[0] * b[0] + c[0])


def test_two_outputs_one_shape_for_all_and_per_call_dims():
    m = jnp.array([[1.0, 2.0], [3.5, 0.0], [-1.0, 1.0]], jnp.float32)
    fn = jax_kernel(K.row_sums_kernel, num_outputs=2)
    sums, out = fn(m, launch_dims=[3], output_dims=3)
    np.testing.assert_allclose(out, [3.0, 3.5, 0.0])
    np.testing.assert_array_equal(sums, [3, 3, 0])
    assert sums.dtype == jnp.int32


def test_in_out_argnames_must_be_inputs():
    with pytest.raises(ValueError, match="in-out arguments"):
        jax_kernel(K.scale_add_kernel, num_outputs=2, in_out_argnames=["out"])


def test_unknown_in_out_name_and_wrong_arity():
    with pytest.raises(ValueError, match="not parameters"):
        jax_kernel(K.relu_kernel, in_out_argnames=["nope"])
    fn = jax_kernel(K.relu_kernel, launch_dims=[2])
    with pytest.raises(TypeError, match="takes 1 input"):
        fn(jnp.zeros(2), jnp.zeros(2))


def test_not_a_warp_kernel():
    with pytest.raises(TypeError, match="@warp.kernel"):
        jax_kernel(lambda x: x)

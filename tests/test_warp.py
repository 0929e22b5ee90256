"""evjax.warp_kernel on Warp's CPU device (and CUDA where a GPU exists)."""
import os
import subprocess
import sys
import textwrap
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

wp = pytest.importorskip("warp")

import evjax  # noqa: E402
from evjax.backends import warp as bridge  # noqa: E402
from tests.helpers import HANG_GUARD_S  # noqa: E402
from tests.threads import check_in_threads  # noqa: E402
from tests.warp_kernels_for_tests import scatter_k  # noqa: E402  (test_warp_handlers.py launches it too)

wp.config.quiet = True
S = jax.ShapeDtypeStruct
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = settings(max_examples=8, deadline=None, derandomize=True)

# All kernels below share one Warp module (this file): one compile, then Warp's cache (scatter_k,
# which tests/test_warp_handlers.py uses too, is in tests/warp_kernels_for_tests.py).


@wp.kernel(enable_backward=False)
def add_k(a: wp.array(dtype=wp.float32), b: wp.array(dtype=wp.float32), out: wp.array(dtype=wp.float32)):
    i = wp.tid()
    out[i] = a[i] + b[i]


@wp.kernel(enable_backward=False)
def add64_k(a: wp.array(dtype=wp.float64), b: wp.array(dtype=wp.float64), out: wp.array(dtype=wp.float64)):
    i = wp.tid()
    out[i] = a[i] + b[i]


@wp.kernel(enable_backward=False)
def in_out_middle_k(
    x: wp.array(dtype=wp.float32), acc: wp.array(dtype=wp.float32), scale: wp.array(dtype=wp.float32),
    doubled: wp.array(dtype=wp.float32),
):
    i = wp.tid()
    acc[i] = acc[i] + x[i] * scale[0]
    doubled[i] = 2.0 * x[i]


@wp.kernel(enable_backward=False)
def sum_prod_k(a: wp.array2d(dtype=wp.float64), s: wp.array2d(dtype=wp.float64), p: wp.array2d(dtype=wp.int32)):
    i, j = wp.tid()
    s[i, j] = a[i, j] + a[i, j]
    p[i, j] = wp.int32(i * 100 + j)


@wp.kernel(enable_backward=False)
def coords3_k(out: wp.array3d(dtype=wp.int32)):
    i, j, k = wp.tid()
    out[i, j, k] = i * 100 + j * 10 + k


@wp.kernel(enable_backward=False)
def coords4_k(out: wp.array4d(dtype=wp.int64)):
    i, j, k, m = wp.tid()
    out[i, j, k, m] = wp.int64(i * 1000 + j * 100 + k * 10 + m)


@wp.kernel(enable_backward=False)
def cast_k(x: wp.array(dtype=wp.int8), f: wp.array(dtype=wp.float16), flag: wp.array(dtype=wp.bool), out: wp.array(dtype=wp.uint16)):
    i = wp.tid()
    v = wp.uint16(0)
    if flag[i]:
        v = wp.uint16(int(x[i]) + int(f[i]))
    out[i] = v


@wp.kernel(enable_backward=False)
def scalar_param_k(x: wp.array(dtype=wp.float32), alpha: float, out: wp.array(dtype=wp.float32)):
    i = wp.tid()
    out[i] = alpha * x[i]


def _add(n):
    return evjax.warp_kernel(add_k, S((n,), jnp.float32), launch_dims=n)


# ---------------------------------------------------------------------------
# types
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "dtype, name",
    [(jnp.float16, "float16"), (jnp.float32, "float32"), (jnp.float64, "float64"), (jnp.int8, "int8"),
     (jnp.int16, "int16"), (jnp.int32, "int32"), (jnp.int64, "int64"), (jnp.uint8, "uint8"),
     (jnp.uint16, "uint16"), (jnp.uint32, "uint32"), (jnp.uint64, "uint64"), (jnp.bool_, "bool")],
)
def test_jaxtype_to_warptype(dtype, name):
    assert evjax.jaxtype_to_warptype(dtype) is getattr(wp, name)
    info = evjax.jaxinfo_to_warpinfo(S((2, 3), dtype))
    assert info.dtype is getattr(wp, name) and info.ndim == 2


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.complex64, "float8_e4m3fn", object])
def test_unsupported_dtype_is_a_type_error(dtype):
    with pytest.raises(TypeError, match="no Warp scalar type"):
        evjax.jaxtype_to_warptype(dtype)


def test_jaxinfo_rank_limits():
    assert evjax.jaxinfo_to_warpinfo(S((1, 2, 3, 4), jnp.float32)).ndim == 4
    for shape in [(), (1, 1, 1, 1, 1)]:
        with pytest.raises(ValueError, match="1 to 4 dimensions"):
            evjax.jaxinfo_to_warpinfo(S(shape, jnp.float32))
    with pytest.raises(TypeError):
        evjax.jaxinfo_to_warpinfo(np.float32)


# ---------------------------------------------------------------------------
# outputs: pure, in-out, several, every launch rank
# ---------------------------------------------------------------------------
@SETTINGS
@given(n=st.integers(0, 300), seed=st.integers(0, 2**16))
def test_pure_output_eager_and_jit(n, seed):
    rng = np.random.default_rng(seed)
    a, b = (jnp.asarray(rng.standard_normal(n), jnp.float32) for _ in range(2))
    f = _add(n)
    np.testing.assert_allclose(f(a, b), np.asarray(a) + np.asarray(b), rtol=1e-6)
    np.testing.assert_allclose(jax.jit(f)(a, b), np.asarray(a) + np.asarray(b), rtol=1e-6)


@SETTINGS
@given(m=st.integers(1, 200), n_out=st.integers(1, 20), seed=st.integers(0, 2**16))
def test_in_out_atomic_accumulation(m, n_out, seed):
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(m).astype(np.float32)
    targets = rng.integers(0, n_out, m).astype(np.int32)
    init = rng.standard_normal(n_out).astype(np.float32)
    call = evjax.warp_kernel(scatter_k, [], launch_dims=m, in_out_argnames=["acc"])
    init_j = jnp.asarray(init)
    (acc,) = jax.jit(call)(jnp.asarray(values), jnp.asarray(targets), init_j)
    expected = init.copy()
    np.add.at(expected, targets, values)
    np.testing.assert_allclose(acc, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(init_j), init)  # the initial value is not mutated


def test_in_out_in_the_middle_and_pure_output_order():
    x = jnp.arange(6, dtype=jnp.float32)
    acc0 = jnp.ones(6, jnp.float32)
    call = evjax.warp_kernel(in_out_middle_k, S((6,), jnp.float32), launch_dims=6, in_out_argnames="acc")
    acc, doubled = jax.jit(call)(x, acc0, jnp.asarray([3.0], jnp.float32))
    np.testing.assert_allclose(acc, 1 + 3 * np.arange(6))
    np.testing.assert_allclose(doubled, 2 * np.arange(6))


def test_two_outputs_2d_launch_and_mixed_dtypes():
    with jax.enable_x64(True):
        x = jnp.arange(15, dtype=jnp.float64).reshape(3, 5)
        call = evjax.warp_kernel(sum_prod_k, [S((3, 5), jnp.float64), S((3, 5), jnp.int32)], launch_dims=(3, 5))
        s, p = jax.jit(call)(x)
        np.testing.assert_array_equal(s, 2 * np.asarray(x))
        np.testing.assert_array_equal(p, 100 * np.arange(3)[:, None] + np.arange(5)[None, :])


def test_3d_and_4d_launch():
    out3 = evjax.warp_kernel(coords3_k, S((2, 3, 4), jnp.int32), launch_dims=(2, 3, 4))()
    i, j, k = np.indices((2, 3, 4))
    np.testing.assert_array_equal(out3, 100 * i + 10 * j + k)
    with jax.enable_x64(True):
        out4 = jax.jit(evjax.warp_kernel(coords4_k, S((2, 2, 3, 2), jnp.int64), launch_dims=(2, 2, 3, 2)))()
        i, j, k, m = np.indices((2, 2, 3, 2))
        np.testing.assert_array_equal(out4, 1000 * i + 100 * j + 10 * k + m)


def test_small_int_half_and_bool_arrays():
    x = jnp.asarray([1, -2, 3, 4], jnp.int8)
    f = jnp.asarray([0.5, 2.0, 3.0, 1.0], jnp.float16)
    flag = jnp.asarray([True, False, True, True])
    out = evjax.warp_kernel(cast_k, S((4,), jnp.uint16), launch_dims=4)(x, f, flag)
    np.testing.assert_array_equal(out, np.asarray([1, 0, 6, 5], np.uint16))


def test_single_struct_returns_array_list_returns_tuple():
    a = jnp.ones(4, jnp.float32)
    assert isinstance(_add(4)(a, a), jax.Array)
    pair = evjax.warp_kernel(add_k, [S((4,), jnp.float32)], launch_dims=4)(a, a)
    assert isinstance(pair, tuple) and len(pair) == 1


def test_generic_kernel_is_specialised_to_the_argument_dtypes():
    @wp.kernel(enable_backward=False, module="unique")
    def twice(x: wp.array(dtype=Any), out: wp.array(dtype=Any)):
        i = wp.tid()
        out[i] = x[i] + x[i]

    out = evjax.warp_kernel(twice, S((3,), jnp.int32), launch_dims=3)(jnp.asarray([1, 2, 3], jnp.int32))
    np.testing.assert_array_equal(out, [2, 4, 6])


# ---------------------------------------------------------------------------
# transforms and threads
# ---------------------------------------------------------------------------
def test_vmap_is_sequential_and_correct_for_an_index_driven_kernel():
    rng = np.random.default_rng(3)
    values = jnp.asarray(rng.standard_normal((4, 30)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, 7, (4, 30)), jnp.int32)
    init = jnp.zeros(7, jnp.float32)
    call = evjax.warp_kernel(scatter_k, [], launch_dims=30, in_out_argnames=["acc"])
    (got,) = jax.jit(jax.vmap(call, in_axes=(0, 0, None)))(values, targets, init)
    expected = np.zeros((4, 7), np.float32)
    for b in range(4):
        np.add.at(expected[b], np.asarray(targets[b]), np.asarray(values[b]))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    # batch on axis 1, nested vmap
    (got1,) = jax.vmap(call, in_axes=(1, None, None))(values.T, targets[0], init)
    for b in range(4):
        ref = np.zeros(7, np.float32)
        np.add.at(ref, np.asarray(targets[0]), np.asarray(values[b]))
        np.testing.assert_allclose(got1[b], ref, rtol=1e-5, atol=1e-6)
    a = jnp.arange(24, dtype=jnp.float32).reshape(2, 3, 4)
    nested = jax.vmap(jax.vmap(_add(4), in_axes=(0, None)), in_axes=(0, None))(a, jnp.ones(4, jnp.float32))
    np.testing.assert_allclose(nested, np.asarray(a) + 1)


def test_grad_is_refused_with_a_clear_message():
    a = jnp.ones(4, jnp.float32)
    with pytest.raises(TypeError, match="not differentiable.*XLACustomKernel"):
        jax.grad(lambda x: _add(4)(x, a).sum())(a)


def test_concurrent_calls_from_threads():
    f = jax.jit(_add(1000))
    a = jnp.arange(1000, dtype=jnp.float32)
    f(a, a).block_until_ready()

    def work(k):
        for _ in range(20):
            np.testing.assert_allclose(f(a, a * k), np.arange(1000) * (1 + k))

    check_in_threads(work)


def test_hlo_is_one_custom_call_to_the_compiled_handler():
    a = jnp.ones(8, jnp.float32)
    text = jax.jit(_add(8)).lower(a, a).as_text()
    target = bridge.CPU_TARGET if jax.default_backend() == "cpu" else bridge.CUDA_TARGET
    assert text.count("custom_call") == 1 and target in text


# ---------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------
def test_not_a_warp_kernel():
    with pytest.raises(TypeError, match="@warp.kernel"):
        evjax.warp_kernel(lambda a, out: None, S((4,), jnp.float32), launch_dims=4)
    with pytest.raises(TypeError, match="@warp.kernel"):
        evjax.warp_kernel(add_k.func, S((4,), jnp.float32), launch_dims=4)


def test_launch_dims_that_do_not_match_the_outputs():
    a = jnp.ones(8, jnp.float32)
    with pytest.raises(ValueError, match="do not match output 'out'"):
        evjax.warp_kernel(add_k, S((8,), jnp.float32), launch_dims=4)(a, a)
    with pytest.raises(ValueError, match="wp.tid\\(\\) returns 1"):
        evjax.warp_kernel(add_k, S((8,), jnp.float32), launch_dims=(8, 1))(a, a)
    with pytest.raises(ValueError, match="1 to 4 dimensions"):
        evjax.warp_kernel(add_k, S((8,), jnp.float32), launch_dims=(1, 1, 1, 1, 8))
    for bad in ["8", 8.0, (8, "x"), True]:
        with pytest.raises(TypeError, match="launch_dims"):
            evjax.warp_kernel(add_k, S((8,), jnp.float32), launch_dims=bad)
    with pytest.raises(ValueError, match="non-negative"):
        evjax.warp_kernel(add_k, S((8,), jnp.float32), launch_dims=-1)
    # the check can be waived by a kernel that knows better
    out = evjax.warp_kernel(add_k, S((8,), jnp.float32), launch_dims=8, check_launch_dims=False)(a, a)
    np.testing.assert_array_equal(out, 2 * np.ones(8))


def test_dtype_and_rank_mismatches():
    a = jnp.ones(8, jnp.float32)
    call = _add(8)
    with pytest.raises(TypeError, match="argument 'b' is annotated wp.array\\(dtype=float32.*gets int32"):
        call(a, a.astype(jnp.int32))
    with pytest.raises(TypeError, match="argument 'a'.*2-d"):
        evjax.warp_kernel(add_k, S((2, 4), jnp.float32), launch_dims=2, check_launch_dims=False)(
            a.reshape(2, 4), a
        )
    with pytest.raises(TypeError, match="output 'out'.*float64"):
        with jax.enable_x64(True):
            evjax.warp_kernel(add_k, S((8,), jnp.float64), launch_dims=8)(a, a)
    with pytest.raises(TypeError, match="takes 2 arrays"):
        call(a)
    with pytest.raises(TypeError, match="cannot take"):
        call(a, a.astype(jnp.bfloat16))


def test_bad_parameters_and_options():
    with pytest.raises(TypeError, match="'alpha'.*must be a wp.array"):
        evjax.warp_kernel(scalar_param_k, S((4,), jnp.float32), launch_dims=4)
    with pytest.raises(ValueError, match="not parameters"):
        evjax.warp_kernel(scatter_k, [], launch_dims=4, in_out_argnames=["nope"])
    with pytest.raises(ValueError, match="pure output"):
        evjax.warp_kernel(add_k, S((4,), jnp.float32), launch_dims=4, in_out_argnames=["out"])
    with pytest.raises(TypeError, match="return nothing"):
        evjax.warp_kernel(add_k, [], launch_dims=4)
    with pytest.raises(ValueError, match="vmap_method"):
        evjax.warp_kernel(add_k, S((4,), jnp.float32), launch_dims=4, vmap_method="broadcast_all")


def test_missing_warp_names_the_extra(monkeypatch):
    monkeypatch.setattr(bridge, "_warp", None)
    monkeypatch.setitem(sys.modules, "warp", None)  # `import warp` now raises ImportError
    with pytest.raises(ImportError, match=r"pip install evjax\[warp\]"):
        evjax.jaxtype_to_warptype(jnp.float32)
    with pytest.raises(bridge.WarpNotInstalledError):
        evjax.warp_kernel(add_k, S((4,), jnp.float32), launch_dims=4)


# ---------------------------------------------------------------------------
# laziness and the kernel cache folder
# ---------------------------------------------------------------------------
def test_import_evjax_does_not_import_warp_and_cache_dir_is_overridable(tmp_path):
    code = textwrap.dedent(
        """
        import sys
        import evjax
        assert "warp" not in sys.modules, "import evjax imported warp"
        from evjax.backends import warp as bridge
        wp = bridge.import_warp()
        print(wp.config.kernel_cache_dir)
        """
    )
    env = dict(os.environ, EVJAX_WARP_CACHE_DIR=str(tmp_path / "wc"), PYTHONPATH=ROOT)
    env.pop("WARP_CACHE_PATH", None)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1].startswith(str(tmp_path / "wc"))  # Warp adds /<version>


# ---------------------------------------------------------------------------
# XLACustomKernel registration
# ---------------------------------------------------------------------------
def _warp_add_generator(outs, ins):
    n = outs[0].shape[0]
    call = evjax.warp_kernel(add_k, outs[0], launch_dims=n)
    return lambda a, b: [call(a, b)]


def test_def_warp_kernel_registers_cpu_and_gpu_and_is_selectable():
    op = evjax.XLACustomKernel("test_warp_add_op")
    op.def_warp_kernel(_warp_add_generator)
    op.def_reference(lambda a, b, outs: [a + b])
    assert op.backends("cpu") == ["warp", "reference"] and op.backends("gpu") == ["warp", "reference"]
    assert op.defaults == {"cpu": "warp", "gpu": "warp"}
    a = jnp.arange(5, dtype=jnp.float32)
    out = jax.jit(lambda a, b: op(a, b, outs=[S((5,), jnp.float32)], backend="warp")[0])(a, a)
    np.testing.assert_array_equal(out, 2 * np.arange(5))


def test_multi_backend_op_numba_default_warp_selectable():
    import numba

    @numba.njit
    def add_numba(a, b, out):
        for i in range(out.size):
            out[i] = a[i] + b[i] + 100.0  # tells the backends apart

    op = evjax.XLACustomKernel("test_warp_multi_backend")
    op.def_numba_kernel(lambda outs, ins: (lambda a, b: [evjax.numba_kernel(add_numba, outs[0])(a, b)]))
    op.def_warp_kernel(_warp_add_generator)
    assert op.defaults["cpu"] == "numba"
    a = jnp.arange(3, dtype=jnp.float32)
    outs = [S((3,), jnp.float32)]
    np.testing.assert_array_equal(op(a, a, outs=outs)[0], 2 * np.arange(3) + 100)
    np.testing.assert_array_equal(op(a, a, outs=outs, backend="warp")[0], 2 * np.arange(3))
    with evjax.use_backend("warp"):
        np.testing.assert_array_equal(jax.jit(lambda a: op(a, a, outs=outs)[0])(a), 2 * np.arange(3))


# ---------------------------------------------------------------------------
# CUDA (skipped without a GPU)
# ---------------------------------------------------------------------------
@pytest.mark.gpu
def test_cuda_pure_and_in_out_on_xla_stream():
    gpu = jax.devices("gpu")[0]
    a = jax.device_put(jnp.arange(1000, dtype=jnp.float32), gpu)
    out = jax.jit(_add(1000))(a, a)
    assert out.devices() == {gpu}
    np.testing.assert_allclose(np.asarray(out), 2 * np.arange(1000))
    rng = np.random.default_rng(0)
    values = jax.device_put(jnp.asarray(rng.standard_normal(5000), jnp.float32), gpu)
    targets = jax.device_put(jnp.asarray(rng.integers(0, 50, 5000), jnp.int32), gpu)
    call = evjax.warp_kernel(scatter_k, [], launch_dims=5000, in_out_argnames=["acc"])
    (acc,) = jax.jit(call)(values, targets, jax.device_put(jnp.zeros(50, jnp.float32), gpu))
    expected = np.zeros(50, np.float32)
    np.add.at(expected, np.asarray(targets), np.asarray(values))
    np.testing.assert_allclose(np.asarray(acc), expected, rtol=1e-4, atol=1e-4)
    text = jax.jit(_add(1000)).lower(a, a).as_text()
    assert bridge.CUDA_TARGET in text


@pytest.mark.gpu
def test_cuda_vmap_and_loops_under_jit():
    gpu = jax.devices("gpu")[0]
    f = _add(64)
    a = jax.device_put(jnp.arange(64 * 3, dtype=jnp.float32).reshape(3, 64), gpu)

    @jax.jit
    def loop(x):
        return jax.lax.fori_loop(0, 5, lambda _, y: f(y, y), x)

    np.testing.assert_allclose(np.asarray(jax.vmap(loop)(a)), np.asarray(a) * 32)


def _family_calls(rng):
    """One call of each family's main ops, ``backend -> result``, on the default device."""
    n_pre, n_post, k = 300, 200, 6
    w = np.where(rng.random((n_pre, n_post)) < 0.05, rng.standard_normal((n_pre, n_post)), 0.0).astype(np.float32)
    indptr = jnp.asarray(np.concatenate([[0], np.cumsum((w != 0).sum(1))]), jnp.int32)
    indices = jnp.asarray(np.nonzero(w)[1], jnp.int32)
    data = jnp.asarray(w[w != 0])
    shape = (n_pre, n_post)
    spikes = jnp.asarray(rng.random(n_pre) < 0.1)
    spikes_mm = jnp.asarray(rng.random((n_pre, k)) < 0.1)
    v = jnp.asarray(rng.standard_normal(n_post), jnp.float32)
    dense = jnp.asarray(w)
    u = jnp.asarray(rng.standard_normal(n_pre), jnp.float32)
    return {
        "binary_csrmv": lambda be: evjax.binary_csrmv(data, indices, indptr, spikes, shape=shape, transpose=True,
                                                      backend=be),
        "binary_csrmm": lambda be: evjax.binary_csrmm(data, indices, indptr, spikes_mm, shape=shape, transpose=True,
                                                      backend=be),
        "csrmv grad": lambda be: jax.grad(lambda d: evjax.csrmv(d, indices, indptr, v, shape=shape,
                                                                backend=be).sum())(data),
        "binary_csrmv vmap": lambda be: jax.vmap(lambda s: evjax.binary_csrmv(
            data, indices, indptr, s, shape=shape, transpose=True, backend=be))(spikes_mm.T),
        "binary_densemv": lambda be: evjax.binary_densemv(dense, spikes, transpose=True, backend=be),
        "binary_densemv grad": lambda be: jax.grad(lambda m: evjax.binary_densemv(
            m, spikes, transpose=True, backend=be).sum())(dense),
        "binary_jitsmv": lambda be: evjax.binary_jitsmv(0.5, 0.1, spikes, 7, shape=shape, transpose=True,
                                                        backend=be),
        "jitnmv": lambda be: evjax.jitnmv(0.0, 1.0, 0.1, v, 7, shape=shape, backend=be),
        "update_csr_on_binary_pre": lambda be: evjax.update_csr_on_binary_pre(
            data, indices, indptr, spikes, v * 0.1, -1.0, 1.0, shape=shape, backend=be),
        "csr_delay_deliver": lambda be: evjax.csr_delay_deliver(
            jnp.zeros((8, n_post)), spikes, data, indices, indptr, (indices % 7) + 1, 5, shape=shape, backend=be),
        "csr_delay_deliver grad": lambda be: jax.grad(lambda d: (evjax.csr_delay_deliver(
            jnp.zeros((8, n_post)), spikes, d, indices, indptr, (indices % 7) + 1, 5, shape=shape,
            backend=be) ** 2).sum())(data),
        "csrmv_dt2t": lambda be: evjax.csrmv_dt2t(u, data, indices, indptr, shape=shape, backend=be),
    }


@pytest.mark.gpu
def test_every_family_on_the_warp_backend_matches_the_reference_on_the_gpu():
    for name, call in _family_calls(np.random.default_rng(3)).items():
        got = jax.jit(lambda call=call: call("warp"))()
        assert got.devices() == {jax.devices("gpu")[0]}, name
        np.testing.assert_allclose(got, call("reference"), rtol=1e-4, atol=1e-4, err_msg=name)

"""numba_cuda_kernel / numba_cuda_callable and the CSR CUDA kernels on a real GPU.

Every test here is marked ``gpu`` and skipped without one (tests/conftest.py).
"""
from __future__ import annotations

import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numba
import numpy as np
import pytest

from evjax import numba_cuda_callable, numba_cuda_kernel
from evjax.backends import numba_cuda as bridge
from tests.helpers import CUDA_TESTS_ON_GPU_ENV, HANG_GUARD_S

pytestmark = pytest.mark.gpu

if bridge.gpu_devices():  # numba.cuda only where it can be used
    from numba import cuda

    @cuda.jit
    def axpy(a, x, y, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = a[0] * x[i] + y[i]

    @cuda.jit
    def outer(u, v, out):
        i, j = cuda.grid(2)
        if i < out.shape[0] and j < out.shape[1]:
            out[i, j] = u[i] * v[j]

    @cuda.jit
    def gather(table, idx, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = table[idx[i]]

    @cuda.jit
    def count(values, zeros, counts):
        i = cuda.grid(1)
        if i < values.size:
            cuda.atomic.add(counts, values[i], 1)

    @cuda.jit
    def dynamic_reverse(x, out):
        buf = cuda.shared.array(0, numba.float32)
        t = cuda.threadIdx.x
        i = cuda.grid(1)
        buf[t] = x[i]
        cuda.syncthreads()
        out[i] = buf[cuda.blockDim.x - 1 - t]

    @cuda.jit
    def double(x, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = 2 * x[i]


@pytest.fixture(params=["compiled", "python"])
def launch_path(request, monkeypatch):
    monkeypatch.setenv(bridge.LAUNCH_ENV, request.param)
    return request.param


def test_one_and_two_dimensional_kernels(launch_path):
    x = jnp.arange(1000, dtype=jnp.float32)
    call = numba_cuda_kernel(axpy, jax.ShapeDtypeStruct((1000,), jnp.float32), launch_dims=1000)
    a = jnp.array([3.0], jnp.float32)
    np.testing.assert_allclose(call(a, x, x), 4 * x)
    np.testing.assert_allclose(jax.jit(call)(a, x, 1 + x), 1 + 4 * x)
    u, v = jnp.arange(37, dtype=jnp.float32), jnp.arange(53, dtype=jnp.float32)
    o = numba_cuda_kernel(outer, jax.ShapeDtypeStruct((37, 53), jnp.float32), launch_dims=(37, 53))
    np.testing.assert_allclose(jax.jit(o)(u, v), jnp.outer(u, v))


def test_handler_kind_follows_the_launch_path(launch_path):
    call = numba_cuda_kernel(double, jax.ShapeDtypeStruct((64,), jnp.float32), launch_dims=64)
    np.testing.assert_allclose(call(jnp.ones(64, jnp.float32)), 2.0)
    specs = [((64,), np.dtype(np.float32))]
    handler = bridge.kernel_handler(double, specs, specs, (1, 1, 1), (256, 1, 1), 0, "test")
    expected = "compiled" if (launch_path == "compiled" and len(bridge.gpu_devices()) == 1) else "python"
    assert handler.kind == expected


def test_vmap_is_correct_for_index_driven_kernels(launch_path):
    table = jnp.arange(100, dtype=jnp.float32)
    idx = jnp.asarray(np.random.default_rng(0).integers(0, 100, (6, 32)), jnp.int32)
    call = numba_cuda_kernel(gather, jax.ShapeDtypeStruct((32,), jnp.float32), launch_dims=32)
    np.testing.assert_allclose(jax.jit(jax.vmap(call, in_axes=(None, 0)))(table, idx), table[idx])


def test_aliased_zeros_and_atomics(launch_path):
    values = jnp.asarray(np.random.default_rng(1).integers(0, 7, 5000), jnp.int32)
    call = numba_cuda_kernel(count, jax.ShapeDtypeStruct((7,), jnp.int32), launch_dims=5000,
                             input_output_aliases={1: 0})
    np.testing.assert_array_equal(jax.jit(call)(values, jnp.zeros(7, jnp.int32)), jnp.bincount(values, length=7))


def test_dynamic_shared_memory_and_its_limit(launch_path):
    x = jnp.arange(512, dtype=jnp.float32)
    call = numba_cuda_kernel(dynamic_reverse, jax.ShapeDtypeStruct((512,), jnp.float32), grid=4, block=128,
                             shared_mem=128 * 4)
    np.testing.assert_allclose(call(x), x.reshape(4, 128)[:, ::-1].reshape(-1))
    big = numba_cuda_kernel(dynamic_reverse, jax.ShapeDtypeStruct((512,), jnp.float32), grid=4, block=128,
                            shared_mem=80 * 1024)  # above 48 KiB: opt-in
    lib = bridge.libcuda()
    optin = lib.device_attribute(bridge.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 0)
    if optin >= 80 * 1024:
        np.testing.assert_allclose(big(x), x.reshape(4, 128)[:, ::-1].reshape(-1))
    too_big = numba_cuda_kernel(dynamic_reverse, jax.ShapeDtypeStruct((512,), jnp.float32), grid=4, block=128,
                                shared_mem=min(optin + 1024, bridge.MAX_SHARED_MEM_ANY_GPU))
    if optin + 1024 <= bridge.MAX_SHARED_MEM_ANY_GPU:
        with pytest.raises(ValueError, match="bytes per block this GPU allows"):
            too_big(x)


def test_callable_with_scratch_under_jit_and_vmap():
    def two_steps(x, out, tmp, stream):
        n = x.shape[0]
        blocks = math.ceil(n / 128)
        double[blocks, 128, stream](x, tmp)
        double[blocks, 128, stream](tmp, out)

    spec = jax.ShapeDtypeStruct((300,), jnp.float32)
    call = numba_cuda_callable(two_steps, spec, scratch=[spec])
    x = jnp.arange(300, dtype=jnp.float32)
    np.testing.assert_allclose(jax.jit(call)(x), 4 * x)
    np.testing.assert_allclose(jax.vmap(call)(jnp.stack([x, -x])), 4 * jnp.stack([x, -x]))


def test_callable_errors_become_exceptions():
    def broken(x, out, stream):
        raise ValueError("no such block size")

    with pytest.raises(Exception, match="no such block size"):
        jax.block_until_ready(numba_cuda_callable(broken, jax.ShapeDtypeStruct((4,), jnp.float32))(jnp.ones(4)))


def test_tutorial_runs_fully_on_the_gpu():
    from tests.helpers import run_numba_cuda_tutorial

    namespace = run_numba_cuda_tutorial(include_gpu=True)
    assert namespace["ON_GPU"] is True


@pytest.mark.parametrize("homogeneous", [False, True])
def test_csr_ops_numba_cuda_backend_matches_reference(homogeneous):
    import evjax

    rng = np.random.default_rng(2)
    n_pre, n_post, k = 400, 300, 8
    w = np.where(rng.random((n_pre, n_post)) < 0.05, rng.standard_normal((n_pre, n_post)), 0.0).astype(np.float32)
    indptr = jnp.asarray(np.concatenate([[0], np.cumsum((w != 0).sum(1))]), jnp.int32)
    indices = jnp.asarray(np.nonzero(w)[1], jnp.int32)
    data = jnp.array([0.3], jnp.float32) if homogeneous else jnp.asarray(w[w != 0])
    shape = (n_pre, n_post)
    spikes = jnp.asarray(rng.random(n_pre) < 0.1)
    v = jnp.asarray(rng.standard_normal(n_post), jnp.float32)
    spikes_mm = jnp.asarray(rng.random((n_pre, k)) < 0.1)
    b = jnp.asarray(rng.standard_normal((n_post, k)), jnp.float32)
    calls = [
        lambda be: evjax.binary_csrmv(data, indices, indptr, spikes, shape=shape, transpose=True, backend=be),
        lambda be: evjax.csrmv(data, indices, indptr, v, shape=shape, transpose=False, backend=be),
        lambda be: evjax.binary_csrmm(data, indices, indptr, spikes_mm, shape=shape, transpose=True, backend=be),
        lambda be: evjax.csrmm(data, indices, indptr, b, shape=shape, transpose=False, backend=be),
        lambda be: jax.vmap(lambda s: evjax.binary_csrmv(data, indices, indptr, s, shape=shape, transpose=True,
                                                         backend=be))(spikes_mm.T),
        lambda be: jax.grad(lambda d: evjax.csrmv(d, indices, indptr, v, shape=shape, backend=be).sum())(data),
    ]
    for i, call in enumerate(calls):
        got = jax.jit(lambda: call("numba_cuda"))()
        want = call("reference")
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"case {i}")


def test_the_simulator_tests_of_every_family_on_the_gpu():
    """tests/cudasim (CSR, dense, fixed, JITC through the property harness, and the CSR kernels
    launched directly) on the device instead of the simulator, in a separate process."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, CUDA_TESTS_ON_GPU_ENV: "1", "PYTHONPATH": path}
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/cudasim"],
                            cwd=root, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and " failed" not in result.stdout

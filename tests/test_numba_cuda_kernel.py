"""numba_cuda_kernel / numba_cuda_callable on a machine without a GPU: argument
validation, launch configuration, the no-GPU error, and lazy numba.cuda."""
from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numba
import numpy as np
import pytest

import evjax
from evjax import numba_cuda_callable, numba_cuda_kernel
from evjax.backends import numba_cuda as bridge
from evjax.numba_cuda_kernel import launch_config
from tests.helpers import HANG_GUARD_S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = jax.ShapeDtypeStruct((64,), jnp.float32)
_keep_alive: list = []  # XLA holds only a handler's address: test handlers live as long as the process


def _kernel():
    from numba import cuda

    @cuda.jit
    def add_one(x, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = x[i] + 1

    return add_one


def test_import_evjax_does_not_import_numba_cuda():
    code = "import sys, evjax; evjax.numba_cuda_kernel; print('numba.cuda' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S,
                            env={**os.environ, "PYTHONPATH": ROOT})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_exported():
    assert evjax.numba_cuda_kernel is numba_cuda_kernel and evjax.numba_cuda_callable is numba_cuda_callable


@pytest.mark.parametrize(
    "kwargs, grid, block",
    [
        (dict(grid=4, block=256), (4, 1, 1), (256, 1, 1)),
        (dict(grid=(2, 3), block=(8, 8)), (2, 3, 1), (8, 8, 1)),
        (dict(launch_dims=1000), (4, 1, 1), (256, 1, 1)),
        (dict(launch_dims=1000, threads_per_block=128), (8, 1, 1), (128, 1, 1)),
        (dict(launch_dims=(64, 33)), (4, 3, 1), (16, 16, 1)),
        (dict(launch_dims=(64, 33), threads_per_block=128), (4, 5, 1), (16, 8, 1)),
        (dict(launch_dims=(10, 10, 10)), (2, 2, 3), (8, 8, 4)),
        (dict(launch_dims=0), (0, 1, 1), (256, 1, 1)),
    ],
)
def test_launch_config(kwargs, grid, block):
    assert launch_config(**kwargs) == (grid, block)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(grid=4, block=256, launch_dims=1024), ValueError, "not both"),
        (dict(launch_dims=8, block=8), ValueError, "not both"),
        (dict(), ValueError, "no launch configuration"),
        (dict(grid=4), ValueError, "go together"),
        (dict(launch_dims=100, threads_per_block=2048), ValueError, "1 to 1024"),
        (dict(launch_dims=100, threads_per_block=0), ValueError, "1 to 1024"),
        (dict(grid=1, block=(64, 32)), ValueError, "at most 1024"),
        (dict(grid=1, block=(1, 1, 128)), ValueError, "limit of 64"),
        (dict(grid=(1, 70000), block=32), ValueError, "limit of 65535"),
        (dict(launch_dims=(8, 8), threads_per_block=96), ValueError, "power of two"),
        (dict(launch_dims=(1, 2, 3, 4)), ValueError, "1 to 3"),
        (dict(launch_dims=-3), ValueError, ">= 0"),
        (dict(grid=1, block=0), ValueError, "positive"),
        (dict(grid=1.5, block=32), TypeError, "ints"),
        (dict(launch_dims=10, threads_per_block=True), TypeError, "int"),
    ],
)
def test_launch_config_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        launch_config(**kwargs)


def test_wrapper_validates_arguments():
    kernel = _kernel()
    with pytest.raises(ValueError, match="not both"):
        numba_cuda_kernel(kernel, OUT, grid=1, block=64, launch_dims=64)
    with pytest.raises(ValueError, match="no launch configuration"):
        numba_cuda_kernel(kernel, OUT)
    with pytest.raises(ValueError, match="1 to 1024"):
        numba_cuda_kernel(kernel, OUT, launch_dims=64, threads_per_block=1025)
    with pytest.raises(ValueError, match="more dynamic shared memory than any NVIDIA GPU"):
        numba_cuda_kernel(kernel, OUT, launch_dims=64, shared_mem=1 << 20)
    with pytest.raises(ValueError, match=">= 0"):
        numba_cuda_kernel(kernel, OUT, launch_dims=64, shared_mem=-1)
    with pytest.raises(TypeError, match="ShapeDtypeStruct"):
        numba_cuda_kernel(kernel, [(64,), "float32"], launch_dims=64)
    with pytest.raises(TypeError, match="ShapeDtypeStruct"):
        numba_cuda_kernel(kernel, jnp.float32, launch_dims=64)
    with pytest.raises(TypeError, match="empty"):
        numba_cuda_kernel(kernel, [], launch_dims=64)
    with pytest.raises(ValueError, match="vmap_method"):
        numba_cuda_kernel(kernel, OUT, launch_dims=64, vmap_method="broadcast_all")


def test_wrapper_rejects_non_cuda_kernels():
    @numba.njit
    def cpu_kernel(x, out):
        out[:] = x

    with pytest.raises(TypeError, match="evjax.numba_kernel"):
        numba_cuda_kernel(cpu_kernel, OUT, launch_dims=64)
    with pytest.raises(TypeError, match=r"@numba.cuda.jit"):
        numba_cuda_kernel(lambda x, out: None, OUT, launch_dims=64)

    from numba import cuda

    @cuda.jit(device=True)
    def helper(x):
        return x + 1

    with pytest.raises(TypeError, match="device function"):
        numba_cuda_kernel(helper, OUT, launch_dims=64)


def test_callable_validates_arguments():
    with pytest.raises(TypeError, match="Python function"):
        numba_cuda_callable(42, OUT)
    with pytest.raises(TypeError, match="numba_cuda_kernel"):
        numba_cuda_callable(_kernel(), OUT)
    with pytest.raises(TypeError, match="ShapeDtypeStruct"):
        numba_cuda_callable(lambda x, out, stream: None, OUT, scratch=[(4,)])


@pytest.mark.skipif(bool(bridge.gpu_devices()), reason="this machine has a GPU")
def test_calling_without_a_gpu_names_the_cpu_backends():
    call = numba_cuda_kernel(_kernel(), OUT, launch_dims=64)
    x = jnp.zeros(64, jnp.float32)
    for attempt in (lambda: call(x), lambda: jax.jit(call)(x)):
        with pytest.raises(RuntimeError, match="needs an NVIDIA GPU") as info:
            attempt()
        assert "backend='numba'" in str(info.value) and "backend='warp'" in str(info.value)
        assert "NUMBA_ENABLE_CUDASIM" in str(info.value)
    func = numba_cuda_callable(lambda x, out, stream: None, OUT)
    with pytest.raises(RuntimeError, match="numba_cuda_callable.*needs an NVIDIA GPU"):
        func(x)


def test_call_checks_arity_and_dtypes_before_anything_else():
    call = numba_cuda_kernel(_kernel(), OUT, launch_dims=64)
    x = jnp.zeros(64, jnp.float32)
    with pytest.raises(TypeError, match="takes 2 arguments"):
        call(x, x)
    func = numba_cuda_callable(lambda x, out: None, OUT)
    with pytest.raises(TypeError, match="and the stream"):
        func(x)
    with pytest.raises(TypeError, match="bfloat16"):
        call(x.astype(jnp.bfloat16))
    aliased = numba_cuda_kernel(_kernel(), OUT, launch_dims=64, input_output_aliases={0: 0})
    with pytest.raises(ValueError, match="must match output"):
        aliased(jnp.zeros(32, jnp.float32))


def test_raw_kernel_has_no_derivative():
    call = numba_cuda_kernel(_kernel(), OUT, launch_dims=64)
    with pytest.raises(TypeError, match="XLACustomKernel"):
        jax.jvp(call, (jnp.zeros(64, jnp.float32),), (jnp.ones(64, jnp.float32),))


@pytest.mark.parametrize("n_rows, k", [(0, 4), (7, 1), (5, 3), (10_000_000, 64), (3, 100_000)])
def test_csr_mm_launch_covers_the_output_within_cuda_limits(n_rows, k):
    from evjax.primitives.csr.numba_cuda import mm_launch

    grid, block = mm_launch(n_rows, k)
    grid3, block3 = launch_config(grid=grid, block=block)  # raises beyond CUDA's limits
    assert grid3[0] * block3[1] >= n_rows and grid3[1] * block3[0] >= k
    assert block3[0] * block3[1] == 256 and block3[0] <= 32


def test_ffi_plumbing_under_jit_and_vmap_with_host_handlers(monkeypatch):
    """The wrappers' path through jax.ffi (scratch outputs dropped, aliases, vmap,
    jit), with handlers registered on CPU that run numpy code on host views in
    place of CUDA launches."""
    sys.path.insert(0, os.path.dirname(__file__))
    from numba_cuda_fakes import HostViews

    monkeypatch.setattr(bridge, "simulator_enabled", lambda: False)
    monkeypatch.setattr(bridge, "require_gpu", lambda who: None)
    real_callable_handler = bridge.callable_handler

    def callable_on_cpu(func, in_specs, out_specs, who):
        return real_callable_handler(func, in_specs, out_specs, who, platform="cpu", views=HostViews,
                                     stream_of=lambda frame: (0, 0), wrap_stream=lambda stream: None)

    class AddInto:  # stands for a compiled kernel: out (aliased to zeros) += x
        def launch(self, arrays, grid, block, stream, shared):
            arrays[2][...] += arrays[0]

    def kernel_on_cpu(kernel, in_specs, out_specs, grid, block, shared_mem, who):
        specs = list(in_specs) + list(out_specs)
        run = bridge.PythonLaunch(AddInto(), HostViews(specs), len(in_specs), len(out_specs), grid, block,
                                  shared_mem, stream_of=lambda frame: (0, 0), wrap_stream=lambda s: s)
        handler = bridge.PythonHandler(who, run, platform="cpu")
        _keep_alive.append(bridge.Handler(handler.target_name, "python", handler.address, [handler],
                                          handler.attributes))
        return _keep_alive[-1]

    monkeypatch.setattr(bridge, "callable_handler", callable_on_cpu)
    monkeypatch.setattr(bridge, "kernel_handler", kernel_on_cpu)

    def twice_plus_one(x, out, tmp, stream):
        tmp[...] = 2 * x
        out[...] = tmp + 1

    spec = jax.ShapeDtypeStruct((5,), jnp.float32)
    call = numba_cuda_callable(twice_plus_one, spec, scratch=[spec])
    x = jnp.arange(5, dtype=jnp.float32)
    assert call(x).shape == (5,)
    np.testing.assert_allclose(jax.jit(call)(x), 2 * x + 1)
    batch = jnp.stack([x, -x, 3 * x])
    np.testing.assert_allclose(jax.vmap(call)(batch), 2 * batch + 1)

    from numba import cuda

    @cuda.jit
    def add_into_kernel(x, zeros, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] += x[i]

    add_into = numba_cuda_kernel(add_into_kernel, spec, launch_dims=5, input_output_aliases={1: 0})
    np.testing.assert_allclose(jax.jit(add_into)(x, jnp.zeros(5, jnp.float32)), x)
    np.testing.assert_allclose(jax.jit(jax.vmap(add_into, in_axes=(0, None)))(batch, jnp.ones(5, jnp.float32)),
                               batch + 1)

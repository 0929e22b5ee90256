"""numba_cuda_kernel / numba_cuda_callable semantics, run in Numba's CUDA simulator.

The wrappers execute the kernels in the simulator through jax.pure_callback
when NUMBA_ENABLE_CUDASIM=1: launch configurations, shared memory, several
outputs, multi-kernel callables with temporaries, jit and vmap are checked
here against jnp.  Sizes are tiny: the simulator runs a Python thread per
CUDA thread.
"""
from __future__ import annotations

import math
import os

import jax
import jax.numpy as jnp
import numba
import numpy as np
import pytest
from numba import cuda

from evjax import XLACustomKernel, numba_cuda_callable, numba_cuda_kernel

from tests.helpers import cuda_kernel_tests_on_simulator

ON_SIMULATOR = cuda_kernel_tests_on_simulator()

f32 = jnp.float32


@cuda.jit
def add(x, y, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] + y[i]


@cuda.jit
def split(x, pos, neg):
    i = cuda.grid(1)
    if i < x.size:
        pos[i] = max(x[i], 0.0)
        neg[i] = min(x[i], 0.0)


@cuda.jit
def hadamard(a, b, c):
    i, j = cuda.grid(2)
    if i < c.shape[0] and j < c.shape[1]:
        c[i, j] = a[i, j] * b[i, j]


@cuda.jit
def scale3(a, out):
    i, j, k = cuda.grid(3)
    if i < out.shape[0] and j < out.shape[1] and k < out.shape[2]:
        out[i, j, k] = 2 * a[i, j, k] + i


BLOCK = 32


@cuda.jit
def block_sums(x, sums):
    shared = cuda.shared.array(BLOCK, numba.float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    shared[t] = x[i] if i < x.size else 0.0
    cuda.syncthreads()
    step = BLOCK // 2
    while step > 0:
        if t < step:
            shared[t] += shared[t + step]
        cuda.syncthreads()
        step //= 2
    if t == 0:
        sums[cuda.blockIdx.x] = shared[0]


@cuda.jit
def reverse_in_block(x, out):
    buf = cuda.shared.array(0, numba.float32)  # dynamic: size from shared_mem
    t = cuda.threadIdx.x
    n = cuda.blockDim.x
    i = cuda.grid(1)
    buf[t] = x[i]
    cuda.syncthreads()
    out[i] = buf[n - 1 - t]


@cuda.jit
def gather(table, idx, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = table[idx[i]]


@cuda.jit
def half_written(out):
    i = cuda.grid(1)
    if i < out.size // 2:
        out[i] = 1.0


@cuda.jit
def accumulate(x, acc_in, acc_out):
    i = cuda.grid(1)
    if i < x.size:
        cuda.atomic.add(acc_out, x[i] % acc_out.size, 1.0)


@cuda.jit
def square(x, tmp):
    i = cuda.grid(1)
    if i < tmp.size:
        tmp[i] = x[i] * x[i]


@cuda.jit
def root(tmp, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = math.sqrt(tmp[i])


def test_one_dimensional_launches_and_jit():
    x = jnp.arange(40, dtype=f32)
    by_grid = numba_cuda_kernel(add, jax.ShapeDtypeStruct((40,), f32), grid=2, block=32)
    by_dims = numba_cuda_kernel(add, jax.ShapeDtypeStruct((40,), f32), launch_dims=40, threads_per_block=16)
    np.testing.assert_array_equal(by_grid(x, x), 2 * x)
    np.testing.assert_array_equal(jax.jit(by_dims)(x, 1 + x), 1 + 2 * x)


def test_too_small_a_launch_leaves_outputs_unwritten():
    short = numba_cuda_kernel(add, jax.ShapeDtypeStruct((40,), f32), grid=1, block=32)
    out = np.asarray(short(jnp.ones(40, f32), jnp.ones(40, f32)))
    np.testing.assert_array_equal(out[:32], 2.0)
    assert np.isnan(out[32:]).all()  # uninitialised, as a GPU buffer would be


def test_several_outputs():
    x = jnp.linspace(-2, 2, 24, dtype=f32)
    outs = [jax.ShapeDtypeStruct((24,), f32)] * 2
    pos, neg = numba_cuda_kernel(split, outs, launch_dims=24, threads_per_block=32)(x)
    np.testing.assert_array_equal(pos, jnp.maximum(x, 0))
    np.testing.assert_array_equal(neg, jnp.minimum(x, 0))
    single = numba_cuda_kernel(split, outs[:1] + outs[1:], launch_dims=24)
    assert isinstance(single(x), tuple)


def test_two_and_three_dimensional_launches():
    a = jnp.arange(7 * 5, dtype=f32).reshape(7, 5)
    c = numba_cuda_kernel(hadamard, jax.ShapeDtypeStruct((7, 5), f32), launch_dims=(7, 5), threads_per_block=64)
    np.testing.assert_array_equal(c(a, a + 1), a * (a + 1))
    b = jnp.arange(3 * 4 * 5, dtype=f32).reshape(3, 4, 5)
    d = numba_cuda_kernel(scale3, jax.ShapeDtypeStruct((3, 4, 5), f32), launch_dims=(3, 4, 5), threads_per_block=64)
    np.testing.assert_array_equal(d(b), 2 * b + jnp.arange(3, dtype=f32)[:, None, None])


def test_static_and_dynamic_shared_memory():
    x = jnp.arange(70, dtype=f32)
    sums = numba_cuda_kernel(block_sums, jax.ShapeDtypeStruct((3,), f32), grid=3, block=BLOCK)(x)
    np.testing.assert_array_equal(sums, [x[:32].sum(), x[32:64].sum(), x[64:].sum()])
    y = jnp.arange(32, dtype=f32)
    rev = numba_cuda_kernel(reverse_in_block, jax.ShapeDtypeStruct((32,), f32), grid=2, block=16, shared_mem=16 * 4)
    np.testing.assert_array_equal(rev(y), jnp.concatenate([y[:16][::-1], y[16:][::-1]]))


def test_vmap_runs_an_index_driven_kernel_once_per_example():
    table = jnp.arange(10, dtype=f32) * 10
    idx = jnp.array([[0, 1, 2, 3], [9, 8, 7, 6], [5, 5, 5, 5]], jnp.int32)
    call = numba_cuda_kernel(gather, jax.ShapeDtypeStruct((4,), f32), launch_dims=4, threads_per_block=32)
    np.testing.assert_array_equal(jax.vmap(call, in_axes=(None, 0))(table, idx), table[idx])
    tables = jnp.stack([table, -table, table + 1])
    np.testing.assert_array_equal(jax.jit(jax.vmap(call))(tables, idx), jnp.take_along_axis(tables, idx, 1))


def test_input_output_alias_accumulates_into_zeros():
    x = jnp.array([0, 1, 1, 3, 3, 3, 4], jnp.int32)
    call = numba_cuda_kernel(accumulate, jax.ShapeDtypeStruct((4,), f32), launch_dims=7, threads_per_block=32,
                             input_output_aliases={1: 0})
    np.testing.assert_array_equal(jax.jit(call)(x, jnp.zeros(4, f32)), [2, 2, 0, 3])


def test_callable_with_temporaries_and_scratch():
    def abs_two_kernels(x, out, stream):
        n = x.shape[0]
        tmp = cuda.device_array(n, dtype=np.float32)
        square[math.ceil(n / 32), 32, stream](x, tmp)
        root[math.ceil(n / 32), 32, stream](tmp, out)

    def abs_with_scratch(x, out, tmp, stream):
        n = x.shape[0]
        square[math.ceil(n / 32), 32, stream](x, tmp)
        root[math.ceil(n / 32), 32, stream](tmp, out)

    x = jnp.linspace(-3, 3, 20, dtype=f32)
    out = jax.ShapeDtypeStruct((20,), f32)
    np.testing.assert_allclose(numba_cuda_callable(abs_two_kernels, out)(x), jnp.abs(x), rtol=1e-6)
    with_scratch = numba_cuda_callable(abs_with_scratch, out, scratch=[jax.ShapeDtypeStruct((20,), f32)])
    np.testing.assert_allclose(jax.jit(with_scratch)(x), jnp.abs(x), rtol=1e-6)
    batch = jnp.stack([x, 2 * x])
    np.testing.assert_allclose(jax.vmap(with_scratch)(batch), jnp.abs(batch), rtol=1e-6)


def test_callable_exceptions_propagate():
    def broken(x, out, stream):
        raise ValueError("bad block size")

    with pytest.raises(Exception, match="bad block size"):
        jax.block_until_ready(numba_cuda_callable(broken, jax.ShapeDtypeStruct((4,), f32))(jnp.ones(4, f32)))


def test_unwritten_integer_outputs_are_garbage_not_zero():
    call = numba_cuda_kernel(half_written, jax.ShapeDtypeStruct((8,), jnp.int32), launch_dims=8)
    out = np.asarray(call())
    assert (out[:4] == 1).all() and (out[4:] == 0x5A5A5A5A).all()


def test_generator_registered_with_def_numba_cuda_kernel():
    def generator(outs, ins, alpha):
        n = outs[0].shape[0]
        call = numba_cuda_kernel(add, outs[0], launch_dims=n, threads_per_block=32)
        return lambda x: call(x, jnp.full(x.shape, alpha, x.dtype))

    op = XLACustomKernel("sim_add_alpha")
    op.def_numba_cuda_kernel(generator)
    assert op.backends("gpu") == ["numba_cuda"] and op.defaults["gpu"] == "numba_cuda"
    kernel = op.kernel_for("gpu", "numba_cuda", [jax.ShapeDtypeStruct((8,), f32)],
                           (jax.ShapeDtypeStruct((8,), f32),), {"alpha": 0.5})
    np.testing.assert_array_equal(kernel(jnp.arange(8, dtype=f32)), jnp.arange(8, dtype=f32) + 0.5)


def _shared_arrays_from_threads(n_threads: int):
    """``cuda.shared.array`` called from one line by threads that all switch between lookup and insert."""
    import threading
    import time

    from numba.cuda.simulator import kernelapi

    class SlowLookup(dict):
        def get(self, key, default=None):
            value = super().get(key, default)
            time.sleep(0.005)  # another thread runs between the lookup and the insert
            return value

    shared = kernelapi.FakeCUDAShared(0)
    shared._allocations = SlowLookup()
    barrier = threading.Barrier(n_threads)
    buffers = []

    def thread():
        barrier.wait()
        buffers.append(shared.array(4, np.float32))

    threads = [threading.Thread(target=thread) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = shared.array(2, np.float32)  # another line: another buffer
    second = shared.array(2, np.int32)
    return buffers, first, second


def test_shared_array_is_one_buffer_per_block_whatever_the_thread_switches():
    # Numba's simulator creates a block's shared buffer on first lookup, without a lock: threads that
    # switch in between got buffers of their own, and a warp reduction lost partial sums (a CI failure of
    # the CSR mv_gather kernel).  Every simulated launch installs evjax's locked lookup.
    from evjax import _kernel_compat

    _kernel_compat.cuda_simulator_threadsafe_shared()
    buffers, first, second = _shared_arrays_from_threads(8)
    assert len(buffers) == 8 and all(b is buffers[0] for b in buffers)
    assert first is not second and second.dtype == np.int32


@pytest.mark.skipif(not os.environ.get("EVJAX_SIM_CPU") or not hasattr(os, "sched_getaffinity"),
                    reason="started without a CPU to run on (tests/helpers.py's simulator_cpu)")
def test_the_simulator_process_runs_on_the_cpu_it_was_given():
    """tests/cudasim/conftest.py pins the main thread (hence every simulated CUDA thread) to one CPU."""
    assert os.sched_getaffinity(0) == {int(os.environ["EVJAX_SIM_CPU"])}

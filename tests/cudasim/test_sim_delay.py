"""The delay ops' Numba CUDA kernels through the property harness, in Numba's CUDA simulator (started by
tests/test_numba_cuda_sim.py), or on a GPU (tests/test_numba_cuda_gpu.py): tiny sizes, each kernel
thread is a Python thread in the simulator."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from evjax.primitives import delay
from evjax.primitives.delay import CSRDelayLayout, csr_delay_deliver, csr_delay_deliver_layout
from evjax.testing import OpSpec, check_all, random_csr
from tests.helpers import cuda_kernel_tests_on_simulator, delay_deliver_reference, delay_resampler, SIM_SKIP

ON_SIMULATOR = cuda_kernel_tests_on_simulator(delay.OPS)

BACKEND = "numba_cuda"


def _args(seed, weighted, homogeneous=False):
    rng = np.random.default_rng(seed)
    indices, indptr = random_csr(rng, 4, 3, 9)
    nnz = len(indices)
    data = rng.uniform(-1, 1, 1 if homogeneous else nnz).astype(np.float32)
    if not homogeneous:
        data[0] = np.nan  # reaches the ring only where its row is active
    events = (rng.uniform(-2, 2, 4) * (rng.random(4) < 0.6)).astype(np.float32) if weighted else rng.random(4) < 0.5
    ring = rng.uniform(-1, 1, (3, 3)).astype(np.float32)
    return ring, events, data, indices, indptr, rng.integers(0, 3, nnz).astype(np.int32), np.int32(-4), (4, 3)


@pytest.mark.parametrize("weighted, homogeneous", [(False, False), (True, False), (False, True)])
def test_deliver(weighted, homogeneous):
    def fn(ring, events, data, indices, indptr, delays, t, shape):
        return csr_delay_deliver(ring, events, data, indices, indptr, delays, t, shape=shape, weighted=weighted,
                                 backend=BACKEND)

    def reference(ring, events, data, indices, indptr, delays, t, shape):
        return delay_deliver_reference(ring, events, data, indices, indptr, delays, t, weighted)

    spec = OpSpec(fn, reference, diff_argnums=(0, 1, 2) if weighted else (0, 2), static_argnums=(7,),
                  backend=BACKEND, smooth=False, name=f"csr_delay_deliver[numba_cuda, weighted={weighted}]",
                  resample=delay_resampler(events=1, indices=3, indptr=4, delays=5, t=6, ring=0))
    args = _args(1 + weighted, weighted, homogeneous)
    if not homogeneous:  # NaN weights: forward and jvp only (a NaN cotangent would meet it in the vjp checks)
        check_all(spec, args, skip=("check_grads", "vjp", "vmap", "nested_vmap", "jit_grad_vmap"))
        args = (args[0], args[1], np.nan_to_num(args[2]), *args[3:])
    check_all(spec, args, skip=SIM_SKIP)


def test_traced_delays_clamp_and_the_layout_agrees():
    ring, events, data, indices, indptr, _, t, shape = _args(5, False)
    data = np.nan_to_num(data)
    wild = np.array([-3, 9, 1, 0, 2, 5, -1, 2, 7][:len(indices)], np.int32)
    got = jax.jit(lambda d: csr_delay_deliver(ring, events, data, indices, indptr, d, t, shape=shape,
                                              backend=BACKEND))(wild)
    want = delay_deliver_reference(ring, events, data, indices, indptr, np.clip(wild, 0, 2), t, False)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
    delays = np.clip(wild, 0, 2)
    layout = CSRDelayLayout.build(data, indices, indptr, delays, n_slots=3, shape=shape)
    laid = csr_delay_deliver_layout(ring, events, layout, t, backend=BACKEND)
    np.testing.assert_allclose(np.asarray(laid), np.asarray(want), rtol=1e-6, atol=1e-6)
    g = jax.grad(lambda w: csr_delay_deliver(ring, events, w, indices, indptr, delays, t, shape=shape,
                                             backend=BACKEND).sum())(data)
    g_ref = jax.grad(lambda w: delay_deliver_reference(ring, events, w, indices, indptr, delays, t, False).sum())(data)
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), rtol=1e-6)

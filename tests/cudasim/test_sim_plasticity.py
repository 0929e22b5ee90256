"""The plasticity ops' Numba CUDA kernel through the property harness, in Numba's CUDA simulator (started by
tests/test_numba_cuda_sim.py), or on a GPU (tests/test_numba_cuda_gpu.py): tiny sizes, each kernel
thread is a Python thread in the simulator."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import evjax
from evjax.primitives import plasticity
from evjax.testing import OpSpec, check_all, random_csr
from tests.helpers import cuda_kernel_tests_on_simulator, line_update_reference, line_update_resampler, SIM_SKIP

ON_SIMULATOR = cuda_kernel_tests_on_simulator(plasticity.OPS)

BACKEND = "numba_cuda"


def _structure(seed):
    rng = np.random.default_rng(seed)
    indices, indptr = random_csr(rng, 4, 3, 7)
    weight = rng.uniform(-1, 1, len(indices)).astype(np.float32)
    weight[0] = np.nan  # kept bit for bit where its row is silent, NaN + trace where active
    return rng, indices, indptr, weight


@pytest.mark.parametrize("bounds", [(None, None), (-0.3, 0.4)])
def test_pre_update(bounds):
    rng, indices, indptr, weight = _structure(1)

    def fn(w, indices, indptr, spikes, trace, shape):
        return evjax.update_csr_on_binary_pre(w, indices, indptr, spikes, trace, *bounds, shape=shape, backend=BACKEND)

    def reference(w, indices, indptr, spikes, trace, shape):
        return line_update_reference(w, indices, indptr, None, trace, spikes, *bounds)

    spec = OpSpec(fn, reference, diff_argnums=(0, 4), static_argnums=(5,), backend=BACKEND, smooth=False,
                  name="update_csr_on_binary_pre[numba_cuda]",
                  resample=line_update_resampler(indices=1, indptr=2, positions=None, shape=5, other_axis=1))
    args = (weight, indices, indptr, rng.random(4) < 0.5, rng.uniform(-0.5, 0.5, 3).astype(np.float32), (4, 3))
    check_all(spec, args, skip=SIM_SKIP)


def test_post_update():
    rng, indices, indptr, weight = _structure(2)
    order = sp.csr_matrix((np.arange(1, len(indices) + 1), indices, indptr), shape=(4, 3)).tocsc()
    order.sort_indices()
    c_indices, c_indptr = order.indices.astype(np.int32), order.indptr.astype(np.int32)
    weight_indices = (order.data - 1).astype(np.int32)

    def fn(w, indices, indptr, weight_indices, trace, spikes, shape):
        return evjax.update_csr_on_binary_post(w, indices, indptr, weight_indices, trace, spikes, None, 0.5,
                                               shape=shape, backend=BACKEND)

    def reference(w, indices, indptr, weight_indices, trace, spikes, shape):
        return line_update_reference(w, indices, indptr, weight_indices, trace, spikes, None, 0.5)

    spec = OpSpec(fn, reference, diff_argnums=(0, 4), static_argnums=(6,), backend=BACKEND, smooth=False,
                  name="update_csr_on_binary_post[numba_cuda]",
                  resample=line_update_resampler(indices=1, indptr=2, positions=3, shape=6, other_axis=0))
    args = (weight, c_indices, c_indptr, weight_indices, rng.uniform(-0.5, 0.5, 4).astype(np.float32),
            rng.random(3) < 0.5, (4, 3))
    check_all(spec, args, skip=SIM_SKIP)


@pytest.mark.parametrize("axis", [0, 1])
def test_dense_update(axis):
    from tests.helpers import dense_update_reference

    rng = np.random.default_rng(3 + axis)
    weight = rng.uniform(-1, 1, (3, 4)).astype(np.float32)
    weight[0, 0] = np.nan
    lines, others = (3, 4) if axis == 0 else (4, 3)
    spikes, trace = rng.random(lines) < 0.5, rng.uniform(-0.5, 0.5, others).astype(np.float32)

    def fn(w, a, b):
        if axis == 0:
            return evjax.update_dense_on_binary_pre(w, a, b, -0.3, 0.3, backend=BACKEND)
        return evjax.update_dense_on_binary_post(w, a, b, -0.3, 0.3, backend=BACKEND)

    def reference(w, a, b):
        s, t = (a, b) if axis == 0 else (b, a)
        return dense_update_reference(w, s, t, -0.3, 0.3, axis)

    spec = OpSpec(fn, reference, diff_argnums=(0, 2 if axis == 0 else 1), backend=BACKEND, smooth=False,
                  name=f"update_dense[{axis}, numba_cuda]")
    check_all(spec, (weight, spikes, trace) if axis == 0 else (weight, trace, spikes),
              skip=SIM_SKIP)

"""The compact family's and the listed CSR scatter's Numba CUDA kernels through the property harness, in
Numba's CUDA simulator (started by tests/test_numba_cuda_sim.py), or on a GPU (tests/test_numba_cuda_gpu.py):
tiny sizes, each kernel thread is a Python thread in the simulator."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import evjax
from evjax.primitives import compact, csr
from evjax.primitives.compact import active_list
from evjax.testing import OpSpec, check_all, csr_resampler, random_csr
from tests.helpers import cuda_kernel_tests_on_simulator, structural_matmul, SIM_SKIP

ON_SIMULATOR = cuda_kernel_tests_on_simulator(compact.OPS + csr.OPS)

BACKEND = "numba_cuda"


def test_active_list_rows_and_vmap():
    rng = np.random.default_rng(0)
    x = (rng.random((3, 11)) < 0.4) * rng.choice([-1.0, 2.0], size=(3, 11))
    for rows in (x, x[0]):
        ids, count = jax.jit(lambda r: active_list(r, backend=BACKEND))(jnp.asarray(rows, jnp.float32))
        for r, row in enumerate(np.atleast_2d(rows)):
            nz = np.flatnonzero(row)
            np.testing.assert_array_equal(np.atleast_2d(np.asarray(ids))[r], np.pad(nz, (0, row.size - nz.size)))
            assert int(np.asarray(count).reshape(-1)[r]) == nz.size
    ids, _ = jax.vmap(lambda r: active_list(r, backend=BACKEND))(jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(ids), np.asarray(active_list(jnp.asarray(x), backend="reference")[0]))


def test_listed_scatter_properties():
    def fn(d, i, p, x, shape):
        ids, count = active_list(x, backend=BACKEND)
        return evjax.binary_csrmv_active(d, i, p, ids, count, x, shape=shape, backend=BACKEND)

    spec = OpSpec(fn, lambda d, i, p, x, shape: structural_matmul(d, i, p, x, shape, True, True),
                  diff_argnums=(0,), static_argnums=(4,), backend=BACKEND, smooth=False, batch_size=2,
                  resample=csr_resampler(indices=1, indptr=2, shape=4), name="binary_csrmv_active[numba_cuda]")
    rng = np.random.default_rng(1)
    indices, indptr = random_csr(rng, 5, 4, 11)
    for homogeneous in (False, True):
        data = rng.uniform(-1, 1, 1 if homogeneous else len(indices)).astype(np.float32)
        x = rng.random(5) < 0.5
        check_all(spec, (data, indices, indptr, x, (5, 4)), skip=SIM_SKIP)

"""The CSR CUDA kernels with int32 ``indices`` and an int64 ``indptr`` (matrices of more than
2**31 - 1 synapses), in Numba's CUDA simulator: every forward generator and the weight gradient,
end to end under jax.jit, against dense NumPy.  Run by tests/test_validation.py."""
from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evjax.primitives.csr import numba_cuda as csr_cuda
from tests.helpers import cuda_kernel_tests_on_simulator, sddmm_numpy

ON_SIMULATOR = cuda_kernel_tests_on_simulator()

N_ROWS, N_COLS, K = 6, 5, 2
GENERATORS = {
    ("mv", False): csr_cuda.csrmv_numba_cuda,
    ("mm", False): csr_cuda.csrmm_numba_cuda,
    ("mv", True): csr_cuda.binary_csrmv_numba_cuda,
    ("mm", True): csr_cuda.binary_csrmm_numba_cuda,
}


def _structure(rng):
    mask = rng.random((N_ROWS, N_COLS)) < 0.5
    mask[1] = False  # an empty row
    indptr = np.concatenate([[0], np.cumsum(mask.sum(1))]).astype(np.int64)
    indices = np.nonzero(mask)[1].astype(np.int32)
    weights = np.where(mask, rng.uniform(0.5, 1.5, mask.shape), 0.0).astype(np.float32)
    return mask, weights, indices, indptr


@pytest.mark.parametrize("kind, event, transpose", list(itertools.product(("mv", "mm"), (False, True), (False, True))))
def test_forward_generators_take_mixed_index_dtypes(kind, event, transpose):
    rng = np.random.default_rng([kind == "mm", event, transpose])  # the same data in every process
    mask, weights, indices, indptr = _structure(rng)
    data = weights[mask]
    n_in = N_ROWS if transpose else N_COLS
    x = rng.standard_normal((n_in,) if kind == "mv" else (n_in, K)).astype(np.float32)
    if event:
        x = x > 0
    want = (weights.T if transpose else weights).astype(np.float64) @ x.astype(np.float64)
    with jax.enable_x64(True):
        outs = [jax.ShapeDtypeStruct(want.shape, np.float32)]
        ins = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (data, indices, indptr, x)]
        assert ins[1].dtype == np.int32 and ins[2].dtype == np.int64
        run = GENERATORS[(kind, event)](outs=outs, ins=ins, shape=(N_ROWS, N_COLS), transpose=transpose)
        (got,) = jax.jit(run)(data, indices, jnp.asarray(indptr, jnp.int64), x)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("matrix", [False, True])
def test_sddmm_generator_takes_mixed_index_dtypes(matrix):
    rng = np.random.default_rng(3 + matrix)
    mask, _, indices, indptr = _structure(rng)
    r = rng.standard_normal((N_ROWS, K) if matrix else (N_ROWS,)).astype(np.float32)
    q = rng.standard_normal((N_COLS, K) if matrix else (N_COLS,)).astype(np.float32)
    want = sddmm_numpy(indices, indptr, r, q)
    with jax.enable_x64(True):
        outs = [jax.ShapeDtypeStruct((indices.shape[0],), np.float32)]
        ins = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (indices, indptr, r, q)]
        (got,) = jax.jit(csr_cuda.csr_sddmm_numba_cuda(outs=outs, ins=ins, shape=(N_ROWS, N_COLS), weighted=None))(indices, jnp.asarray(indptr), r, q)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)

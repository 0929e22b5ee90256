"""The Numba CUDA backends of the CSR ops through the property harness,
in Numba's CUDA simulator (started by tests/test_numba_cuda_sim.py).

The simulator runs CUDA kernels on the host, so the ops' ``numba_cuda`` GPU
generators are registered here as a CPU backend of the same name as well
(this process only); ``backend="numba_cuda"`` then lowers to them on the CPU,
where the harness checks that they really run (a host callback into the
simulator) and compares every transform with the references that
tests/test_csr_ops.py uses (tests/helpers.py).  Sizes are tiny: each kernel
thread is a Python thread.
"""
from __future__ import annotations

import numpy as np
import pytest

from evjax.primitives import csr
from evjax.testing import check_all, random_csr
from tests.helpers import (
    OP_CASES, OP_IDS, WEIGHTED_CASES, WEIGHTED_IDS, csr_matmul_spec, csr_sddmm_spec, weighted_sddmm_spec,
    cuda_kernel_tests_on_simulator, SIM_SKIP,
)

ON_SIMULATOR = cuda_kernel_tests_on_simulator(csr.OPS)

BACKEND = "numba_cuda"


def csr_case(rank, transpose, event, seed):
    """A 4 x 3 structure with an empty row and duplicates possible; homogeneous weights on odd seeds."""
    rng = np.random.default_rng(seed)
    indices, indptr = random_csr(rng, 4, 3, 6)
    data = rng.uniform(0.5, 1.5, 1 if seed % 2 else 6).astype(np.float32)
    n_in = 3 if not transpose else 4
    shape = (n_in,) if rank == 1 else (n_in, 2)
    x = rng.random(shape) < 0.5 if event else rng.standard_normal(shape).astype(np.float32)
    return data, indices, indptr, x, (4, 3)


@pytest.mark.parametrize("rank, event, transpose", OP_CASES, ids=OP_IDS)
def test_csr_matmul_ops(rank, event, transpose):
    spec = csr_matmul_spec(rank, event, transpose, BACKEND)
    check_all(spec, csr_case(rank, transpose, event, seed=rank + 2 * transpose + 4 * event),
              skip=SIM_SKIP)


def test_csr_sddmm():
    rng = np.random.default_rng(1)
    indices, indptr = random_csr(rng, 4, 3, 6)
    r = (rng.standard_normal((4, 2)) * (rng.random((4, 2)) < 0.6)).astype(np.float32)  # silent rows skipped
    q = rng.standard_normal((3, 2)).astype(np.float32)
    check_all(csr_sddmm_spec(BACKEND), (indices, indptr, r, q, (4, 3)), skip=SIM_SKIP)


@pytest.mark.parametrize("nonfinite", [False, True], ids=["finite", "nonfinite"])
@pytest.mark.parametrize("rank, transpose", WEIGHTED_CASES, ids=WEIGHTED_IDS)
def test_csr_weighted_ops(rank, transpose, nonfinite):
    """weighted=True: graded events with zeros (a zero hides its weights), true gradient w.r.t. them."""
    data, indices, indptr, x, shape = csr_case(rank, transpose, False, seed=rank + 2 * transpose)
    x = (x * (np.random.default_rng(rank).random(x.shape) < 0.6)).astype(np.float32)
    spec = csr_matmul_spec(rank, True, transpose, BACKEND, weighted=True, nonfinite=nonfinite)
    check_all(spec, (data, indices, indptr, x, shape), skip=SIM_SKIP)


@pytest.mark.parametrize("mode", ["r", "q"])
def test_csr_weighted_sddmm(mode):
    rng = np.random.default_rng(3)
    indices, indptr = random_csr(rng, 4, 3, 6)
    r, q = ((rng.standard_normal((n, 2)) * (rng.random((n, 2)) < 0.6)).astype(np.float32) for n in (4, 3))
    check_all(weighted_sddmm_spec(mode, BACKEND), (indices, indptr, r, q, (4, 3)),
              skip=SIM_SKIP)

"""The Numba CUDA backend of the dense event ops through the property harness, in Numba's
CUDA simulator (started by tests/test_dense_cudasim.py).

As in test_sim_harness.py, the ops' ``numba_cuda`` GPU generators are registered as a
CPU backend of the same name (this process only), so ``backend="numba_cuda"`` runs the
CUDA kernels in the simulator and the harness compares every transform with the
references that tests/test_dense_ops.py uses (tests/helpers.py).  Sizes are tiny: each kernel
thread is a Python thread.
"""
from __future__ import annotations

import numpy as np
import pytest

from evjax.primitives import dense
from evjax.primitives.dense import binary_dense_outer
from evjax.testing import check_all
from tests.helpers import cuda_kernel_tests_on_simulator, dense_one_example, dense_spec

ON_SIMULATOR = cuda_kernel_tests_on_simulator(dense.OPS)

BACKEND = "numba_cuda"


# every kernel (compact, scatter, gather, outer_rows, outer_cols) with bool and weighted events;
# vmap (which runs the same kernels on a matrix of events) once
SIM_CASES = [(1, True, False, True), (1, False, True, False), (2, True, True, False), (2, False, False, False)]


@pytest.mark.parametrize("rank, transpose, weighted, vmap", SIM_CASES)
def test_dense_ops_in_simulator(rank, transpose, weighted, vmap):
    spec = dense_spec(rank, transpose, weighted, BACKEND, float_events=weighted)
    skip = ("check_grads", "nested_vmap") + (() if vmap else ("vmap", "jit_grad_vmap"))
    example = dense_one_example(rank, transpose, weighted, seed=rank + 2 * transpose)
    check_all(spec, example, skip=skip)


@pytest.mark.parametrize("transpose", [True, False])
def test_outer_selects(transpose):
    s = np.array([[False, True], [True, True], [False, False]])
    g = np.array([[np.nan, 1.0], [2.0, 3.0]], np.float32)  # g[0, 0] meets only silent events
    got = np.asarray(binary_dense_outer(s, g, transpose=transpose, backend=BACKEND))
    want = np.where(s[:, None, :], g[None, :, :], 0.0).sum(-1)
    np.testing.assert_array_equal(got, want if transpose else want.T)

"""The JITC Numba CUDA kernels in Numba's CUDA simulator (started by tests/test_jitc_cudasim.py).

The ``numba_cuda`` GPU generators are registered as a CPU backend of the same
name in this process only, so ``backend="numba_cuda"`` runs the CUDA kernels
in the simulator.  Checked: ``todense()`` is the reference's matrix (structure
bitwise, weights within 1 ulp) for every law and orientation, and the
products, gather and scatter, vector and matrix, float and events, through
the property harness.  Sizes are tiny: each CUDA thread is a Python thread.
"""
from __future__ import annotations

import numpy as np
import pytest

import evjax
from evjax.primitives import jitc
from evjax.testing import check_all
from tests.helpers import cuda_kernel_tests_on_simulator, JITC_LAWS, jitc_spec_for

ON_SIMULATOR = cuda_kernel_tests_on_simulator(jitc.OPS)

DENSE = {"scalar": (evjax.jits, (1.5,)), "normal": (evjax.jitn, (0.5, 0.25)), "uniform": (evjax.jitu, (0.1, 0.9))}


@pytest.mark.parametrize("law", list(DENSE))
def test_todense_matches_reference(law):
    fn, params = DENSE[law]
    for transpose, corder in ((False, True), (False, False), (True, True)):
        want = np.asarray(fn(*params, 0.3, 77, shape=(9, 7), transpose=transpose, corder=corder, backend="reference"))
        got = np.asarray(fn(*params, 0.3, 77, shape=(9, 7), transpose=transpose, corder=corder, backend="numba_cuda"))
        np.testing.assert_array_equal(got != 0, want != 0)
        np.testing.assert_array_max_ulp(got, want, maxulp=1)


CASES = [("normal", 1, True, False), ("uniform", 2, True, True)]


@pytest.mark.parametrize("law, rank, event, weighted", CASES)
def test_products_through_the_harness(law, rank, event, weighted):
    make = jitc_spec_for(law, rank, event, weighted=weighted, x_float=not event or weighted)
    rng = np.random.default_rng(rank)
    params = [rng.standard_normal(1).astype(np.float32) for _ in range(JITC_LAWS[law])]
    for transpose, corder in ((False, False), (True, True)):  # a scatter and a gather
        n_in = 4 if transpose else 3
        shape_x = (n_in,) if rank == 1 else (n_in, 2)
        x = rng.standard_normal(shape_x).astype(np.float32) * (rng.random(shape_x) < 0.6)
        if event and not weighted:
            x = x != 0
        args = (*params, np.array([5], np.uint32), x.astype(x.dtype), (4, 3), 0.5, transpose, corder)
        check_all(make("numba_cuda"), args, skip=("check_grads", "nested_vmap", "jit_grad_vmap", "vmap"))

"""Run tests/cudasim in a subprocess with Numba's CUDA simulator on.

NUMBA_ENABLE_CUDASIM must be set before numba is imported, which this pytest
process has already done, hence the separate process.
"""
from __future__ import annotations

import pytest
from tests.helpers import run_simulator_tests
FILES = ["test_sim_wrappers.py", "test_sim_csr.py", "test_sim_tutorial.py", "test_sim_harness.py",
         "test_sim_plasticity.py", "test_sim_delay.py", "test_sim_compact.py", "test_sim_sparse_backward.py"]


@pytest.mark.cudasim
@pytest.mark.parametrize("name", FILES)
def test_under_the_cuda_simulator(name):
    run_simulator_tests(f"{name}")

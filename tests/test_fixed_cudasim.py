"""Run tests/cudasim/test_sim_fixed.py (the fixed functions on CSR's Numba CUDA kernels) in a
subprocess with Numba's CUDA simulator on (NUMBA_ENABLE_CUDASIM must be set before numba is imported)."""
from __future__ import annotations

import pytest
from tests.helpers import run_simulator_tests


@pytest.mark.cudasim
def test_fixed_functions_under_the_cuda_simulator():
    run_simulator_tests("test_sim_fixed.py")

"""The dense family's Numba CUDA kernels in Numba's CUDA simulator (tests/cudasim/test_sim_dense.py).

NUMBA_ENABLE_CUDASIM must be set before numba is imported, hence a separate process.
"""
from __future__ import annotations

import pytest
from tests.helpers import run_simulator_tests


@pytest.mark.cudasim
def test_dense_under_the_cuda_simulator():
    run_simulator_tests("test_sim_dense.py")

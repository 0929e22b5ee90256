"""Run tests/cudasim/test_sim_jitc.py in a subprocess with Numba's CUDA simulator on.

NUMBA_ENABLE_CUDASIM must be set before numba is imported, which this pytest
process has already done, hence the separate process.
"""
from __future__ import annotations

import pytest
from tests.helpers import run_simulator_tests


@pytest.mark.cudasim
def test_jitc_under_the_cuda_simulator():
    run_simulator_tests("test_sim_jitc.py")

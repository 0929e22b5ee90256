"""Run tests/cudasim in a subprocess with Numba's CUDA simulator on.

NUMBA_ENABLE_CUDASIM must be set before numba is imported, which this pytest
process has already done, hence the separate process.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from tests.helpers import HANG_GUARD_S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = ["test_sim_wrappers.py", "test_sim_csr.py", "test_sim_tutorial.py", "test_sim_harness.py",
         "test_sim_plasticity.py", "test_sim_delay.py", "test_sim_compact.py", "test_sim_sparse_backward.py"]


@pytest.mark.cudasim
@pytest.mark.parametrize("name", FILES)
def test_under_the_cuda_simulator(name):
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": path, "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"tests/cudasim/{name}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and " failed" not in result.stdout

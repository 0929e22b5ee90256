"""docs/tutorials/numba_cuda.md runs in Numba's CUDA simulator: every code block
except those marked ```python gpu (tests/test_numba_cuda_gpu.py runs all of
them on a GPU; both through tests/helpers.py)."""
from __future__ import annotations

from tests.helpers import numba_cuda_tutorial_blocks, run_numba_cuda_tutorial


def test_tutorial_runs_in_the_simulator():
    simulated, everything = numba_cuda_tutorial_blocks(False), numba_cuda_tutorial_blocks(True)
    assert len(simulated) >= 12 and len(everything) > len(simulated)
    namespace = run_numba_cuda_tutorial(include_gpu=False)
    assert namespace["ON_GPU"] is False
    assert "lif_step" in namespace and "leaky_relu_op" in namespace

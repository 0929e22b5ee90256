"""Run tests/cudasim in a subprocess with Numba's CUDA simulator on.

NUMBA_ENABLE_CUDASIM must be set before numba is imported, which this pytest
process has already done, hence the separate process.
"""
from __future__ import annotations

import os

import pytest
from tests.helpers import run_simulator_tests, simulator_cpu

FILES = ["test_sim_wrappers.py", "test_sim_csr.py", "test_sim_tutorial.py", "test_sim_harness.py",
         "test_sim_plasticity.py", "test_sim_delay.py", "test_sim_compact.py", "test_sim_sparse_backward.py"]


@pytest.mark.cudasim
@pytest.mark.parametrize("name", FILES)
def test_under_the_cuda_simulator(name):
    run_simulator_tests(name)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs CPU affinity and two CPUs")
def test_two_workers_run_their_simulators_on_two_cpus(monkeypatch):
    cpus = []
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        cpus.append(simulator_cpu())
    assert cpus[0] != cpus[1] and set(cpus) <= os.sched_getaffinity(0)

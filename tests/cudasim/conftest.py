"""Tests of CUDA kernel logic in Numba's CUDA simulator, or on a GPU.

They run only in a process started with NUMBA_ENABLE_CUDASIM=1 (set before
numba is imported; tests/test_numba_cuda_sim.py and the *_cudasim.py tests start
those processes), or with EVJAX_CUDA_TESTS_ON_GPU=1 on a machine with a CUDA GPU
(tests/test_numba_cuda_gpu.py starts that one), where the kernels run on the
device and the modules that test the simulator itself are left out.  In a
normal pytest run this folder is skipped.
"""
import os
import sys

if os.environ.get("EVJAX_CUDA_TESTS_ON_GPU") == "1" and os.environ.get("NUMBA_ENABLE_CUDASIM", "0") in ("", "0"):
    # the simulator's own semantics (host callbacks, the tutorial's simulated blocks): real-GPU
    # counterparts are tests/test_numba_cuda_gpu.py
    collect_ignore_glob = ["test_sim_wrappers.py", "test_sim_tutorial.py"]
elif os.environ.get("NUMBA_ENABLE_CUDASIM", "0") in ("", "0"):
    collect_ignore_glob = ["test_*.py"]
else:
    # The simulator runs one Python thread per CUDA thread; switching more
    # often than CPython's default 5 ms makes it markedly faster.  A smaller
    # EVJAX_SIM_SWITCH_INTERVAL (seconds) interleaves the threads more finely:
    # a stress run for races in the kernels (a missing syncthreads, a
    # non-atomic shared update) or in the simulator.
    sys.setswitchinterval(float(os.environ.get("EVJAX_SIM_SWITCH_INTERVAL", "1e-4")))
    # The CPU that tests/helpers.py's run_in_cuda_simulator chose for this process (one per pytest
    # worker): the main thread, and so every simulated CUDA thread it starts, runs there.  Their GIL
    # hand-offs then stay on one core; spread over two busy cores they were 2.9x slower (simulator_cpu).
    if os.environ.get("EVJAX_SIM_CPU") and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(os.environ["EVJAX_SIM_CPU"])})

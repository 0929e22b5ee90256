import os

# XLA_FLAGS as the user set it (empty: unset), before this file changes it: kept in the environment,
# so that pytest-xdist workers and nested pytest runs (which see the changed value) keep the first
# one, for tests/test_smoke_user_defaults.py, which runs the README's path under a user's defaults.
USER_XLA_FLAGS_VAR = "EVJAX_USER_XLA_FLAGS"
os.environ.setdefault(USER_XLA_FLAGS_VAR, os.environ.get("XLA_FLAGS", ""))

# Tests check results, not speed: compile XLA programs with fewer optimisation
# passes, which halves compile time on CPU, and with XLA's older CPU emitters
# (fusion emitters off, one codegen split), which cut the median compile of a
# small program from 19 ms to 10-11 ms on 2 cores (2026-11-28; most of the
# suite's time is XLA compiles).  Set EVJAX_TEST_FULL_OPT=1 to keep XLA's defaults.
if not os.environ.get("EVJAX_TEST_FULL_OPT"):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + " --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
        + " --xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1"
    ).strip()

import pytest  # noqa: E402

from evjax.testing import register_profiles  # noqa: E402

# Hypothesis: HYPOTHESIS_PROFILE=default (CI, the default: a few examples per test,
# random seeds) or thorough (hundreds of examples per test); see evjax.testing.
HYPOTHESIS_PROFILE = register_profiles()


def _has_cuda_gpu() -> bool:
    try:
        import jax

        return any(d.platform == "gpu" for d in jax.devices())
    except Exception:  # noqa: BLE001
        return False


def pytest_collection_modifyitems(config, items):
    # the long tests (marked slow or cudasim: subprocesses, simulators, leak windows) first, the rest in
    # their order after them: with `-n 2 --dist loadfile --no-loadscope-reorder`, the files that hold
    # them go first, and the two workers then finish together instead of one running a long test
    # alone at the end
    items.sort(key=lambda item: not ("slow" in item.keywords or "cudasim" in item.keywords))
    if _has_cuda_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none found)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# A test marked ``fresh_process`` runs in a new Python process of its own (``python -m pytest <its id>``
# with FRESH_PROCESS_VAR set, where it runs as usual): tests whose time or result depends on what the
# process has done before them.  A full ``gc.collect()`` walks every object the worker's earlier tests
# left, and ``compile_full_kernels`` compiles the full kernel of every serial tier the worker has used:
# with ``--dist loadfile`` a worker runs the few-test files last, and a CI run (2026-11-29) took 304 s
# for tests/test_call_depth.py and 108 s for the 50 kB leak window, 14-16 s and 27-29 s in a new process.
FRESH_PROCESS_VAR = "EVJAX_TEST_IN_FRESH_PROCESS"


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    if "fresh_process" not in pyfuncitem.keywords or os.environ.get(FRESH_PROCESS_VAR):
        return None
    import subprocess
    import sys

    from tests.helpers import HANG_GUARD_S

    env = {**os.environ, FRESH_PROCESS_VAR: "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_XDIST_WORKER_COUNT", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-rs", "-p", "no:cacheprovider", "-p",
                           "no:xdist", pyfuncitem.nodeid], cwd=pyfuncitem.config.rootpath, env=env,
                          capture_output=True, text=True, timeout=HANG_GUARD_S)
    print(proc.stdout[-3000:])
    if proc.returncode == 0 and " passed" not in proc.stdout and " skipped" in proc.stdout:
        reasons = [line.split(": ", 1)[-1] for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
        pytest.skip(f"in a fresh process: {reasons[0] if reasons else 'skipped'}")
    assert proc.returncode == 0 and " passed" in proc.stdout, (
        f"{pyfuncitem.nodeid} failed in a fresh process:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}")
    return True


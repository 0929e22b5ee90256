"""``evjax.set_num_threads``: one process-wide thread count, read by compiled handlers at every call."""
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

import evjax
from evjax.backends import numba_cpu, threads
from tests import kernels_for_tests as K
from tests.helpers import HANG_GUARD_S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def call_report(x):
    return numba_cpu.call(K.report_threads, (x,), (1,), np.int32)


@pytest.fixture
def restore_threads():
    before = evjax.get_num_threads()
    yield
    evjax.set_num_threads(before)


def test_the_count_reaches_compiled_programs_at_their_next_call_without_a_retrace(restore_threads):
    traces = []

    def f(x):
        traces.append(1)
        return call_report(x)

    f = jax.jit(f)
    x = jnp.zeros(1, jnp.int32)
    assert int(f(x)[0]) == threads.pool_size() == evjax.get_num_threads()
    evjax.set_num_threads(1)
    assert int(f(x)[0]) == 1 and evjax.get_num_threads() == 1
    evjax.set_num_threads(threads.pool_size())
    assert int(f(x)[0]) == threads.pool_size()
    assert len(traces) == 1


SCRIPT = '''
import jax.numpy as jnp, numba, numpy as np, evjax
from evjax.backends import numba_cpu
from tests import kernels_for_tests as K
evjax.set_num_threads(1)
print(int(numba_cpu.call(K.report_threads, (jnp.zeros(1, jnp.int32),), (1,), np.int32)[0]))
'''


def test_a_handler_loaded_from_the_disk_cache_reads_the_count(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "EVJAX_CACHE_DIR": str(tmp_path / "evjax"),
           "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    outputs = []
    for _ in range(2):  # compiled, then loaded from the cache
        done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=HANG_GUARD_S)
        assert done.returncode == 0, done.stderr[-3000:]
        outputs.append(done.stdout.strip().splitlines()[-1])
    assert outputs == ["1", "1"]
    assert any(name.endswith(".nbc") for _, _, files in os.walk(tmp_path / "numba") for name in files)


@pytest.mark.parametrize("bad, error, match", [
    (0, ValueError, r"n=0 is outside \[1, "), (10_000, ValueError, "NUMBA_NUM_THREADS"),
    (1.5, TypeError, "must be an int"), (True, TypeError, "must be an int"),
])
def test_bad_counts_are_named(bad, error, match, restore_threads):
    with pytest.raises(error, match=match):
        evjax.set_num_threads(bad)


def test_a_csr_scatter_above_the_parallel_threshold_is_right_at_every_count(restore_threads):
    a = sp.random(2000, 600, density=0.2, format="csr", random_state=1, dtype=np.float32)
    W = evjax.CSR((jnp.asarray(a.data), jnp.asarray(a.indices), jnp.asarray(a.indptr)), shape=a.shape)
    spikes = np.random.default_rng(0).random(2000) < 0.5
    f = jax.jit(lambda s: s @ W)
    for n in range(threads.pool_size(), 0, -1):
        evjax.set_num_threads(n)
        np.testing.assert_allclose(f(jnp.asarray(spikes)), a.T @ spikes, rtol=1e-5, atol=1e-4)

"""``evjax.set_num_threads``: one process-wide thread count, read by compiled handlers at every call."""
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numba
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
    # no fall-back left by an earlier test's parallel kernel that stalled on a loaded machine (it keeps
    # threads_now at 1 for up to a second: a run of the suite under -n 2 read 1 where the count was the pool's)
    threads._cells["evjax_serial_until_ns"].value = 0
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


# ---------------------------------------------------------------------------
# the fall-back under load: a stalled parallel region sends kernels to one thread for a while
# ---------------------------------------------------------------------------
@numba.njit
def _report_region(ends_after_t0):
    """One parallel region's bookkeeping, its parts ending at ``t0 + ends_after_t0`` (ns)."""
    ends, t0 = threads.start_region(ends_after_t0.shape[0])
    for p in range(ends.shape[0]):
        ends[p] = t0 + ends_after_t0[p]
    threads.region_done(ends, t0)
    return threads.threads_now()


@numba.njit
def _threads_now():
    """What a handler's ``threads_now()`` (an intrinsic: compiled code only) reads now."""
    return threads.threads_now()


@pytest.fixture
def clean_fallback():
    _report_region(np.array([1000, 1000], np.int64))  # a clean region forgets past stalls
    # ... but a fall-back a real stall started (an earlier test's kernels on a loaded machine) runs to its
    # end: wait it out, so that the test starts with the full pool
    time.sleep(threads.fallback_state()[0] + 1e-3)
    yield
    _report_region(np.array([1000, 1000], np.int64))
    threads._cells["evjax_serial_until_ns"].value = 0


def test_a_stalled_region_sends_kernels_to_one_thread_and_the_back_off_doubles(clean_fallback):
    stall = threads.STALL_NS
    # balanced parts, and parts a few microseconds apart: no stall
    assert _report_region(np.array([50_000, 52_000], np.int64)) == evjax.get_num_threads()
    assert threads.fallback_state() == (0.0, 0.0)
    # the last part ended 10 stall-thresholds after the first (a descheduled worker)
    first = _report_region(np.array([20_000, 20_000 + 10 * stall], np.int64))
    remaining, backoff = threads.fallback_state()
    assert backoff == threads.BACKOFF_MIN_NS / 1e9 and 0 < remaining <= backoff
    if threads.pool_size() > 1:
        assert first == 1
    _report_region(np.array([20_000, 20_000 + 10 * stall], np.int64))
    assert threads.fallback_state()[1] == 2 * threads.BACKOFF_MIN_NS / 1e9  # doubles while stalls go on
    # a spread above the threshold but small against the region's own time is imbalance, not a stall
    _report_region(np.array([1000, 1000], np.int64))
    _report_region(np.array([100 * stall, 101 * stall], np.int64))
    assert threads.fallback_state()[1] == 0.0


def test_the_back_off_is_bounded(clean_fallback):
    for _ in range(40):
        _report_region(np.array([0, 10 * threads.STALL_NS], np.int64))
    assert threads.fallback_state()[1] == threads.BACKOFF_MAX_NS / 1e9


SPLIT_CASES = ["csr spikes @ W", "csr graded @ W", "csr W.T @ values", "csr few-sample batch", "jitc spikes @ M",
               "dense batch @ W", "csr weight gradient"]


def _split_case(name):
    """A jitted call whose kernel splits its work (above the parallel thresholds at 2+ threads)."""
    rng = np.random.default_rng(3)
    a = sp.random(3000, 2000, density=0.05, format="csr", random_state=4, dtype=np.float32)
    W = evjax.CSR((jnp.asarray(a.data), jnp.asarray(a.indices), jnp.asarray(a.indptr)), shape=a.shape)
    spikes = jnp.asarray(rng.random(3000) < 0.6)
    if name == "csr spikes @ W":
        return jax.jit(lambda: spikes @ W)
    if name == "csr graded @ W":
        graded = evjax.WeightedArray(jnp.where(spikes, rng.standard_normal(3000).astype(np.float32), 0))
        return jax.jit(lambda: graded @ W)
    if name == "csr W.T @ values":
        values = jnp.asarray(rng.standard_normal(3000).astype(np.float32))
        return jax.jit(lambda: W.T @ values)
    if name == "csr few-sample batch":
        batch = jnp.asarray(rng.random((2, 3000)) < 0.6)
        return jax.jit(lambda: batch @ W) if threads.pool_size() > 2 else jax.jit(lambda: spikes @ W)
    if name == "jitc spikes @ M":
        M = evjax.JITCNormalR(0.1, 0.05, prob=0.05, seed=5, shape=(3000, 2000))
        return jax.jit(lambda: spikes @ M)
    if name == "dense batch @ W":
        D = jnp.asarray(rng.standard_normal((3000, 500)).astype(np.float32))
        batch = jnp.asarray(rng.random((8, 3000)) < 0.3)
        return jax.jit(lambda: batch @ evjax.Dense(D))
    loss = jax.grad(lambda d: jnp.sum((spikes @ W.with_data(d)) ** 2))
    return jax.jit(lambda: loss(W.data))


@pytest.mark.skipif(threads.pool_size() < 2, reason="needs Numba's pool to have 2+ threads")
@pytest.mark.parametrize("name", SPLIT_CASES)
def test_one_thread_and_the_fall_back_give_the_bits_of_the_parallel_kernel(name, restore_threads, clean_fallback):
    f = _split_case(name)
    parallel = np.asarray(f())
    evjax.set_num_threads(1)
    serial = np.asarray(f())
    evjax.set_num_threads(threads.pool_size())
    threads._cells["evjax_serial_until_ns"].value = time.monotonic_ns() + 60 * 10**9  # as after a stall
    assert _threads_now() == 1
    fallback = np.asarray(f())
    assert parallel.tobytes() == serial.tobytes() == fallback.tobytes()

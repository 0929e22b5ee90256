"""Serial tiers (``numba_cpu.call(..., serial=...)``): what a first call compiles, and the handover to
the full kernel inside the handler.

* the mechanism, with toy kernels that tell apart which one ran: the tier serves the calls it does; a
  declined call compiles the full kernel inside that call and hands every later call to it; a
  splittable call takes the full kernel at once where that costs no compile, else once the tier has
  been busy with such calls for ``HOT_NS``; no retrace; failures name the kernel;
* the CSR tiers give the full kernels' bits, bit for bit (NaN payloads included), wherever they do a
  call, on one and two threads, for well-formed and malformed structures; they write nothing where
  they decline; and through jit, a function whose calls move from the tier to the full kernel returns
  the same bits for the same input before and after.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import evjax
from evjax.backends import numba_cpu, threads as evjax_threads
from evjax.primitives.csr import numba as csr_numba

from . import kernels_for_tests as kft
from .helpers import THOROUGH


def _call(x, kernel=kft.tripling_kernel, serial=kft.doubling_tier):
    return numba_cpu.call(kernel, (x,), x.shape, x.dtype, serial=serial)


# ---------------------------------------------------------------------------
# the mechanism
# ---------------------------------------------------------------------------
def test_a_declined_call_compiles_the_full_kernel_and_hands_over_for_good():
    traces = []

    @jax.jit
    def f(x):
        traces.append(x.shape)
        return _call(x)

    small = jnp.arange(4, dtype=jnp.float32)
    big = jnp.arange(12, dtype=jnp.float32)
    np.testing.assert_array_equal(f(small), 2 * np.arange(4))  # the tier
    np.testing.assert_array_equal(f(big), 3 * np.arange(12))  # declined: the full kernel, in this call
    np.testing.assert_array_equal(f(small), 3 * np.arange(4))  # the full kernel from now on
    assert len(traces) == 2  # one per shape: the handover retraces nothing
    # a new jitted function over the same handler finds the full kernel too
    np.testing.assert_array_equal(jax.jit(lambda x: _call(x) + 0)(small), 3 * np.arange(4))


_SPLITTABLE_SCRIPT = """
import sys
import jax, jax.numpy as jnp, numpy as np
from evjax.backends import numba_cpu
sys.path.insert(0, {tests!r})
import kernels_for_tests as kft
numba_cpu.HOT_NS = {hot}
if {full_first}:  # the full kernel compiled in this process before the first splittable call
    numba_cpu.get_handler(kft.tripling_kernel, [(np.dtype(np.float32), 1)], [(np.dtype(np.float32), 1)],
                          threads=True)
f = jax.jit(lambda x: numba_cpu.call(kft.tripling_kernel, (x,), x.shape, x.dtype, serial=kft.doubling_tier))
x = jnp.arange(8, dtype=jnp.float32)  # splittable for the toy tier
seen = []
for i in range(4):
    seen.append(int(f(x)[1]))
    if {hand_over} and i == 1:  # what a benchmark does after its first calls
        numba_cpu.compile_full_kernels(hand_over=True)
print(seen)
"""


@pytest.mark.parametrize("hot, full_first, hand_over, expected", [
    (10**15, False, False, [2, 2, 2, 2]),  # never hot, no full kernel to take: the tier serves every call
    (1, False, False, [2, 2, 3, 3]),  # hot at the second call (its result is the tier's), then compiled and taken
    (10**15, True, False, [2, 3, 3, 3]),  # the full kernel costs no compile: taken at the first splittable call
    (10**15, False, True, [2, 2, 3, 3]),  # compile_full_kernels(hand_over=True) after the second call
])
def test_splittable_calls_take_the_full_kernel_when_free_or_hot(tmp_path, hot, full_first, hand_over, expected):
    """In a fresh process with empty caches (nothing compiled is found on disk)."""
    import os
    import subprocess
    import sys

    tests = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "EVJAX_CACHE_DIR": str(tmp_path / "evjax")}
    script = _SPLITTABLE_SCRIPT.format(tests=tests, hot=hot, full_first=full_first, hand_over=hand_over)
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == str(expected)


def test_a_full_kernel_that_does_not_compile_is_named_in_the_error():
    f = jax.jit(lambda x: _call(x, kernel=kft.mistyped_kernel))
    np.testing.assert_array_equal(f(jnp.ones(3, jnp.float32)), 2 * np.ones(3))  # the tier alone: fine
    with pytest.raises(Exception, match="mistyped_kernel. failed to compile .its serial tier .doubling_tier"):
        f(jnp.ones(11, jnp.float32)).block_until_ready()


def test_a_raising_tier_is_reported():
    with pytest.raises(Exception, match="raising_tier.*raised ValueError: the tier raised"):
        jax.jit(lambda x: _call(x, serial=kft.raising_tier))(jnp.ones(3, jnp.float32)).block_until_ready()


def test_a_tier_must_return_an_int64():
    with pytest.raises(Exception, match="serial tier .bool_tier. returns .*bool.*; a serial tier returns an int64"):
        jax.jit(lambda x: _call(x, serial=kft.bool_tier))(jnp.ones(3, jnp.float32))


# ---------------------------------------------------------------------------
# the CSR tiers: the same bits as their full kernels
# ---------------------------------------------------------------------------
def _structure(rng, n_rows, n_cols, per_row, malformed):
    counts = rng.integers(0, 2 * per_row + 1, n_rows)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    nnz = int(indptr[-1])
    indices = rng.integers(0, n_cols, nnz).astype(np.int32)
    if malformed and nnz:
        indices[rng.integers(0, nnz, max(nnz // 20, 1))] = n_cols + 3  # columns out of range
        indptr[n_rows // 2] = indptr[n_rows // 2] + 5  # a row pointer out of order
    return indices, indptr, nnz


def _data(rng, nnz, homogeneous, dtype):
    data = rng.standard_normal(1 if homogeneous else nnz).astype(dtype)
    if data.size > 4:
        data[rng.integers(0, data.size, 3)] = [np.nan, np.inf, -np.inf]
    return data


def _operand(rng, n, kind, activity, dtype):
    active = rng.random(n) < activity
    if kind == "events":
        return active.astype(np.uint8)
    values = rng.standard_normal(n).astype(dtype) * active  # weighted events and values: zeros included
    if n > 4:
        values[rng.integers(0, n, 2)] = [np.nan, -0.0]
    return values


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


def _batch(rng, n, width, kind, activity, dtype):
    """``width`` operands of ``n`` entries, batch-major (``(width, n)``)."""
    return np.stack([_operand(rng, n, kind, activity, dtype) for _ in range(width)])


BATCH_KERNELS = {  # kind -> (batch scatter, batch gather, weight gradient with a batched operand)
    "events": (csr_numba.scatter_mm_batch_major, csr_numba.gather_mm, csr_numba.sddmm_mm),
    "values": (csr_numba.scatter_mm_batch_major, csr_numba.gather_mm, csr_numba.sddmm_mm),
    "weighted": (csr_numba.weighted_scatter_mm_batch_major, csr_numba.weighted_gather_mm,
                 csr_numba.sddmm_r_weighted),
}


def _batched_calls(rng, kind, data, indices, indptr, n_rows, n_cols, activity, dtype, widths=(1, 5)):
    """The batched kernels' calls (a vmap over trials) for operands of ``kind``: the batch scatter
    (batch-major), the batch gather (row-major), the weight gradient of a batch (``r`` the operand,
    row-major), and for weighted events also the gradient with ``q`` weighted."""
    scatter, gather, sddmm = BATCH_KERNELS[kind]
    nnz = indices.shape[0]
    calls = []
    for width in widths:
        x_rows = _batch(rng, n_rows, width, kind, activity, dtype)
        x_cols = np.ascontiguousarray(_batch(rng, n_cols, width, kind, activity, dtype).T)
        q = rng.standard_normal((n_cols, width)).astype(dtype)
        calls += [(scatter, (data, indices, indptr, x_rows), (width, n_cols)),
                  (gather, (data, indices, indptr, x_cols), (n_rows, width)),
                  (sddmm, (indices, indptr, np.ascontiguousarray(x_rows.T), q), nnz)]
        if kind == "weighted":
            r = rng.standard_normal((n_rows, width)).astype(dtype)
            calls.append((csr_numba.sddmm_q_weighted, (indices, indptr, r, x_cols), nnz))
    return calls


CASES = [  # (n_rows, n_cols, synapses per row, activity): serial-sized and split-sized work
    (50, 40, 3, 0.3), (1000, 800, 10, 0.05), (4000, 4000, 80, 0.1), (20000, 20000, 40, 0.2), (3000, 50, 30, 0.9),
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("malformed", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_csr_tiers_give_the_full_kernels_bits(threads, case, malformed, dtype):
    if dtype == np.float64 and not THOROUGH:  # CI budget: float64 compiles every CSR kernel again (~30 s)
        pytest.skip("the same code at another dtype; the thorough profile runs it")
    rng = np.random.default_rng(hash((case, malformed, threads)) % 2**32)
    n_rows, n_cols, per_row, activity = case
    indices, indptr, nnz = _structure(rng, n_rows, n_cols, per_row, malformed)
    t = np.int64(threads)
    seen = set()
    for homogeneous in (False, True):
        data = _data(rng, nnz, homogeneous, dtype)
        for kind in ("events", "weighted", "values"):
            x_rows = _operand(rng, n_rows, kind, activity, dtype)  # scatter: one entry per row
            x_cols = _operand(rng, n_cols, kind, activity, dtype)  # gather: one per column
            scatter, gather = {
                "events": (csr_numba.scatter_mv, csr_numba.gather_mv),
                "values": (csr_numba.scatter_mv, csr_numba.gather_mv),
                "weighted": (csr_numba.weighted_scatter_mv, csr_numba.weighted_gather_mv),
            }[kind]
            calls = [(scatter, (data, indices, indptr, x_rows), n_cols),
                     (gather, (data, indices, indptr, x_cols), n_rows)]
            if kind == "events":  # the same events as the list of their active rows (CompactBinary)
                ids = np.flatnonzero(x_rows).astype(indices.dtype)
                if malformed:  # rows outside the matrix add nothing; a count past the list reads the list
                    ids = np.concatenate([ids, np.array([-1, n_rows], indices.dtype)])
                count = np.array([ids.size + (5 if malformed else 0)], np.int32)
                calls.append((csr_numba.scatter_active_mv, (data, indices, indptr, ids, count), n_cols))
            if kind != "weighted":
                r = x_rows
                q = rng.standard_normal(n_cols).astype(dtype)
                calls.append((csr_numba.sddmm_mv, (indices, indptr, r, q), nnz))
            if kind != "values" or THOROUGH:  # (CI budget: batched values run the events' loops at another dtype)
                calls += _batched_calls(rng, kind, data, indices, indptr, n_rows, n_cols, activity, dtype)
            for kernel, args, n_out in calls:
                expected = np.full(n_out, 7, dtype)
                kernel(t, *args, expected)
                for tier in csr_numba.SERIAL_TIERS[kernel]:
                    got = np.full(n_out, 7, dtype)
                    outcome = tier(t, *args, got)
                    seen.add(outcome)
                    if outcome == numba_cpu.DECLINED:
                        assert (got == 7).all(), f"{tier.__name__} wrote before declining"
                        continue
                    assert np.array_equal(_bits(got), _bits(expected)), \
                        f"{tier.__name__}, {kind}, homogeneous={homogeneous}"
    assert seen <= {numba_cpu.DONE, numba_cpu.SPLITTABLE, numba_cpu.DECLINED}


_FEW_SAMPLES_SCRIPT = """
import numpy as np
from evjax.backends import numba_cpu
from evjax.primitives.csr import numba as csr_numba

rng = np.random.default_rng(3)
outcomes = set()
for n_rows, n_cols, per_row, activity in [(50, 40, 3, 0.3), (20000, 20000, 40, 0.2)]:
    indptr = np.concatenate([[0], np.cumsum(rng.integers(0, 2 * per_row + 1, n_rows))]).astype(np.int32)
    indices = rng.integers(0, n_cols, int(indptr[-1])).astype(np.int32)
    data = rng.standard_normal(indices.size).astype(np.float32)
    data[:3] = [np.nan, np.inf, -np.inf]
    active = rng.random((3, n_rows)) < activity
    for scatter, x in [(csr_numba.scatter_mm_batch_major, active.astype(np.uint8)),
                       (csr_numba.weighted_scatter_mm_batch_major,
                        (rng.standard_normal(active.shape) * active).astype(np.float32))]:
        first, second = csr_numba.SERIAL_TIERS[scatter]
        for threads in (1, 2, 4):
            expected = np.full((3, n_cols), 7, np.float32)
            scatter(np.int64(threads), data, indices, indptr, x, expected)
            got = np.full((3, n_cols), 7, np.float32)
            assert first(np.int64(threads), data, indices, indptr, x, got) == numba_cpu.DECLINED
            assert (got == 7).all(), "the first tier wrote before declining"
            outcomes.add(int(second(np.int64(threads), data, indices, indptr, x, got)))
            assert np.array_equal(got.view(np.uint32), expected.view(np.uint32)), (scatter, threads, n_rows)
print(sorted(outcomes))
"""


def test_batch_scatter_tiers_split_a_few_samples_as_the_kernel_does():
    """With a pool of 4 threads, the batch scatter splits each of 2 or 3 samples as a vector (its
    parts): the first tier declines such a batch, writing nothing, and the second gives the
    kernel's bits, the parts in turn, on any thread count (a fresh process: the pool size is fixed
    when Numba starts)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "NUMBA_NUM_THREADS": "4"}
    res = subprocess.run([sys.executable, "-c", _FEW_SAMPLES_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    # both outcomes reached: one pass / one thread (DONE) and parts split over threads (SPLITTABLE)
    assert res.stdout.strip().splitlines()[-1] == str(sorted([numba_cpu.DONE, numba_cpu.SPLITTABLE]))


def test_csr_scatter_tiers_keep_the_one_pass_where_its_estimate_does():
    """Long active rows among empty ones: one pass by the estimate (visited rows at twice the mean row
    length), though the exact work would split into parts.  Every tier does the one pass's sum too:
    a tier that has taken over from the first serves such calls as well."""
    if evjax_threads.pool_size() < 2:
        pytest.skip("a pool of one thread never splits")
    rng = np.random.default_rng(5)
    n_rows, n_cols = 2000, 500
    counts = np.zeros(n_rows, np.int64)
    long_rows = rng.choice(n_rows, 12, replace=False)
    counts[long_rows] = 9000
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    nnz = int(indptr[-1])
    indices = rng.integers(0, n_cols, nnz).astype(np.int32)
    data = (rng.standard_normal(nnz) * 10.0 ** rng.integers(-3, 4, nnz)).astype(np.float32)
    x = np.zeros(n_rows, np.uint8)
    x[long_rows] = 1
    expected = np.full(n_cols, 7, np.float32)
    csr_numba.scatter_mv(np.int64(2), data, indices, indptr, x, expected)
    one_pass = np.zeros(n_cols, np.float32)  # the rows in order, each row's synapses in order
    for i in np.sort(long_rows):
        for k in range(indptr[i], indptr[i + 1]):
            one_pass[indices[k]] += data[k]
    assert np.array_equal(_bits(expected), _bits(one_pass))  # the kernel: one pass
    for tier in csr_numba.SERIAL_TIERS[csr_numba.scatter_mv]:
        got = np.full(n_cols, 7, np.float32)
        assert tier(np.int64(2), data, indices, indptr, x, got) != numba_cpu.DECLINED, tier.__name__
        assert np.array_equal(_bits(got), _bits(expected)), tier.__name__


ACTIVITY_PATTERNS = {  # rows of a 64-row matrix that spike: the scatter's look-ahead ring empty, full, wrapping
    "none": [],
    "one": [37],
    "first and last": [0, 63],
    "every row": list(range(64)),
    "runs of 3, 5 and 9": list(range(2, 5)) + list(range(11, 16)) + list(range(40, 49)),
    "every third": list(range(1, 64, 3)),
    "the last eight": list(range(56, 64)),
}


@pytest.mark.parametrize("pattern", sorted(ACTIVITY_PATTERNS))
@pytest.mark.parametrize("homogeneous", [False, True])
def test_the_event_scatter_visits_each_active_row_once_in_order(pattern, homogeneous):
    """The vector scatter finds its rows ``numba_rows.SCATTER_LOOKAHEAD`` visits ahead (a ring while it
    scans events, the list read ahead for ``CompactBinary``): whatever the runs of active rows, it adds
    each active row's synapses once, rows in order, synapses in stored order: bit for bit the sum of a
    NumPy loop in that order (``np.add.at`` adds in the order given), silent rows' NaN weights
    excluded; a listed row outside the matrix (read ahead too) adds nothing."""
    rng = np.random.default_rng(len(pattern))
    n_rows, n_cols = 64, 50
    counts = rng.integers(0, 30, n_rows)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    nnz = int(indptr[-1])
    indices = rng.integers(0, n_cols, nnz).astype(np.int32)
    data = (rng.standard_normal(1 if homogeneous else nnz) * 10.0 ** rng.integers(-3, 4)).astype(np.float32)
    active = np.array(ACTIVITY_PATTERNS[pattern], np.int64)
    x = np.zeros(n_rows, np.uint8)
    x[active] = 1
    if not homogeneous:
        data[np.repeat(x == 0, counts)] = np.nan  # every synapse of a silent row
    expected = np.zeros(n_cols, np.float32)
    for i in active:  # rows in order, each row's synapses in stored order
        span = np.arange(indptr[i], indptr[i + 1])
        np.add.at(expected, indices[span], data[0] if homogeneous else data[span])
    scanned = np.full(n_cols, 7, np.float32)
    csr_numba.scatter_mv(np.int64(1), data, indices, indptr, x, scanned)
    assert np.array_equal(_bits(scanned), _bits(expected)), "the scan"
    listed_ids = np.empty(2 * active.size + 2, np.int32)  # rows outside the matrix between the listed ones
    listed_ids[0::2] = np.concatenate([active, [n_rows + 4]])
    listed_ids[1::2] = np.concatenate([np.full(active.size, -1), [n_rows]])
    for ids in (active.astype(np.int32), listed_ids):
        listed = np.full(n_cols, 7, np.float32)
        csr_numba.scatter_active_mv(np.int64(1), data, indices, indptr, ids, np.array([ids.size], np.int32), listed)
        assert np.array_equal(_bits(listed), _bits(expected)), f"the list {ids.tolist()}"


def test_csr_tiers_decline_or_split_where_the_kernels_split():
    """The large cases above reach the other outcomes (so that test compares something there)."""
    if evjax_threads.pool_size() < 2:
        pytest.skip("a pool of one thread never splits")
    rng = np.random.default_rng(0)
    indices, indptr, nnz = _structure(rng, 20000, 20000, 40, False)
    data = _data(rng, nnz, False, np.float32)
    x = _operand(rng, 20000, "events", 0.2, np.float32)
    out = np.zeros(20000, np.float32)
    assert csr_numba.serial_scatter_mv(np.int64(2), data, indices, indptr, x, out) == numba_cpu.DECLINED
    assert csr_numba.plain_parts_scatter_mv(np.int64(2), data, indices, indptr, x, out) == numba_cpu.SPLITTABLE
    assert csr_numba.parts_scatter_mv(np.int64(2), data, indices, indptr, x, out) == numba_cpu.SPLITTABLE
    assert csr_numba.parts_scatter_mv(np.int64(1), data, indices, indptr, x, out) == numba_cpu.DONE
    assert csr_numba.serial_gather(np.int64(2), data, indices, indptr, x, out) == numba_cpu.SPLITTABLE
    assert csr_numba.serial_gather(np.int64(1), data, indices, indptr, x, out) == numba_cpu.DONE
    g = np.zeros(nnz, np.float32)
    q = rng.standard_normal(20000).astype(np.float32)
    assert csr_numba.serial_sddmm_mv(np.int64(2), indices, indptr, x, q, g) == numba_cpu.SPLITTABLE


def test_a_jitted_op_returns_the_same_bits_before_and_after_the_handover():
    """``spikes @ W`` at 1 % (the first tier) and 30 % activity (declined: the second tier, in parts)
    in one jitted function: one trace, and the 1 % input gives the same bits before and after; the
    same once the full kernel has been compiled and taken over."""
    rng = np.random.default_rng(1)
    n = 20000
    indices, indptr, nnz = _structure(rng, n, n, 40, False)
    W = evjax.CSR((jnp.asarray(rng.standard_normal(nnz).astype(np.float32)), jnp.asarray(indices),
                   jnp.asarray(indptr)), shape=(n, n))
    traces = []

    @jax.jit
    def f(spikes, data):
        traces.append(1)
        return spikes @ W.with_data(data)

    quiet = jnp.asarray(rng.random(n) < 0.01)
    busy = jnp.asarray(rng.random(n) < 0.3)
    before = np.asarray(f(quiet, W.data))
    busy_bits = np.asarray(f(busy, W.data))
    after = np.asarray(f(quiet, W.data))
    f32, i32 = np.dtype(np.float32), np.dtype(np.int32)  # the full kernel, compiled: the next splittable call takes it
    numba_cpu.get_handler(csr_numba.scatter_mv, [(f32, 1), (i32, 1), (i32, 1), (np.dtype(np.uint8), 1)], [(f32, 1)],
                          threads=True)
    for _ in range(2):
        assert np.array_equal(_bits(np.asarray(f(busy, W.data))), _bits(busy_bits))
    assert np.array_equal(_bits(np.asarray(f(quiet, W.data))), _bits(before))
    assert len(traces) == 1
    assert np.array_equal(_bits(before), _bits(after))
    dense = np.zeros((n, n), np.float32)
    rows = np.repeat(np.arange(n), np.diff(indptr))
    np.add.at(dense, (rows, indices), np.asarray(W.data))
    np.testing.assert_allclose(after, np.asarray(quiet, np.float32) @ dense, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------
# the dense and JITC tiers: the same bits as their full kernels
# ---------------------------------------------------------------------------
def _compare(kernel, tier, threads, args, out_shape, dtype):
    """Run the kernel and its tier on the same inputs; the tier's outcome (its output checked)."""
    expected = np.full(out_shape, 7, dtype)
    kernel(np.int64(threads), *args, expected)
    got = np.full(out_shape, 7, dtype)
    outcome = tier(np.int64(threads), *args, got)
    if outcome == numba_cpu.DECLINED:
        assert (got == 7).all(), f"{tier.__name__} wrote before declining"
    else:
        assert np.array_equal(_bits(got), _bits(expected)), tier.__name__
    return outcome


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("size", ["small", "large", "large vector"])
@pytest.mark.parametrize("weighted", [False, True])
def test_dense_tiers_give_the_full_kernels_bits(threads, size, weighted):
    from evjax.primitives.dense import numba as dense_numba

    rng = np.random.default_rng(3)
    k, n, m = {"small": (40, 1, 30), "large": (1500, 3, 800), "large vector": (1500, 1, 800)}[size]
    dtype = np.float32
    active = rng.random((k, n)) < 0.4
    x = (rng.standard_normal((k, n)).astype(dtype) * active) if weighted else active.astype(np.uint8)
    w = rng.standard_normal((k, m)).astype(dtype)
    w[rng.integers(0, k, 3), rng.integers(0, m, 3)] = [np.nan, np.inf, -np.inf]
    g = rng.standard_normal((n, m)).astype(dtype)
    outcomes = {
        _compare(dense_numba.scatter, dense_numba.serial_scatter, threads, (w, x), (n, m), dtype),
        _compare(dense_numba.gather, dense_numba.serial_gather, threads, (np.ascontiguousarray(w.T), x), (m, n), dtype),
        _compare(dense_numba.outer_rows, dense_numba.serial_outer_rows, threads, (x, g), (k, m), dtype),
        _compare(dense_numba.outer_cols, dense_numba.serial_outer_cols, threads, (x, np.ascontiguousarray(g.T)),
                 (m, k), dtype),
    }
    if n == 1:  # the tiers a first call compiles for one vector of events
        outcomes |= {
            _compare(dense_numba.scatter, dense_numba.serial_scatter_vector, threads, (w, x), (n, m), dtype),
            _compare(dense_numba.outer_rows, dense_numba.serial_outer_rows_vector, threads, (x, g), (k, m), dtype),
        }
    if size != "small" and threads == 2 and evjax_threads.pool_size() >= 2:
        assert numba_cpu.SPLITTABLE in outcomes  # the comparison covers the kernels' parallel paths


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("size", ["small", "large"])
@pytest.mark.parametrize("law", ["scalar", "normal", "uniform"])
def test_jitc_tiers_give_the_full_kernels_bits(threads, size, law):
    """The vector kernels and the batch gather (its tier is a plain loop of its own) of the normal
    law; the batch scatter and the other laws (which change only the batch row loops and the weight
    function passed to the same drivers) under the thorough profile (CI budget: each full JITC
    kernel takes some 3 s of CPU to compile)."""
    if law != "normal" and not THOROUGH:
        pytest.skip("the normal law's case covers the tiers' code; the thorough profile runs every law")
    from evjax.primitives.jitc import numba as jitc_numba
    from evjax.primitives.jitc.kernel_args import config

    rng = np.random.default_rng(4)
    n_outer, n_inner, prob = (30, 40, 0.2) if size == "small" else (3000, 2500, 0.05)
    dtype = np.float32
    params = np.array([0.5, 0.2], dtype)
    seed = np.array([11], np.uint32)
    outcomes = set()
    for event in (True, False):
        cfg = config(prob, event, n_inner)
        kinds = (("gather_mv", (n_inner,), (n_outer,)), ("gather_mm", (n_inner, 3), (n_outer, 3)),
                 ("scatter_mv", (n_outer,), (n_inner,)), ("scatter_mm", (n_outer, 3), (n_inner, 3)))
        for kind, x_shape, out_shape in kinds if THOROUGH else kinds[:3]:  # (CI budget: no scatter_mm)
            x = rng.standard_normal(x_shape).astype(dtype) * (rng.random(x_shape) < 0.3)
            if event:
                x = (x != 0).astype(dtype)
            kernel = jitc_numba.KERNELS[(kind, law)]
            for tier in jitc_numba.SERIAL_TIERS[kernel]:
                outcomes.add(_compare(kernel, tier, threads, (params, seed, cfg, x), out_shape, dtype))
    if size == "large" and threads == 2 and evjax_threads.pool_size() >= 2:
        assert numba_cpu.SPLITTABLE in outcomes and numba_cpu.DECLINED in outcomes

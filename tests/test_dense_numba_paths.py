"""The Numba dense kernels' size- and density-dependent paths, against NumPy.

The property harness (tests/test_dense_ops.py) draws tiny shapes; the Numba
kernels choose their loops by size and activity: bool events are scanned eight
bytes at a time (with a tail), the gather walks blocks of up to 256 rows by
strided columns when events are sparse and whole rows when they are dense, and
both split over the thread pool above ``PARALLEL_MIN_WORK``.  Each case here
lands on one of those paths; NaN weights sit in the rows/columns of silent
events, so a kernel that multiplied instead of selecting would return NaN.
"""
from __future__ import annotations

import numpy as np
import pytest

import evjax
from evjax.primitives.dense import binary_dense_outer
from evjax.primitives.dense import numba as dense_numba


def _events(rng, k, n, rate, weighted):
    active = rng.random((k, n)) < rate
    if not weighted:
        return active, active.astype(np.float64)
    values = np.where(active, rng.standard_normal((k, n)), 0.0).astype(np.float32)
    return values, values.astype(np.float64)


def _silent_nan(w_rows, e):
    """``w_rows`` (k, m) with NaN in every row whose events are all silent (a select must ignore them)."""
    w = w_rows.copy()
    w[~(e != 0).any(axis=1)] = np.nan
    return w


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("k, m, n, rate", [
    (301, 600, 1, 0.01),  # sparse: strided columns over 256-row blocks; a byte tail (301 = 37 * 8 + 5)
    (301, 600, 5, 0.02),  # sparse, a batch: events grouped by sample
    (301, 600, 1, 0.3),   # dense (over 1 in 12): row dots
    (64, 40, 3, 0.0),     # no event at all: zeros
])
def test_both_orientations_match_numpy(k, m, n, rate, weighted):
    rng = np.random.default_rng(k + m + n + int(rate * 100) + weighted)
    x, e = _events(rng, k, n, rate, weighted)
    w_rows = _silent_nan(rng.standard_normal((k, m)).astype(np.float32), e)  # (k, m): row j for event j
    expect = np.nan_to_num(w_rows.astype(np.float64), nan=0.0).T @ e  # (m, n); NaN rows meet only zeros
    for transpose, w in ((True, w_rows), (False, np.ascontiguousarray(w_rows.T))):
        got = evjax.binary_densemm(w, x, transpose=transpose, weighted=weighted, backend="numba")
        np.testing.assert_allclose(np.asarray(got), expect, rtol=1e-5, atol=1e-4, err_msg=f"transpose={transpose}")
        got = evjax.binary_densemv(w, x[:, 0], transpose=transpose, weighted=weighted, backend="numba")
        np.testing.assert_allclose(np.asarray(got), expect[:, 0], rtol=1e-5, atol=1e-4)


def test_parallel_sparse_gather_and_gradients():
    """A sparse gather above the parallel threshold (row blocks split over the pool), and its weight gradients."""
    rng = np.random.default_rng(3)
    k, m, n = 2048, 2048, 4
    x = rng.random((k, n)) < 0.02
    active = int(x.sum())
    assert active * m * 8 >= dense_numba.PARALLEL_MIN_WORK  # split over the pool (when it has 2+ threads)
    assert active * dense_numba._DENSE_GATHER < k * n  # the sparse (strided columns) path
    w = rng.standard_normal((m, k)).astype(np.float32)
    got = evjax.binary_densemm(w, x, transpose=False, backend="numba")
    np.testing.assert_allclose(np.asarray(got), w.astype(np.float64) @ x, rtol=1e-5, atol=1e-4)
    g = rng.standard_normal((m, n)).astype(np.float32)
    np.testing.assert_allclose(binary_dense_outer(x, g, transpose=False, backend="numba"), g @ x.T, rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(binary_dense_outer(x, g, transpose=True, backend="numba"), x @ g.T, rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("pool", [1, 2, 4])
@pytest.mark.parametrize("n, rate", [(1, 1.0), (3, 0.5)])
def test_scatter_kernel_splits(pool, n, rate):
    """The scatter kernel called directly with each pool size: serial, samples per thread (n >= pool) and
    column blocks (fewer samples than threads; a vector adds four rows a pass)."""
    rng = np.random.default_rng(pool * 10 + n)
    k, m = 1600, 1400
    x = rng.random((k, n)) < rate
    assert int(x.sum()) * m >= dense_numba.PARALLEL_MIN_WORK
    w = rng.standard_normal((k, m)).astype(np.float32)
    out_t = np.full((n, m), np.nan, np.float32)  # every entry must be written
    dense_numba.scatter(pool, w, x, out_t)
    np.testing.assert_allclose(out_t, x.T.astype(np.float64) @ w, rtol=1e-5, atol=1e-3)

"""The sparse-backward family's Numba CUDA kernels in Numba's CUDA simulator (or on a GPU, see
tests/cudasim/conftest.py): tiny sizes, each kernel thread is a Python thread in the simulator.

Each op with ``backend="numba_cuda"`` against the Numba CPU backend (the same bits: one thread per
output entry, the Numba kernels' order of terms) and against a dense NumPy product.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from evjax.primitives import sparse_backward as sb
from evjax.primitives.grouping import transposed_view
from evjax.primitives.sparse_backward import numba_cuda as sb_cuda
from tests.helpers import cuda_kernel_tests_on_simulator

ON_SIMULATOR = cuda_kernel_tests_on_simulator(sb.OPS)

BACKEND = "numba_cuda"
CPU = jax.devices("cpu")[0]


def structure(rng, m, n, *, sort: bool):
    """Rows of 0 to 6 entries (row 1 empty, row 0 with a column three times and, unsorted, a step down)."""
    lengths = rng.integers(0, 7, m)
    lengths[0], lengths[1] = 6, 0
    rows = [rng.integers(0, n, k) for k in lengths]
    rows[0][:3] = rows[0][2]
    if sort:
        rows = [np.sort(r) for r in rows]
    else:
        rows[0][3], rows[0][4] = n - 1, 0
    return (np.concatenate(rows).astype(np.int32),
            np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))


def sparse_rows(rng, shape, dtype, density=0.5):
    return ((rng.random(shape) < density) * rng.standard_normal(shape)).astype(dtype)


def dense_of(data, indices, indptr, shape):
    a = np.zeros(shape, np.float64)
    w = np.broadcast_to(data, indices.shape) if data.shape[0] == 1 else data
    for i in range(shape[0]):
        for e in range(indptr[i], indptr[i + 1]):
            a[i, indices[e]] += w[e]
    return a


def numba_cpu(fn):
    """``fn("numba")`` on the CPU (the CUDA kernels may run on a GPU)."""
    with jax.default_device(CPU):
        return np.asarray(fn("numba"))


def test_kernels_are_registered():
    assert "numba_cuda" in sb.csrmv_nonzero_p.backends("gpu")
    assert sb.csrmv_nonzero_p.kernel_generator("gpu", "numba_cuda") is sb_cuda.csrmv_nonzero_numba_cuda
    assert len(sb_cuda.KERNELS) == 6 * len(sb_cuda.COMPUTE_DTYPES)


def test_csrmv_nonzero():
    rng = np.random.default_rng(0)
    m, n = 5, 6
    for dtype in (np.float32, np.float64):
        with jax.enable_x64(dtype == np.float64):
            for layout in ("sorted", "sorted_unflagged", "unsorted"):
                indices, indptr = structure(rng, m, n, sort=layout != "unsorted")
                view = transposed_view(jnp.asarray(indices), jnp.asarray(indptr), n)
                for transpose in (False, True):
                    homogeneous = transpose and layout == "sorted"
                    data = rng.standard_normal(1 if homogeneous else indices.size).astype(dtype)
                    if not homogeneous:
                        data[-1] = np.nan  # the last synapse: its source entry is zeroed below
                    batch = 3 if transpose else 1
                    v = sparse_rows(rng, (batch, m if transpose else n), dtype)
                    last_row = np.repeat(np.arange(m), np.diff(indptr))[-1]
                    v[:, last_row if transpose else indices[-1]] = 0

                    def fn(backend):
                        return sb.csrmv_nonzero(jnp.asarray(data), indices, indptr, view, jnp.asarray(v),
                                                shape=(m, n), transpose=transpose, sorted_rows=layout == "sorted",
                                                backend=backend)

                    got = np.asarray(fn(BACKEND))
                    assert got.dtype == dtype and np.all(np.isfinite(got))
                    np.testing.assert_array_equal(got, numba_cpu(fn))
                    a = dense_of(np.nan_to_num(data, nan=0.0), indices, indptr, (m, n))
                    np.testing.assert_allclose(got, v @ (a if transpose else a.T), rtol=1e-5, atol=1e-5)


def test_csrmv_nonzero_unsorted_row_adds_in_column_order():
    data = np.array([1.0, 1e8, -1e8], np.float32)  # stored: columns 2, 0, 1
    indices, indptr = np.array([2, 0, 1], np.int32), np.array([0, 3], np.int32)
    view = transposed_view(jnp.asarray(indices), jnp.asarray(indptr), 3)

    def fn(backend):
        return sb.csrmv_nonzero(jnp.asarray(data), indices, indptr, view, jnp.ones((1, 3), jnp.float32),
                                shape=(1, 3), transpose=False, sorted_rows=False, backend=backend)

    got = np.asarray(fn(BACKEND))
    np.testing.assert_array_equal(got, numba_cpu(fn))
    assert got[0, 0] == 1.0


def test_csr_sddmm_nonzero():
    rng = np.random.default_rng(1)
    m, n = 5, 6
    for dtype in (np.float32, np.float64):
        with jax.enable_x64(dtype == np.float64):
            indices, indptr = structure(rng, m, n, sort=False)
            view = transposed_view(jnp.asarray(indices), jnp.asarray(indptr), n)
            for batch in (1, 3):
                r = sparse_rows(rng, (batch, m), dtype)
                q = sparse_rows(rng, (batch, n), dtype)

                def fn(backend):
                    return sb.csr_sddmm_nonzero(indices, indptr, view, jnp.asarray(r), jnp.asarray(q), shape=(m, n),
                                                backend=backend)

                got = np.asarray(fn(BACKEND))
                assert got.shape == (indices.size,)
                np.testing.assert_array_equal(got, numba_cpu(fn))
                rows = np.repeat(np.arange(m), np.diff(indptr))
                np.testing.assert_allclose(got, np.sum(r[:, rows] * q[:, indices], axis=0), rtol=1e-5, atol=1e-6)


def test_densemv_and_outer_nonzero():
    rng = np.random.default_rng(2)
    m, n = 4, 5
    for dtype in (np.float32, np.float64):
        with jax.enable_x64(dtype == np.float64):
            w = rng.standard_normal((m, n)).astype(dtype)
            for transpose in (False, True):
                v = sparse_rows(rng, (2, m if transpose else n), dtype)
                w_nan = w.copy()
                v[:, 1] = 0
                if transpose:
                    w_nan[1, :] = np.nan
                else:
                    w_nan[:, 1] = np.nan

                def mv(backend):
                    return sb.densemv_nonzero(jnp.asarray(w_nan), jnp.asarray(v), transpose=transpose,
                                              backend=backend)

                got = np.asarray(mv(BACKEND))
                np.testing.assert_array_equal(got, numba_cpu(mv))
                np.testing.assert_allclose(got, v @ (w if transpose else w.T), rtol=1e-5, atol=1e-6)
            for batch in (1, 3):
                r = sparse_rows(rng, (batch, m), dtype)
                q = sparse_rows(rng, (batch, n), dtype)

                def outer(backend):
                    return sb.dense_outer_nonzero(jnp.asarray(r), jnp.asarray(q), backend=backend)

                got = np.asarray(outer(BACKEND))
                assert got.shape == (m, n)
                np.testing.assert_array_equal(got, numba_cpu(outer))
                np.testing.assert_allclose(got, r.T @ q, rtol=1e-5, atol=1e-6)

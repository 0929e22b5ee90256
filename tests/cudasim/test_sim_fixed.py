"""The fixed-width functions on the Numba CUDA backend, in Numba's CUDA simulator
(started by tests/test_fixed_cudasim.py).

The fixed family binds CSR's ops on the table's CSR structure (flat indices,
row pointers ``k * arange(n + 1)``), so its CUDA kernels are CSR's.  As in
tests/cudasim/test_sim_harness.py, the CSR ops' ``numba_cuda`` GPU generators
are registered here as a CPU backend of the same name (this process only):
``backend="numba_cuda"`` on the public fixed functions then lowers to them on
the CPU.  Checked against dense NumPy under jax.jit: duplicate targets (atomic
adds), silent rows, out-of-range targets skipped, the event-driven weight
gradient; and every transform through the property harness.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import evjax
from evjax.primitives import csr
from evjax.testing import check_all
from tests.helpers import cuda_kernel_tests_on_simulator, FIXED_OPS, fixed_matmul_spec, fixed_sddmm_spec, SIM_SKIP

ON_SIMULATOR = cuda_kernel_tests_on_simulator(csr.OPS)

BACKEND = "numba_cuda"
N_ROWS, N_COLS, K = 6, 4, 3
CASES = [(rank, event, transpose) for rank in (1, 2) for event in (False, True) for transpose in (False, True)]


def _table(rng):
    indices = rng.integers(0, N_COLS, (N_ROWS, K)).astype(np.int32)
    indices[0] = [1, 1, 1]  # duplicate targets
    indices[1, 0], indices[2, 2] = N_COLS, -1  # malformed: skipped (traced under jit)
    return indices, rng.standard_normal((N_ROWS, K)).astype(np.float32)


def _dense(indices, weights):
    a = np.zeros((N_ROWS, N_COLS))
    w = np.broadcast_to(np.asarray(weights, np.float64).reshape(-1) if np.ndim(weights) == 1 else weights,
                        indices.shape)
    for i, l in np.ndindex(indices.shape):
        if 0 <= indices[i, l] < N_COLS:
            a[i, indices[i, l]] += w[i, l]
    return a


@pytest.mark.parametrize("rank, event, transpose", CASES)
def test_matmul_matches_dense_under_jit(rank, event, transpose):
    rng = np.random.default_rng(rank * 4 + event * 2 + transpose)
    indices, weights = _table(rng)
    n_in = N_ROWS if transpose else N_COLS
    x = rng.random((n_in,) if rank == 1 else (n_in, 2)) < 0.6
    x = x if event else rng.standard_normal(x.shape).astype(np.float32)
    fn = FIXED_OPS[(rank, event)]
    run = jax.jit(lambda w, i, x: fn(w, i, x, shape=(N_ROWS, N_COLS), transpose=transpose, backend=BACKEND))
    for w in (weights, np.array([0.5], np.float32)):
        a = _dense(indices, w)
        want = (a.T if transpose else a) @ x.astype(np.float64)
        np.testing.assert_allclose(np.asarray(run(w, indices, x), np.float64), want, rtol=1e-5, atol=1e-5)


def test_weight_gradient_event_driven():
    rng = np.random.default_rng(9)
    indices, weights = _table(rng)
    spikes = rng.random(N_ROWS) < 0.5
    ct = rng.standard_normal(N_COLS).astype(np.float32)
    valid = (indices >= 0) & (indices < N_COLS)
    want = np.where(spikes[:, None] & valid, ct[np.clip(indices, 0, N_COLS - 1)], 0)
    loss = jax.jit(jax.grad(lambda w, i: jnp.vdot(ct, evjax.binary_fcnmv(
        w, i, spikes, shape=(N_ROWS, N_COLS), transpose=True, backend=BACKEND))))
    np.testing.assert_allclose(loss(weights, indices), want, rtol=1e-6)
    sddmm = jax.jit(lambda i: evjax.fcn_sddmm(i, spikes, ct, shape=(N_ROWS, N_COLS), backend=BACKEND))
    np.testing.assert_allclose(sddmm(indices), want, rtol=1e-6)


def _one_table(rank, event, transpose, seed):
    """5 x 4, k = 3, duplicates in row 0; homogeneous weights on odd seeds."""
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, 4, (5, 3)).astype(np.int32)
    indices[0] = [2, 2, 1]
    weights = rng.uniform(0.5, 1.5, (1,) if seed % 2 else (5, 3)).astype(np.float32)
    shape = ((4,) if not transpose else (5,)) + ((2,) if rank == 2 else ())
    x = rng.random(shape) < 0.5 if event else rng.standard_normal(shape).astype(np.float32)
    return weights, indices, x, (5, 4)


@pytest.mark.parametrize("rank, event, transpose", CASES)
def test_every_transform(rank, event, transpose):
    seed = CASES.index((rank, event, transpose))
    check_all(fixed_matmul_spec(rank, event, transpose, BACKEND), _one_table(rank, event, transpose, seed),
              skip=SIM_SKIP, seed=seed)


def test_sddmm_every_transform():
    rng = np.random.default_rng(1)
    indices = rng.integers(0, 4, (5, 3)).astype(np.int32)
    r = (rng.standard_normal((5, 2)) * (rng.random((5, 2)) < 0.6)).astype(np.float32)
    q = rng.standard_normal((4, 2)).astype(np.float32)
    check_all(fixed_sddmm_spec(BACKEND), (indices, r, q, (5, 4)), skip=SIM_SKIP)

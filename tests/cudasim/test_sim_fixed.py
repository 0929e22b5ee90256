"""The fixed-width ops' Numba CUDA generators (the CSR CUDA kernels on the flattened
table) end to end under jax.jit in Numba's CUDA simulator, against dense NumPy:
duplicate targets (atomic adds), silent rows, out-of-range targets skipped, and
the event-driven weight gradient."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from evjax.backends import numba_cuda as bridge
from evjax.primitives.fixed import numba_cuda as fixed_cuda  # registers the generators
from evjax.primitives.fixed import ops

assert bridge.simulator_enabled(), "run with NUMBA_ENABLE_CUDASIM=1"
assert fixed_cuda.__name__.endswith("fixed.numba_cuda")

N_ROWS, N_COLS, K = 6, 4, 3
OPS = {(1, False): ops.fcnmv_p, (2, False): ops.fcnmm_p, (1, True): ops.binary_fcnmv_p, (2, True): ops.binary_fcnmm_p}


def _table(rng):
    indices = rng.integers(0, N_COLS, (N_ROWS, K)).astype(np.int32)
    indices[0] = [1, 1, 1]  # duplicate targets
    indices[1, 0], indices[2, 2] = N_COLS, -1  # malformed: skipped
    return indices, rng.standard_normal((N_ROWS, K)).astype(np.float32)


def _dense(indices, weights):
    a = np.zeros((N_ROWS, N_COLS))
    for i, l in np.ndindex(indices.shape):
        if 0 <= indices[i, l] < N_COLS:
            a[i, indices[i, l]] += weights[i, l]
    return a


def _run_generator(op, outs, *args, **params):
    ins = tuple(jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype) for a in args)
    generator = op.kernel_generator("gpu", "numba_cuda")
    run = generator(outs=outs, ins=ins, shape=(N_ROWS, N_COLS), **params)
    return np.asarray(jax.jit(run)(*args)[0], np.float64)


@pytest.mark.parametrize("rank, event, transpose", [(rank, event, transpose) for rank in (1, 2)
                                                    for event in (False, True) for transpose in (False, True)])
def test_matmul_generators_match_dense(rank, event, transpose):
    rng = np.random.default_rng(rank * 4 + event * 2 + transpose)
    indices, weights = _table(rng)
    a = _dense(indices, weights)
    n_in = N_ROWS if transpose else N_COLS
    x = rng.random((n_in,) if rank == 1 else (n_in, 2)) < 0.6
    x = x if event else rng.standard_normal(x.shape).astype(np.float32)
    want = (a.T if transpose else a) @ x.astype(np.float64)
    outs = [jax.ShapeDtypeStruct(want.shape, np.float32)]
    for w in (weights, np.array([0.5], np.float32)):
        expect = want if w.shape != (1,) else (_dense(indices, np.full_like(weights, 0.5)).T if transpose else
                                                _dense(indices, np.full_like(weights, 0.5))) @ x.astype(np.float64)
        np.testing.assert_allclose(_run_generator(OPS[(rank, event)], outs, w, indices, x, transpose=transpose), expect,
                                   rtol=1e-5, atol=1e-5)


def test_sddmm_generator_event_driven():
    rng = np.random.default_rng(9)
    indices, _ = _table(rng)
    spikes = rng.random(N_ROWS) < 0.5
    ct = rng.standard_normal(N_COLS).astype(np.float32)
    valid = (indices >= 0) & (indices < N_COLS)
    want = np.where(spikes[:, None] & valid, ct[np.clip(indices, 0, N_COLS - 1)], 0)
    got = _run_generator(ops.fcn_sddmm_p, [jax.ShapeDtypeStruct(indices.shape, np.float32)], indices, spikes, ct)
    np.testing.assert_allclose(got, want, rtol=1e-6)

"""A malformed structure traced under ``jit`` cannot be validated: every CPU kernel of the delay,
plasticity and sparse-backward families must stay in bounds (``docs/csr_backend_contract.md``,
"Malformed structures").  The result is unspecified; the call must return, not crash the process.

Each case runs in this process: a kernel that reads or writes out of bounds crashes the test worker
(each of these cases crashed the process before its kernel clamped its spans and checked its indices)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import evjax
from evjax.primitives.delay import csr_delay_deliver

N_PRE, N_POST = 3, 4
INDICES = np.array([0, 1, 2, 3, 1, 2], np.int32)
INDPTR = np.array([0, 2, 4, 6], np.int32)
W = np.ones(6, np.float32)
SPIKES = np.array([True, True, True])
IDENTITY = np.arange(6, dtype=np.int32)
BAD_INDPTR = {"huge": [0, 2, 10**8, 6], "negative": [0, -40, 4, 6], "falling": [0, 5, 1, 6], "past_end": [0, 2, 4, 60]}
BAD_INDEX = {"huge": [0, 10**8, 2, 3, 1, 2], "negative": [0, -10**6, 2, 3, 1, -1]}


def _deliver(ptr=INDPTR, idx=INDICES, backend="numba"):
    return csr_delay_deliver(jnp.zeros((4, N_POST)), SPIKES, W, idx, ptr, np.ones(6, np.int32), 1,
                             shape=(N_PRE, N_POST), backend=backend)


def _delay_gather(ptr=INDPTR, idx=INDICES, backend="numba"):  # the weight gradient
    return jax.grad(lambda d: csr_delay_deliver(jnp.zeros((4, N_POST)), SPIKES, d, idx, ptr, np.ones(6, np.int32), 1,
                                                shape=(N_PRE, N_POST), backend=backend).sum())(jnp.asarray(W))


def _pre(ptr=INDPTR, idx=INDICES, backend="numba"):
    return evjax.update_csr_on_binary_pre(W, idx, ptr, SPIKES, np.ones(N_POST, np.float32), 0.0, 1.0,
                                          shape=(N_PRE, N_POST), backend=backend)


def _post(ptr=INDPTR, idx=INDICES, positions=IDENTITY, backend="numba"):  # the CSC view of a (4, 3) matrix
    return evjax.update_csr_on_binary_post(W, idx, ptr, positions, np.ones(4, np.float32), np.ones(3, bool), 0.0,
                                           1.0, shape=(4, 3), backend=backend)


def _nonzero_mv(ptr=INDPTR, idx=INDICES, perm=IDENTITY, transpose=False, backend="numba"):
    v = np.ones(N_PRE if transpose else N_POST, np.float32)
    return evjax.csrmv_nonzero(W, idx, ptr, (idx, ptr, perm), v, shape=(N_PRE, N_POST), transpose=transpose,
                               sorted_rows=not transpose and perm is IDENTITY, backend=backend)


def _nonzero_sddmm(ptr=INDPTR, idx=INDICES, perm=IDENTITY, backend="numba"):
    return evjax.csr_sddmm_nonzero(idx, ptr, (idx, ptr, perm), np.ones(N_PRE, np.float32),
                                   np.ones(N_POST, np.float32), shape=(N_PRE, N_POST), backend=backend)


OPS = {"delay deliver": _deliver, "delay weight gradient": _delay_gather, "plasticity pre": _pre,
       "plasticity post": _post, "csrmv_nonzero": _nonzero_mv,
       "csrmv_nonzero transposed": lambda **k: _nonzero_mv(transpose=True, **k), "csr_sddmm_nonzero": _nonzero_sddmm}
CASES = [(op, "ptr", bad) for op in OPS for bad in BAD_INDPTR] + \
        [(op, "idx", bad) for op in OPS for bad in BAD_INDEX] + \
        [(op, "positions" if op == "plasticity post" else "perm", bad)
         for op in ("plasticity post", "csrmv_nonzero", "csr_sddmm_nonzero") for bad in BAD_INDEX]
SPARSE_BACKWARD = ("csrmv_nonzero", "csrmv_nonzero transposed", "csr_sddmm_nonzero")


@pytest.mark.parametrize("backend", ["numba", "warp"])
@pytest.mark.parametrize("op, operand, bad", CASES)
def test_a_malformed_traced_structure_stays_in_bounds(op, operand, bad, backend):
    if backend == "warp":
        pytest.importorskip("warp")
    table = BAD_INDPTR if operand == "ptr" else BAD_INDEX
    value = np.array(table[bad], np.int32)
    fn = OPS[op]
    out = jax.jit(lambda a: fn(**{operand: a}, backend=backend))(value)
    jax.block_until_ready(out)
    want = jax.eval_shape(lambda: fn(backend="reference"))
    assert out.shape == want.shape and out.dtype == want.dtype

"""Fixed fan-out / fan-in ops under every transform, on every CPU backend, against dense references.

Every op x orientation x weight kind x backend (numba, warp on Warp's CPU
device, the reference) goes through the property harness (evjax.testing):
eager, jit, jvp, vjp, grad, finite differences, vmap over every argument (a
different index table per batch element included, see ``table_resampler`` in tests/helpers.py),
nested vmap and jit(grad(vmap)).  The reference is the dense matrix built from
the table, A[i, j] = sum_{l: indices[i, l] = j} w[i, l], times the operand:
it pins down what ``transpose`` means (False: A @ x, the gather; True: A.T @ x,
the scatter).  Tables come from small buckets (rows and columns 0, 1, 2, 5;
k 0, 1, 4), with duplicate targets in a row.  The non-finite tests use the
structural reference instead (sums over the stored synapses only; events
select their weights).
"""
from __future__ import annotations


import jax
import numpy as np
import pytest
from hypothesis import strategies as st

import evjax
from evjax.testing import SIZES, check_all, property_test
from tests.helpers import FIXED_OPS, THOROUGH, fixed_matmul_spec, fixed_sddmm_spec

BACKENDS = ("numba", "warp", "reference")
K = (0, 1, 4)
# The references (fixed_dense_reference, fixed_structural_reference, fixed_sddmm_reference), the
# table resampler and the specs are in tests/helpers.py, named apart from the CSR family's.


@st.composite
def fixed_args(draw, *, rank, transpose, event, float_spikes=False, weighted=False, dtype=np.float32):
    """(weights, indices, x, shape): random tables (duplicates happen), homogeneous or per synapse."""
    n_rows, n_cols, k = draw(st.sampled_from(SIZES)), draw(st.sampled_from(SIZES)), draw(st.sampled_from(K))
    if n_cols == 0:
        k = 0  # no target to point at
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    indices = rng.integers(0, max(n_cols, 1), (n_rows, k)).astype(np.int32)
    homogeneous = draw(st.booleans())
    w_shape = (1,) if homogeneous else (n_rows, k)
    weights = (rng.uniform(0.5, 1.5, w_shape) * rng.choice([-1.0, 1.0])).astype(dtype)
    n_in = n_cols if not transpose else n_rows
    x_shape = (n_in,) if rank == 1 else (n_in, draw(st.sampled_from([1, 3])))
    if event:
        x = rng.random(x_shape) < draw(st.sampled_from([0.0, 0.4, 1.0]))  # no spikes, some, all
        x = (x * rng.uniform(0.5, 2.0, x_shape)).astype(dtype) if float_spikes else x
        x = (x * rng.standard_normal(x_shape)).astype(dtype) if weighted else x  # graded, zeros kept
    else:
        x = rng.standard_normal(x_shape).astype(dtype)
    return weights, indices, x, (n_rows, n_cols)


OP_CASES = [(rank, event, transpose) for event in (False, True) for rank in (1, 2) for transpose in (False, True)]
OP_IDS = [f"{FIXED_OPS[(r, e)].__name__}-{'scatter' if t else 'gather'}" for r, e, t in OP_CASES]
# CI (default profile): each op x orientation on one backend, the backends in turn (the kernels
# themselves are the CSR family's, tested on every backend in tests/test_csr_ops.py); the thorough
# profile runs every op x orientation on every backend.
ROTATION = {case: BACKENDS[n % len(BACKENDS)] for n, case in enumerate(OP_CASES)}
MATRIX = [(case, backend) for case in OP_CASES for backend in BACKENDS if THOROUGH or ROTATION[case] == backend]


@pytest.mark.parametrize("case, backend", MATRIX, ids=[f"{OP_IDS[OP_CASES.index(c)]}-{b}" for c, b in MATRIX])
def test_matmul_properties(case, backend):
    rank, event, transpose = case
    property_test(fixed_matmul_spec(rank, event, transpose, backend),
                  fixed_args(rank=rank, transpose=transpose, event=event))()


def one_table(rank, event, transpose, weighted, seed):
    """One fixed example for check_all: 5 x 4, k = 3, duplicates in row 0, a silent row; homogeneous
    weights on odd seeds."""
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, 4, (5, 3)).astype(np.int32)
    indices[0] = [2, 2, 1]
    weights = rng.uniform(0.5, 1.5, (1,) if seed % 2 else (5, 3)).astype(np.float32)
    x_shape = ((4,) if not transpose else (5,)) + ((2,) if rank == 2 else ())
    if not event:
        x = rng.standard_normal(x_shape).astype(np.float32)
    else:
        x = rng.random(x_shape) < 0.5
        x[0] = False
        x = (x * rng.standard_normal(x_shape)).astype(np.float32) if weighted else x
    return weights, indices, x, (5, 4)


# The cases the default profile's rotations above leave out, one example each under every transform
# (nested vmap and finite differences left to the property tests): every op x orientation x weight
# kind on every backend in CI.
SWEEP = [(case, backend) for case in OP_CASES for backend in BACKENDS if ROTATION[case] != backend]
WEIGHTED_SWEEP = [(rank, transpose, backend) for rank in (1, 2) for transpose in (True, False) for backend in BACKENDS
                  if (rank, transpose, backend) not in ((1, True, "numba"), (2, False, "warp"))]


@pytest.mark.parametrize("case, backend", SWEEP, ids=[f"{OP_IDS[OP_CASES.index(c)]}-{b}" for c, b in SWEEP])
def test_matmul_every_backend_once(case, backend):
    rank, event, transpose = case
    seed = SWEEP.index((case, backend))  # per-synapse and homogeneous weights in turn
    check_all(fixed_matmul_spec(rank, event, transpose, backend), one_table(rank, event, transpose, False, seed),
              skip=("nested_vmap", "check_grads"), seed=seed)


@pytest.mark.parametrize("rank, transpose, backend", WEIGHTED_SWEEP)
def test_weighted_every_backend_once(rank, transpose, backend):
    seed = rank + 2 * transpose
    check_all(fixed_matmul_spec(rank, True, transpose, backend, weighted=True),
              one_table(rank, True, transpose, True, seed), skip=("nested_vmap", "check_grads"), seed=seed)


NONFINITE = [(case, backend) for case in OP_CASES for backend in BACKENDS
             if THOROUGH or (case, backend) == ((1, True, True), "numba")]


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("case, backend", NONFINITE,
                         ids=[f"{OP_IDS[OP_CASES.index(c)]}-{b}" for c, b in NONFINITE])
def test_matmul_nonfinite(case, backend):
    """NaN and inf in weights and operands: IEEE on stored synapses, events select."""
    rank, event, transpose = case
    property_test(fixed_matmul_spec(rank, event, transpose, backend, nonfinite=True),
                  fixed_args(rank=rank, transpose=transpose, event=event), skip=("nested_vmap",))()


@pytest.mark.parametrize("rank, transpose", [(1, True), (2, False)] if THOROUGH else [(1, True)])
def test_float_spikes_straight_through(rank, transpose):
    """Float spikes: forward on 1[s != 0]; d out / d s = A (straight-through)."""
    property_test(fixed_matmul_spec(rank, True, transpose, "numba", float_spikes=True),
                  fixed_args(rank=rank, transpose=transpose, event=True, float_spikes=True),
                  skip=("nested_vmap",))()


WEIGHTED = [(rank, transpose, backend) for rank in (1, 2) for transpose in (True, False) for backend in BACKENDS
            if THOROUGH or (rank, transpose, backend) in ((1, True, "numba"), (2, False, "warp"))]


@pytest.mark.parametrize("rank, transpose, backend", WEIGHTED)
def test_weighted_properties(rank, transpose, backend):
    """Weighted (graded) events: A @ v over the nonzero entries; true gradient w.r.t. the values."""
    property_test(fixed_matmul_spec(rank, True, transpose, backend, weighted=True),
                  fixed_args(rank=rank, transpose=transpose, event=True, weighted=True))()


@pytest.mark.parametrize("transpose", (True, False))
def test_weighted_is_csrs_weighted_op_on_the_flat_table(transpose):
    """One kernel call, CSR's weighted one (its FFI target), and a zero value skips even NaN weights."""
    rng = np.random.default_rng(3)
    n, k = 6, 3
    indices = rng.integers(0, n, (n, k)).astype(np.int32)
    weights = rng.standard_normal((n, k)).astype(np.float32)
    values = np.where(rng.random(n) < 0.5, rng.standard_normal(n), 0).astype(np.float32)
    values[0], values[1] = 0.0, 2.0
    weights[0 if transpose else 1] = np.nan  # row 0 (scatter: values[0] = 0) / row 1 (gather)
    if not transpose:
        values[indices[1]] = 0.0  # gather: row 1 reads only zero values
    fn = jax.jit(lambda w, i, v: evjax.binary_fcnmv(w, i, v, shape=(n, n), transpose=transpose, weighted=True))
    got = np.asarray(fn(weights, indices, values))
    a = np.zeros((n, n), np.float64)
    for i in range(n):
        for l in range(k):
            if (values[i] if transpose else values[indices[i, l]]) != 0:
                a[i, indices[i, l]] += weights[i, l] * (1.0 if transpose else values[indices[i, l]])
    expected = (a.T @ values) if transpose else a.sum(axis=1)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert fn.lower(weights, indices, values).as_text().count("custom_call") == 1
    names = [e.primitive.name for e in jax.make_jaxpr(fn)(weights, indices, values).eqns[0].params["jaxpr"].eqns]
    assert "evjax_binary_csrmv" in names and not any(name.startswith("evjax_fcn") for name in names)


# ---------------------------------------------------------------------------
# the weight-gradient op itself under every transform
# ---------------------------------------------------------------------------
@st.composite
def sddmm_args(draw):
    n_rows, n_cols, k = draw(st.sampled_from(SIZES)), draw(st.sampled_from(SIZES[1:])), draw(st.sampled_from(K))
    extra = () if draw(st.booleans()) else (2,)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    indices = rng.integers(0, n_cols, (n_rows, k)).astype(np.int32)
    r = (rng.standard_normal((n_rows, *extra)) * (rng.random((n_rows, *extra)) < 0.6)).astype(np.float32)
    return indices, r, rng.standard_normal((n_cols, *extra)).astype(np.float32), (n_rows, n_cols)


test_sddmm_properties = property_test(fixed_sddmm_spec, sddmm_args(), backends=BACKENDS if THOROUGH else ("numba",))


# ---------------------------------------------------------------------------
# a lone op stays a cheap program for JAX's CPU client
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["spikes", "float", "weighted"])
@pytest.mark.parametrize("cls", ["FixedPostNumConn", "FixedPreNumConn"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_a_lone_op_counts_no_xla_flops(cls, side, kind):
    """JAX's CPU client runs a program on the calling thread only when XLA counts under 1000 flops
    in it (else, by default, it hands it to a worker thread: tens of microseconds).  A kernel call
    counts none; the row pointers (n + 1 = 2001 of them) must not either (``arange * k`` did)."""
    n, k = 2000, 8
    W = getattr(evjax, cls).random(0, n, n, k, weight=np.ones((n, k), np.float32))
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(np.float32)
    operand = {"spikes": x > 1, "float": x, "weighted": evjax.WeightedArray(np.where(x > 1, x, 0))}[kind]
    fn = (lambda W, v: v @ W) if side == "left" else (lambda W, v: W @ v)
    with evjax.use_backend("numba"):
        compiled = jax.jit(fn).lower(W, operand).compile()
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
    assert analysis.get("flops", 0.0) < 1000, analysis

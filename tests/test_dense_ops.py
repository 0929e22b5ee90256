"""Dense event ops under every transform, on every CPU backend, against a dense jax.numpy reference.

``binary_densemv``/``binary_densemm`` x orientation x ``weighted`` x backend
(numba, warp on Warp's CPU device, the reference) go through the property
harness: eager, jit, jvp, vjp, grad, vmap over weights, events and both
(every in_axes), nested vmap and jit(grad(vmap)).  Shapes come from the
harness's small buckets (0, 1, 2, 5: k = 0, 1x1 and empty outputs happen),
activity from {none, some, all}.

The reference is written term by term with the promised semantics: an
inactive event contributes nothing whatever its weight holds (``where``, not a
product); an active one contributes its weight (binary) or ``value * weight``
(weighted).  Its derivative in float events is ``W`` (straight-through for
binary spikes, the true derivative of the linear map for weighted values).
"""
from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st

import evjax
from evjax.primitives.dense import binary_dense_outer
from evjax.testing import SIZES, check_all, property_test
from tests.helpers import DENSE_OPS, THOROUGH, dense_one_example, dense_spec

HAS_WARP = importlib.util.find_spec("warp") is not None
BACKENDS = ("numba", "reference") + (("warp",) if HAS_WARP else ())
NONFINITE_WARNINGS = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
# The reference (dense_events_reference: y[i, c] = sum_j where(s[j, c] != 0, v[j, c] * W_rows[j, i], 0)),
# the resampler and dense_spec are in tests/helpers.py (tests/cudasim/test_sim_dense.py uses them too).


@st.composite
def dense_args(draw, *, rank, transpose, weighted, dtype=np.float32, events="bool"):
    """``(weights, spikes)`` from the size buckets; events bool, uint8, float 0/1 or graded floats."""
    k, m = draw(st.sampled_from(SIZES)), draw(st.sampled_from(SIZES))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    w = rng.standard_normal((k, m) if transpose else (m, k)).astype(dtype)
    s_shape = (k,) if rank == 1 else (k, draw(st.sampled_from([1, 3])))
    active = rng.random(s_shape) < draw(st.sampled_from([0.0, 0.4, 1.0]))  # none, some, all
    if events == "bool":
        s = active
    elif events == "uint8":
        s = (active * rng.integers(1, 3, s_shape)).astype(np.uint8)
    elif events == "float01":
        s = active.astype(np.float32)
    else:  # graded
        s = (active * rng.uniform(0.5, 2.0, s_shape) * rng.choice([-1.0, 1.0], s_shape)).astype(np.float32)
    return w, s


CASES = [(rank, transpose, weighted) for rank in (1, 2) for transpose in (True, False) for weighted in (False, True)]
IDS = [f"{DENSE_OPS[r].__name__}-{'scatter' if t else 'gather'}-{'weighted' if w else 'binary'}" for r, t, w in CASES]


# CI budget: every case on numba (the CPU default); warp and the reference on a diagonal that still
# runs each of their kernels with both event kinds; the whole product under the thorough profile
DIAGONAL = {(1, True, False), (2, False, True)}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rank, transpose, weighted", CASES, ids=IDS)
def test_dense_properties(rank, transpose, weighted, backend):
    if backend != "numba" and (rank, transpose, weighted) not in DIAGONAL and not THOROUGH:
        pytest.skip("covered by the diagonal cases; the thorough profile runs it")
    events = "graded" if weighted else "bool"
    property_test(dense_spec(rank, transpose, weighted, backend, float_events=weighted),
                  dense_args(rank=rank, transpose=transpose, weighted=weighted, events=events),
                  skip=("nested_vmap",) if backend == "reference" else ())()


SWEEP = [(case, backend) for case in CASES for backend in BACKENDS if backend != "numba" and case not in DIAGONAL]


@pytest.mark.parametrize("case, backend", SWEEP, ids=[f"{IDS[CASES.index(c)]}-{b}" for c, b in SWEEP])
def test_dense_every_backend_once(case, backend):
    """The cases the diagonal leaves out, one example under every transform (nested vmap and finite
    differences left to the property tests): every op x orientation x event kind on every backend in CI."""
    rank, transpose, weighted = case
    example = dense_one_example(rank, transpose, weighted, seed=SWEEP.index((case, backend)), k=5, m=3)
    check_all(dense_spec(rank, transpose, weighted, backend, float_events=weighted), example,
              skip=("nested_vmap", "check_grads"))


@pytest.mark.parametrize("rank, transpose, events", [(1, True, "uint8"), (2, False, "float01")])
def test_event_dtypes_straight_through(rank, transpose, events):
    """uint8 and float 0/1 events (float: d out / d s = W, straight-through)."""
    property_test(dense_spec(rank, transpose, False, "numba", float_events=events == "float01"),
                  dense_args(rank=rank, transpose=transpose, weighted=False, events=events),
                  skip=("nested_vmap", "jit_grad_vmap"))()


@pytest.mark.parametrize("dtype, rank, transpose, weighted", [
    (jnp.float16, 1, True, False), (jnp.bfloat16, 2, False, True), (np.float64, 1, False, True)])
def test_weight_dtypes(dtype, rank, transpose, weighted):
    """float16/bfloat16 (accumulated in float32) and float64 weights: the op returns their dtype."""
    with jax.enable_x64(dtype == np.float64):
        property_test(dense_spec(rank, transpose, weighted, "numba"),
                      dense_args(rank=rank, transpose=transpose, weighted=weighted, dtype=dtype,
                                 events="graded" if weighted else "bool"),
                      skip=("nested_vmap", "vmap", "jit_grad_vmap"))()


@NONFINITE_WARNINGS
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rank, transpose, weighted", [(1, True, False), (2, False, True)])
def test_dense_nonfinite(rank, transpose, weighted, backend):
    """NaN and inf in weights (and graded events): an inactive event never meets its weights."""
    property_test(dense_spec(rank, transpose, weighted, backend, float_events=weighted, nonfinite=True),
                  dense_args(rank=rank, transpose=transpose, weighted=weighted,
                             events="graded" if weighted else "bool"),
                  skip=("nested_vmap", "vmap"))()


# ---------------------------------------------------------------------------
# the weight gradient visits only active events; fixed edge cases
# ---------------------------------------------------------------------------
@NONFINITE_WARNINGS
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rank", [1, 2])
@pytest.mark.parametrize("transpose", [True, False])
def test_outer_selects_active_events(transpose, rank, backend):
    """W_bar = outer(e(s), g): rows (or columns) of inactive events are exactly 0, even where g is nan."""
    rng = np.random.default_rng(rank + 2 * transpose)
    k, m = 6, 5
    s = rng.random((k, 3) if rank == 2 else (k,)) < 0.5
    s[0], s[1] = False, True
    g = rng.standard_normal((m, 3) if rank == 2 else (m,)).astype(np.float32)
    g[0] = np.nan
    got = np.asarray(binary_dense_outer(s, g, transpose=transpose, backend=backend))
    s2, g2 = (s, g) if rank == 2 else (s[:, None], g[:, None])
    want = np.where(s2[:, None, :], g2[None, :, :], 0.0).sum(-1)  # (k, m): select, then sum over columns
    want = want if transpose else want.T
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    inactive = ~s2.any(axis=1)
    assert np.all((got if transpose else got.T)[inactive] == 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_edge_shapes(backend):
    """k = 0 (zeros), 1x1, no events and all events, against NumPy."""
    for (k, m, rate) in [(0, 3, 1.0), (1, 1, 1.0), (1, 1, 0.0), (4, 3, 0.0), (4, 3, 1.0)]:
        w = np.arange(k * m, dtype=np.float32).reshape(k, m) - 2
        s = np.full(k, rate > 0)
        for transpose, weights in ((True, w), (False, np.ascontiguousarray(w.T))):
            got = evjax.binary_densemv(weights, s, transpose=transpose, backend=backend)
            np.testing.assert_allclose(got, s.astype(np.float32) @ w, err_msg=f"k={k} m={m} rate={rate}")
            both = np.stack([s, ~s], 1)  # (k, 2)
            got = evjax.binary_densemm(weights, both, transpose=transpose, backend=backend)
            np.testing.assert_allclose(got, (both.T.astype(np.float32) @ w).T, err_msg=f"mm k={k} m={m}")


def test_larger_parallel_kernels_match_numpy():
    """Sizes above the parallel threshold (every kernel's prange path) against NumPy."""
    from evjax.primitives.dense import numba as dense_numba

    assert 1600 * 1400 > dense_numba.PARALLEL_MIN_WORK
    rng = np.random.default_rng(7)
    k, m, n = 1600, 1400, 3  # active work and outer sizes above PARALLEL_MIN_WORK (2**21)
    w = rng.standard_normal((k, m)).astype(np.float32)
    s = rng.random((k, n)) < 0.5
    ref = s.T.astype(np.float64) @ w
    np.testing.assert_allclose(evjax.binary_densemm(w, s, transpose=True, backend="numba"), ref.T, rtol=1e-4,
                               atol=1e-3)
    np.testing.assert_allclose(evjax.binary_densemm(w.T.copy(), s, transpose=False, backend="numba"), ref.T,
                               rtol=1e-4, atol=1e-3)
    g = rng.standard_normal((m, n)).astype(np.float32)
    np.testing.assert_allclose(binary_dense_outer(s, g, transpose=True, backend="numba"), s @ g.T, rtol=1e-4,
                               atol=1e-4)
    np.testing.assert_allclose(binary_dense_outer(s, g, transpose=False, backend="numba"), g @ s.T, rtol=1e-4,
                               atol=1e-4)


def test_check_all_by_hand_on_nan_weights():
    """One fixed example through every check, NaN weights in the rows of silent events."""
    w = np.array([[np.nan, 1.0], [2.0, -1.0], [np.inf, 0.5]], np.float32)  # (k=3, m=2)
    s = np.array([False, True, False])
    check_all(dense_spec(1, True, False, "numba"), (w, s), skip=("check_grads",))
    np.testing.assert_array_equal(evjax.binary_densemv(w, s, transpose=True), [2.0, -1.0])

"""The per-synapse products (``*_dt2t``) against tests/helpers.py's dense oracles, under every transform.

CSR/CSC (``evjax.primitives.csr.products``), fixed tables (``.fixed.products``) and JITC
(``.jitc.products``).  A few shapes only (edges included: no synapse, no row, one row), so that the
harness's programs are reused across examples.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st

import evjax
from evjax.errors import BackendNotAvailableError
from evjax.primitives.csr.products import cscmm_dt2t, cscmv_dt2t, csrmm_dt2t, csrmv_dt2t
from evjax.primitives.fixed.products import fcnmm_dt2t, fcnmv_dt2t
from evjax.primitives.jitc.products import jitnmv_dt2t, jitsmv_dt2t, jitumv_dt2t
from evjax.testing import OpSpec, check_all, property_test, random_csr
from tests.helpers import (
    csr_dt2t_reference, csr_dt2t_resampler, fixed_dt2t_reference, jitc_dt2t_reference, jitc_dt2t_synapses,
    table_resampler,
)

CSR_FUNCTIONS = {("csr", 1): csrmv_dt2t, ("csc", 1): cscmv_dt2t, ("csr", 2): csrmm_dt2t, ("csc", 2): cscmm_dt2t}
BATCH = 2


# ---------------------------------------------------------------------------
# CSR and CSC: args (y, w, indices, indptr, shape, transpose)
# ---------------------------------------------------------------------------
@functools.cache  # one spec per op: its compiled programs serve every test of the same shapes
def csr_spec(layout: str, rank: int, backend: str | None = None) -> OpSpec:
    fn = CSR_FUNCTIONS[(layout, rank)]
    csc = layout == "csc"
    return OpSpec(lambda y, w, indices, indptr, shape, transpose: fn(y, w, indices, indptr, shape=shape,
                                                                     transpose=transpose, backend=backend),
                  csr_dt2t_reference(csc), diff_argnums=(0, 1), static_argnums=(4, 5), backend=backend,
                  resample=csr_dt2t_resampler(csc), name=f"{fn.__name__}[{backend}]")


def csr_example(rng, layout: str, rank: int, shape, nse: int, transpose: bool, dtype=np.float32,
                index_dtype=np.int32):
    """Arguments of one call: the structure is over ``shape`` (CSR) or its reverse (CSC)."""
    stored = shape[::-1] if layout == "csc" else shape
    indices, indptr = random_csr(rng, stored[0], stored[1], nse, index_dtype=index_dtype)
    n_y = shape[1] if transpose else shape[0]
    lead = (BATCH,) if rank == 2 else ()
    y = rng.standard_normal(lead + (n_y,)).astype(dtype)
    w = rng.standard_normal(lead + (len(indices),)).astype(dtype)
    return y, w, indices, indptr, tuple(shape), transpose


# (shape, nse): no synapse, no row, no column, one row, a square-ish one with empty rows and duplicates
EDGE_CASES = [((3, 4), 0), ((0, 3), 0), ((4, 0), 0), ((1, 5), 3), ((5, 4), 9)]


@st.composite
def csrmv_args(draw):
    shape, nse = (5, 4), 9  # one shape: examples reuse its programs (edges: test_edge_shapes)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return csr_example(rng, "csr", 1, shape, nse, draw(st.booleans()))


# every backend of csr_sddmm, which gives each synapse its row's (column's) value
test_csrmv_dt2t_properties = property_test(lambda backend: csr_spec("csr", 1, backend), csrmv_args(),
                                           backends=("numba", "warp", "reference"))


@pytest.mark.parametrize("layout, rank, transpose", [("csr", 2, True), ("csc", 1, False), ("csc", 1, True),
                                                    ("csc", 2, False)])
def test_csc_and_batched_products_under_every_transform(layout, rank, transpose):
    rng = np.random.default_rng(3)
    # bilinear: jvp and vjp against the reference say it all; nested vmap: the csrmv property test
    check_all(csr_spec(layout, rank), csr_example(rng, layout, rank, (5, 4), 9, transpose), seed=11,
              skip=("check_grads", "nested_vmap"))


@pytest.mark.parametrize("shape, nse", EDGE_CASES[:4])
def test_edge_shapes(shape, nse):
    rng = np.random.default_rng(5)
    for layout, rank in CSR_FUNCTIONS:
        spec = csr_spec(layout, rank)
        for transpose in (False, True):
            args = csr_example(rng, layout, rank, shape, nse, transpose)
            out = spec.fn(*args)
            assert out.shape == np.shape(args[1]) and out.dtype == jnp.float32
            if (layout, rank) == ("csr", 1):  # forward, jvp, vjp and the vmap cases, under jit
                check_all(spec, args, skip=("check_grads", "nested_vmap", "jit_grad_vmap"))
            else:
                spec.close(out, spec.expected(args), "eager forward")


def test_the_products_are_brainevents_examples():
    indices, indptr = np.array([0, 2, 1, 2]), np.array([0, 2, 4])
    w = np.array([0.5, 0.3, 0.7, 0.1], np.float32)
    np.testing.assert_allclose(csrmv_dt2t(np.array([1.0, 2.0], np.float32), w, indices, indptr, shape=(2, 3)),
                               [0.5, 0.3, 1.4, 0.2], rtol=1e-7)
    np.testing.assert_allclose(csrmv_dt2t(np.array([1.0, 2.0, 3.0], np.float32), w, indices, indptr, shape=(2, 3),
                                          transpose=True), [0.5, 0.9, 1.4, 0.3], rtol=1e-6)
    # CSC of a (3, 2) matrix: y by the CSC row (indices), or by the column owning the synapse
    y3 = np.array([1.0, 2.0, 3.0], np.float32)
    np.testing.assert_array_equal(cscmv_dt2t(y3, np.ones(4, np.float32), indices, indptr, shape=(3, 2)),
                                  [1.0, 3.0, 2.0, 3.0])
    np.testing.assert_array_equal(cscmv_dt2t(y3[:2], np.ones(4, np.float32), indices, indptr, shape=(3, 2),
                                             transpose=True), [1.0, 1.0, 2.0, 2.0])
    y = np.array([[1.0, 2.0], [10.0, 20.0]], np.float32)
    np.testing.assert_array_equal(csrmm_dt2t(y, np.ones((2, 4), np.float32), indices, indptr, shape=(2, 3)),
                                  [[1, 1, 2, 2], [10, 10, 20, 20]])


@pytest.mark.parametrize("y_dtype, w_dtype, index_dtype", [(np.float32, np.float64, np.int64),
                                                           (np.float64, np.float32, np.int32),
                                                           (np.int32, np.float32, np.int64),
                                                           (np.int64, np.float64, np.int32)])
def test_dtypes_promote_as_jax_does(y_dtype, w_dtype, index_dtype):
    rng = np.random.default_rng(7)
    with jax.enable_x64(True):
        for layout, rank in (("csr", 1), ("csc", 2)):
            for transpose in (False, True):
                y, w, indices, indptr, shape, _ = csr_example(rng, layout, rank, (5, 4), 9, transpose,
                                                              index_dtype=index_dtype)
                y = (y * 10).astype(y_dtype)
                w = w.astype(w_dtype)
                out = CSR_FUNCTIONS[(layout, rank)](y, w, indices, indptr, shape=shape, transpose=transpose)
                assert out.dtype == jnp.result_type(y, w)
                want = csr_dt2t_reference(layout == "csc")(y, w, indices, indptr, shape, transpose)
                np.testing.assert_array_equal(np.asarray(out), np.asarray(want))


def test_ieee_products_and_out_of_range_columns_under_jit():
    y = np.array([np.nan, np.inf, 0.0], np.float32)
    w = np.array([0.0, 2.0, np.inf, 1.0], np.float32)
    indices, indptr = np.array([0, 1, 2, 2], np.int32), np.array([0, 1, 4], np.int32)
    out = csrmv_dt2t(y, w, indices, indptr, shape=(2, 3), transpose=True)
    np.testing.assert_array_equal(np.asarray(out), [np.nan, np.inf, np.nan, 0.0])  # 0*nan, 2*inf, inf*0, 1*0
    # a traced column outside [0, n_cols) is skipped (0), as the CSR products skip it
    f = jax.jit(lambda idx: csrmv_dt2t(np.ones(3, np.float32), np.ones(4, np.float32), idx, indptr, shape=(2, 3),
                                       transpose=True))
    np.testing.assert_array_equal(np.asarray(f(np.array([0, 3, -1, 2], np.int32))), [1.0, 0.0, 0.0, 1.0])


def test_no_retrace_for_new_structures_and_values():
    traces = []

    @jax.jit
    def step(y, w, indices, indptr):
        traces.append(1)
        return csrmv_dt2t(y, w, indices, indptr, shape=(5, 4))

    rng = np.random.default_rng(9)
    for _ in range(3):
        y, w, indices, indptr, _, _ = csr_example(rng, "csr", 1, (5, 4), 9, False)
        want = csr_dt2t_reference(False)(y, w, indices, indptr, (5, 4), False)
        np.testing.assert_array_equal(np.asarray(step(y, w, indices, indptr)), np.asarray(want))
    assert len(traces) == 1


def _csr_call(fn=csrmv_dt2t, **change):
    args = dict(y=np.ones(2, np.float32), w=np.ones(3, np.float32), indices=np.array([0, 1, 0], np.int32),
                indptr=np.array([0, 2, 3], np.int32), shape=(2, 2))
    args.update(change)
    return fn(args.pop("y"), args.pop("w"), args.pop("indices"), args.pop("indptr"), **args)


@pytest.mark.parametrize("change, error, match", [
    (dict(w=np.ones(3, np.int32)), TypeError, "csrmv_dt2t: w must be floating point"),
    (dict(w=np.ones(2, np.float32)), ValueError, r"w must have shape \(nse,\) = \(3,\)"),
    (dict(w=np.ones((1, 3), np.float32)), ValueError, r"w must have shape \(nse,\)"),
    (dict(y=np.ones(3, np.float32)), ValueError, r"y must have shape \(2,\) \(one value per row"),
    (dict(y=np.ones(2, np.float32), transpose=True, shape=(2, 5)), ValueError,
     r"y must have shape \(5,\) \(one value per column"),
    (dict(y=np.ones(2, bool)), TypeError, "y is bool"),
    (dict(y=np.ones(2, np.complex64)), TypeError, "complex y"),
    (dict(indptr=np.array([0, 2], np.int32)), ValueError, "indptr has length 2"),
    (dict(indptr=np.array([0, 3, 2], np.int32)), ValueError, "indptr"),
    (dict(indices=np.array([0, 2, 0], np.int32)), ValueError, "indices"),
    (dict(indices=np.array([0.0, 1.0, 0.0])), TypeError, "indices must be an integer array"),
    (dict(shape=(2,)), ValueError, "shape must be a pair"),
    (dict(backend="nmba"), BackendNotAvailableError, "csrmv_dt2t: unknown backend 'nmba'"),
    (dict(backend=3), TypeError, "backend name is a string"),
])
def test_bad_csr_arguments_are_named(change, error, match):
    with pytest.raises(error, match=match):
        _csr_call(**change)


def test_bad_batched_and_csc_arguments_are_named():
    with pytest.raises(ValueError, match=r"csrmm_dt2t: w must have shape \(n_batch, nse\) = \(2, 3\)"):
        _csr_call(csrmm_dt2t, y=np.ones((2, 2), np.float32), w=np.ones((3, 3), np.float32))
    with pytest.raises(ValueError, match=r"csrmm_dt2t: y must have shape \(n_batch, 2\)"):
        _csr_call(csrmm_dt2t, y=np.ones(2, np.float32), w=np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"cscmv_dt2t: indptr has length 3, but a CSC matrix of shape \(2, 3\)"):
        _csr_call(cscmv_dt2t, shape=(2, 3))


@pytest.mark.parametrize("backend", [None, "reference", "numba", "warp"])
def test_every_backend_gives_the_same_bits(backend):
    np.testing.assert_array_equal(np.asarray(_csr_call(backend=backend)), np.asarray(_csr_call()))


# ---------------------------------------------------------------------------
# fixed tables: args (weights, indices, y, shape, transpose)
# ---------------------------------------------------------------------------
@functools.cache
def fixed_spec(rank: int) -> OpSpec:
    fn = fcnmv_dt2t if rank == 1 else fcnmm_dt2t
    return OpSpec(lambda weights, indices, y, shape, transpose: fn(weights, indices, y, shape=shape,
                                                                   transpose=transpose),
                  fixed_dt2t_reference, diff_argnums=(0, 2), static_argnums=(3, 4),
                  resample=table_resampler(indices=1, shape=3), name=fn.__name__)


def fixed_example(rng, rank: int, shape, k: int, transpose: bool, homogeneous: bool = False):
    indices = rng.integers(0, max(shape[1], 1), (shape[0], k)).astype(np.int32)
    lead = (BATCH,) if rank == 2 else ()
    weights = rng.standard_normal((1,) if homogeneous else lead + indices.shape).astype(np.float32)
    y = rng.standard_normal(lead + (shape[1] if transpose else shape[0],)).astype(np.float32)
    return weights, indices, y, tuple(shape), transpose


@pytest.mark.parametrize("rank, homogeneous, transpose", [(1, False, False), (2, False, True), (1, True, True)])
def test_fixed_products_under_every_transform(rank, homogeneous, transpose):
    rng = np.random.default_rng(13)
    check_all(fixed_spec(rank), fixed_example(rng, rank, (5, 4), 3, transpose, homogeneous), seed=2,
              skip=("check_grads", "nested_vmap" if homogeneous else "check_grads"))


@pytest.mark.parametrize("shape, k", [((0, 4), 3), ((3, 4), 0), ((1, 4), 2)])
def test_fixed_edge_shapes(shape, k):
    rng = np.random.default_rng(17)
    for rank in (1, 2):
        for transpose in (False, True):
            args = fixed_example(rng, rank, shape, k, transpose)
            out = fixed_spec(rank).fn(*args)
            assert out.shape == ((BATCH,) if rank == 2 else ()) + (shape[0], k)
            np.testing.assert_array_equal(np.asarray(out), np.asarray(fixed_dt2t_reference(*args)))


def test_fixed_matches_brainevent_convention_opposite_to_fcnmv():
    weights, indices = np.array([[0.5, 1.0], [1.5, 2.0]], np.float32), np.array([[0, 1], [1, 2]])
    np.testing.assert_array_equal(fcnmv_dt2t(weights, indices, np.array([10.0, 20.0], np.float32), shape=(2, 3),
                                             transpose=False), [[5, 10], [30, 40]])
    np.testing.assert_array_equal(fcnmv_dt2t(weights, indices, np.array([1.0, 2.0, 3.0], np.float32), shape=(2, 3),
                                             transpose=True), [[0.5, 2.0], [3.0, 6.0]])
    # fcnmv's transpose=False reads x by the stored columns: the synapse terms of A @ x are dt2t's transpose=True
    x = np.array([1.0, 2.0, 3.0], np.float32)
    terms = fcnmv_dt2t(weights, indices, x, shape=(2, 3), transpose=True)
    np.testing.assert_allclose(np.asarray(terms).sum(1), np.asarray(evjax.fcnmv(weights, indices, x, shape=(2, 3))))


@pytest.mark.parametrize("call, error, match", [
    (lambda: fcnmv_dt2t(np.ones((2, 2), np.int32), np.zeros((2, 2), np.int32), np.ones(2), shape=(2, 3),
                        transpose=False), TypeError, "fcnmv_dt2t: weights must be floating point"),
    (lambda: fcnmv_dt2t(np.ones((2, 3), np.float32), np.zeros((2, 2), np.int32), np.ones(2), shape=(2, 3),
                        transpose=False), ValueError, r"weights must have size 1 .* or the shape of indices"),
    (lambda: fcnmv_dt2t(1.0, np.zeros((2, 2), np.int32), np.ones(3), shape=(2, 3), transpose=False), ValueError,
     r"y must have shape \(2,\) \(one value per row"),
    (lambda: fcnmv_dt2t(1.0, np.zeros((3, 2), np.int32), np.ones(2), shape=(2, 3), transpose=False), ValueError,
     r"indices must have shape \(n_rows, k\)"),
    (lambda: fcnmv_dt2t(1.0, np.full((2, 2), 3, np.int32), np.ones(3), shape=(2, 3), transpose=True), ValueError,
     "indices out of range"),
    (lambda: fcnmv_dt2t(1.0, np.zeros((2, 2), np.int32), np.ones(2), shape=(2, 3), transpose="no"), TypeError,
     "transpose must be True or False"),
    (lambda: fcnmm_dt2t(np.ones((3, 2, 2), np.float32), np.zeros((2, 2), np.int32), np.ones((2, 2)), shape=(2, 3),
                        transpose=False), ValueError, r"\(n_batch, n_rows, k\) = \(2, 2, 2\)"),
    (lambda: fcnmm_dt2t(1.0, np.zeros((2, 2), np.int32), np.ones(2), shape=(2, 3), transpose=False), ValueError,
     r"fcnmm_dt2t: y must have shape \(n_batch, 2\)"),
])
def test_bad_fixed_arguments_are_named(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ---------------------------------------------------------------------------
# JITC: args (params..., y, seed, prob, shape, transpose, corder)
# ---------------------------------------------------------------------------
JITC = {"scalar": (jitsmv_dt2t, evjax.jits, (0.5,)), "normal": (jitnmv_dt2t, evjax.jitn, (0.5, 0.2)),
        "uniform": (jitumv_dt2t, evjax.jitu, (-0.1, 0.3))}
JITC_SHAPE, JITC_PROB, JITC_SEED = (9, 7), 0.3, 21


@functools.cache
def jitc_spec(law: str) -> OpSpec:
    fn, _, params = JITC[law]
    n = len(params)

    def call(*a):
        return fn(*a[:n], a[n + 2], a[n], a[n + 1], shape=a[n + 3], transpose=a[n + 4], corder=a[n + 5])

    return OpSpec(call, jitc_dt2t_reference(law), diff_argnums=tuple(range(n + 1)),
                  static_argnums=tuple(range(n + 1, n + 6)), name=fn.__name__)


def jitc_args(law: str, transpose: bool, corder: bool, y=None, dtype=np.float32):
    _, _, params = JITC[law]
    if y is None:
        rng = np.random.default_rng(19)
        y = rng.standard_normal(JITC_SHAPE[1] if transpose else JITC_SHAPE[0])
    return (*[np.asarray(p, dtype) for p in params], np.asarray(y, dtype), JITC_SEED, JITC_PROB, JITC_SHAPE,
            transpose, corder)


@pytest.mark.parametrize("law", list(JITC))
def test_jitc_products_under_every_transform(law):
    check_all(jitc_spec(law), jitc_args(law, law == "normal", law != "uniform"),
              skip=("check_grads", "nested_vmap"))  # vmap over y and the weights: the "vmap" cases


@pytest.mark.parametrize("corder", [True, False])
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("law", list(JITC))
def test_jitc_products_scatter_back_to_todense_times_y(law, transpose, corder):
    fn, dense, params = JITC[law]
    args = jitc_args(law, transpose, corder)
    y = args[len(params)]
    out = np.asarray(jitc_spec(law).fn(*args))
    M = np.asarray(dense(*params, JITC_PROB, JITC_SEED, shape=JITC_SHAPE, corder=corder))
    rows, cols = np.nonzero(M)  # row-major: the CSR order the products follow
    assert out.shape == rows.shape and rows.size > 0
    scattered = np.zeros(JITC_SHAPE, np.float32)
    scattered[rows, cols] = out
    np.testing.assert_allclose(scattered, M * (y[None, :] if transpose else y[:, None]), rtol=1e-6, atol=1e-7)
    # the same order as the matrix's own CSR (tocsr), and the pure-JAX generation's structure
    r, c, _ = jitc_dt2t_synapses(law, JITC_SEED, JITC_PROB, JITC_SHAPE, corder)
    np.testing.assert_array_equal(r, rows)
    np.testing.assert_array_equal(c, cols)


def test_jitc_corder_picks_the_matrix_and_matches_tocsr():
    y = np.arange(1.0, 41.0, dtype=np.float32)
    for corder in (True, False):
        W = evjax.JITCNormalR(0.5, 0.2, prob=0.1, seed=3, shape=(40, 30), corder=corder)
        csr = W.tocsr()
        want = np.asarray(csr.data) * y[np.repeat(np.arange(40), np.diff(np.asarray(csr.indptr)))]
        got = np.asarray(jitnmv_dt2t(0.5, 0.2, 0.1, y, 3, shape=(40, 30), corder=corder))
        np.testing.assert_allclose(got, want, rtol=1e-6)
    a = jitsmv_dt2t(1.0, 0.1, y, 3, shape=(40, 30), corder=True)
    b = jitsmv_dt2t(1.0, 0.1, y, 3, shape=(40, 30), corder=False)
    assert a.shape != b.shape or not np.array_equal(np.asarray(a), np.asarray(b))


def test_jitc_float64_and_edge_cases():
    with jax.enable_x64(True):
        out = jitumv_dt2t(np.float64(0.0), np.float64(1.0), 0.2, np.ones(6), 4, shape=(6, 5))
        assert out.dtype == jnp.float64
        M = np.asarray(evjax.jitu(np.float64(0.0), np.float64(1.0), 0.2, 4, shape=(6, 5)))
        np.testing.assert_array_equal(np.asarray(out), M[np.nonzero(M)])
    for shape, prob in [((0, 5), 0.5), ((5, 0), 0.5), ((5, 5), 0.0)]:
        out = jitsmv_dt2t(1.0, prob, np.ones(shape[0]), 1, shape=shape)
        assert out.shape == (0,) and out.dtype == jnp.float32
    out = jitsmv_dt2t(2.0, 1.0, np.arange(3.0), 1, shape=(3, 2))  # prob 1: every entry, row-major
    np.testing.assert_array_equal(np.asarray(out), [0, 0, 2, 2, 4, 4])
    out = jitsmv_dt2t(2.0, 1.0, np.arange(2.0), 1, shape=(1, 2), transpose=True)  # one row
    np.testing.assert_array_equal(np.asarray(out), [0, 2])


def test_jitc_traced_seed_raises_naming_seed_and_the_fix():
    y = jnp.ones(9)
    with pytest.raises(TypeError, match=r"jitsmv_dt2t: seed must be concrete.*static_argnames='seed'"):
        jax.jit(lambda s: jitsmv_dt2t(0.5, 0.3, y, s, shape=(9, 7)))(3)
    with pytest.raises(TypeError, match="jitnmv_dt2t: seed must be concrete"):
        jax.vmap(lambda s: jitnmv_dt2t(0.5, 0.1, 0.3, y, s, shape=(9, 7)))(jnp.arange(2))
    with pytest.raises(TypeError, match="seed is required"):
        jitumv_dt2t(0.0, 1.0, 0.3, y, None, shape=(9, 7))
    with pytest.raises(TypeError, match="prob must be a Python number"):
        jax.jit(lambda p: jitsmv_dt2t(0.5, p, y, 3, shape=(9, 7)))(0.3)
    # a static seed under jit is fine, and so are traced weights and y
    f = jax.jit(lambda w, y: jitsmv_dt2t(w, 0.3, y, 3, shape=(9, 7)))
    np.testing.assert_allclose(np.asarray(f(0.5, y)), np.asarray(jitsmv_dt2t(0.5, 0.3, y, 3, shape=(9, 7))))


@pytest.mark.parametrize("call, error, match", [
    (lambda: jitsmv_dt2t(0.5, 0.3, np.ones(7), 1, shape=(9, 7)), ValueError,
     r"jitsmv_dt2t: y must have shape \(9,\) \(one value per row"),
    (lambda: jitsmv_dt2t(0.5, 1.5, np.ones(9), 1, shape=(9, 7)), ValueError, "prob must be in"),
    (lambda: jitsmv_dt2t(np.ones(2), 0.3, np.ones(9), 1, shape=(9, 7)), ValueError, "weight must be a scalar"),
    (lambda: jitsmv_dt2t(0.5, 0.3, np.ones(9, bool), 1, shape=(9, 7)), TypeError, "y must be real numbers"),
    (lambda: jitsmv_dt2t(0.5, 0.3, np.ones(9), "1", shape=(9, 7)), TypeError, r"seed must be one integer"),
    (lambda: jitsmv_dt2t(0.5, 0.3, np.ones(9), 1, shape=(9, 7), backend="cuda"), BackendNotAvailableError,
     "unknown backend 'cuda'"),
])
def test_bad_jitc_arguments_are_named(call, error, match):
    with pytest.raises(error, match=match):
        call()

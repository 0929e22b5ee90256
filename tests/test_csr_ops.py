"""CSR operators under every transform, against dense references (evjax.testing harness).

Random structures include empty rows, nnz 0, size-0/1 dimensions, duplicate
columns in a row (summed), no spikes and all spikes, homogeneous and
per-synapse weights.  Sizes are tiny: each new shape compiles.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import evjax
from evjax.primitives import csr
from evjax.primitives.csr import numba as csr_numba
from evjax.testing import OpSpec, check_all

BACKENDS = ("numba", "reference")
SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


# ---------------------------------------------------------------------------
# structures and dense references
# ---------------------------------------------------------------------------
def random_structure(rng, n_rows, n_cols, *, index_dtype=np.int32):
    """Rows of 0..n_cols+1 entries (empty rows and duplicate columns happen)."""
    counts = rng.integers(0, n_cols + 2, size=n_rows) if n_cols else np.zeros(n_rows, np.int64)
    if n_rows and rng.random() < 0.3:
        counts[rng.integers(0, n_rows)] = 0
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(index_dtype)
    indices = rng.integers(0, max(n_cols, 1), size=int(indptr[-1])).astype(index_dtype)
    return indices, indptr


def dense_matrix(data, indices, indptr, shape):
    """Dense A in jax.numpy (vmappable); duplicates summed.  Row of entry k = #{i >= 1: indptr[i] <= k}."""
    nnz = indices.shape[0]
    rows = jnp.sum(jnp.arange(nnz)[:, None] >= indptr[None, 1:], axis=1)
    w = jnp.broadcast_to(data, (nnz,)) if data.shape[0] != nnz else data
    return jnp.zeros(shape, w.dtype).at[rows, indices].add(w)


def reference(shape, transpose, event):
    def ref(data, indices, indptr, x):
        a = dense_matrix(data, indices, indptr, shape)
        a = a.T if transpose else a
        if event:  # forward on 1[x != 0], straight-through derivative w.r.t. float x
            ones = (x != 0).astype(a.dtype)
            x = ones if x.dtype == jnp.bool_ else x + jax.lax.stop_gradient(ones - x)
        return a @ x.astype(a.dtype)

    return ref


def op_fn(rank, event, shape, transpose, backend):
    fn = {(1, False): evjax.csrmv, (2, False): evjax.csrmm, (1, True): evjax.binary_csrmv,
          (2, True): evjax.binary_csrmm}[(rank, event)]
    return lambda d, i, p, x: fn(d, i, p, x, shape=shape, transpose=transpose, backend=backend)


def keep_spikes(argnum, value, k):
    """Batch perturbation that keeps events 0/1 (the harness default scales floats)."""
    value = np.asarray(value)
    if argnum == 3:
        return np.roll(value, k, axis=0)
    if np.issubdtype(value.dtype, np.inexact):
        return (value * (1.0 + 0.25 * k) + 0.125 * k).astype(value.dtype)
    return value


@st.composite
def cases(draw, *, rank, transpose, event, dtype=np.float32, index_dtype=np.int32, float_spikes=False):
    n_rows, n_cols = draw(st.integers(0, 5)), draw(st.integers(0, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    indices, indptr = random_structure(rng, n_rows, n_cols, index_dtype=index_dtype)
    nnz = indices.shape[0]
    homogeneous = draw(st.booleans())
    data = (rng.uniform(0.5, 1.5, 1 if homogeneous else nnz) * rng.choice([-1.0, 1.0])).astype(dtype)
    n_in = n_cols if not transpose else n_rows
    x_shape = (n_in,) if rank == 1 else (n_in, draw(st.integers(1, 3)))
    if event:
        rate = draw(st.sampled_from([0.0, 0.4, 1.0]))  # no spikes, some, all
        x = rng.random(x_shape) < rate
        if float_spikes:
            x = x.astype(dtype)
    else:
        x = rng.standard_normal(x_shape).astype(dtype)
    return (n_rows, n_cols), (data, indices, indptr, x)


def run_case(case, *, rank, transpose, event, backend, float_spikes=False, skip=()):
    shape, args = case
    diff = (0, 3) if (not event or float_spikes) else (0,)
    spec = OpSpec(
        fn=op_fn(rank, event, shape, transpose, backend),
        reference=reference(shape, transpose, event),
        diff_argnums=diff,
        smooth=not event,  # finite differences of a step function are meaningless
        perturb=keep_spikes if event else None,
        batch_size=2,
        name=f"{'binary_' if event else ''}csrm{'v' if rank == 1 else 'm'}(T={transpose},{backend})",
    )
    check_all(spec, args, skip=skip)


# ---------------------------------------------------------------------------
# float32, every op x orientation x backend
# ---------------------------------------------------------------------------
# The pure-JAX reference is checked on fewer examples and transforms: it is
# plain jax.numpy, and the tests' time goes to compiling each transform.
REFERENCE_SKIP = ("check_grads", "nested_vmap", "jit_grad_vmap")


def examples(backend):
    return (2, ()) if backend == "numba" else (1, REFERENCE_SKIP)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("rank", [1, 2])
def test_float_ops_properties(rank, transpose, backend):
    count, skip = examples(backend)

    @settings(max_examples=count, **SETTINGS)
    @given(cases(rank=rank, transpose=transpose, event=False))
    def check(case):
        run_case(case, rank=rank, transpose=transpose, event=False, backend=backend, skip=skip)

    check()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("rank", [1, 2])
def test_event_ops_properties(rank, transpose, backend):
    count, skip = examples(backend)

    @settings(max_examples=count, **SETTINGS)
    @given(cases(rank=rank, transpose=transpose, event=True))
    def check(case):
        run_case(case, rank=rank, transpose=transpose, event=True, backend=backend, skip=skip)

    check()


@pytest.mark.parametrize("rank, transpose", [(1, True), (2, False)])
def test_event_ops_float_spikes_straight_through(rank, transpose):
    """Float spikes: forward on 1[s != 0]; d out / d s = A (straight-through)."""
    @settings(max_examples=2, **SETTINGS)
    @given(cases(rank=rank, transpose=transpose, event=True, float_spikes=True))
    def check(case):
        run_case(case, rank=rank, transpose=transpose, event=True, backend="numba", float_spikes=True,
                 skip=("nested_vmap", "jit_grad_vmap"))

    check()


# ---------------------------------------------------------------------------
# dtypes: float64 / int64 (x64), float16 / bfloat16 weights
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("event, transpose", [(False, False), (True, True)])
def test_float64_int64_indices(event, transpose):
    with jax.enable_x64(True):
        @settings(max_examples=1, **SETTINGS)
        @given(cases(rank=1, transpose=transpose, event=event, dtype=np.float64, index_dtype=np.int64))
        def check(case):
            shape, (data, indices, indptr, x) = case
            out = op_fn(1, event, shape, transpose, "numba")(data, indices, indptr, x)
            assert out.dtype == jnp.float64
            run_case(case, rank=1, transpose=transpose, event=event, backend="numba",
                     skip=("nested_vmap", "jit_grad_vmap"))

        check()


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("event", [False, True])
@pytest.mark.parametrize("rank", [1, 2])
def test_low_precision_weights_accumulate_in_float32(dtype, event, rank):
    rng = np.random.default_rng(3)
    n_rows, n_cols = 3, 300
    indptr = np.array([0, 300, 300, 600], np.int32)
    indices = np.concatenate([np.arange(300), rng.integers(0, 300, 300)]).astype(np.int32)
    data = jnp.asarray(rng.uniform(0.9, 1.1, 600), dtype)
    x = rng.random((n_cols,) if rank == 1 else (n_cols, 2)) < 0.9
    if not event:
        x = jnp.asarray(x, dtype)
    fn = op_fn(rank, event, (n_rows, n_cols), False, "numba")
    out = fn(data, indices, indptr, x)
    assert out.dtype == dtype
    # float32 accumulation of the rounded weights, rounded once at the end
    exact = np.asarray(dense_matrix(jnp.asarray(data, jnp.float32), indices, indptr, (n_rows, n_cols)))
    expected = (exact @ np.asarray(x, np.float32)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(jnp.asarray(expected, dtype), np.float32),
                               rtol=0, atol=1e-6 + np.abs(expected).max() * float(jnp.finfo(dtype).eps))
    ref = op_fn(rank, event, (n_rows, n_cols), False, "reference")(data, indices, indptr, x)
    np.testing.assert_array_equal(np.asarray(ref, np.float32), np.asarray(out, np.float32))


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_low_precision_properties(dtype):
    @settings(max_examples=2, **SETTINGS)
    @given(cases(rank=1, transpose=True, event=True, dtype=np.float32))
    def check(case):
        shape, (data, indices, indptr, x) = case
        run_case((shape, (jnp.asarray(data, dtype), indices, indptr, x)), rank=1, transpose=True, event=True,
                 backend="numba", skip=("nested_vmap", "jit_grad_vmap"))

    check()


# ---------------------------------------------------------------------------
# the weight-gradient op itself (csr_sddmm_p) under every transform
# ---------------------------------------------------------------------------
def sddmm_reference(shape):
    """g[k] = <r[row k], q[indices[k]]> in jax.numpy (rows from indptr, as in dense_matrix)."""

    def ref(indices, indptr, r, q):
        rows = jnp.sum(jnp.arange(indices.shape[0])[:, None] >= indptr[None, 1:], axis=1)
        r2, q2 = r.reshape(shape[0], -1), q.reshape(shape[1], -1)
        return jnp.sum(r2[rows] * q2[indices], axis=1)

    return ref


def run_sddmm_case(seed, width, backend, skip=()):
    """One random structure (empty rows possible) through the harness; r has zero rows (silent)."""
    rng = np.random.default_rng(seed)
    shape = (4, 3)
    indices, indptr = random_structure(rng, *shape)
    r_shape = (shape[0],) if width is None else (shape[0], width)
    q_shape = (shape[1],) if width is None else (shape[1], width)
    r = (rng.standard_normal(r_shape) * (rng.random(r_shape) < 0.6)).astype(np.float32)
    q = rng.standard_normal(q_shape).astype(np.float32)
    spec = OpSpec(
        fn=lambda i, p, r, q: csr.csr_sddmm(i, p, r, q, shape=shape, backend=backend),
        reference=sddmm_reference(shape),
        diff_argnums=(2, 3),
        batch_size=2,
        name=f"csr_sddmm({backend})",
    )
    check_all(spec, (indices, indptr, r, q), skip=skip)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("width", [None, 2])
def test_sddmm_properties(width, backend):
    for seed in range(2):
        run_sddmm_case(seed, width, backend, skip=() if backend == "numba" else REFERENCE_SKIP)


# ---------------------------------------------------------------------------
# direct scipy comparison at a moderate size (parallel kernel paths)
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("homogeneous", [False, True])
def test_against_scipy_parallel_sizes(homogeneous):
    import scipy.sparse as sp

    rng = np.random.default_rng(0)
    a = sp.random(1200, 500, density=0.6, format="csr", random_state=1, dtype=np.float32)  # parallel paths
    if homogeneous:
        a.data[:] = 0.7
    w = evjax.CSR.from_scipy(a) if not homogeneous else evjax.CSR(
        (np.float32(0.7), a.indices, a.indptr), shape=a.shape)
    s = rng.random(1200) < 0.8
    S = rng.random((6, 1200)) < 0.5
    assert np.diff(a.indptr)[s].sum() > csr_numba.SCATTER_PARALLEL_MIN_WORK  # the parallel paths run
    x = rng.standard_normal(500).astype(np.float32)
    X = rng.standard_normal((500, 4)).astype(np.float32)
    af = a.astype(np.float64)
    for got, want in [
        (s @ w, af.T @ s),
        (S @ w, (af.T @ S.T).T),
        (w @ x, af @ x),
        (w @ X, af @ X),
        (x @ w.T, af @ x),
        (w.T @ s, af.T @ s),
        (evjax.BinaryArray(S) @ w, (af.T @ S.T).T),
    ]:
        np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-4)
    # event-driven weight gradient against the dense gradient
    ct = rng.standard_normal(500).astype(np.float32)
    g = jax.grad(lambda d: jnp.vdot(ct, s @ w.with_data(d)))(w.data)
    rows = np.repeat(np.arange(1200), np.diff(a.indptr))
    want = s[rows] * ct[a.indices] if not homogeneous else np.sum(s[rows] * ct[a.indices])
    np.testing.assert_allclose(np.asarray(g).ravel(), np.ravel(want), rtol=1e-4, atol=1e-3)

"""CSR operators under every transform, on every CPU backend, against structural references.

Every op x orientation x backend (numba, warp on Warp's CPU device, the
reference) goes through the property harness (evjax.testing): eager, jit, jvp,
vjp, grad, finite differences, vmap over every argument (index structures
that differ per batch element included), nested vmap and jit(grad(vmap)).
Structures come from small size buckets (0, 1, 2, 5 rows/columns; nnz 0, 1,
4, 9) so that most examples reuse compiled programs; they include empty rows,
nnz 0, size-0/1 dimensions, duplicate columns in a row (summed), no spikes and
all spikes, homogeneous and per-synapse weights.

The references are structural, like scipy: y_i = sum over the stored entries
k of row i of w_k x_{j_k}; a structural zero never meets x (so x_j = inf
without a stored entry in row i leaves y_i finite), and a stored weight meets
x by IEEE arithmetic.  Event ops select: an inactive event contributes nothing
whatever its weight holds (where(e, w, 0), never w * e).  The non-finite tests
put NaN and infinities into weights and inputs and hold every backend to
these rules, forward and every gradient.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck
from hypothesis import strategies as st

import evjax
from evjax.primitives import csr
from evjax.primitives.csr import numba as csr_numba
from evjax.testing import NNZ, SIZES, OpSpec, check_all, csr_resampler, property_test, random_csr

BACKENDS = ("numba", "warp", "reference")
OPS = {(1, False): evjax.csrmv, (2, False): evjax.csrmm, (1, True): evjax.binary_csrmv, (2, True): evjax.binary_csrmm}
# kept for tests/test_warp_csr.py, which runs its own fixed-count Hypothesis tests
SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


# ---------------------------------------------------------------------------
# structural references (jax.numpy: differentiable, vmappable)
# ---------------------------------------------------------------------------
def row_of_entries(indptr, nnz: int):
    """Row of each stored entry: row[k] = #{i >= 1 : indptr[i] <= k}."""
    return jnp.sum(jnp.arange(nnz)[:, None] >= indptr[None, 1:], axis=1)


@jax.custom_jvp
def _float_event_terms(w, s):
    # forward: w where the spike is nonzero, else 0 (select: an inactive spike never meets w)
    return jnp.where(s != 0, w, jnp.zeros_like(w))


@_float_event_terms.defjvp
def _float_event_terms_jvp(primals, tangents):
    # d/dw: the same select; d/ds: straight-through, as if the term were w * s
    w, s = primals
    dw, ds = tangents
    out = _float_event_terms(w, s)
    return out, jnp.where(s != 0, dw, jnp.zeros_like(dw)) + (w * ds).astype(out.dtype)


@jax.custom_jvp
def _weighted_event_terms(w, v):
    # forward: w * v where the event is nonzero, else 0 (select: a zero event never meets w)
    return jnp.where(v != 0, w * v, jnp.zeros_like(w * v))


@_weighted_event_terms.defjvp
def _weighted_event_terms_jvp(primals, tangents):
    # d/dw: the same select, scaled by v; d/dv: the true derivative of the linear map, w
    w, v = primals
    dw, dv = tangents
    out = _weighted_event_terms(w, v)
    return out, _weighted_event_terms(dw, v) + (w * dv).astype(out.dtype)


def structural_matmul(data, indices, indptr, x, shape, transpose: bool, event: bool, weighted: bool = False):
    """y = A x (or A.T x) summed over the stored entries only; events select their weights;
    weighted events select and scale them."""
    nnz = indices.shape[0]
    w = jnp.broadcast_to(data, (nnz,)) if data.shape[0] != nnz else data
    rows = row_of_entries(indptr, nnz)
    src, dst, n_out = (indices, rows, shape[0]) if not transpose else (rows, indices, shape[1])
    xs = x[src]  # the operand entry each stored weight meets
    w = w[:, None] if x.ndim == 2 else w
    if weighted:
        terms = _weighted_event_terms(jnp.broadcast_to(w, xs.shape).astype(jnp.result_type(w, xs)), xs)
    elif not event:
        terms = w * xs
    elif x.dtype == jnp.bool_:
        terms = jnp.where(xs, w, jnp.zeros_like(w))
    else:
        terms = _float_event_terms(jnp.broadcast_to(w, xs.shape), xs)
    return jax.ops.segment_sum(terms, dst, num_segments=n_out)


def reference(shape, transpose, event):
    """The structural reference of one op as a function of (data, indices, indptr, x)."""
    return lambda d, i, p, x: structural_matmul(d, i, p, x, shape, transpose, event)


def op_fn(rank, event, shape, transpose, backend):
    """The op as a function of (data, indices, indptr, x)."""
    fn = OPS[(rank, event)]
    return lambda d, i, p, x: fn(d, i, p, x, shape=shape, transpose=transpose, backend=backend)


def keep_spikes(argnum, value, k):
    """Batch element k for OpSpec(perturb=...): spikes rolled (still 0/1), floats scaled and shifted."""
    value = np.asarray(value)
    if argnum == 3:
        return np.roll(value, k, axis=0)
    return (value * (1.0 + 0.25 * k) + 0.125 * k).astype(value.dtype)


def op_name(rank, event, transpose, backend):
    return f"{'binary_' if event else ''}csrm{'v' if rank == 1 else 'm'}(T={transpose},{backend})"


def matmul_spec(rank, event, transpose, backend, *, float_spikes=False, nonfinite=False, weighted=False):
    """The harness's description of one op; arguments (data, indices, indptr, x, shape)."""
    fn = OPS[(rank, event)]
    extra = {"weighted": True} if weighted else {}
    return OpSpec(
        fn=lambda d, i, p, x, shape: fn(d, i, p, x, shape=shape, transpose=transpose, backend=backend, **extra),
        reference=lambda d, i, p, x, shape: structural_matmul(d, i, p, x, shape, transpose, event, weighted),
        diff_argnums=(0, 3) if (not event or float_spikes or weighted) else (0,),
        static_argnums=(4,),
        backend=backend,
        resample=csr_resampler(indices=1, indptr=2, shape=4),
        smooth=not event or weighted,  # finite differences of a step function are meaningless
        nonfinite=nonfinite,
        batch_size=2,
        name=op_name(rank, event, transpose, backend) + (" weighted" if weighted else "")
        + (" nonfinite" if nonfinite else ""),
    )


# ---------------------------------------------------------------------------
# strategies
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
    """Dense A in jax.numpy; duplicates summed."""
    nnz = indices.shape[0]
    w = jnp.broadcast_to(data, (nnz,)) if data.shape[0] != nnz else data
    return jnp.zeros(shape, w.dtype).at[row_of_entries(indptr, nnz), indices].add(w)


@st.composite
def cases(draw, *, rank, transpose, event, dtype=np.float32, index_dtype=np.int32, float_spikes=False,
          weighted=False):
    """``(shape, (data, indices, indptr, x))`` from the size buckets."""
    n_rows, n_cols, nnz = draw(st.sampled_from(SIZES)), draw(st.sampled_from(SIZES)), draw(st.sampled_from(NNZ))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    indices, indptr = random_csr(rng, n_rows, n_cols, nnz, index_dtype=index_dtype)
    homogeneous = draw(st.booleans())
    data = (rng.uniform(0.5, 1.5, 1 if homogeneous else indices.shape[0]) * rng.choice([-1.0, 1.0])).astype(dtype)
    n_in = n_cols if not transpose else n_rows
    x_shape = (n_in,) if rank == 1 else (n_in, draw(st.sampled_from([1, 3])))
    if event:
        rate = draw(st.sampled_from([0.0, 0.4, 1.0]))  # no spikes, some, all
        x = rng.random(x_shape) < rate
        x = x.astype(dtype) * rng.uniform(0.5, 2.0, x_shape).astype(dtype) if float_spikes else x
        x = (x * rng.standard_normal(x_shape)).astype(dtype) if weighted else x  # graded, zeros kept
    else:
        x = rng.standard_normal(x_shape).astype(dtype)
    return (n_rows, n_cols), (data, indices, indptr, x)


def csr_args(**kwargs):
    """Argument tuples (data, indices, indptr, x, shape) for :func:`matmul_spec`."""
    return cases(**kwargs).map(lambda case: (*case[1], case[0]))


def run_case(case, *, rank, transpose, event, backend, float_spikes=False, skip=()):
    """One ``cases`` example through every check of the harness."""
    shape, args = case
    check_all(matmul_spec(rank, event, transpose, backend, float_spikes=float_spikes), (*args, shape), skip=skip)


# ---------------------------------------------------------------------------
# float32, every op x orientation x backend
# ---------------------------------------------------------------------------
OP_CASES = [(rank, event, transpose) for event in (False, True) for rank in (1, 2) for transpose in (False, True)]
OP_IDS = [f"{OPS[(r, e)].__name__}-{'scatter' if t else 'gather'}" for r, e, t in OP_CASES]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rank, event, transpose", OP_CASES, ids=OP_IDS)
def test_matmul_properties(rank, event, transpose, backend):
    property_test(matmul_spec(rank, event, transpose, backend),
                  csr_args(rank=rank, transpose=transpose, event=event))()


@pytest.mark.parametrize("backend", ("numba", "warp"))
@pytest.mark.parametrize("rank, transpose", [(1, True), (2, False)])
def test_event_ops_float_spikes_straight_through(rank, transpose, backend):
    """Float spikes: forward on 1[s != 0]; d out / d s = A (straight-through)."""
    property_test(matmul_spec(rank, True, transpose, backend, float_spikes=True),
                  csr_args(rank=rank, transpose=transpose, event=True, float_spikes=True))()


# ---------------------------------------------------------------------------
# weighted events (WeightedArray): select the nonzero entries, scale by their value
# ---------------------------------------------------------------------------
NONFINITE_WARNINGS = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
WEIGHTED_CASES = [(rank, transpose) for rank in (1, 2) for transpose in (False, True)]
WEIGHTED_IDS = [f"{'mv' if r == 1 else 'mm'}-{'scatter' if t else 'gather'}" for r, t in WEIGHTED_CASES]


@pytest.mark.parametrize("backend", ("numba", "warp"))  # (reference: test_weighted_integer_counts_...)
@pytest.mark.parametrize("rank, transpose", WEIGHTED_CASES, ids=WEIGHTED_IDS)
def test_weighted_properties(rank, transpose, backend):
    """y = sum_k where(v != 0, w_k v, 0): forward, true gradient w.r.t. v, event-driven w.r.t. w."""
    property_test(matmul_spec(rank, True, transpose, backend, weighted=True),
                  csr_args(rank=rank, transpose=transpose, event=True, weighted=True))()


@NONFINITE_WARNINGS
@pytest.mark.parametrize("backend", ("numba",))  # (warp's select: test_weighted_properties, the simulator)
@pytest.mark.parametrize("rank, transpose", WEIGHTED_CASES, ids=WEIGHTED_IDS)
def test_weighted_nonfinite(rank, transpose, backend):
    """A zero event hides a nan/inf weight (forward and weight gradient); nonzero ones are IEEE."""
    property_test(matmul_spec(rank, True, transpose, backend, weighted=True, nonfinite=True),
                  csr_args(rank=rank, transpose=transpose, event=True, weighted=True), skip=("nested_vmap",))()


@pytest.mark.parametrize("backend", ("numba", "reference"))
def test_weighted_integer_counts_and_array_dispatch(backend):
    """Integer counts take the weights' dtype; WeightedArray @ CSR/CSC (both sides) runs weighted=True."""
    rng = np.random.default_rng(5)
    dense = (rng.standard_normal((5, 4)) * (rng.random((5, 4)) < 0.6)).astype(np.float32)
    dense[1, :] = np.nan  # row 1 meets only zero events below: contributes nothing
    counts = np.array([2, 0, 0, 1, 3], np.int32)
    batch = np.stack([counts, np.array([0, 0, 4, 1, 0], np.int32)], axis=1)  # (5, 2), row 1 zero
    want = np.nan_to_num(dense).T @ counts
    for W in (evjax.CSR.fromdense(dense), evjax.CSC.fromdense(dense)):
        with evjax.use_backend(backend):
            got = evjax.WeightedArray(counts) @ W
            assert got.dtype == jnp.float32
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(W.T @ evjax.WeightedArray(counts), want, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(evjax.WeightedArray(batch.T) @ W, batch.T @ np.nan_to_num(dense),
                                       rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(W.T @ evjax.WeightedArray(batch), np.nan_to_num(dense).T @ batch,
                                       rtol=1e-5, atol=1e-5)
    # weighted=False on the same counts: spikes, 1[c != 0]
    W = evjax.CSR.fromdense(np.nan_to_num(dense))
    np.testing.assert_allclose(evjax.BinaryArray(counts) @ W, (counts != 0) @ np.nan_to_num(dense), rtol=1e-5)


def weighted_sddmm_reference(mode):
    def reference(indices, indptr, r, q, shape):
        rows = row_of_entries(indptr, indices.shape[0])
        rv, qv = r[rows], q[indices]
        # where(e != 0, r q, 0); derivative w.r.t. e the plain product, w.r.t. the other selected
        terms = _weighted_event_terms(qv, rv) if mode == "r" else _weighted_event_terms(rv, qv)
        return terms if r.ndim == 1 else jnp.sum(terms, axis=1)

    return reference


def weighted_sddmm_spec(mode, backend):
    return OpSpec(
        fn=lambda i, p, r, q, shape: csr.csr_sddmm(i, p, r, q, shape=shape, backend=backend, weighted=mode),
        reference=weighted_sddmm_reference(mode),
        diff_argnums=(2, 3),
        static_argnums=(4,),
        backend=backend,
        resample=csr_resampler(indices=0, indptr=1, shape=4),
        batch_size=2,
        name=f"csr_sddmm(weighted={mode},{backend})",
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["r", "q"])
def test_weighted_sddmm_properties(mode, backend):
    """csr_sddmm(weighted=mode): g_k = where(e != 0, r_i q_j, 0) with e the weighted operand."""
    property_test(weighted_sddmm_spec(mode, backend), sddmm_args())()


# ---------------------------------------------------------------------------
# non-finite weights and inputs: IEEE on stored entries, selects for events
# ---------------------------------------------------------------------------


@NONFINITE_WARNINGS
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rank, event, transpose", OP_CASES, ids=OP_IDS)
def test_matmul_nonfinite(rank, event, transpose, backend):
    property_test(matmul_spec(rank, event, transpose, backend, nonfinite=True),
                  csr_args(rank=rank, transpose=transpose, event=event), skip=("nested_vmap",))()


@NONFINITE_WARNINGS
def test_structural_reference_follows_scipy_and_selects_events():
    """The reference itself: scipy's structural sums, and selected (not multiplied) event weights."""
    import scipy.sparse as sp

    indices, indptr = np.array([0, 2, 2], np.int32), np.array([0, 2, 2, 3], np.int32)  # row 1 empty
    data = np.array([np.inf, 0.0, 2.0], np.float32)
    x = np.array([1.0, np.inf, 3.0], np.float32)  # x[1] = inf meets no stored entry
    a = sp.csr_matrix((data, indices, indptr), shape=(3, 3))
    y = np.asarray(structural_matmul(data, indices, indptr, x, (3, 3), False, False))
    np.testing.assert_array_equal(y, a @ x)  # [inf + 0 * 3, 0, 6]: no NaN from x[1]
    assert np.isnan(structural_matmul(data, indices, indptr, np.array([0.0, 0, 0], np.float32), (3, 3), False,
                                      False)[0])  # inf * 0 on a stored entry: NaN
    spikes = np.array([False, True, True])  # column 0 silent: its inf weight contributes nothing
    np.testing.assert_array_equal(structural_matmul(data, indices, indptr, spikes, (3, 3), False, True), [0, 0, 2])


# ---------------------------------------------------------------------------
# dtypes: float64 / int64 (x64), float16 / bfloat16 weights
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ("numba", "warp"))
@pytest.mark.parametrize("event, transpose", [(False, False), (True, True)])
def test_float64_int64_indices(event, transpose, backend):
    with jax.enable_x64(True):
        property_test(matmul_spec(1, event, transpose, backend),
                      csr_args(rank=1, transpose=transpose, event=event, dtype=np.float64, index_dtype=np.int64),
                      skip=("nested_vmap",))()


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("rank, event, transpose", [(1, True, True), (2, False, False)])
def test_low_precision_properties(rank, event, transpose, dtype):
    """float16/bfloat16 weights (and operands): the op returns that dtype, accurate to it."""
    strategy = csr_args(rank=rank, transpose=transpose, event=event, dtype=dtype)
    property_test(matmul_spec(rank, event, transpose, "numba"), strategy, skip=("nested_vmap",))()


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


# ---------------------------------------------------------------------------
# the weight-gradient op itself (csr_sddmm_p) under every transform
# ---------------------------------------------------------------------------
def sddmm_reference(indices, indptr, r, q, shape):
    """g[k] = <r[row k], q[indices[k]]> in jax.numpy."""
    products = r[row_of_entries(indptr, indices.shape[0])] * q[indices]
    return products if r.ndim == 1 else jnp.sum(products, axis=1)


def sddmm_spec(backend):
    return OpSpec(
        fn=lambda i, p, r, q, shape: csr.csr_sddmm(i, p, r, q, shape=shape, backend=backend),
        reference=sddmm_reference,
        diff_argnums=(2, 3),
        static_argnums=(4,),
        backend=backend,
        resample=csr_resampler(indices=0, indptr=1, shape=4),
        batch_size=2,
        name=f"csr_sddmm({backend})",
    )


@st.composite
def sddmm_args(draw):
    """(indices, indptr, r, q, shape): r has silent (zero) rows, which the kernels skip."""
    n_rows, n_cols, nnz = draw(st.sampled_from(SIZES)), draw(st.sampled_from(SIZES)), draw(st.sampled_from(NNZ))
    width = draw(st.sampled_from([None, 2]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    indices, indptr = random_csr(rng, n_rows, n_cols, nnz)
    extra = () if width is None else (width,)
    r = (rng.standard_normal((n_rows, *extra)) * (rng.random((n_rows, *extra)) < 0.6)).astype(np.float32)
    q = rng.standard_normal((n_cols, *extra)).astype(np.float32)
    return indices, indptr, r, q, (n_rows, n_cols)


def run_sddmm_case(seed, width, backend, skip=()):
    """One random 4 x 3 structure (empty rows possible) through the harness; r has zero rows (silent)."""
    rng = np.random.default_rng(seed)
    shape = (4, 3)
    indices, indptr = random_structure(rng, *shape)
    extra = () if width is None else (width,)
    r = (rng.standard_normal((4, *extra)) * (rng.random((4, *extra)) < 0.6)).astype(np.float32)
    q = rng.standard_normal((3, *extra)).astype(np.float32)
    check_all(sddmm_spec(backend), (indices, indptr, r, q, shape), skip=skip)


test_sddmm_properties = property_test(sddmm_spec, sddmm_args(), backends=BACKENDS)


# ---------------------------------------------------------------------------
# direct scipy comparison at a moderate size (parallel kernel paths)
# ---------------------------------------------------------------------------
def test_vector_scatter_parallel_decision():
    """A vector scatter goes parallel only with enough synapses and enough of them per output."""
    from evjax.primitives.csr import numba_rows

    floor, per_out = numba_rows.VECTOR_SCATTER_PARALLEL_MIN_WORK, numba_rows.VECTOR_SCATTER_WORK_PER_OUTPUT
    assert numba_rows._vector_scatter_serial(floor - 1, 10)
    assert not numba_rows._vector_scatter_serial(floor, 10)
    assert numba_rows._vector_scatter_serial(10 * floor, 10 * floor // per_out + 1)
    assert not numba_rows._vector_scatter_serial(10 * floor, 10 * floor // per_out)


def test_batch_scatter_and_gradient_parallel_decisions():
    """A batch scatter and a weight gradient go parallel from a cost that counts their zero-fill too."""
    from evjax.primitives.csr import numba_rows

    batch, sddmm = numba_rows.BATCH_SCATTER_PARALLEL_MIN_COST, numba_rows.SDDMM_PARALLEL_MIN_COST
    assert numba_rows._batch_scatter_serial(batch - 1, 0)
    assert not numba_rows._batch_scatter_serial(batch, 0)
    assert not numba_rows._batch_scatter_serial(0, 4 * batch)  # a large output to zero-fill alone
    assert numba_rows._batch_scatter_serial(batch // 2, 2 * batch - 4)
    assert numba_rows._sddmm_serial(sddmm - 1, 0)
    assert not numba_rows._sddmm_serial(sddmm, 0)
    assert not numba_rows._sddmm_serial(0, 4 * sddmm)  # a silent batch: zero-fill only
    assert numba_rows._sddmm_serial(sddmm // 2, 2 * sddmm - 4)


@pytest.mark.parametrize("pool", [1, 2, 3])
@pytest.mark.parametrize("weighted", [False, True])
def test_vector_scatter_kernel_split_between_thresholds(pool, weighted):
    """Above the vector threshold (about 96k synapses into 1500 outputs), called directly with each
    pool size: duplicates summed, NaN rows of silent events ignored, every output written."""
    from evjax.primitives.csr import numba_rows, numba_weighted

    rng = np.random.default_rng(pool)
    n_rows, n_out, k = 3000, 1500, 40
    indices = rng.integers(0, n_out, n_rows * k).astype(np.int32)  # duplicates within rows
    indptr = (np.arange(n_rows + 1) * k).astype(np.int32)
    data = rng.standard_normal(n_rows * k).astype(np.float32)
    x = rng.random(n_rows) < 0.8  # about 96k synapses
    data.reshape(n_rows, k)[~x] = np.nan  # silent rows: NaN weights that must not reach the output
    work = int(x.sum()) * k
    assert not numba_rows._vector_scatter_serial(work, n_out)
    rows = np.repeat(np.arange(n_rows), k)
    want = np.zeros(n_out)
    np.add.at(want, indices[x[rows]], data[x[rows]].astype(np.float64))
    out = np.full(n_out, np.nan, np.float32)
    if weighted:  # graded events of value 1 (silent: 0)
        numba_weighted.weighted_scatter_mv(pool, data, indices, indptr, x.astype(np.float32),
                                           out)
    else:
        csr_numba.scatter_mv(pool, data, indices, indptr, x, out)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)


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
    assert np.diff(a.indptr)[s].sum() > csr_numba.PARALLEL_MIN_WORK  # the parallel paths run (the highest threshold)
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

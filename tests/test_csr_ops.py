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
from hypothesis import strategies as st

import evjax
from evjax.primitives.csr import numba as csr_numba
from evjax.testing import NNZ, SIZES, property_test, random_csr
from tests.helpers import (
    OP_CASES, OP_IDS, WEIGHTED_CASES, WEIGHTED_IDS, csr_args, csr_matmul_spec, csr_op_fn, csr_sddmm_spec,
    dense_matrix, primitive_names, structural_matmul, weighted_sddmm_spec,
)

BACKENDS = ("numba", "warp", "reference")
# The structural references, the specs (csr_matmul_spec, csr_sddmm_spec, weighted_sddmm_spec) and
# the structures (csr_cases, random_structure) are in tests/helpers.py: other modules use them too.


# ---------------------------------------------------------------------------
# float32, every op x orientation x backend
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rank, event, transpose", OP_CASES, ids=OP_IDS)
def test_matmul_properties(rank, event, transpose, backend):
    property_test(csr_matmul_spec(rank, event, transpose, backend),
                  csr_args(rank=rank, transpose=transpose, event=event))()


@pytest.mark.parametrize("backend", ("numba", "warp"))
@pytest.mark.parametrize("rank, transpose", [(1, True), (2, False)])
def test_event_ops_float_spikes_straight_through(rank, transpose, backend):
    """Float spikes: forward on 1[s != 0]; d out / d s = A (straight-through)."""
    property_test(csr_matmul_spec(rank, True, transpose, backend, float_spikes=True),
                  csr_args(rank=rank, transpose=transpose, event=True, float_spikes=True))()


# ---------------------------------------------------------------------------
# weighted events (WeightedArray): select the nonzero entries, scale by their value
# ---------------------------------------------------------------------------
NONFINITE_WARNINGS = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


@pytest.mark.parametrize("backend", ("numba", "warp"))  # (reference: test_weighted_integer_counts_...)
@pytest.mark.parametrize("rank, transpose", WEIGHTED_CASES, ids=WEIGHTED_IDS)
def test_weighted_properties(rank, transpose, backend):
    """y = sum_k where(v != 0, w_k v, 0): forward, true gradient w.r.t. v, event-driven w.r.t. w."""
    property_test(csr_matmul_spec(rank, True, transpose, backend, weighted=True),
                  csr_args(rank=rank, transpose=transpose, event=True, weighted=True))()


@NONFINITE_WARNINGS
@pytest.mark.parametrize("backend", ("numba",))  # (warp's select: test_weighted_properties, the simulator)
@pytest.mark.parametrize("rank, transpose", WEIGHTED_CASES, ids=WEIGHTED_IDS)
def test_weighted_nonfinite(rank, transpose, backend):
    """A zero event hides a nan/inf weight (forward and weight gradient); nonzero ones are IEEE."""
    property_test(csr_matmul_spec(rank, True, transpose, backend, weighted=True, nonfinite=True),
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
    property_test(csr_matmul_spec(rank, event, transpose, backend, nonfinite=True),
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
        property_test(csr_matmul_spec(1, event, transpose, backend),
                      csr_args(rank=1, transpose=transpose, event=event, dtype=np.float64, index_dtype=np.int64),
                      skip=("nested_vmap",))()


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("rank, event, transpose", [(1, True, True), (2, False, False)])
def test_low_precision_properties(rank, event, transpose, dtype):
    """float16/bfloat16 weights (and operands): the op returns that dtype, accurate to it."""
    strategy = csr_args(rank=rank, transpose=transpose, event=event, dtype=dtype)
    property_test(csr_matmul_spec(rank, event, transpose, "numba"), strategy, skip=("nested_vmap",))()


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
    fn = csr_op_fn(rank, event, (n_rows, n_cols), False, "numba")
    out = fn(data, indices, indptr, x)
    assert out.dtype == dtype
    # float32 accumulation of the rounded weights, rounded once at the end
    exact = np.asarray(dense_matrix(jnp.asarray(data, jnp.float32), indices, indptr, (n_rows, n_cols)))
    expected = (exact @ np.asarray(x, np.float32)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(jnp.asarray(expected, dtype), np.float32),
                               rtol=0, atol=1e-6 + np.abs(expected).max() * float(jnp.finfo(dtype).eps))
    ref = csr_op_fn(rank, event, (n_rows, n_cols), False, "reference")(data, indices, indptr, x)
    np.testing.assert_array_equal(np.asarray(ref, np.float32), np.asarray(out, np.float32))


# ---------------------------------------------------------------------------
# the weight-gradient op itself (csr_sddmm_p) under every transform
# ---------------------------------------------------------------------------
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


test_sddmm_properties = property_test(csr_sddmm_spec, sddmm_args(), backends=BACKENDS)


# ---------------------------------------------------------------------------
# direct scipy comparison at a moderate size (parallel kernel paths)
# ---------------------------------------------------------------------------
def test_vector_scatter_parallel_decision():
    """A vector scatter goes parallel only with enough synapses and enough of them per output."""
    from evjax.primitives.csr import numba_rows

    floor, per_out = numba_rows.VECTOR_SCATTER_PARALLEL_MIN_WORK, numba_rows.VECTOR_SCATTER_WORK_PER_OUTPUT
    assert numba_rows._vector_scatter_serial.py_func(floor - 1, 10)
    assert not numba_rows._vector_scatter_serial.py_func(floor, 10)
    assert numba_rows._vector_scatter_serial.py_func(10 * floor, 10 * floor // per_out + 1)
    assert not numba_rows._vector_scatter_serial.py_func(10 * floor, 10 * floor // per_out)


def test_batch_scatter_and_gradient_parallel_decisions():
    """A batch scatter and a weight gradient go parallel from a cost that counts their zero-fill too."""
    from evjax.primitives.csr import numba_rows

    batch, sddmm = numba_rows.BATCH_SCATTER_PARALLEL_MIN_COST, numba_rows.SDDMM_PARALLEL_MIN_COST
    assert numba_rows._batch_scatter_serial.py_func(batch - 1, 0)
    assert not numba_rows._batch_scatter_serial.py_func(batch, 0)
    assert not numba_rows._batch_scatter_serial.py_func(0, 4 * batch)  # a large output to zero-fill alone
    assert numba_rows._batch_scatter_serial.py_func(batch // 2, 2 * batch - 4)
    assert numba_rows._sddmm_serial.py_func(sddmm - 1, 0)
    assert not numba_rows._sddmm_serial.py_func(sddmm, 0)
    assert not numba_rows._sddmm_serial.py_func(0, 4 * sddmm)  # a silent batch: zero-fill only
    assert numba_rows._sddmm_serial.py_func(sddmm // 2, 2 * sddmm - 4)


@pytest.mark.parametrize("pool", [1, 2, 3])
@pytest.mark.parametrize("weighted", [False, True])
def test_vector_scatter_kernel_split_between_thresholds(pool, weighted):
    """Above the vector threshold (about 96k synapses into 1500 outputs), called directly with each
    pool size: duplicates summed, NaN rows of silent events ignored, every output written."""
    from evjax.primitives.csr import numba_rows

    rng = np.random.default_rng(pool)
    n_rows, n_out, k = 3000, 1500, 40
    indices = rng.integers(0, n_out, n_rows * k).astype(np.int32)  # duplicates within rows
    indptr = (np.arange(n_rows + 1) * k).astype(np.int32)
    data = rng.standard_normal(n_rows * k).astype(np.float32)
    x = rng.random(n_rows) < 0.8  # about 96k synapses
    data.reshape(n_rows, k)[~x] = np.nan  # silent rows: NaN weights that must not reach the output
    work = int(x.sum()) * k
    assert not numba_rows._vector_scatter_serial.py_func(work, n_out)
    rows = np.repeat(np.arange(n_rows), k)
    want = np.zeros(n_out)
    np.add.at(want, indices[x[rows]], data[x[rows]].astype(np.float64))
    out = np.full(n_out, np.nan, np.float32)
    if weighted:  # graded events of value 1 (silent: 0)
        csr_numba.weighted_scatter_mv(pool, data, indices, indptr, x.astype(np.float32),
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


def _batched_structures(rng, size, n_rows, n_cols, nnz):
    """``size`` CSR structures of one shape and one nnz, each its own rows and columns."""
    indices, indptr = [], []
    for _ in range(size):
        cuts = np.sort(rng.integers(0, nnz + 1, n_rows - 1))
        indptr.append(np.concatenate([[0], cuts, [nnz]]).astype(np.int32))
        indices.append(rng.integers(0, n_cols, nnz).astype(np.int32))
    return np.stack(indices), np.stack(indptr)


def _dense_of(data, indices, indptr, shape):
    """Structural dense matrix: entries outside [0, n_cols) or outside every row are skipped."""
    a = np.zeros(shape, np.float64)
    w = np.broadcast_to(np.asarray(data, np.float64), indices.shape)
    for i in range(shape[0]):
        for k in range(indptr[i], indptr[i + 1]):
            if 0 <= indices[k] < shape[1]:
                a[i, indices[k]] += w[k]
    return a


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transpose", [True, False])
def test_vmap_over_structures_is_one_kernel_call(transpose, backend):
    """vmap over structures (and weights, events) of the forward op and of its weight gradient
    binds each CSR op once on the block-diagonal structure: no loop (scan, while), and the
    weight gradient is the event-driven csr_sddmm, bound once."""
    rng = np.random.default_rng(31)
    size, n_rows, n_cols, nnz = 4, 6, 5, 11
    indices, indptr = _batched_structures(rng, size, n_rows, n_cols, nnz)
    data = rng.standard_normal((size, nnz)).astype(np.float32)
    n_in = n_rows if transpose else n_cols
    spikes = rng.random((size, n_in)) < 0.5
    spikes[1] = False
    ct = rng.standard_normal((size, n_cols if transpose else n_rows)).astype(np.float32)

    def loss(w, i, p, s, c):
        return jnp.vdot(c, evjax.binary_csrmv(w, i, p, s, shape=(n_rows, n_cols), transpose=transpose,
                                              backend=backend))

    grad = jax.vmap(jax.grad(loss))
    names = primitive_names(jax.make_jaxpr(grad)(data, indices, indptr, spikes, ct).jaxpr)
    assert names.count("evjax_csr_sddmm") == 1, names
    assert not {"scan", "while"} & set(names), names
    g = jax.jit(grad)(data, indices, indptr, spikes, ct)
    fwd = jax.jit(jax.vmap(lambda w, i, p, s: evjax.binary_csrmv(w, i, p, s, shape=(n_rows, n_cols),
                                                                 transpose=transpose, backend=backend)))
    names = primitive_names(jax.make_jaxpr(fwd)(data, indices, indptr, spikes).jaxpr)
    assert names.count("evjax_binary_csrmv") == 1 and not {"scan", "while"} & set(names), names
    y = fwd(data, indices, indptr, spikes)
    for b in range(size):
        a = _dense_of(data[b], indices[b], indptr[b], (n_rows, n_cols))
        e = spikes[b].astype(np.float64)
        np.testing.assert_allclose(y[b], e @ a if transpose else a @ e, rtol=1e-5, atol=1e-6)
        rows = np.repeat(np.arange(n_rows), np.diff(indptr[b]))
        r, q = (e, ct[b]) if transpose else (ct[b], e)
        np.testing.assert_allclose(g[b], r[rows] * q[indices[b]], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_vmap_out_of_range_index_in_one_element(backend):
    """Under jit + vmap (no validation), a column outside [0, n_cols) in one batch element is
    skipped there (in the matmuls and the sddmm) and never reaches another element's columns;
    silent events with nan weights still contribute nothing."""
    rng = np.random.default_rng(32)
    size, n_rows, n_cols, nnz = 3, 4, 5, 8
    indices, indptr = _batched_structures(rng, size, n_rows, n_cols, nnz)
    indices[0, 2], indices[1, 5], indices[2, 0] = n_cols, -1, n_cols + 3  # n_cols: the next block's column 0
    data = rng.standard_normal((size, nnz)).astype(np.float32)
    data[2, 1] = np.nan
    spikes = np.ones((size, n_rows), bool)
    spikes[2] = False
    x = rng.standard_normal((size, n_cols)).astype(np.float32)
    q = rng.standard_normal((size, n_cols)).astype(np.float32)
    kw = dict(shape=(n_rows, n_cols), backend=backend)
    scatter = jax.jit(jax.vmap(lambda w, i, p, s: evjax.binary_csrmv(w, i, p, s, transpose=True, **kw)))
    gather = jax.jit(jax.vmap(lambda w, i, p, v: evjax.csrmv(w, i, p, v, **kw)))
    sddmm = jax.jit(jax.vmap(lambda i, p, r, q: evjax.csr_sddmm(i, p, r, q, **kw), in_axes=(0, 0, 0, 0)))
    ys, yg, g = scatter(data, indices, indptr, spikes), gather(data, indices, indptr, x), \
        sddmm(indices, indptr, spikes, q)
    for b in range(size):
        a = _dense_of(data[b], indices[b], indptr[b], (n_rows, n_cols))
        want = spikes[b].astype(np.float64) @ np.where(spikes[b][:, None], a, 0)
        np.testing.assert_allclose(ys[b], np.nan_to_num(want) if b == 2 else want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(yg[b], a @ x[b], rtol=1e-5, atol=1e-6)  # a nan weight: IEEE
        rows = np.repeat(np.arange(n_rows), np.diff(indptr[b]))
        ok = (indices[b] >= 0) & (indices[b] < n_cols)
        want = np.where(ok & spikes[b][rows], q[b][np.clip(indices[b], 0, n_cols - 1)], 0)
        np.testing.assert_allclose(g[b], want, rtol=1e-6)
    assert not np.any(np.isnan(ys[2])) and np.all(ys[2] == 0)

"""The CSR CUDA kernels of evjax.primitives.csr.numba_cuda against dense
references, in Numba's CUDA simulator, at small sizes.

Two levels: the ``@cuda.jit`` kernels of ``KERNELS`` / ``WEIGHTED_KERNELS`` / ``SDDMM_KERNELS``
launched directly on host arrays, and the op generators
(``generator(outs=, ins=, shape=, transpose=)``) run end to end through
numba_cuda_kernel under jax.jit.
"""
from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evjax.primitives.csr import numba_cuda as csr_cuda
from evjax.primitives.csr import ops
from tests.helpers import cuda_kernel_tests_on_simulator, sddmm_numpy

ON_SIMULATOR = cuda_kernel_tests_on_simulator()

N_ROWS, N_COLS, K = 7, 5, 3


def _csr(rng, n_rows=N_ROWS, n_cols=N_COLS, p=0.4, index_dtype=np.int32):
    mask = rng.random((n_rows, n_cols)) < p
    mask[2] = False  # an empty row
    weights = np.where(mask, rng.standard_normal((n_rows, n_cols)), 0.0)
    indptr = np.concatenate([[0], np.cumsum(mask.sum(1))]).astype(index_dtype)
    indices = np.nonzero(mask)[1].astype(index_dtype)
    return mask, weights, indices, indptr


def _dense_operand(rng, shape, event, event_dtype):
    x = rng.standard_normal(shape) * (rng.random(shape) < 0.5)
    if not event:
        return x.astype(np.float32)
    return (x != 0).astype(event_dtype)


def _reference(mask, weights, data, homogeneous, event, transpose, x):
    w = np.where(mask, data[0], 0.0) if homogeneous else weights
    w = w.T if transpose else w
    x = (x != 0).astype(np.float64) if event else x.astype(np.float64)
    return w @ x


def _warp_per_row(n_rows):
    return -(-n_rows // csr_cuda.WARPS_PER_BLOCK), csr_cuda.THREADS


def _launch(kind, event, transpose, data, indices, indptr, x, out_shape, weighted=False):
    out = np.full(out_shape, np.nan, np.float32)
    n_rows = indptr.shape[0] - 1
    if transpose:
        out[...] = 0  # the op zero-fills the aliased accumulator
        args = (data, indices, indptr, x, out, out)
    else:
        args = (data, indices, indptr, x, out)
    if kind == "mv":
        grid, block = _warp_per_row(n_rows)
    else:
        grid, block = csr_cuda.mm_launch(n_rows, x.shape[1])
    kernel = csr_cuda.WEIGHTED_KERNELS[(kind, transpose)] if weighted else csr_cuda.KERNELS[(kind, event, transpose)]
    kernel[grid, block](*args)
    return out


def test_kernel_table():
    assert set(csr_cuda.KERNELS) == set(itertools.product(("mv", "mm"), (False, True), (False, True)))
    names = {key: kernel.__name__ for key, kernel in csr_cuda.KERNELS.items()}
    assert names[("mv", True, True)] == "mv_scatter_events" and names[("mm", False, False)] == "mm_gather"
    assert set(csr_cuda.WEIGHTED_KERNELS) == set(itertools.product(("mv", "mm"), (False, True)))
    assert csr_cuda.WEIGHTED_KERNELS[("mv", False)].__name__ == "weighted_mv_gather"
    assert set(csr_cuda.SDDMM_KERNELS) == (set(itertools.product(("vec", "mat"), ("values", "r_events", "q_events")))
                                           | {("mat", "r_weighted"), ("mat", "q_weighted")})
    every = [*csr_cuda.KERNELS.values(), *csr_cuda.WEIGHTED_KERNELS.values(), *csr_cuda.SDDMM_KERNELS.values()]
    assert len({kernel.__name__ for kernel in every}) == len(every) == 20  # one name per built kernel


@pytest.mark.parametrize("homogeneous, event", list(itertools.product([False, True], [False, True])))
def test_kernels_match_dense(homogeneous, event):
    rng = np.random.default_rng(int(homogeneous) * 2 + int(event))
    index_dtype = np.int64 if homogeneous else np.int32  # both index and event kinds, across the cases
    event_dtype = np.float32 if homogeneous else np.bool_
    mask, weights, indices, indptr = _csr(rng, index_dtype=index_dtype)
    data = np.array([0.75], np.float32) if homogeneous else weights[mask].astype(np.float32)
    for kind, transpose in itertools.product(("mv", "mm"), (False, True)):
        n_in = N_ROWS if transpose else N_COLS
        n_out = N_COLS if transpose else N_ROWS
        shape_in = (n_in,) if kind == "mv" else (n_in, K)
        shape_out = (n_out,) if kind == "mv" else (n_out, K)
        x = _dense_operand(rng, shape_in, event, event_dtype)
        got = _launch(kind, event, transpose, data, indices, indptr, x, shape_out)
        want = _reference(mask, weights, data, homogeneous, event, transpose, x)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{kind} transpose={transpose}")


def test_malformed_structure_is_clamped_not_out_of_bounds():
    data = np.ones(4, np.float32)
    indices = np.array([0, 9, -1, 1], np.int32)  # 9 and -1 are outside the 3 columns
    indptr = np.array([0, 2, 7], np.int32)  # the last row claims more synapses than exist
    v = np.ones(3, np.float32)
    np.testing.assert_array_equal(_launch("mv", False, False, data, indices, indptr, v, (2,)), [1, 1])
    u = np.ones(2, np.float32)
    np.testing.assert_array_equal(_launch("mv", False, True, data, indices, indptr, u, (3,)), [1, 1, 0])
    e = np.ones((2, 2), np.bool_)
    np.testing.assert_array_equal(_launch("mm", True, True, data, indices, indptr, e, (3, 2)),
                                  [[1, 1], [1, 1], [0, 0]])
    negative = np.array([-5, 2, 7], np.int32)  # a negative start is clamped to 0
    np.testing.assert_array_equal(_launch("mv", True, False, data, indices, negative, np.ones(3, np.bool_), (2,)),
                                  [1, 1])


def _structural(indices, indptr, data, homogeneous, event, transpose, x, weighted=False):
    """Stored entries only, one term each: an event selects w (a silent one adds nothing,
    even for a nan or inf w), a value multiplies it (IEEE: nan * 0 is nan), a weighted event
    selects, then multiplies (w * s where s != 0, else nothing)."""
    x = np.asarray(x)
    x2 = x if x.ndim == 2 else x[:, None]
    n_rows = indptr.shape[0] - 1
    y = np.zeros((N_COLS if transpose else n_rows, x2.shape[1]))
    for i in range(n_rows):
        for k in range(indptr[i], indptr[i + 1]):
            w = float(data[0] if homogeneous else data[k])
            src, dst = (i, indices[k]) if transpose else (indices[k], i)
            for c in range(x2.shape[1]):
                s = x2[src, c]
                if weighted:
                    y[dst, c] += w * float(s) if s != 0 else 0.0
                else:
                    y[dst, c] += (w if s != 0 else 0.0) if event else w * float(s)
    return y if x.ndim == 2 else y[:, 0]


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the simulator's nan
@pytest.mark.parametrize("homogeneous", [False, True])
def test_kernels_nan_and_inf_weights(homogeneous):
    """docs/semantics.md on every forward kernel: nan positions equal the structural oracle's."""
    rng = np.random.default_rng(21 + homogeneous)
    mask, weights, indices, indptr = _csr(rng, p=0.6)
    data = weights[mask].astype(np.float32)
    data[::3], data[1::5], data[2::7] = np.nan, np.inf, -np.inf
    weight_cases = [np.array([w], np.float32) for w in (np.nan, np.inf)] if homogeneous else [data]
    for w, kind, transpose, event in itertools.product(weight_cases, ("mv", "mm"), (False, True), (False, True)):
        n_in, n_out = (N_ROWS, N_COLS) if transpose else (N_COLS, N_ROWS)
        shape_in = (n_in,) if kind == "mv" else (n_in, K)
        x = (rng.random(shape_in) < 0.5) if event else \
            rng.choice(np.array([0.0, 0.0, 1.5, -2.0, np.inf], np.float32), size=shape_in)
        got = _launch(kind, event, transpose, w, indices, indptr, x, (n_out,) + shape_in[1:])
        want = _structural(indices, indptr, w, homogeneous, event, transpose, x)
        msg = f"{kind} event={event} transpose={transpose} w={w[:3]}"
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=msg)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=msg)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the simulator's nan
@pytest.mark.parametrize("homogeneous", [False, True])
def test_weighted_kernels_nan_and_inf_weights(homogeneous):
    """Weighted events on every forward kernel: a zero entry hides nan/inf weights, a nonzero one
    multiplies them (IEEE), against the structural oracle."""
    rng = np.random.default_rng(41 + homogeneous)
    mask, weights, indices, indptr = _csr(rng, p=0.6)
    data = weights[mask].astype(np.float32)
    data[::3], data[1::5], data[2::7] = np.nan, np.inf, -np.inf
    weight_cases = [np.array([w], np.float32) for w in (np.nan, np.inf)] if homogeneous else [data]
    for w, kind, transpose in itertools.product(weight_cases, ("mv", "mm"), (False, True)):
        n_in, n_out = (N_ROWS, N_COLS) if transpose else (N_COLS, N_ROWS)
        shape_in = (n_in,) if kind == "mv" else (n_in, K)
        x = rng.choice(np.array([0.0, 0.0, 0.0, 1.5, -2.0, np.inf], np.float32), size=shape_in)
        got = _launch(kind, True, transpose, w, indices, indptr, x, (n_out,) + shape_in[1:], weighted=True)
        want = _structural(indices, indptr, w, homogeneous, True, transpose, x, weighted=True)
        msg = f"{kind} transpose={transpose} w={w[:3]}"
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=msg)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=msg)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the simulator's nan
@pytest.mark.parametrize("matrix", [False, True])
def test_sddmm_kernels_nan_and_inf(matrix):
    """Each SDDMM mode: an event operand selects (0 whatever the other holds), two values multiply."""
    rng = np.random.default_rng(31 + matrix)
    _, _, indices, indptr = _csr(rng, p=0.7)
    shape_r, shape_q = ((N_ROWS, K), (N_COLS, K)) if matrix else ((N_ROWS,), (N_COLS,))
    special = np.array([0.0, 1.5, -2.0, np.nan, np.inf, -np.inf], np.float32)
    r_vals, q_vals = rng.choice(special, size=shape_r), rng.choice(special, size=shape_q)
    r_vals[0] = 0  # a zero row of r beside non-finite q
    r_ev, q_ev = rng.random(shape_r) < 0.5, rng.random(shape_q) < 0.5
    for r, q in ((r_vals, q_vals), (r_ev, q_vals), (r_vals, q_ev), (r_ev, q_ev.astype(np.float32))):
        got = _launch_sddmm("mat" if matrix else "vec", indices, indptr, r, q)
        want = sddmm_numpy(indices, indptr, r, q)  # 0 * inf: nan, as wanted
        msg = f"r {r.dtype}, q {q.dtype}"
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=msg)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=msg)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the simulator's nan
def test_weighted_sddmm_kernels_nan_and_inf():
    """The weighted SDDMM modes (matrices): g = sum where(e != 0, r q, 0), e the weighted operand;
    r_weighted skips the rows of all-zero r (their entries keep the buffer), q_weighted visits every row."""
    rng = np.random.default_rng(51)
    _, _, indices, indptr = _csr(rng, p=0.7)
    special = np.array([0.0, 0.0, 1.5, -2.0, np.nan, np.inf, -np.inf], np.float32)
    r, q = rng.choice(special, size=(N_ROWS, K)), rng.choice(special, size=(N_COLS, K))
    r[0], r[3] = 0, [0.0, np.inf, 0.0]  # an all-zero row; inf beside zeros
    assert indptr[1] > indptr[0]  # row 0 has synapses
    rows = np.repeat(np.arange(N_ROWS), np.diff(indptr))
    a, b = r[rows].astype(np.float64), q[indices].astype(np.float64)
    for mode, e in (("r_weighted", a), ("q_weighted", b)):
        with np.errstate(invalid="ignore"):
            want = np.sum(np.where(e != 0, a * b, 0.0), axis=1)
        got = _launch_sddmm("mat", indices, indptr, r, q, mode=mode)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=mode)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=mode)
        g = _launch_sddmm("mat", indices, indptr, r, q, fill=7.0, mode=mode)
        zero_row = g[indptr[0]:indptr[1]]
        assert np.all(zero_row == 7.0) if mode == "r_weighted" else not np.any(zero_row == 7.0), mode


GENERATORS = {
    ("mv", False): csr_cuda.csrmv_numba_cuda,
    ("mm", False): csr_cuda.csrmm_numba_cuda,
    ("mv", True): csr_cuda.binary_csrmv_numba_cuda,
    ("mm", True): csr_cuda.binary_csrmm_numba_cuda,
}


@pytest.mark.parametrize(
    "kind, event, transpose, homogeneous, dtype",
    [
        ("mv", False, False, False, np.float32),
        ("mv", True, True, True, np.float32),
        ("mm", False, True, False, np.float64),
        ("mm", True, False, True, np.float16),
        ("mv", True, False, False, jnp.bfloat16),
    ],
)
def test_generators_end_to_end_under_jit(kind, event, transpose, homogeneous, dtype):
    with jax.enable_x64(np.dtype(dtype) == np.float64):
        _check_generator(kind, event, transpose, homogeneous, dtype)


def _check_generator(kind, event, transpose, homogeneous, dtype):
    rng = np.random.default_rng(7)
    mask, weights, indices, indptr = _csr(rng)
    data = np.array([0.5], dtype) if homogeneous else weights[mask].astype(dtype)
    n_in = N_ROWS if transpose else N_COLS
    shape_in = (n_in,) if kind == "mv" else (n_in, K)
    x = _dense_operand(rng, shape_in, event, np.float16)
    if not event:
        x = x.astype(dtype)
    want = _reference(mask, weights.astype(dtype).astype(np.float64), np.asarray(data, np.float64), homogeneous,
                      event, transpose, np.asarray(x, np.float64))
    outs = [jax.ShapeDtypeStruct(want.shape, dtype)]
    ins = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (data, indices, indptr, x)]
    run = GENERATORS[(kind, event)](outs=outs, ins=ins, shape=(N_ROWS, N_COLS), transpose=transpose)
    (got,) = jax.jit(run)(data, indices, indptr, x)
    assert got.dtype == dtype and got.shape == want.shape
    tol = 1e-2 if np.dtype(dtype).itemsize == 2 else 1e-5
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol)


def test_generator_with_no_rows_or_no_synapses():
    data = np.zeros(0, np.float32)
    indices = np.zeros(0, np.int32)
    indptr = np.zeros(4, np.int32)  # 3 empty rows
    v = np.ones(3, np.bool_)
    ins = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (data, indices, indptr, v)]
    for transpose in (False, True):
        outs = [jax.ShapeDtypeStruct((3,), np.float32)]
        run = csr_cuda.binary_csrmv_numba_cuda(outs=outs, ins=ins, shape=(3, 3), transpose=transpose)
        np.testing.assert_array_equal(run(data, indices, indptr, v)[0], np.zeros(3))


# ---------------------------------------------------------------------------
# SDDMM (the weight gradient): g[k] = <r[row k], q[indices[k]]>
# ---------------------------------------------------------------------------
def _sddmm_operands(rng, matrix, dtype=np.float32):
    shape_r = (N_ROWS, K) if matrix else (N_ROWS,)
    shape_q = (N_COLS, K) if matrix else (N_COLS,)
    r = rng.standard_normal(shape_r).astype(dtype)
    r[1] = 0  # a silent row (all zeros for matrices): skipped
    r[4] = 0
    q = rng.standard_normal(shape_q).astype(dtype)
    return r, q


def _launch_sddmm(name, indices, indptr, r, q, fill=0.0, mode=None):
    g = np.full(indices.shape[0], fill, np.float32)  # the aliased in-out buffer
    mode = ops.sddmm_mode(r.dtype, q.dtype) if mode is None else mode
    csr_cuda.SDDMM_KERNELS[(name, mode)][_warp_per_row(r.shape[0])](indices, indptr, r, q, g, g)
    return g


@pytest.mark.parametrize("matrix", [False, True])
def test_sddmm_kernels_match_numpy(matrix):
    rng = np.random.default_rng(11 + matrix)
    mask, _, indices, indptr = _csr(rng, p=0.7, index_dtype=np.int64 if matrix else np.int32)
    r, q = _sddmm_operands(rng, matrix)
    name = "mat" if matrix else "vec"
    np.testing.assert_allclose(_launch_sddmm(name, indices, indptr, r, q), sddmm_numpy(indices, indptr, r, q),
                               rtol=1e-5, atol=1e-6)
    # two float operands: every row is computed (0 * inf must be nan)
    assert not np.any(_launch_sddmm(name, indices, indptr, r, q, fill=7.0) == 7.0)
    # an event operand: rows whose r is zero are not visited, their entries keep whatever the buffer held
    for r_op, q_op in ((r != 0, q), (r, q > 0)):
        g = _launch_sddmm(name, indices, indptr, r_op, q_op, fill=7.0)
        for i in range(N_ROWS):
            span = slice(indptr[i], indptr[i + 1])
            if i in (1, 4):
                assert np.all(g[span] == 7.0)
            else:
                assert not np.any(g[span] == 7.0)


def test_sddmm_malformed_structure_stays_in_bounds():
    indices = np.array([0, 9, -1, 1], np.int32)  # 9 and -1 are outside the 3 columns
    indptr = np.array([-3, 2, 7], np.int32)  # a negative start and a row past nnz
    r = np.array([1.0, 2.0], np.float32)
    q = np.array([1.0, 2.0, 3.0], np.float32)
    np.testing.assert_array_equal(_launch_sddmm("vec", indices, indptr, r, q), [1, 0, 0, 4])
    rm = np.stack([r, r], axis=1)
    qm = np.stack([q, q], axis=1)
    np.testing.assert_array_equal(_launch_sddmm("mat", indices, indptr, rm, qm), [2, 0, 0, 8])
    for mode_r, mode_q in ((r > 0, q), (r, q > 0)):
        np.testing.assert_array_equal(_launch_sddmm("vec", indices, indptr, mode_r, mode_q), [1, 0, 0, 2])


@pytest.mark.parametrize(
    "matrix, dtype, r_bool",
    [(False, np.float32, False), (True, np.float32, False), (False, np.float64, True), (True, np.float16, True),
     (False, jnp.bfloat16, False)],
)
def test_sddmm_generator_end_to_end_under_jit(matrix, dtype, r_bool):
    with jax.enable_x64(np.dtype(dtype) == np.float64):
        rng = np.random.default_rng(5)
        _, _, indices, indptr = _csr(rng, p=0.6)
        r, q = _sddmm_operands(rng, matrix, np.float32)
        r = r != 0 if r_bool else r.astype(dtype)
        q = q.astype(dtype)
        shape = (N_ROWS, N_COLS)
        want = ops.csr_sddmm(indices, indptr, r, q, shape=shape, dtype=dtype, backend="reference")
        outs = [jax.ShapeDtypeStruct((indices.shape[0],), dtype)]
        ins = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (indices, indptr, r, q)]
        run = csr_cuda.csr_sddmm_numba_cuda(outs=outs, ins=ins, shape=shape, weighted=None)
        (got,) = jax.jit(run)(indices, indptr, r, q)
        assert got.dtype == dtype and got.shape == want.shape
        tol = 1e-2 if np.dtype(dtype).itemsize == 2 else 1e-5
        np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=tol, atol=tol)
        np.testing.assert_allclose(np.asarray(got, np.float64),
                                   sddmm_numpy(indices, indptr, np.asarray(r, np.float64), np.asarray(q, np.float64)),
                                   rtol=tol, atol=tol)


def test_sddmm_with_no_synapses_or_no_rows():
    indices = np.zeros(0, np.int32)
    for n_rows, matrix in ((3, False), (3, True), (0, False)):
        indptr = np.zeros(n_rows + 1, np.int32)
        r = np.ones((n_rows, 2) if matrix else (n_rows,), np.float32)
        q = np.ones((4, 2) if matrix else (4,), np.float32)
        outs = [jax.ShapeDtypeStruct((0,), np.float32)]
        ins = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (indices, indptr, r, q)]
        (g,) = jax.jit(csr_cuda.csr_sddmm_numba_cuda(outs=outs, ins=ins, shape=(n_rows, 4), weighted=None))(
            indices, indptr, r, q)
        assert g.shape == (0,) and g.dtype == np.float32
    # synapses, but every row of r silent: all zeros (the zero-filled buffer)
    indices = np.array([0, 1, 1], np.int32)
    indptr = np.array([0, 2, 3], np.int32)
    r, q = np.zeros(2, np.float32), np.ones(2, np.float32)
    outs = [jax.ShapeDtypeStruct((3,), np.float32)]
    ins = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (indices, indptr, r, q)]
    (g,) = jax.jit(csr_cuda.csr_sddmm_numba_cuda(outs=outs, ins=ins, shape=(2, 2), weighted=None))(indices, indptr, r, q)
    np.testing.assert_array_equal(g, np.zeros(3))


# ---------------------------------------------------------------------------
# registration
# ---------------------------------------------------------------------------
def test_registered_as_the_numba_cuda_backend_of_the_csr_ops():
    """The ops of evjax.primitives.csr pick these generators for backend='numba_cuda' on GPU;
    here the chosen kernel runs in the simulator and matches the op's reference backend."""
    from evjax.primitives import csr

    rng = np.random.default_rng(3)
    mask, weights, indices, indptr = _csr(rng)
    data = weights[mask].astype(np.float32)
    cases = [
        (csr.csrmv_p, (N_COLS,), False, False), (csr.csrmv_p, (N_ROWS,), True, False),
        (csr.csrmm_p, (N_COLS, K), False, False), (csr.binary_csrmm_p, (N_ROWS, K), True, True),
        (csr.binary_csrmv_p, (N_ROWS,), True, True),
    ]
    for op, shape_in, transpose, event in cases:
        assert "numba_cuda" in op.backends("gpu")
        x = _dense_operand(rng, shape_in, event, np.bool_)
        params = dict(shape=(N_ROWS, N_COLS), transpose=transpose, **({"weighted": False} if event else {}))
        want = op(data, indices, indptr, x, outs=[jax.ShapeDtypeStruct(
            ((N_COLS if transpose else N_ROWS),) + shape_in[1:], np.float32)], backend="reference", **params)[0]
        avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (data, indices, indptr, x)]
        kernel = op.kernel_for("gpu", "numba_cuda", avals, (jax.ShapeDtypeStruct(want.shape, want.dtype),), params)
        got = jax.jit(kernel)(data, indices, indptr, x)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{op.name} transpose={transpose}")

    op = csr.csr_sddmm_p
    assert "numba_cuda" in op.backends("gpu")
    params = dict(shape=(N_ROWS, N_COLS), weighted=None)
    for matrix in (False, True):
        r, q = _sddmm_operands(rng, matrix)
        outs = (jax.ShapeDtypeStruct((indices.shape[0],), np.float32),)
        want = op(indices, indptr, r, q, outs=list(outs), backend="reference", **params)[0]
        avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (indices, indptr, r, q)]
        kernel = op.kernel_for("gpu", "numba_cuda", avals, outs, params)
        got = jax.jit(kernel)(indices, indptr, r, q)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{op.name} matrix={matrix}")

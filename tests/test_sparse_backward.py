"""The sparse-backward family: the Numba kernels' two paths (the same bits), the four ops
(``csrmv_nonzero``, ``csr_sddmm_nonzero``, ``densemv_nonzero``, ``dense_outer_nonzero``) against
dense NumPy references on every backend and transform, ``sparse_backward_matmul`` against
``BinaryArray(spikes) @ W`` and NumPy, ``sparse_backward_gate`` and ``bptt_scan``."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads

import evjax
from evjax.primitives.grouping import transposed_view
from evjax.primitives.sparse_backward import (
    csr_sddmm_nonzero, csrmv_nonzero, dense_outer_nonzero, densemv_nonzero, rows_sorted,
)
from evjax.primitives.sparse_backward import numba as sb_numba
from evjax.testing import OpSpec, assert_close, check_all, csr_resampler
from tests.helpers import THOROUGH, dense_matrix, primitive_names, random_structure

BACKENDS = ("numba", "reference")
WHOLE, NONZERO, AUTO = 0, 1, -1


# ===========================================================================
# NumPy references (float64, term by term: a zero entry of the vector contributes nothing)
# ===========================================================================
def entry_rows(indptr):
    indptr = np.asarray(indptr)
    return np.repeat(np.arange(indptr.shape[0] - 1), np.diff(indptr))


def entry_weights(data, nnz):
    data = np.asarray(data, np.float64)
    return np.broadcast_to(data, (nnz,)) if data.shape[0] == 1 and nnz != 1 else data


def np_dense(data, indices, indptr, shape):
    """The dense matrix of a CSR structure (duplicates summed), float64."""
    a = np.zeros(shape)
    np.add.at(a, (entry_rows(indptr), np.asarray(indices)), entry_weights(data, len(indices)))
    return a


def np_csrmv(data, indices, indptr, v, shape, transpose):
    """``A v`` / ``A.T v`` over the stored entries, zero entries of ``v`` skipped (NaN weights included)."""
    v = np.asarray(v, np.float64)
    rows = v[None] if v.ndim == 1 else v
    src, dst = (entry_rows(indptr), np.asarray(indices))
    if not transpose:
        src, dst = dst, src
    w = entry_weights(data, len(indices))
    out = np.zeros((rows.shape[0], shape[1] if transpose else shape[0]))
    with np.errstate(invalid="ignore", over="ignore"):
        for b in range(rows.shape[0]):
            x = rows[b, src]
            np.add.at(out[b], dst, np.where(x != 0, w * x, 0.0))
    return out if v.ndim == 2 else out[0]


def np_masked_outer(r, q):
    """``r[..., i] q[..., j]`` where both are nonzero, else 0: ``(..., m, n)``."""
    r, q = np.asarray(r, np.float64), np.asarray(q, np.float64)
    a, b = r[..., :, None], q[..., None, :]
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where((a != 0) & (b != 0), a * b, 0.0)


def np_sddmm(indices, indptr, r, q):
    """``g[..., k] = sum_b r[..., b, i_k] q[..., b, j_k]`` where both are nonzero (1-d ``r``, ``q``: no sum)."""
    g = np_masked_outer(r, q)[..., entry_rows(indptr), np.asarray(indices)]
    return g if np.ndim(r) == 1 else g.sum(axis=-2)


def np_densemv(w, v, transpose):
    w, v = np.asarray(w, np.float64), np.asarray(v, np.float64)
    rows = v[None] if v.ndim == 1 else v
    wt = w if transpose else w.T  # (contracted, out)
    with np.errstate(invalid="ignore", over="ignore"):
        terms = np.where(rows[:, :, None] != 0, rows[:, :, None] * wt[None], 0.0)
    out = terms.sum(axis=1)
    return out if v.ndim == 2 else out[0]


def close(actual, expected, what=""):
    """``assert_close`` (NaN and infinities exact, finite values at the dtype's tolerance)."""
    actual = np.asarray(actual)
    assert_close(actual, np.asarray(expected).astype(actual.dtype), what=what)


def bits(x):
    x = np.ascontiguousarray(x)
    return x.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize])


def assert_same_bits(a, b, what=""):
    assert a.shape == b.shape and a.dtype == b.dtype, what
    np.testing.assert_array_equal(bits(a), bits(b), err_msg=what)


# ===========================================================================
# structures
# ===========================================================================
def sorted_structure(rng, n_rows, n_cols, *, sort=True):
    """Rows of 0..n_cols+2 entries over a random subset of the columns (empty columns happen),
    duplicates within a row, an empty row with some chance; sorted within rows if ``sort``."""
    if n_rows == 0 or n_cols == 0:
        return np.zeros(0, np.int32), np.zeros(n_rows + 1, np.int32)
    used = rng.choice(n_cols, size=rng.integers(1, n_cols + 1), replace=False)
    counts = rng.integers(0, n_cols + 3, size=n_rows)
    if rng.random() < 0.5:
        counts[rng.integers(0, n_rows)] = 0
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    indices = rng.choice(used, size=int(indptr[-1])).astype(np.int32)
    for r in range(n_rows):
        if sort:
            indices[indptr[r]:indptr[r + 1]].sort()
        else:
            rng.shuffle(indices[indptr[r]:indptr[r + 1]])
    return indices, indptr


# a fixed structure with every feature: duplicates (row 0 col 1, row 3 col 4), empty rows (2, 5),
# empty columns (0, 3), a full row (4); 6 x 6
FEATURED_INDICES = np.array([1, 1, 2, 4, 5, 1, 4, 4, 1, 2, 4, 5], np.int32)
FEATURED_INDPTR = np.array([0, 3, 5, 5, 8, 12, 12], np.int32)
FEATURED_SHAPE = (6, 6)


def numpy_view(indices, indptr, n_cols):
    """The column view with the dtypes the ops pass the kernel (int32 throughout)."""
    return tuple(np.asarray(a) for a in transposed_view(jnp.asarray(indices), jnp.asarray(indptr), n_cols))


def vector_rows(rng, batch, n, rate, dtype, nonfinite=False):
    """``(batch, n)``: row 0 at ``rate``, row 1 all zeros (some -0.0), row 2 all nonzero."""
    v = (rng.standard_normal((batch, n)) * (rng.random((batch, n)) < rate))
    v[v == 0] = 0.0
    if batch > 1:
        v[1] = np.where(rng.random(n) < 0.5, -0.0, 0.0)
    if batch > 2:
        v[2] = rng.uniform(0.5, 2.0, n) * rng.choice([-1.0, 1.0], n)
    if nonfinite and v.size:
        v.flat[rng.integers(0, v.size)] = rng.choice([np.nan, np.inf, -np.inf])
    return np.ascontiguousarray(v.astype(dtype))


def weights(rng, nnz, dtype, homogeneous, nonfinite=False):
    data = rng.uniform(0.5, 1.5, 1 if homogeneous else nnz) * rng.choice([-1.0, 1.0], 1 if homogeneous else nnz)
    if nonfinite and data.size and not homogeneous:
        data[rng.integers(0, data.size)] = rng.choice([np.nan, np.inf, -np.inf])
    return data.astype(dtype)


def flags(*values):
    return np.asarray(values, np.int32)


# ===========================================================================
# 1. the Numba kernels: path 0 and path 1 give the same bits; the automatic choice too
# ===========================================================================
def run_csrmv_kernel(data, indices, indptr, view, v, n_out, transpose, sorted_rows, path):
    out = np.full((v.shape[0], n_out), np.nan, v.dtype)  # every entry must be written
    sb_numba.csrmv_nonzero_kernel(data, indices, indptr, *view, v, flags(transpose, sorted_rows, path), out)
    return out


def check_csrmv_paths(data, indices, indptr, shape, v, transpose, *, sorted_ok):
    view = numpy_view(indices, indptr, shape[1])
    n_out = shape[1] if transpose else shape[0]
    want = np_csrmv(data, indices, indptr, v, shape, transpose)
    first = None
    # with sorted rows every flag gives the same bits; unsorted: sorted_rows=0 only (transpose: any)
    for sorted_flag in ((0, 1) if (sorted_ok or transpose) else (0,)):
        for path in (WHOLE, NONZERO, AUTO):
            got = run_csrmv_kernel(data, indices, indptr, view, v, n_out, int(transpose), sorted_flag, path)
            what = f"csrmv transpose={transpose} sorted_rows={sorted_flag} path={path}"
            close(got, want, what)
            if first is None:
                first = got
            assert_same_bits(got, first, what)


@st.composite
def kernel_cases(draw):
    return dict(n_rows=draw(st.integers(0, 7)), n_cols=draw(st.integers(0, 7)),
                seed=draw(st.integers(0, 2**32 - 1)), dtype=draw(st.sampled_from([np.float32, np.float64])),
                homogeneous=draw(st.booleans()), rate=draw(st.sampled_from([0.0, 0.15, 0.5, 1.0])),
                batch=draw(st.sampled_from([1, 3])), nonfinite=draw(st.booleans()))


@settings(max_examples=60, deadline=None)
@given(case=kernel_cases())
def test_csrmv_kernel_paths_same_bits(case):
    rng = np.random.default_rng(case["seed"])
    shape = (case["n_rows"], case["n_cols"])
    indices, indptr = sorted_structure(rng, *shape)
    data = weights(rng, len(indices), case["dtype"], case["homogeneous"], case["nonfinite"])
    for transpose in (False, True):
        v = vector_rows(rng, case["batch"], shape[0] if transpose else shape[1], case["rate"], case["dtype"],
                        case["nonfinite"])
        check_csrmv_paths(data, indices, indptr, shape, v, transpose, sorted_ok=True)


@settings(max_examples=25, deadline=None)
@given(case=kernel_cases())
def test_csrmv_kernel_unsorted_rows(case):
    """Unsorted rows: A.T v gives the same bits on both paths; A v with sorted_rows=0 too (one path)."""
    rng = np.random.default_rng(case["seed"])
    shape = (case["n_rows"], case["n_cols"])
    indices, indptr = sorted_structure(rng, *shape, sort=False)
    data = weights(rng, len(indices), case["dtype"], case["homogeneous"], case["nonfinite"])
    for transpose in (False, True):
        v = vector_rows(rng, case["batch"], shape[0] if transpose else shape[1], case["rate"], case["dtype"],
                        case["nonfinite"])
        check_csrmv_paths(data, indices, indptr, shape, v, transpose, sorted_ok=False)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("homogeneous", [False, True])
@pytest.mark.parametrize("fill", ["zeros", "all", "some"])
def test_csrmv_kernel_featured_structure(dtype, homogeneous, fill):
    """Duplicates, empty rows, empty columns; a vector all zero, all nonzero, or mixed."""
    rng = np.random.default_rng(7)
    data = weights(rng, len(FEATURED_INDICES), dtype, homogeneous)
    for transpose in (False, True):
        n = FEATURED_SHAPE[0] if transpose else FEATURED_SHAPE[1]
        v = {"zeros": np.zeros((2, n)), "all": rng.uniform(0.5, 1.5, (2, n)),
             "some": rng.standard_normal((2, n)) * (rng.random((2, n)) < 0.3)}[fill].astype(dtype)
        check_csrmv_paths(data, FEATURED_INDICES, FEATURED_INDPTR, FEATURED_SHAPE, v, transpose, sorted_ok=True)
        if fill == "zeros":  # nothing reaches the output, not even 0 * NaN
            view = numpy_view(FEATURED_INDICES, FEATURED_INDPTR, FEATURED_SHAPE[1])
            nan_data = np.full_like(data, np.nan)
            for path in (WHOLE, NONZERO, AUTO):
                got = run_csrmv_kernel(nan_data, FEATURED_INDICES, FEATURED_INDPTR, view, v,
                                       FEATURED_SHAPE[1] if transpose else FEATURED_SHAPE[0], int(transpose), 1, path)
                assert_same_bits(got, np.zeros_like(got), f"path {path}")


def test_csrmv_kernel_whole_path_is_not_the_nonzero_path():
    """The two paths are distinct code: on unsorted rows with sorted_rows=1 (a wrong flag), A v sums a
    row's terms in stored order on the whole path, in column order on the nonzero path, so bits differ."""
    data = np.array([1.0, 1e8, -1e8], np.float32)  # row 0: columns 2, 0, 1 (unsorted)
    indices, indptr = np.array([2, 0, 1], np.int32), np.array([0, 3], np.int32)
    view = numpy_view(indices, indptr, 3)
    v = np.ones((1, 3), np.float32)
    whole = run_csrmv_kernel(data, indices, indptr, view, v, 1, 0, 1, WHOLE)
    nonzero = run_csrmv_kernel(data, indices, indptr, view, v, 1, 0, 1, NONZERO)
    assert float(whole[0, 0]) == 0.0  # (1 + 1e8) - 1e8 in float32
    assert float(nonzero[0, 0]) == 1.0  # (1e8 - 1e8) + 1
    # with the honest flag the kernel always scatters: the nonzero path's bits
    for path in (WHOLE, NONZERO, AUTO):
        assert_same_bits(run_csrmv_kernel(data, indices, indptr, view, v, 1, 0, 0, path), nonzero)


def grouped(rng, groups, batch, n, rate, dtype, nonfinite):
    return np.stack([vector_rows(rng, batch, n, rate, dtype, nonfinite)[::(-1) ** g] for g in range(groups)])


@settings(max_examples=40, deadline=None)
@given(case=kernel_cases(), sort=st.booleans(), groups=st.sampled_from([1, 2]))
def test_csr_sddmm_kernel_paths_same_bits(case, sort, groups):
    rng = np.random.default_rng(case["seed"])
    shape = (case["n_rows"], case["n_cols"])
    indices, indptr = sorted_structure(rng, *shape, sort=sort)
    view = numpy_view(indices, indptr, shape[1])
    r = grouped(rng, groups, case["batch"], shape[0], case["rate"], case["dtype"], case["nonfinite"])
    q = grouped(rng, groups, case["batch"], shape[1], 0.5, case["dtype"], case["nonfinite"])[:, ::-1].copy()
    want = np_sddmm(indices, indptr, r, q)
    first = None
    for path in (WHOLE, NONZERO, AUTO):
        out = np.full((groups, len(indices)), np.nan, r.dtype)
        sb_numba.csr_sddmm_nonzero_kernel(indices, indptr, *view, r, q, flags(path), out)
        close(out, want, f"sddmm path {path}")
        first = out if first is None else first
        assert_same_bits(out, first, f"sddmm path {path}")


@settings(max_examples=40, deadline=None)
@given(case=kernel_cases(), groups=st.sampled_from([1, 2]))
def test_dense_kernels_paths_same_bits(case, groups):
    rng = np.random.default_rng(case["seed"])
    m, n, dtype = case["n_rows"], case["n_cols"], case["dtype"]
    w = rng.standard_normal((m, n)).astype(dtype)
    if case["nonfinite"] and w.size:
        w.flat[rng.integers(0, w.size)] = np.nan
    for transpose in (False, True):
        v = vector_rows(rng, case["batch"], m if transpose else n, case["rate"], dtype, case["nonfinite"])
        want = np_densemv(w, v, transpose)
        first = None
        for path in (WHOLE, NONZERO, AUTO):
            out = np.full((v.shape[0], n if transpose else m), np.nan, dtype)
            sb_numba.densemv_nonzero_kernel(w, v, flags(int(transpose), path), out)
            close(out, want, f"densemv transpose={transpose} path {path}")
            first = out if first is None else first
            assert_same_bits(out, first, f"densemv transpose={transpose} path {path}")
    r = grouped(rng, groups, case["batch"], m, case["rate"], dtype, case["nonfinite"])
    q = grouped(rng, groups, case["batch"], n, case["rate"], dtype, False)[:, ::-1].copy()
    want = np_masked_outer(r, q).sum(axis=1)
    first = None
    for path in (WHOLE, NONZERO, AUTO):
        out = np.full((groups, m, n), np.nan, dtype)
        sb_numba.dense_outer_nonzero_kernel(r, q, flags(path), out)
        close(out, want, f"dense_outer path {path}")
        first = out if first is None else first
        assert_same_bits(out, first, f"dense_outer path {path}")


# ===========================================================================
# 2. the ops on every backend against NumPy; the harness on every transform
# ===========================================================================
def csr_case(rng, shape, *, sort, homogeneous=False, nnz_zero=False):
    if nnz_zero:
        indices, indptr = np.zeros(0, np.int32), np.zeros(shape[0] + 1, np.int32)
    else:
        indices, indptr = sorted_structure(rng, *shape, sort=sort)
    return weights(rng, len(indices), np.float32, homogeneous), indices, indptr


SHAPE_CASES = [  # (shape, sort, homogeneous, nnz 0, batch)
    ((6, 5), True, False, False, None),
    ((6, 5), False, False, False, 3),
    ((5, 7), True, True, False, 2),
    ((4, 3), True, False, True, 2),  # nnz 0
    ((0, 4), True, False, False, 2),  # no rows
    ((4, 0), True, False, False, None),  # no columns
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_csr_ops_against_numpy(backend):
    rng = np.random.default_rng(11)
    for shape, sort, homogeneous, nnz_zero, batch in SHAPE_CASES:
        data, indices, indptr = csr_case(rng, shape, sort=sort, homogeneous=homogeneous, nnz_zero=nnz_zero)
        view = transposed_view(jnp.asarray(indices), jnp.asarray(indptr), shape[1])
        a = np_dense(data, indices, indptr, shape)
        for transpose in (False, True):
            n_in = shape[0] if transpose else shape[1]
            vshape = (n_in,) if batch is None else (batch, n_in)
            v = (rng.standard_normal(vshape) * (rng.random(vshape) < 0.5)).astype(np.float32)
            got = csrmv_nonzero(data, indices, indptr, view, v, shape=shape, transpose=transpose, backend=backend)
            assert got.dtype == jnp.float32
            want = v @ a if transpose else v @ a.T
            close(got, want, f"csrmv_nonzero {shape} transpose={transpose} {backend}")
        rshape = (shape[0],) if batch is None else (batch, shape[0])
        qshape = (shape[1],) if batch is None else (batch, shape[1])
        r = (rng.standard_normal(rshape) * (rng.random(rshape) < 0.5)).astype(np.float32)
        q = (rng.standard_normal(qshape) * (rng.random(qshape) < 0.5)).astype(np.float32)
        g = csr_sddmm_nonzero(indices, indptr, view, r, q, shape=shape, backend=backend)
        assert g.shape == (len(indices),) and g.dtype == jnp.float32
        r2, q2 = np.atleast_2d(r).astype(np.float64), np.atleast_2d(q).astype(np.float64)
        want = np.einsum("bi,bj->ij", r2, q2)[entry_rows(indptr), indices]  # the dense gradient, sampled
        close(g, want, f"csr_sddmm_nonzero {shape} {backend}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_dense_ops_against_numpy(backend):
    rng = np.random.default_rng(12)
    for (m, n), batch in [((5, 4), None), ((3, 6), 3), ((0, 4), 2), ((4, 0), None), ((1, 1), 1)]:
        w = rng.standard_normal((m, n)).astype(np.float32)
        for transpose in (False, True):
            n_in = m if transpose else n
            if n_in == 0:
                continue  # an empty contraction: test_empty_sums
            vshape = (n_in,) if batch is None else (batch, n_in)
            v = (rng.standard_normal(vshape) * (rng.random(vshape) < 0.5)).astype(np.float32)
            got = densemv_nonzero(w, v, transpose=transpose, backend=backend)
            close(got, v @ w if transpose else v @ w.T, f"densemv_nonzero {(m, n)} transpose={transpose}")
        rshape, qshape = ((m,), (n,)) if batch is None else ((batch, m), (batch, n))
        r = (rng.standard_normal(rshape) * (rng.random(rshape) < 0.5)).astype(np.float32)
        q = (rng.standard_normal(qshape) * (rng.random(qshape) < 0.5)).astype(np.float32)
        got = dense_outer_nonzero(r, q, backend=backend)
        assert got.shape == (m, n)
        close(got, np.multiply.outer(r, q) if batch is None else np.einsum("bi,bj->ij", r, q),
              f"dense_outer_nonzero {(m, n)}")


@pytest.mark.parametrize("backend", ["numba", "reference"])
@pytest.mark.parametrize("case", ["densemv", "densemv-transpose", "csr_sddmm", "dense_outer"])
def test_empty_sums(backend, case):
    """A sum over nothing is zeros: an empty contraction (densemv), an empty batch (the gradients)."""
    view = transposed_view(jnp.asarray(FEATURED_INDICES), jnp.asarray(FEATURED_INDPTR), 6)
    if case == "densemv":
        got, shape = densemv_nonzero(jnp.ones((4, 0)), jnp.ones((2, 0)), transpose=False, backend=backend), (2, 4)
    elif case == "densemv-transpose":
        got, shape = densemv_nonzero(jnp.ones((0, 4)), jnp.ones(0), transpose=True, backend=backend), (4,)
    elif case == "csr_sddmm":
        got = csr_sddmm_nonzero(FEATURED_INDICES, FEATURED_INDPTR, view, jnp.ones((0, 6)), jnp.ones((0, 6)),
                                shape=FEATURED_SHAPE, backend=backend)
        shape = FEATURED_INDICES.shape
    else:
        got, shape = dense_outer_nonzero(jnp.ones((0, 2)), jnp.ones((0, 3)), backend=backend), (2, 3)
    assert got.shape == shape
    np.testing.assert_array_equal(np.asarray(got), np.zeros(shape))


def test_ops_reject_mismatched_ranks():
    view = transposed_view(jnp.asarray(FEATURED_INDICES), jnp.asarray(FEATURED_INDPTR), 6)
    with pytest.raises(ValueError, match="r and q must both be 1-d or both 2-d"):
        csr_sddmm_nonzero(FEATURED_INDICES, FEATURED_INDPTR, view, jnp.ones(6), jnp.ones((1, 6)), shape=(6, 6))
    with pytest.raises(ValueError, match="r and q must both be 1-d or both 2-d"):
        csr_sddmm_nonzero(FEATURED_INDICES, FEATURED_INDPTR, view, jnp.ones((1, 1, 6)), jnp.ones((1, 1, 6)),
                          shape=(6, 6))
    with pytest.raises(ValueError, match="r and q must both be 1-d or both 2-d"):
        dense_outer_nonzero(jnp.ones((2, 3)), jnp.ones(3))


def test_numba_op_runs_the_kernel_bits():
    """The op (automatic path) gives the kernel's bits; sorted_rows=False (the scatter) the same bits
    on sorted rows, and the gather is skipped for unsorted rows (rows_sorted)."""
    rng = np.random.default_rng(13)
    data = weights(rng, len(FEATURED_INDICES), np.float32, False)
    view = numpy_view(FEATURED_INDICES, FEATURED_INDPTR, 6)
    v = vector_rows(rng, 3, 6, 0.9, np.float32)
    for transpose in (False, True):
        want = run_csrmv_kernel(data, FEATURED_INDICES, FEATURED_INDPTR, view, v, 6, int(transpose), 1, WHOLE)
        for sorted_rows in (None, True, False):
            got = csrmv_nonzero(data, FEATURED_INDICES, FEATURED_INDPTR, view, v, shape=FEATURED_SHAPE,
                                transpose=transpose, sorted_rows=sorted_rows, backend="numba")
            assert_same_bits(np.asarray(got), want, f"transpose={transpose} sorted_rows={sorted_rows}")


def test_rows_sorted():
    assert rows_sorted(FEATURED_INDICES, FEATURED_INDPTR)
    assert rows_sorted(np.array([3, 5, 0, 1], np.int32), np.array([0, 2, 4], np.int32))  # drop at a row start
    assert not rows_sorted(np.array([3, 5, 4, 1], np.int32), np.array([0, 3, 4], np.int32))
    assert not rows_sorted(np.array([3, 1], np.int32), np.array([0, 2, 2], np.int32))  # drop after an empty row
    assert rows_sorted(np.array([3, 1], np.int32), np.array([0, 1, 1, 2], np.int32))
    assert rows_sorted(np.zeros(0, np.int32), np.zeros(3, np.int32))
    seen = []
    jax.jit(lambda i: seen.append(rows_sorted(i, FEATURED_INDPTR)) or i)(FEATURED_INDICES)
    assert seen == [False]  # traced: not known, so the scatter


def csrmv_spec(transpose, backend, batched_v):
    def fn(d, i, p, v, shape):
        return csrmv_nonzero(d, i, p, transposed_view(i, p, shape[1]), v, shape=shape, transpose=transpose,
                             backend=backend)

    def reference(d, i, p, v, shape):
        a = dense_matrix(d, i, p, shape)
        return v @ a if transpose else v @ a.T

    return OpSpec(fn=fn, reference=reference, diff_argnums=(0, 3), static_argnums=(4,), backend=backend,
                  resample=csr_resampler(indices=1, indptr=2, shape=4), batch_size=2,
                  name=f"csrmv_nonzero(transpose={transpose}, {backend}, v {'2-d' if batched_v else '1-d'})")


def sddmm_spec(backend):
    def fn(i, p, r, q, shape):
        return csr_sddmm_nonzero(i, p, transposed_view(i, p, shape[1]), r, q, shape=shape, backend=backend)

    def reference(i, p, r, q, shape):  # the dense gradient (summed over the batch), sampled at the entries
        rows = jnp.searchsorted(p[1:], jnp.arange(i.shape[0], dtype=p.dtype), side="right")
        return jnp.einsum("...i,...j->ij", r, q)[rows, i]

    return OpSpec(fn=fn, reference=reference, diff_argnums=(2, 3), static_argnums=(4,), backend=backend,
                  resample=csr_resampler(indices=0, indptr=1, shape=4), batch_size=2,
                  name=f"csr_sddmm_nonzero({backend})")


def densemv_spec(transpose, backend):
    return OpSpec(fn=lambda w, v: densemv_nonzero(w, v, transpose=transpose, backend=backend),
                  reference=lambda w, v: v @ w if transpose else v @ w.T,
                  diff_argnums=(0, 1), backend=backend, batch_size=2,
                  name=f"densemv_nonzero(transpose={transpose}, {backend})")


def outer_spec(backend):
    return OpSpec(fn=lambda r, q: dense_outer_nonzero(r, q, backend=backend),
                  reference=lambda r, q: jnp.einsum("...i,...j->ij", r, q),
                  diff_argnums=(0, 1), backend=backend, batch_size=2, name=f"dense_outer_nonzero({backend})")


def sparse_vector(rng, shape, rate=0.5):
    return (rng.standard_normal(shape) * (rng.random(shape) < rate)).astype(np.float32)


# the reference backend shares the rules (jvp, transpose, batching) checked on numba: its kernels only
def harness_skip(backend):
    return () if backend == "numba" else ("check_grads", "vmap", "nested_vmap", "jit_grad_vmap")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transpose", [False, True])
def test_csrmv_nonzero_harness(backend, transpose):
    rng = np.random.default_rng(20 + transpose)
    shape = (5, 4)
    indices, indptr = random_structure(rng, *shape)
    data = weights(rng, len(indices), np.float32, False)
    v = sparse_vector(rng, (2, shape[0] if transpose else shape[1]))
    check_all(csrmv_spec(transpose, backend, True), (data, indices, indptr, v, shape), skip=harness_skip(backend))
    if backend == "numba":  # one weight shared by every synapse, one vector
        homogeneous = weights(rng, 1, np.float32, True)
        check_all(csrmv_spec(transpose, backend, False), (homogeneous, indices, indptr, v[0], shape),
                  skip=("backend", "check_grads", "nested_vmap", "jit_grad_vmap"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_csr_sddmm_nonzero_harness(backend):
    rng = np.random.default_rng(22)
    shape = (4, 5)
    indices, indptr = random_structure(rng, *shape)
    r, q = sparse_vector(rng, (2, 4)), sparse_vector(rng, (2, 5))
    check_all(sddmm_spec(backend), (indices, indptr, r, q, shape), skip=harness_skip(backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_dense_ops_harness(backend):
    rng = np.random.default_rng(23)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    check_all(densemv_spec(False, backend), (w, sparse_vector(rng, (2, 3))), skip=harness_skip(backend))
    check_all(densemv_spec(True, backend), (w, sparse_vector(rng, (4,))),
              skip=tuple({"nested_vmap", "jit_grad_vmap", *harness_skip(backend)}))
    check_all(outer_spec(backend), (sparse_vector(rng, (2, 4)), sparse_vector(rng, (2, 3))),
              skip=harness_skip(backend))


# ===========================================================================
# 3. zero entries skip NaN and infinite weights; nonzero ones follow IEEE
# ===========================================================================
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_zero_entries_skip_nonfinite_weights(backend, bad):
    rng = np.random.default_rng(30)
    data = weights(rng, len(FEATURED_INDICES), np.float32, False)
    data[3] = bad  # row 1, column 4
    view = numpy_view(FEATURED_INDICES, FEATURED_INDPTR, 6)
    for transpose in (False, True):
        v = rng.uniform(0.5, 1.5, 6).astype(np.float32)
        v[1 if transpose else 4] = 0.0  # the vector entry that meets the bad weight
        got = np.asarray(csrmv_nonzero(data, FEATURED_INDICES, FEATURED_INDPTR, view, v, shape=FEATURED_SHAPE,
                                       transpose=transpose, backend=backend))
        assert np.all(np.isfinite(got)), got
        finite = np.where(np.isfinite(data), data, 0.0)
        close(got, np_csrmv(finite, FEATURED_INDICES, FEATURED_INDPTR, v, FEATURED_SHAPE, transpose))
        v[1 if transpose else 4] = 2.0  # now it meets it: IEEE
        got = np.asarray(csrmv_nonzero(data, FEATURED_INDICES, FEATURED_INDPTR, view, v, shape=FEATURED_SHAPE,
                                       transpose=transpose, backend=backend))
        hit = 4 if transpose else 1
        assert np.isnan(got[hit]) if np.isnan(bad) else got[hit] == np.inf
        assert np.all(np.isfinite(np.delete(got, hit)))
    w = rng.uniform(0.5, 1.5, (4, 5)).astype(np.float32)
    w[2, 1] = bad
    for transpose in (False, True):
        v = rng.uniform(0.5, 1.5, 4 if transpose else 5).astype(np.float32)
        v[2 if transpose else 1] = 0.0
        got = np.asarray(densemv_nonzero(w, v, transpose=transpose, backend=backend))
        assert np.all(np.isfinite(got)), got
        close(got, np_densemv(np.where(np.isfinite(w), w, 0.0), v, transpose))
    # the products: a zero factor gives 0 whatever the other holds
    r = np.array([[0.0, 2.0, 1.0]], np.float32)
    q = np.array([[bad, 3.0]], np.float32)
    np.testing.assert_array_equal(np.asarray(dense_outer_nonzero(r, q, backend=backend))[0], [0.0, 0.0])
    g = np.asarray(csr_sddmm_nonzero(np.array([0, 1, 0], np.int32), np.array([0, 2, 2, 3], np.int32),
                                     transposed_view(jnp.array([0, 1, 0]), jnp.array([0, 2, 2, 3]), 2),
                                     r, q, shape=(3, 2), backend=backend))
    assert g[0] == 0.0 and g[1] == 0.0 and (np.isnan(g[2]) if np.isnan(bad) else g[2] == np.inf)


# ===========================================================================
# 4. sparse_backward_matmul: the forward of BinaryArray(spikes) @ W, its derivatives
# ===========================================================================
N_PRE, N_POST = 7, 5
KINDS = ("csr", "csr_sorted", "csr_homogeneous", "csc", "fixed", "dense", "array")


def layer_weights(kind, rng, dtype=np.float32):
    """``(W, params, rebuild, dense, to_params)``: ``W`` of ``kind``, its weights, ``rebuild(params) -> W``,
    ``dense(params)``, the ``(N_PRE, N_POST)`` float64 NumPy matrix, and ``to_params(Wbar)``, a dense
    gradient mapped onto the weights (per synapse; summed for a shared weight)."""
    if kind in ("csr", "csr_sorted", "csr_homogeneous"):
        indices, indptr = random_structure(rng, N_PRE, N_POST)
        if kind == "csr_sorted":
            for r in range(N_PRE):
                indices[indptr[r]:indptr[r + 1]].sort()
        data = weights(rng, len(indices), dtype, kind == "csr_homogeneous")
        W = evjax.CSR((data, indices, indptr), shape=(N_PRE, N_POST))
        rows = entry_rows(indptr)

        def to_params(wbar):
            g = wbar[rows, indices]
            return np.sum(g, keepdims=True) if kind == "csr_homogeneous" else g

        return W, W.data, W.with_data, lambda d: np_dense(d, indices, indptr, (N_PRE, N_POST)), to_params
    if kind == "csc":
        indices, indptr = random_structure(rng, N_POST, N_PRE)  # the CSR of W.T
        data = weights(rng, len(indices), dtype, False)
        W = evjax.CSC((data, indices, indptr), shape=(N_PRE, N_POST))
        rows = entry_rows(indptr)
        return (W, W.data, W.with_data, lambda d: np_dense(d, indices, indptr, (N_POST, N_PRE)).T,
                lambda wbar: wbar[indices, rows])
    if kind == "fixed":
        k = 3
        table = rng.integers(0, N_POST, (N_PRE, k)).astype(np.int32)
        data = rng.standard_normal((N_PRE, k)).astype(dtype)
        W = evjax.FixedPostNumConn((data, table), shape=(N_PRE, N_POST))
        pre = np.repeat(np.arange(N_PRE), k)

        def dense(d):
            a = np.zeros((N_PRE, N_POST))
            np.add.at(a, (pre, table.ravel()), np.asarray(d, np.float64).ravel())
            return a

        return W, W.data, W.with_data, dense, lambda wbar: wbar[pre, table.ravel()].reshape(N_PRE, k)
    w = jnp.asarray(rng.standard_normal((N_PRE, N_POST)) * (rng.random((N_PRE, N_POST)) < 0.6), dtype)
    if kind == "dense":
        return evjax.Dense(w), w, evjax.Dense, lambda d: np.asarray(d, np.float64), lambda wbar: wbar
    return w, w, lambda d: d, lambda d: np.asarray(d, np.float64), lambda wbar: wbar


SPIKES = ("bool-1d", "bool-2d", "float-1d", "float-2d", "weighted-2d")


def make_spikes(kind, rng, batch=3):
    shape = (N_PRE,) if kind.endswith("1d") else (batch, N_PRE)
    active = rng.random(shape) < 0.45
    active.reshape(-1, N_PRE)[:, 0] = False  # a silent row, always
    if kind.startswith("bool"):
        return active
    if kind.startswith("float"):
        return active.astype(np.float32) * rng.choice([1.0, 2.0], shape).astype(np.float32)
    return evjax.WeightedArray(jnp.asarray(active * rng.standard_normal(shape), jnp.float32))


def spike_values(spikes):
    """``(values, weighted)``."""
    if isinstance(spikes, evjax.WeightedArray):
        return np.asarray(spikes.value), True
    return np.asarray(spikes), False


def events_np(values, weighted):
    return np.where(values != 0, values, 0.0).astype(np.float64) if weighted else (values != 0).astype(np.float64)


def as_events(x, weighted):
    return evjax.WeightedArray(x) if weighted else evjax.BinaryArray(x)


def wrap(x, weighted):
    """The spikes argument of sparse_backward_matmul for the values ``x``."""
    return evjax.WeightedArray(x) if weighted else x


# the cases: every kind with every spike form under THOROUGH, else two forms per kind (bool and float or
# weighted; 1-d and 2-d)
DIAGONAL = {"csr": ("bool-1d", "weighted-2d"), "csr_sorted": ("bool-2d", "float-2d"),
            "csr_homogeneous": ("float-1d", "weighted-2d"), "csc": ("float-2d", "bool-1d"),
            "fixed": ("weighted-2d", "bool-2d"), "dense": ("float-1d", "weighted-2d"), "array": ("bool-2d", "float-2d")}
LAYER_CASES = [(k, s) for k in KINDS for s in (SPIKES if THOROUGH else DIAGONAL[k])]


@pytest.mark.parametrize("kind,spikes_kind", LAYER_CASES)
def test_matmul_forward_and_gradients(kind, spikes_kind):
    rng = np.random.default_rng(40 + KINDS.index(kind))
    W, params, rebuild, dense, to_params = layer_weights(kind, rng)
    spikes = make_spikes(spikes_kind, rng)
    values, weighted = spike_values(spikes)
    x = jnp.asarray(values)
    a = dense(params)
    e = events_np(values, weighted)

    # forward: the same bits as the event product, and the dense product
    y = evjax.sparse_backward_matmul(spikes, W)
    want = as_events(x, weighted) @ W
    assert y.shape == want.shape and y.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(y), np.asarray(want))
    close(y, e @ a)
    np.testing.assert_array_equal(np.asarray(jax.jit(evjax.sparse_backward_matmul)(spikes, W)), np.asarray(want))

    # gradients of a smooth loss: w.r.t. the weights, and (float spikes) the spikes
    c = jnp.asarray(rng.standard_normal(y.shape), jnp.float32)
    float_spikes = values.dtype != np.bool_

    def loss(layer):
        def f(p, s):
            return jnp.sum(c * jnp.sin(layer(s, rebuild(p))))
        return f

    ours = loss(lambda s, w: evjax.sparse_backward_matmul(wrap(s, weighted), w))
    theirs = loss(lambda s, w: as_events(s, weighted) @ w)
    argnums = (0, 1) if float_spikes else 0
    got = jax.grad(ours, argnums=argnums)(params, x)
    ref = jax.grad(theirs, argnums=argnums)(params, x)
    got_jit = jax.jit(jax.grad(ours, argnums=argnums))(params, x)
    got, ref, got_jit = ((g,) if not float_spikes else g for g in (got, ref, got_jit))
    y_bar = np.asarray(c, np.float64) * np.cos(e @ a)
    w_bar = np.einsum("bi,bj->ij", np.atleast_2d(e), np.atleast_2d(y_bar))  # sum over the batch of e ⊗ y_bar
    expected = [to_params(w_bar)] + ([y_bar @ a.T] if float_spikes else [])
    for g, r, gj, oracle, name in zip(got, ref, got_jit, expected, ("weights", "spikes")):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=2e-5, atol=2e-5, err_msg=name)
        np.testing.assert_allclose(np.asarray(gj), np.asarray(g), rtol=2e-6, atol=2e-6, err_msg=name)
        close(g, oracle, name)
    assert np.any(np.asarray(got[0]) != 0)

    # forward mode: the tangent of the weights (and of float spikes)
    dp = jnp.asarray(rng.standard_normal(np.shape(params)), jnp.float32)
    dx = jnp.asarray(rng.standard_normal(x.shape), jnp.float32) if float_spikes else None

    def layer(p, s):
        return evjax.sparse_backward_matmul(wrap(s, weighted), rebuild(p))

    if float_spikes:
        y1, dy = jax.jvp(layer, (params, x), (dp, dx))
        want_dy = e @ dense(dp) + np.asarray(dx, np.float64) @ a
    else:
        y1, dy = jax.jvp(lambda p: layer(p, x), (params,), (dp,))
        want_dy = e @ dense(dp)
    np.testing.assert_array_equal(np.asarray(y1), np.asarray(want))
    close(dy, want_dy, "jvp")


def test_matmul_backward_runs_the_nonzero_ops():
    """The backward pass binds the sparse-backward ops (the forward does not)."""
    rng = np.random.default_rng(41)
    W, params, rebuild, _, _ = layer_weights("csr", rng)
    x = make_spikes("float-2d", rng)

    def f(p, s):
        return jnp.sum(jnp.sin(evjax.sparse_backward_matmul(s, rebuild(p))))

    forward = primitive_names(jax.make_jaxpr(f)(params, x).jaxpr)
    backward = primitive_names(jax.make_jaxpr(jax.grad(f, argnums=(0, 1)))(params, x).jaxpr)
    assert not any("nonzero" in n for n in forward), forward
    assert "evjax_csrmv_nonzero" in backward and "evjax_csr_sddmm_nonzero" in backward, backward
    Wd, pd, rebuild_d, _, _ = layer_weights("dense", rng)
    backward = primitive_names(jax.make_jaxpr(jax.grad(
        lambda p, s: jnp.sum(jnp.sin(evjax.sparse_backward_matmul(s, rebuild_d(p)))), argnums=(0, 1)))(pd, x).jaxpr)
    assert "evjax_densemv_nonzero" in backward and "evjax_dense_outer_nonzero" in backward, backward


@pytest.mark.parametrize("kind", ["csr", "dense"])
def test_matmul_vmap(kind):
    rng = np.random.default_rng(42)
    W, params, rebuild, dense, to_params = layer_weights(kind, rng)
    a = dense(params)
    K = 3
    S = (rng.random((K, N_PRE)) < 0.5).astype(np.float32)
    P = jnp.stack([params * (1.0 + 0.5 * k) for k in range(K)])
    c = jnp.asarray(rng.standard_normal(N_POST), jnp.float32)

    def layer(p, s):
        return evjax.sparse_backward_matmul(s, rebuild(p))

    def loss(p, s):
        return jnp.sum(c * jnp.sin(layer(p, s)))

    grad = jax.grad(loss, argnums=(0, 1))

    def expected_grads(p_np, s_np):
        e = (s_np != 0).astype(np.float64)
        y_bar = np.asarray(c, np.float64) * np.cos(e @ dense(p_np))
        return to_params(np.outer(e, y_bar)), y_bar @ dense(p_np).T

    # over the spikes: axis 0 and axis 1
    for in_axis, batch in ((0, S), (1, S.T)):
        y = jax.vmap(layer, in_axes=(None, in_axis))(params, batch)
        close(y, S @ a, f"vmap over spikes, in_axes={in_axis}")
        gp, gs = jax.vmap(grad, in_axes=(None, in_axis))(params, batch)
        for k in range(K):
            wp, ws = expected_grads(params, S[k])
            close(gp[k], wp, f"vmap grad weights [{k}]")
            close(gs[k], ws, f"vmap grad spikes [{k}]")
    # over the weights
    y = jax.vmap(layer, in_axes=(0, None))(P, S[0])
    gp, gs = jax.jit(jax.vmap(grad, in_axes=(0, None)))(P, S[0])
    for k in range(K):
        close(y[k], S[0] @ dense(P[k]), f"vmap over weights [{k}]")
        wp, ws = expected_grads(P[k], S[0])
        close(gp[k], wp)
        close(gs[k], ws)
    # nested: weights outside, spikes (axis 1) inside
    y = jax.vmap(jax.vmap(layer, in_axes=(None, 1)), in_axes=(0, None))(P, S.T)
    gp, gs = jax.vmap(jax.vmap(grad, in_axes=(None, 1)), in_axes=(0, None))(P, S.T)
    for k in range(K):
        for j in range(K):
            close(y[k, j], S[j] @ dense(P[k]), f"nested vmap [{k}, {j}]")
            wp, ws = expected_grads(P[k], S[j])
            close(gp[k, j], wp)
            close(gs[k, j], ws)


@pytest.mark.parametrize("backend", BACKENDS)
def test_csrmv_nonzero_vmap_over_structures(backend):
    """A batch of different CSR structures of one nnz: each element against its own dense reference,
    forward and the gradients in the weights and the vector."""
    rng = np.random.default_rng(43)
    shape, nnz, K = (5, 6), 11, 3
    parts = []
    for _ in range(K):
        indptr = np.concatenate([[0], np.sort(rng.integers(0, nnz + 1, shape[0] - 1)), [nnz]]).astype(np.int32)
        indices = rng.integers(0, shape[1], nnz).astype(np.int32)
        parts.append((rng.standard_normal(nnz).astype(np.float32), indices, indptr,
                      *numpy_view(indices, indptr, shape[1])))
    data, indices, indptr, ti, tp, perm = (np.stack(p) for p in zip(*parts))
    v = sparse_vector(rng, (K, 2, shape[1]))
    c = rng.standard_normal((2, shape[0])).astype(np.float32)

    def f(d, i, p, ti, tp, perm, v):
        return csrmv_nonzero(d, i, p, (ti, tp, perm), v, shape=shape, transpose=False, sorted_rows=False,
                             backend=backend)

    y = jax.vmap(f)(data, indices, indptr, ti, tp, perm, v)
    gd, gv = jax.vmap(jax.grad(lambda d, i, p, ti, tp, perm, v: jnp.sum(c * f(d, i, p, ti, tp, perm, v)),
                               argnums=(0, 6)))(data, indices, indptr, ti, tp, perm, v)
    for k in range(K):
        a = np_dense(data[k], indices[k], indptr[k], shape)
        close(y[k], v[k] @ a.T, f"structure {k}")
        close(gv[k], c @ a, f"grad v, structure {k}")
        close(gd[k], np.einsum("bi,bj->ij", c, v[k])[entry_rows(indptr[k]), indices[k]], f"grad data {k}")


@pytest.mark.parametrize("kind", ["csr_sorted", "csc", "dense"])
def test_matmul_check_grads_in_the_weights(kind):
    with jax.enable_x64(True):
        rng = np.random.default_rng(44)
        W, params, rebuild, _, _ = layer_weights(kind, rng, dtype=np.float64)
        for s in ((rng.random((2, N_PRE)) < 0.5), (rng.random(N_PRE) < 0.5).astype(np.float64) * 1.5):
            c = jnp.asarray(rng.standard_normal(N_POST))
            f = lambda p: jnp.sum(c * jnp.sin(evjax.sparse_backward_matmul(s, rebuild(p))))  # noqa: E731
            check_grads(f, (params,), order=2, modes=("fwd", "rev"), atol=1e-6, rtol=1e-6)


def test_matmul_jit_no_retrace():
    rng = np.random.default_rng(45)
    W, params, rebuild, dense, to_params = layer_weights("csr", rng)
    traces, grad_traces = [], []

    @jax.jit
    def f(s, d):
        traces.append(1)
        return evjax.sparse_backward_matmul(s, W.with_data(d))

    @jax.jit
    def g(s, d):
        grad_traces.append(1)
        return jax.grad(lambda d: jnp.sum(jnp.sin(evjax.sparse_backward_matmul(s, W.with_data(d)))))(d)

    for k in range(3):
        s = rng.random(N_PRE) < 0.5
        d = params * (1.0 + k)
        close(f(s, d), s @ dense(d))
        close(g(s, d), to_params(np.outer(s, np.cos(s @ dense(d)))))
    assert len(traces) == 1 and len(grad_traces) == 1


# ===========================================================================
# 5. the weight gradient is event-driven and selective in the cotangent
# ===========================================================================
def np_spikes_cotangent(kind, W, p, y_bar):
    """``W y_bar`` (the spikes' cotangent) over the stored synapses, zero entries of ``y_bar`` skipped."""
    if kind in ("csr", "csr_sorted"):
        return np_csrmv(p, W.indices, W.indptr, y_bar, W.shape, transpose=False)
    if kind == "csc":  # stored: the CSR of W.T
        return np_csrmv(p, W.indices, W.indptr, y_bar, W.shape[::-1], transpose=True)
    return np_densemv(p, y_bar, transpose=False)


@pytest.mark.parametrize("kind", ["csr", "csr_sorted", "csc", "dense"])
def test_weight_gradient_skips_silent_rows_and_zero_cotangent(kind):
    rng = np.random.default_rng(50)
    W, params, rebuild, dense, to_params = layer_weights(kind, rng)
    s = (rng.random((2, N_PRE)) < 0.6).astype(np.float32)
    s[:, 0] = 0.0  # presynaptic neuron 0 silent in every row of the batch
    s[:, 1] = 1.0
    silent_row = np.zeros((N_PRE, N_POST))
    silent_row[0] = 1.0
    p = np.array(params)
    p[to_params(silent_row) > 0] = np.nan  # NaN weights on the synapses of the silent neuron
    y_bar = rng.uniform(0.5, 1.5, (2, N_POST)).astype(np.float32)
    y_bar[:, [1, 3]] = 0.0  # outputs with no gradient
    y_bar[1, 4] = np.inf  # an infinite cotangent: silent events still contribute nothing
    out, pullback = jax.vjp(lambda p, s: evjax.sparse_backward_matmul(s, rebuild(p)), jnp.asarray(p), s)
    assert np.all(np.isfinite(np.asarray(out)))  # the silent row never reaches the forward
    p_bar, s_bar = (np.asarray(g) for g in pullback(jnp.asarray(y_bar)))
    e = (s != 0).astype(np.float64)
    want = np_masked_outer(e, y_bar).sum(axis=0)  # e[b, i] y_bar[b, j] where both are nonzero
    zero = np.zeros((N_PRE, N_POST), bool)
    zero[0] = True
    zero[:, [1, 3]] = True
    assert np.all(want[zero] == 0) and np.isinf(want[1, 4])
    assert np.all(p_bar[to_params(zero.astype(np.float64)) > 0] == 0), p_bar
    assert not np.any(np.isnan(p_bar)), p_bar
    close(p_bar, to_params(want), "weights")
    # the spikes' cotangent: IEEE where a nonzero y_bar meets a weight (NaN for neuron 0)
    close(s_bar, np_spikes_cotangent(kind, W, p, y_bar), "spikes")


def test_spikes_cotangent_skips_nan_weights_on_zero_cotangent():
    """A NaN weight on an output whose cotangent is zero leaves the spikes' gradient finite."""
    rng = np.random.default_rng(51)
    for kind in ("csr", "csr_sorted", "dense"):
        W, params, rebuild, dense, to_params = layer_weights(kind, rng)
        mask = np.zeros((N_PRE, N_POST))
        mask[:, 2] = 1.0
        p = np.array(params)
        if kind == "dense":
            p[:, 2] = np.nan
        else:
            p[to_params(mask) > 0] = np.nan
        s = np.ones(N_PRE, np.float32)
        s[0] = 0.0
        y_bar = rng.standard_normal(N_POST).astype(np.float32)
        y_bar[2] = 0.0
        _, pullback = jax.vjp(lambda p, s: evjax.sparse_backward_matmul(s, rebuild(p)), jnp.asarray(p), s)
        p_bar, s_bar = pullback(jnp.asarray(y_bar))
        a = dense(np.where(np.isnan(p), 0.0, p))
        close(s_bar, a @ y_bar, kind)
        assert np.all(np.isfinite(np.asarray(p_bar))), kind


# ===========================================================================
# 6. sparse_backward_gate
# ===========================================================================
@pytest.mark.parametrize("surrogate,alpha", [("triangle", 2.0), ("box", 4.0), ("clipped_fast_sigmoid", None)])
def test_gate_forward_identity_and_band(surrogate, alpha):
    width = evjax.surrogate.band_width(surrogate, alpha)
    assert width is not None and width > 0
    v_th = 1.0
    v = np.float32(v_th) + np.array([0.0, 0.5, -0.5, 0.99, -0.99, 1.0, -1.0, 2.0, -3.0, 0.0], np.float32) * \
        np.float32(width)
    spikes = np.zeros(v.shape, np.float32)
    spikes[[7, 8]] = 1.0  # spiking but far from threshold: in the band
    live = (spikes != 0) | (np.abs(v - np.float32(v_th)) < np.float32(width))
    assert live.any() and not live.all()
    i_syn = np.linspace(-1, 1, v.size).astype(np.float32)
    state = {"v": jnp.asarray(v), "i": jnp.asarray(i_syn)}
    out = evjax.sparse_backward_gate(state, v, spikes, v_th=v_th, surrogate=surrogate, alpha=alpha)
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(state)
    np.testing.assert_array_equal(np.asarray(out["v"]), v)
    np.testing.assert_array_equal(np.asarray(out["i"]), i_syn)
    wv, wi = np.arange(1, v.size + 1, dtype=np.float32), -np.arange(1, v.size + 1, dtype=np.float32)

    def loss(st):
        g = evjax.sparse_backward_gate(st, v, spikes, v_th=v_th, surrogate=surrogate, alpha=alpha)
        return jnp.sum(wv * g["v"] ** 2) + jnp.sum(wi * g["i"])

    grads = jax.jit(jax.grad(loss))(state)
    np.testing.assert_array_equal(np.asarray(grads["v"]), np.where(live, 2 * wv * v, 0.0))
    np.testing.assert_array_equal(np.asarray(grads["i"]), np.where(live, wi, 0.0))
    # a NaN tangent is cut too (where, not a product)
    tangent = {"v": jnp.full(v.shape, jnp.nan), "i": jnp.ones(v.shape)}
    _, t_out = jax.jvp(lambda st: evjax.sparse_backward_gate(st, v, spikes, v_th=v_th, surrogate=surrogate,
                                                             alpha=alpha), (state,), (tangent,))
    assert np.all(np.isnan(np.asarray(t_out["v"])[live])) and np.all(np.asarray(t_out["v"])[~live] == 0)
    np.testing.assert_array_equal(np.asarray(t_out["i"]), live.astype(np.float32))


def test_gate_rejects_a_surrogate_without_band():
    v = jnp.zeros(3)
    for name in ("fast_sigmoid", "sigmoid"):
        with pytest.raises(ValueError, match=name):
            evjax.sparse_backward_gate(v, v, v, surrogate=name)


# ===========================================================================
# 7. bptt_scan
# ===========================================================================
def lif_network(memory, surrogate="triangle", alpha=2.0):
    rng = np.random.default_rng(70)
    n_in, n = 6, 5
    w_in = jnp.asarray(rng.uniform(0.0, 0.8, (n_in, n)), jnp.float32)
    indices, indptr = random_structure(rng, n, n)
    w_rec = evjax.CSR((rng.uniform(-0.5, 0.5, len(indices)).astype(np.float32), indices, indptr), shape=(n, n))
    inputs = jnp.asarray(rng.random((12, n_in)) < 0.5)

    def run(w_in, rec_data, memory=memory):
        W = w_rec.with_data(rec_data)

        def step(carry, x):
            v, i_syn, s = carry
            i_syn = 0.8 * i_syn + evjax.sparse_backward_matmul(x, w_in) + evjax.sparse_backward_matmul(s, W)
            v, s = evjax.lif_step(v, i_syn, tau=5.0, surrogate=surrogate, alpha=alpha)
            v, i_syn = evjax.sparse_backward_gate((v, i_syn), v, s, surrogate=surrogate, alpha=alpha)
            return (v, i_syn, s), (s, v)

        init = (jnp.zeros(n), jnp.zeros(n), jnp.zeros(n))
        return evjax.bptt_scan(step, init, inputs, memory=memory)

    return run, w_in, w_rec.data


@pytest.mark.parametrize("memory", ["carry", "segments"])
def test_bptt_scan_remat_same_values_and_gradients(memory):
    run, w_in, rec = lif_network("full")
    (vf, _, _), (spikes, vs) = run(w_in, rec)
    (vc, _, _), (spikes_c, vs_c) = run(w_in, rec, memory=memory)
    assert 0 < float(jnp.sum(spikes)) < spikes.size  # some neurons spike, not all
    np.testing.assert_array_equal(np.asarray(spikes_c), np.asarray(spikes))
    np.testing.assert_allclose(np.asarray(vs_c), np.asarray(vs), rtol=1e-6, atol=1e-7)

    def loss(memory):
        def f(w_in, rec):
            (v, _, _), (s, vs) = run(w_in, rec, memory=memory)
            return jnp.sum(vs ** 2) + jnp.sum(v) + jnp.sum(s * jnp.arange(s.shape[0])[:, None])
        return f

    gf = jax.jit(jax.grad(loss("full"), argnums=(0, 1)))(w_in, rec)
    gc = jax.jit(jax.grad(loss(memory), argnums=(0, 1)))(w_in, rec)
    for a, b in zip(gf, gc):
        assert np.any(np.asarray(a) != 0)
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)
    # "carry" checkpoints the step, "segments" each segment; "full" is lax.scan as is
    names_c = primitive_names(jax.make_jaxpr(jax.grad(loss(memory)))(w_in, rec).jaxpr)
    names_f = primitive_names(jax.make_jaxpr(jax.grad(loss("full")))(w_in, rec).jaxpr)
    assert any(n in ("checkpoint", "remat", "remat2") for n in names_c), set(names_c)
    assert not any(n in ("checkpoint", "remat", "remat2") for n in names_f)


def test_bptt_scan_matches_lax_scan_and_rejects_unknown_memory():
    def step(c, x):
        c = jnp.tanh(c * x + 1.0)
        return c, c * 2.0

    xs = jnp.linspace(-1.0, 1.0, 7)
    weights = jnp.arange(1.0, 8.0)
    for reverse in (False, True):
        want = jax.lax.scan(step, jnp.float32(0.3), xs, reverse=reverse)
        gw = jax.grad(lambda c: jnp.sum(weights * jax.lax.scan(step, c, xs, reverse=reverse)[1]))(0.3)
        # segments of 7 steps: 2 (3 of them and a remainder of 1), 3, 7 (one), 1, 10 (longer than the scan)
        for memory, segment in (("full", None), ("carry", None), ("segments", None), ("segments", 2),
                                ("segments", 3), ("segments", 7), ("segments", 1), ("segments", 10)):
            got = evjax.bptt_scan(step, jnp.float32(0.3), xs, memory=memory, segment=segment, reverse=reverse)
            np.testing.assert_allclose(np.asarray(got[1]), np.asarray(want[1]), rtol=1e-6)
            np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=1e-6)
            g = jax.grad(lambda c: jnp.sum(weights * evjax.bptt_scan(
                step, c, xs, memory=memory, segment=segment, reverse=reverse)[1]))(0.3)
            np.testing.assert_allclose(float(g), float(gw), rtol=1e-5)
    # no xs: the length counts the steps
    count = lambda c, _: (c + 1.0, c)  # noqa: E731
    got = evjax.bptt_scan(count, jnp.float32(0.0), None, length=5, memory="segments", segment=2)
    np.testing.assert_array_equal(np.asarray(got[1]), np.arange(5.0))
    with pytest.raises(ValueError, match="bogus"):
        evjax.bptt_scan(step, jnp.float32(0.3), xs, memory="bogus")
    with pytest.raises(ValueError, match="segment must be at least 1"):
        evjax.bptt_scan(step, jnp.float32(0.3), xs, memory="segments", segment=0)
    with pytest.raises(ValueError, match="give xs or length"):
        evjax.bptt_scan(count, jnp.float32(0.0), None, memory="segments")


def test_bptt_scan_segments_store_less():
    """XLA's own accounting of the compiled gradient: segments of sqrt(T) keep fewer bytes than the full scan."""
    n, steps = 256, 64

    def grad_of(memory):
        def loss(w, x):
            def step(c, xt):
                v, i = c
                i = 0.8 * i + xt * w
                v, s = evjax.lif_step(v, i, surrogate="fast_sigmoid")
                return (v, i), s
            _, s = evjax.bptt_scan(step, (jnp.zeros(n), jnp.zeros(n)), x, memory=memory)
            return jnp.sum(jnp.sin(s))
        return jax.jit(jax.grad(loss))

    x, w = jnp.ones((steps, n)), jnp.ones(n)
    temp = {m: grad_of(m).lower(w, x).compile().memory_analysis().temp_size_in_bytes for m in ("full", "segments")}
    assert temp["segments"] < 0.8 * temp["full"], temp


# ===========================================================================
# 8. bad input
# ===========================================================================
def test_matmul_bad_input():
    rng = np.random.default_rng(80)
    W, params, _, _, _ = layer_weights("csr", rng)
    with pytest.raises(ValueError, match=f"spikes have 4 entries on their last axis, W has {N_PRE} rows"):
        evjax.sparse_backward_matmul(jnp.ones(4, bool), W)
    with pytest.raises(ValueError, match=f"spikes have 9 entries on their last axis, W has {N_PRE} rows"):
        evjax.sparse_backward_matmul(jnp.ones((2, 9)), W)
    with pytest.raises(ValueError, match=f"spikes have 3 entries on their last axis, W has {N_PRE} rows"):
        evjax.sparse_backward_matmul(jnp.ones((2, 3), bool), jnp.ones((N_PRE, 2)))
    with pytest.raises(ValueError, match=r"spikes must be \(n_pre,\) or \(batch, n_pre\), got \(2, 3, 7\)"):
        evjax.sparse_backward_matmul(jnp.ones((2, 3, N_PRE), bool), W)
    with pytest.raises(ValueError, match=r"spikes must be \(n_pre,\) or \(batch, n_pre\)"):
        evjax.sparse_backward_matmul(jnp.ones((), bool), W)
    for bad in ([[1.0, 2.0]] * N_PRE, jnp.ones((N_PRE, 2), jnp.int32), jnp.ones(N_PRE), jnp.ones((N_PRE, 2, 2)),
                "W", None):
        with pytest.raises(TypeError, match="W must be an evjax.CSR, CSC, FixedPostNumConn"):
            evjax.sparse_backward_matmul(jnp.ones(N_PRE, bool), bad)

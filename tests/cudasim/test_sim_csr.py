"""The CSR CUDA kernels of evjax.primitives.csr_numba_cuda against dense
references, in Numba's CUDA simulator, at small sizes.

Two levels: the ``@cuda.jit`` kernels launched directly on host arrays, and
the op generators (``generator(outs=, ins=, shape=, transpose=)``) run end to
end through numba_cuda_kernel under jax.jit.
"""
from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evjax.backends import numba_cuda as bridge
from evjax.primitives import csr_numba_cuda as csr_cuda

assert bridge.simulator_enabled(), "run with NUMBA_ENABLE_CUDASIM=1"

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


def _launch(kernels, kind, transpose, data, indices, indptr, x, out_shape):
    out = np.full(out_shape, np.nan, np.float32)
    name = f"{kind}_{'scatter' if transpose else 'gather'}"
    n_rows = indptr.shape[0] - 1
    if transpose:
        out[...] = 0  # the op zero-fills the aliased accumulator
        args = (data, indices, indptr, x, out, out)
    else:
        args = (data, indices, indptr, x, out)
    if kind == "mv":
        grid, block = ((-(-n_rows * 32 // 256)), 256) if transpose else (-(-n_rows // 8), 256)
    else:
        grid, block = csr_cuda.mm_launch(n_rows, x.shape[1])
    kernels[name][grid, block](*args)
    return out


@pytest.mark.parametrize("homogeneous, event", list(itertools.product([False, True], [False, True])))
def test_kernels_match_dense(homogeneous, event):
    rng = np.random.default_rng(int(homogeneous) * 2 + int(event))
    kernels = csr_cuda.csr_cuda_kernels("float32", homogeneous, event)
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
        got = _launch(kernels, kind, transpose, data, indices, indptr, x, shape_out)
        want = _reference(mask, weights, data, homogeneous, event, transpose, x)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{kind} transpose={transpose}")


def test_malformed_structure_is_clamped_not_out_of_bounds():
    data = np.ones(4, np.float32)
    indices = np.array([0, 9, -1, 1], np.int32)  # 9 and -1 are outside the 3 columns
    indptr = np.array([0, 2, 7], np.int32)  # the last row claims more synapses than exist
    kernels = csr_cuda.csr_cuda_kernels("float32", False, False)
    v = np.ones(3, np.float32)
    np.testing.assert_array_equal(_launch(kernels, "mv", False, data, indices, indptr, v, (2,)), [1, 1])
    u = np.ones(2, np.float32)
    np.testing.assert_array_equal(_launch(kernels, "mv", True, data, indices, indptr, u, (3,)), [1, 1, 0])


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
        params = dict(shape=(N_ROWS, N_COLS), transpose=transpose)
        want = op(data, indices, indptr, x, outs=[jax.ShapeDtypeStruct(
            ((N_COLS if transpose else N_ROWS),) + shape_in[1:], np.float32)], backend="reference", **params)[0]
        avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (data, indices, indptr, x)]
        kernel = op.kernel_for("gpu", "numba_cuda", avals, (jax.ShapeDtypeStruct(want.shape, want.dtype),), params)
        got = jax.jit(kernel)(data, indices, indptr, x)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{op.name} transpose={transpose}")

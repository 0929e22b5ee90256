"""Input validation that tells the truth: index values checked before any cast, int64 ``indptr``
(at a size where it matters, by dtype decisions and lowering, not by allocating 2**31 synapses),
shapes, and complex inputs."""
from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest

import evjax
from evjax.primitives.csr import csr_sddmm_p, validate_csr
from evjax._kernel_compat import python_callable
from evjax.primitives.spans import row_span as _compiled_span
from evjax.primitives.csr.validation import INT32_MAX, check_shape, index_dtypes
from tests.helpers import run_simulator_tests, small_scipy_csr

_span = python_callable(_compiled_span)  # compiled, with a Python entry

S = jax.ShapeDtypeStruct
I32, I64 = np.dtype(np.int32), np.dtype(np.int64)


# ---------------------------------------------------------------------------
# index values are checked before they are cast
# ---------------------------------------------------------------------------
def test_a_column_beyond_int32_raises_instead_of_wrapping_with_x64_off():
    assert not jax.config.jax_enable_x64
    data = np.ones(2, np.float32)
    indptr = np.array([0, 2], np.int64)
    for indices in (np.array([1, 2**32 + 4], np.int64), [1, 2**32 + 4], np.array([1, 2**32 + 4], np.uint64)):
        # 2**32 + 4 would become column 4 (in range for 10 columns) if cast first
        with pytest.raises(ValueError, match=r"CSR: indices\[1\] = 4294967300 does not fit int32.*jax_enable_x64"):
            evjax.CSR((data, indices, indptr), shape=(1, 10))
        with pytest.raises(ValueError, match=r"csrmv: indices\[1\] = 4294967300 does not fit int32"):
            evjax.csrmv(data, indices, indptr, np.ones(10, np.float32), shape=(1, 10))
    with pytest.raises(ValueError, match=r"indices\[0\] = 2147483648 does not fit int32"):
        evjax.CSR((data, np.array([2**31, 0], np.uint32), indptr), shape=(1, 10))
    with pytest.raises(ValueError, match=r"indptr\[1\] = 4294967298 does not fit int32"):
        evjax.CSR((data, np.array([0, 1]), np.array([0, 2**32 + 2], np.int64)), shape=(1, 10))
    with pytest.raises(ValueError, match=r"CSC \(as the CSR of its transpose\): indices\[1\] = 4294967300"):
        evjax.CSC((data, np.array([1, 2**32 + 4], np.int64), indptr), shape=(10, 1))
    # values that fit are converted, from any integer dtype
    w = evjax.CSR((data, np.array([1, 4], np.uint64), indptr), shape=(1, 10))
    assert w.indices.dtype == jnp.int32 and w.indptr.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(w.todense())[0, [1, 4]], [1, 1])


def test_with_x64_on_values_are_checked_against_the_true_columns():
    data = np.ones(2, np.float32)
    indptr = np.array([0, 2], np.int64)
    with jax.enable_x64(True):
        with pytest.raises(ValueError, match=r"indices out of range: indices\[1\] = 4294967300.*\[0, 10\)"):
            evjax.CSR((data, np.array([1, 2**32 + 4], np.int64), indptr), shape=(1, 10))
        with pytest.raises(ValueError, match=r"indices\[1\] = 9223372036854775813 does not fit int64: fix the value"):
            evjax.CSR((data, np.array([1, 2**63 + 5], np.uint64), indptr), shape=(1, 10))
        w = evjax.CSR((data, np.array([1, 4], np.int64), indptr), shape=(1, 10))
        assert w.indices.dtype == jnp.int64 and w.indptr.dtype == jnp.int64


def test_from_scipy_and_fromdense_convert_nothing_unchecked():
    a = small_scipy_csr(m=7)
    for index_dtype in (np.int32, np.int64, np.uint16, None):
        w = evjax.CSR.from_scipy(a, index_dtype=index_dtype)
        assert w.indices.dtype == jnp.int32 and w.indptr.dtype == jnp.int32  # x64 off
        np.testing.assert_array_equal(np.asarray(w.todense()), a.toarray())
    with jax.enable_x64(True):
        w = evjax.CSR.fromdense(a.toarray(), index_dtype=np.int64)
        assert w.indices.dtype == jnp.int64 and w.indptr.dtype == jnp.int64  # "auto": indptr follows indices
        w = evjax.CSR.fromdense(a.toarray(), indptr_dtype=jnp.int64)
        assert w.indices.dtype == jnp.int32 and w.indptr.dtype == jnp.int64
        c = evjax.CSC.from_scipy(a.tocsc(), indptr_dtype=jnp.int64)
        assert c.indices.dtype == jnp.int32 and c.indptr.dtype == jnp.int64
        np.testing.assert_array_equal(np.asarray(c.todense()), a.toarray())
    with pytest.raises(ValueError, match="indptr_dtype=int64 needs JAX's 64-bit mode.*jax_enable_x64"):
        evjax.CSR.fromdense(a.toarray(), indptr_dtype=jnp.int64)
    with pytest.raises(ValueError, match="indptr_dtype must be 'auto', jnp.int32 or jnp.int64, got 'int16'"):
        evjax.CSR.fromdense(a.toarray(), indptr_dtype="int16")


def test_empty_and_list_structures():
    w = evjax.CSR(([], [], [0, 0, 0]), shape=(2, 3))  # an empty list is an empty index array
    assert w.nnz == 0 and w.indices.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(w @ np.ones(3, np.float32)), [0, 0])
    with pytest.raises(TypeError, match="indices must be an integer array"):
        evjax.CSR(([1.0], [0.5], [0, 1]), shape=(1, 3))
    with pytest.raises(TypeError, match="indptr must be an integer array.*bool"):
        evjax.CSR(([1.0], [0], np.array([False, True])), shape=(1, 3))


# ---------------------------------------------------------------------------
# int64 indptr: the dtype decision, at sizes where it matters (no allocation)
# ---------------------------------------------------------------------------
def test_index_dtypes_decide_from_nnz_without_allocating():
    big = INT32_MAX + 1  # one more synapse than int32 offsets can count
    assert index_dtypes(I32, I32, INT32_MAX) == (I32, I32)
    with pytest.raises(ValueError, match="nnz = 2147483648 synapses is more than int32 offsets.*jax_enable_x64"):
        index_dtypes(I32, I32, big)
    with pytest.raises(ValueError, match="indptr_dtype=int64 needs JAX's 64-bit mode"):
        index_dtypes(I32, I32, 10, requested=jnp.int64)
    with jax.enable_x64(True):
        assert index_dtypes(I32, I32, big) == (I32, I64)  # columns stay int32; offsets widen
        assert index_dtypes(I32, I32, 3 * 2**32) == (I32, I64)
        assert index_dtypes(I32, I32, INT32_MAX) == (I32, I32)
        assert index_dtypes(I64, I32, 10) == (I64, I32)
        assert index_dtypes(np.uint32, np.uint32, 10) == (I64, I64)  # uint32 values may exceed int32
        assert index_dtypes(np.int16, np.uint16, 10) == (I32, I32)
        assert index_dtypes(I32, I32, 10, requested=jnp.int64) == (I32, I64)
        assert index_dtypes(I64, I64, 10, requested="int32") == (I64, I32)
        with pytest.raises(ValueError, match="indptr_dtype=int32 cannot count nnz = 2147483648"):
            index_dtypes(I32, I64, big, requested=np.int32)
    with pytest.raises(ValueError, match="indptr_dtype must be"):
        index_dtypes(I32, I32, 10, requested=np.float32)


def test_numba_row_spans_keep_int64_offsets_beyond_int32():
    # the offsets a kernel derives from an int64 indptr are not truncated (checked without the synapses)
    indptr = np.array([0, 2**31 + 5, 2**32 + 7, 2**33], np.int64)
    assert _span(indptr, 1, 2**33) == (2**31 + 5, 2**32 + 7)
    assert _span(indptr, 2, 2**33 - 1) == (2**32 + 7, 2**33 - 1)  # clamped to nnz, still 64-bit


@pytest.mark.parametrize("backend", ["numba", "reference", "warp"])
def test_more_synapses_than_int32_lower_with_int64_offsets(backend):
    """Lower (not run) an event product with nnz = 2**31 + 1: shapes only, nothing is allocated."""
    nnz = INT32_MAX + 2

    def forward(data, indices, indptr, spikes):
        return evjax.binary_csrmv(data, indices, indptr, spikes, shape=(3, 4), transpose=True, backend=backend)

    args = (S((nnz,), jnp.float32), S((nnz,), jnp.int32), S((4,), jnp.int64), S((3,), jnp.bool_))
    with jax.enable_x64(True):
        if backend == "warp":  # Warp arrays have int32 sizes: a clear error, not a wrapped size
            with pytest.raises(ValueError, match="too large for Warp's int32 shapes"):
                jax.jit(forward).lower(*args)
            return
        text = jax.jit(forward).lower(*args).as_text()
    assert f"%arg1: tensor<{nnz}xi32>, %arg2: tensor<4xi64>" in text
    if backend == "numba":  # int32 columns and int64 offsets reach the kernel as they are
        (call,) = [line for line in text.splitlines() if "stablehlo.custom_call" in line]
        assert "%arg0, %arg1, %arg2, %arg3)" in call
    else:  # the synapse numbers whose rows are looked up are int64
        assert f"stablehlo.iota dim = 0 : tensor<{nnz}xi64>" in text


# ---------------------------------------------------------------------------
# int64 indptr with int32 indices, end to end on every CPU backend
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["numba", "warp", "reference"])
def test_int32_indices_with_int64_indptr_forward_grad_vmap(backend):
    a = small_scipy_csr(seed=3, m=7)
    dense = a.toarray().astype(np.float64)
    rows = np.repeat(np.arange(a.shape[0]), np.diff(a.indptr))
    rng = np.random.default_rng(1)
    spikes = rng.random(a.shape[0]) < 0.6
    v = rng.standard_normal(a.shape[1]).astype(np.float32)
    batch = rng.random((4, a.shape[0])) < 0.5
    with jax.enable_x64(True):
        w = evjax.CSR((a.data, a.indices.astype(np.int32), a.indptr.astype(np.int32)), shape=a.shape,
                      indptr_dtype=jnp.int64)
        assert w.indices.dtype == jnp.int32 and w.indptr.dtype == jnp.int64
        d, i, p = w.data, w.indices, w.indptr

        def scatter(data, s):
            return evjax.binary_csrmv(data, i, p, s, shape=a.shape, transpose=True, backend=backend)

        def gather(data, x):
            return evjax.csrmv(data, i, p, x, shape=a.shape, backend=backend)

        np.testing.assert_allclose(scatter(d, spikes), spikes @ dense, rtol=1e-5)
        np.testing.assert_allclose(gather(d, v), dense @ v, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(jax.vmap(lambda s: scatter(d, s))(batch), batch @ dense, rtol=1e-5)
        # d/dw_k sum(y^2) with y = s @ A:  2 y[j_k] s[i_k]
        y = spikes @ dense
        g = jax.jit(jax.grad(lambda data: jnp.sum(scatter(data, spikes) ** 2)))(d)
        np.testing.assert_allclose(g, 2 * y[a.indices] * spikes[rows], rtol=1e-5)
        # d/dx sum(ct * (A @ x)) = A.T @ ct
        ct = rng.standard_normal(a.shape[0]).astype(np.float32)
        gx = jax.grad(lambda x: jnp.sum(jnp.asarray(ct) * gather(d, x)))(jnp.asarray(v))
        np.testing.assert_allclose(gx, dense.T @ ct, rtol=1e-5, atol=1e-6)
        gs = evjax.csr_sddmm(i, p, ct, v, shape=a.shape, backend=backend)
        assert csr_sddmm_p.resolve_backend("cpu", backend) == backend
        np.testing.assert_allclose(gs, ct[rows] * v[a.indices], rtol=1e-5, atol=1e-6)


@pytest.mark.cudasim
def test_numba_cuda_kernels_take_int64_indptr_with_int32_indices():
    run_simulator_tests("test_sim_mixed_indices.py")


# ---------------------------------------------------------------------------
# shapes
# ---------------------------------------------------------------------------
# a size that is not an integer is a TypeError (never truncated: (4.7, 5) is not (4, 5)); a shape of the
# wrong length or a negative size a ValueError; every message names ``shape`` and the bad value
TYPE_PROBLEMS = [
    ((4.7, 5), "4.7 is not a whole number; pass an int"),
    ("ab", r"got str 'ab'; pass a tuple of two ints, e\.g\. shape=\(3, 4\)"),
    ((2, "5"), "str '5' is not an integer"),
    ((None, 5), "NoneType None is not an integer"),
    (5, "got int 5; pass a tuple of two ints"),
    ((True, 5), "True is a bool"),
    ((2, np.float32(np.nan)), "nan is not a whole number"),
    ((2, np.float64(2.5)), "2.5 is not a whole number"),
]
VALUE_PROBLEMS = [
    ((2,), "got 1 sizes"),
    ((2, 5, 1), "got 3 sizes"),
    ((-1, 5), "-1 is negative"),
    ((2, np.int64(-3)), "-3 is negative"),
]
SHAPE_PROBLEMS = [(TypeError, *p) for p in TYPE_PROBLEMS] + [(ValueError, *p) for p in VALUE_PROBLEMS]


@pytest.mark.parametrize("error, shape, problem", SHAPE_PROBLEMS)
def test_bad_shapes_raise_naming_shape(error, shape, problem):
    indices, indptr = np.array([0, 1], np.int32), np.array([0, 1, 2], np.int32)
    with pytest.raises(error, match=f"CSR: shape .*{problem}"):
        evjax.CSR((np.ones(2, np.float32), indices, indptr), shape=shape)
    with pytest.raises(error, match=f"csrmv: shape .*{problem}"):
        evjax.csrmv(np.ones(2, np.float32), indices, indptr, np.ones(5, np.float32), shape=shape)
    with pytest.raises(error, match=f"CSC: shape .*{problem}"):
        evjax.CSC((np.ones(2, np.float32), indices, indptr), shape=shape)


@pytest.mark.parametrize("error, shape, problem", SHAPE_PROBLEMS)
def test_every_family_checks_shape_alike(error, shape, problem):
    """Fixed, JITC and Dense took ``int(d)`` of each size: (4.7, 5) became (4, 5) and "ab" raised
    Python's ``invalid literal for int()``.  Now each raises what CSR raises, naming ``shape``."""
    table = np.zeros((2, 1), np.int32)
    with pytest.raises(error, match=rf"FixedPostNumConn: shape must be a pair \(n_pre, n_post\).*{problem}"):
        evjax.FixedPostNumConn((0.5, table), shape=shape)
    with pytest.raises(error, match=rf"FixedPreNumConn: shape must be a pair \(n_pre, n_post\).*{problem}"):
        evjax.FixedPreNumConn((0.5, table), shape=shape)
    with pytest.raises(error, match=f"fcnmv: shape .*{problem}"):
        evjax.fcnmv(0.5, table, np.ones(5, np.float32), shape=shape)
    with pytest.raises(error, match=f"JITCScalarR: shape .*{problem}"):
        evjax.JITCScalarR(0.5, prob=0.1, seed=1, shape=shape)
    with pytest.raises(error, match=f"JITCNormalC: shape .*{problem}"):
        evjax.JITCNormalC(0.5, 0.1, prob=0.1, seed=1, shape=shape)
    with pytest.raises(error, match=f"jits: shape .*{problem}"):
        evjax.jits(0.5, 0.1, 1, shape=shape)
    with pytest.raises(error, match=f"binary_jitsmv: shape .*{problem}"):
        evjax.binary_jitsmv(0.5, 0.1, np.ones(5, bool), 1, shape=shape)
    with pytest.raises(error, match=f"Dense: shape .*{problem}"):
        evjax.Dense(np.ones((2, 5), np.float32), shape=shape)


def test_integral_shapes_of_any_integer_type_are_accepted():
    assert check_shape((np.int64(2), 5.0), "t") == (2, 5)
    assert check_shape([np.uint8(0), np.array(3)], "t") == (0, 3)
    assert all(type(d) is int for d in check_shape((np.int32(2), np.float64(5)), "t"))
    _, _, _, shape = validate_csr(np.ones(2, np.float32), [0, 1], [0, 1, 2], (2.0, np.int16(5)))
    assert shape == (2, 5)
    with pytest.raises(TypeError, match="t: n_shape must be a pair"):
        check_shape(None, "t", name="n_shape")
    table = np.zeros((2, 1), np.int32)
    for shape in ((2.0, np.int64(5)), np.array([2, 5]), [np.uint8(2), 5]):
        assert evjax.FixedPostNumConn((0.5, table), shape=shape).shape == (2, 5)
        assert evjax.FixedPreNumConn((0.5, np.zeros((5, 1), np.int32)), shape=shape).shape == (2, 5)
        assert evjax.JITCScalarR(0.5, prob=0.1, seed=1, shape=shape).shape == (2, 5)
        assert evjax.Dense(np.ones((2, 5), np.float32), shape=shape).shape == (2, 5)
        assert all(type(d) is int for d in evjax.FixedPostNumConn((0.5, table), shape=shape).shape)


def test_the_shared_validators_are_one_module_that_csr_re_exports():
    from evjax import _validation
    from evjax.primitives.csr import validation as csr_validation
    from evjax.primitives.jitc import functions as jitc_functions

    assert csr_validation.check_shape is _validation.check_shape
    assert csr_validation.check_operand is _validation.check_operand
    assert csr_validation.INT32_MAX == _validation.INT32_MAX == INT32_MAX
    assert jitc_functions.as_seed is _validation.as_seed
    assert _validation.check_size(np.int16(3), "t", "k") == 3 and _validation.check_size(4.0, "t", "k") == 4
    with pytest.raises(TypeError, match=r"t: k must be a non-negative integer, got 2\.5: 2\.5 is not a whole"):
        _validation.check_size(2.5, "t", "k")
    with pytest.raises(ValueError, match="t: k must be a non-negative integer, got -1: -1 is negative"):
        _validation.check_size(-1, "t", "k")


# ---------------------------------------------------------------------------
# 64-bit arrays used after 64-bit mode is turned off
# ---------------------------------------------------------------------------
def test_a_matrix_built_in_x64_works_after_x64_is_turned_off():
    """Weights made while 64-bit mode was on stay float64 arrays after it is off; the ops used to
    promise float64 results that the kernels (computing on JAX's float32 view) did not return:
    "the numba kernel returned float32, but outs promised float64".  They are now computed in the
    dtype JAX gives them (float32), as jnp computes ``jnp.asarray(w64) @ x``."""
    assert not jax.config.jax_enable_x64
    rng = np.random.default_rng(0)
    dense = np.where(rng.random((6, 5)) < 0.5, rng.standard_normal((6, 5)), 0.0)
    x, spikes = np.ones(5, np.float32), np.array([1, 0, 1, 0, 1, 1], bool)
    with jax.enable_x64(True):
        W = evjax.CSR.fromdense(dense)
        C = evjax.CSC.fromdense(dense)
        fixed = evjax.FixedPostNumConn((jnp.asarray(rng.standard_normal((6, 2))), rng.integers(0, 5, (6, 2))),
                                       shape=(6, 5), backend="reference")
        D = evjax.Dense(jnp.asarray(dense), backend="reference")
        J = evjax.JITCNormalR(jnp.float64(0.5), jnp.float64(0.1), prob=0.5, seed=3, shape=(6, 5),
                              backend="reference")
        x64 = jnp.ones(5, jnp.float64)
        assert W.data.dtype == fixed.data.dtype == D.dtype == J.dtype == jnp.float64
    dense32 = dense.astype(np.float32)
    # the CSR path of the report (default backend), directly, under jit and with a float64 operand
    for y, expected in [(W @ x, dense32 @ x), (spikes @ W, spikes @ dense32), (W.T @ spikes, spikes @ dense32),
                        (jax.jit(lambda W, x: W @ x)(W, x), dense32 @ x), (W @ x64, dense32 @ x),
                        (C @ x, dense32 @ x), (W @ np.ones((5, 2), np.float32), dense32 @ np.ones((5, 2)))]:
        assert y.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-5, atol=1e-6)
    # the other families: fixed, dense and JITC
    table = np.asarray(fixed.todense(), np.float32)
    for y, expected in [(fixed @ x, table @ x), (spikes @ fixed, spikes @ table), (fixed @ x64, table @ x),
                        (D @ np.ones(5, bool), dense32 @ np.ones(5)), (spikes @ D, spikes @ dense32)]:
        assert y.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-5, atol=1e-6)
    m = np.asarray(J.todense())
    assert m.dtype == np.float32 and (m != 0).any()
    for y, expected in [(J @ x, m @ x), (spikes @ J, spikes @ m)]:
        assert y.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# complex inputs
# ---------------------------------------------------------------------------
def test_complex_inputs_raise_type_error():
    x = jnp.ones(3, jnp.complex64)
    with pytest.raises(TypeError, match="spike: x is complex"):
        evjax.spike(x)
    with pytest.raises(TypeError, match="spike: x is complex"):
        jax.jit(evjax.spike)(x)
    with pytest.raises(TypeError, match="lif_step: v is complex"):
        evjax.lif_step(x, 1.0)
    with pytest.raises(TypeError, match="lif_step: i_ext is complex"):
        evjax.lif_step(jnp.zeros(3), 1j)
    with pytest.raises(TypeError, match="exp_trace: decay is complex"):
        evjax.exp_trace(jnp.zeros(3), jnp.ones(3), 0.5 + 0j)
    with pytest.raises(TypeError, match="exp_trace: spikes is complex"):
        evjax.exp_trace(jnp.zeros(3), np.ones(3, np.complex128), 0.5)
    with pytest.raises(TypeError, match="detect_spikes: v_th is complex"):
        evjax.detect_spikes(jnp.zeros(3), np.complex64(1))
    a = small_scipy_csr(m=7)
    with pytest.raises(TypeError, match="weights \\(data\\) must be floating point.*complex64"):
        evjax.CSR((a.data.astype(np.complex64), a.indices, a.indptr), shape=a.shape)
    w = evjax.CSR.from_scipy(a)
    with pytest.raises(TypeError, match="complex operands are not supported"):
        w @ np.ones(a.shape[1], np.complex64)
    # real inputs still work, and a real-valued spike matches its definition
    np.testing.assert_array_equal(evjax.spike(jnp.array([-1.0, 0.0, 2.0])), [0, 1, 1])


def test_csr_sddmm_checks_its_structure_and_operands():
    a = small_scipy_csr(m=7)
    w = evjax.CSR.from_scipy(a)
    r, q = jnp.ones(a.shape[0]), jnp.ones(a.shape[1])
    expected = np.ones(a.nnz)
    np.testing.assert_array_equal(evjax.csr_sddmm(w.indices, w.indptr, r, q, shape=a.shape), expected)
    with pytest.raises(TypeError, match="csr_sddmm: r must be float or bool.*complex64"):
        evjax.csr_sddmm(w.indices, w.indptr, r.astype(jnp.complex64), q, shape=a.shape)
    with pytest.raises(TypeError, match="csr_sddmm: q must be float or bool.*int32"):
        evjax.csr_sddmm(w.indices, w.indptr, r, q.astype(jnp.int32), shape=a.shape)
    with pytest.raises(TypeError, match="csr_sddmm: shape .*4.7 is not a whole number"):
        evjax.csr_sddmm(w.indices, w.indptr, r, q, shape=(4.7, a.shape[1]))
    bad = np.asarray(w.indices).copy()
    bad[0] = a.shape[1] + 3
    with pytest.raises(ValueError, match="csr_sddmm: indices out of range"):
        evjax.csr_sddmm(bad, w.indptr, r, q, shape=a.shape)

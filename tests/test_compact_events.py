"""Compact event forms: ``bitpack``, ``BitPackedBinary``, ``CompactBinary`` and the listed scatter
``binary_csrmv_active`` (every backend, every transform, bitwise equal to ``binary_csrmv``), and
``binary_csrmv_indexed`` / ``binary_csrmm_indexed``, against NumPy and the dense references of
tests/helpers.py."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import evjax
from evjax.primitives.compact import active_list
from evjax.primitives.csr import numba as csr_numba
from evjax.testing import OpSpec, csr_resampler, property_test
from tests.helpers import csr_args, dense_matrix, structural_matmul

BACKENDS = ("numba", "warp", "reference")


# ---------------------------------------------------------------------------
# bitpack against NumPy's packbits (little bit order, four bytes to a word)
# ---------------------------------------------------------------------------
def _numpy_bitpack(x, axis):
    active = np.moveaxis(np.asarray(x) != 0, axis, -1)
    n = active.shape[-1]
    words = -(-n // 32)
    padded = np.zeros(active.shape[:-1] + (words * 32,), bool)
    padded[..., :n] = active
    packed = np.packbits(padded, axis=-1, bitorder="little").view("<u4")
    return np.moveaxis(packed, -1, axis)


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 70), min_size=1, max_size=3), seed=st.integers(0, 2**32 - 1),
       dtype=st.sampled_from([np.bool_, np.int8, np.float32]), data=st.data())
def test_bitpack_matches_numpy(shape, seed, dtype, data):
    rng = np.random.default_rng(seed)
    x = (rng.random(shape) < 0.3) * rng.choice([-2.0, 1.0, np.nan], size=shape)  # negatives and NaN are active
    x = x.astype(dtype) if dtype != np.int8 else np.nan_to_num(x).astype(dtype)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    got = evjax.bitpack(jnp.asarray(x), axis)
    assert got.dtype == jnp.uint32
    np.testing.assert_array_equal(np.asarray(got), _numpy_bitpack(x, axis))


def test_bitpack_bit_order_and_errors():
    np.testing.assert_array_equal(evjax.bitpack(jnp.array([False, True, False, True]), 0), [10])
    x = np.zeros(35, bool)
    x[[1, 4, 5, 32, 34]] = True
    np.testing.assert_array_equal(evjax.bitpack(x, 0), [2 + 16 + 32, 1 + 4])
    with pytest.raises(ValueError, match="axis 1 is out of range"):
        evjax.bitpack(x, 1)
    with pytest.raises(ValueError, match="at least one axis"):
        evjax.bitpack(jnp.float32(1), 0)


# ---------------------------------------------------------------------------
# active_list: every backend, against NumPy's flatnonzero, under jit and vmap
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=25, deadline=None)
@given(shape=st.sampled_from([(0,), (1,), (7,), (64,), (130,), (3, 0), (0, 5), (4, 33)]),
       rate=st.sampled_from([0.0, 0.05, 0.5, 1.0]), seed=st.integers(0, 2**32 - 1),
       dtype=st.sampled_from([np.bool_, np.float32, np.int8]))
def test_active_list_matches_numpy(backend, shape, rate, seed, dtype):
    rng = np.random.default_rng(seed)
    x = ((rng.random(shape) < rate) * rng.choice([-1.0, 2.0, np.nan], size=shape))
    x = np.nan_to_num(x).astype(dtype) if dtype == np.int8 else x.astype(dtype)
    rows = x.reshape((int(np.prod(shape[:-1])), shape[-1]))
    want_ids = np.zeros(rows.shape, np.int32)
    want_count = np.zeros((rows.shape[0], 1), np.int32)
    for r, row in enumerate(rows):
        nz = np.flatnonzero(row != 0)
        want_ids[r, :nz.size] = nz
        want_count[r, 0] = nz.size
    for fn in (lambda x: active_list(x, backend=backend), jax.jit(lambda x: active_list(x, backend=backend))):
        ids, count = fn(jnp.asarray(x))
        assert ids.dtype == jnp.int32 and ids.shape == x.shape and count.shape == x.shape[:-1] + (1,)
        np.testing.assert_array_equal(np.asarray(ids).reshape(rows.shape), want_ids)
        np.testing.assert_array_equal(np.asarray(count).reshape(-1, 1), want_count)
    if x.ndim == 2:  # vmap over rows, and over the other axis
        ids, count = jax.vmap(lambda r: active_list(r, backend=backend))(jnp.asarray(x))
        np.testing.assert_array_equal(np.asarray(ids), want_ids)
        ids_t, _ = jax.vmap(lambda r: active_list(r, backend=backend), in_axes=1)(jnp.asarray(x).T)
        np.testing.assert_array_equal(np.asarray(ids_t), want_ids)


def test_active_list_has_no_gradient_path_and_rejects_bad_rank():
    x = jnp.array([0.0, 1.5, 0.0, 2.0])
    g = jax.grad(lambda x: jnp.sum(active_list(x)[1].astype(jnp.float32) * 0 + jnp.sum(x)))(x)
    np.testing.assert_array_equal(np.asarray(g), np.ones(4))
    with pytest.raises(ValueError, match=r"x must be \(n,\) or \(rows, n\)"):
        active_list(jnp.zeros((2, 2, 2)))


# ---------------------------------------------------------------------------
# the types
# ---------------------------------------------------------------------------
def test_bit_packed_binary_is_binary_array_with_packed_axes():
    rng = np.random.default_rng(0)
    s = rng.random((6, 40)) < 0.3
    bp = evjax.BinaryArray(s).bitpack()
    assert isinstance(bp, evjax.BinaryArray) and bp.original_shape == (6, 40)
    assert len(bp.packed) == 2
    for axis in (0, 1):
        np.testing.assert_array_equal(np.asarray(bp.packed[axis]), _numpy_bitpack(s, axis))
    t = bp.T
    assert t.shape == (40, 6)
    np.testing.assert_array_equal(np.asarray(t.packed[0]), _numpy_bitpack(s.T, 0))
    leaves, tree = jax.tree_util.tree_flatten(bp)
    back = jax.tree_util.tree_unflatten(tree, leaves)
    np.testing.assert_array_equal(np.asarray(back.value), s)
    a = rng.random((40, 7)).astype(np.float32) * (rng.random((40, 7)) < 0.4)
    w = evjax.CSR.fromdense(a)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda b, w: b @ w)(bp, w)),
                                  np.asarray(evjax.BinaryArray(s) @ w))


@pytest.mark.parametrize("shape", [(35,), (0,), (9, 40)])
def test_compact_binary_from_array(shape):
    rng = np.random.default_rng(1)
    x = rng.random(shape) < 0.3
    cb = evjax.CompactBinary.from_array(x)
    active = x if x.ndim == 1 else x.any(axis=1)
    want = np.flatnonzero(active)
    assert cb.n_orig == shape[0] and cb.batch_size == (shape[1] if len(shape) == 2 else None)
    assert cb.active_ids.dtype == jnp.int32 and cb.active_ids.shape == (shape[0],)
    assert int(cb.n_active[0]) == want.size
    np.testing.assert_array_equal(np.asarray(cb.active_ids[:want.size]), want)
    assert not np.any(np.asarray(cb.active_ids[want.size:]))  # zero padding
    np.testing.assert_array_equal(np.asarray(cb.packed), _numpy_bitpack(x, x.ndim - 1))
    np.testing.assert_array_equal(np.asarray(cb.to_dense()), x)
    leaves, tree = jax.tree_util.tree_flatten(cb)
    back = jax.tree_util.tree_unflatten(tree, leaves)
    assert (back.n_orig, back.batch_size, back.bit_width) == (cb.n_orig, cb.batch_size, 32)


def test_compact_binary_light_and_compact_only():
    x = jnp.array([False, True, True, False])
    light = evjax.CompactBinary.from_array_light(x)
    assert light.active_ids is None and light.active_rows() is None
    only = evjax.CompactBinary.compact_only_vector(x)
    assert only.packed.shape == (0,) and int(only.n_active[0]) == 2
    assert evjax.CompactBinary.compacy_only_vector.__func__ is evjax.CompactBinary.compact_only_vector.__func__
    w = evjax.CSR.fromdense(np.eye(4, dtype=np.float32))
    for cb in (light, only):
        np.testing.assert_array_equal(np.asarray(cb @ w), [0, 1, 1, 0])


def test_compact_binary_bad_input_names_the_argument():
    x = jnp.array([False, True, True, False])
    ok = evjax.CompactBinary.from_array(x)
    with pytest.raises(ValueError, match="Only bit_width=32 is supported"):
        evjax.CompactBinary.from_array(x, bit_width=64)
    with pytest.raises(ValueError, match=r"x must be \(n,\) or \(n, batch_size\)"):
        evjax.CompactBinary.from_array(jnp.zeros((2, 2, 2)))
    with pytest.raises(ValueError, match="ascending"):
        evjax.CompactBinary.from_packed(ok.packed, jnp.array([2, 1, 0, 0]), jnp.array([2]), x, 4)
    with pytest.raises(ValueError, match="ascending"):  # a repeated row would add its synapses twice
        evjax.CompactBinary.from_packed(ok.packed, jnp.array([1, 1, 0, 0]), jnp.array([2]), x, 4)
    with pytest.raises(ValueError, match=r"n_active = 5 is outside \[0, 4\]"):
        evjax.CompactBinary.from_packed(ok.packed, ok.active_ids, jnp.array([5]), x, 4)
    with pytest.raises(ValueError, match="active_ids has 3 entries, expected 4"):
        evjax.CompactBinary.from_packed(ok.packed, jnp.array([1, 2, 0]), jnp.array([2]), x, 4)
    with pytest.raises(TypeError, match="active_ids must be a 1-d integer array"):
        evjax.CompactBinary.from_packed(ok.packed, jnp.array([1.0, 2, 0, 0]), jnp.array([2]), x, 4)
    with pytest.raises(TypeError, match="n_active must be an integer count"):
        evjax.CompactBinary.from_packed(ok.packed, ok.active_ids, jnp.array([2.0]), x, 4)
    with pytest.raises(ValueError, match="batch_size"):
        evjax.CompactBinary(ok.packed, ok.active_ids, ok.n_active, x, 4, batch_size=3)
    w = evjax.CSR.fromdense(np.eye(4, dtype=np.float32))
    with pytest.raises(ValueError, match=r"rows in \[0, 4\)"):
        evjax.binary_csrmv_active(w.data, w.indices, w.indptr, jnp.array([1, 7, 0, 0]), jnp.array([2]), x,
                                  shape=w.shape)


# ---------------------------------------------------------------------------
# binary_csrmv_active: the harness, on every backend
# ---------------------------------------------------------------------------
def active_spec(backend, *, float_spikes=False):
    def fn(d, i, p, x, shape):
        ids, count = active_list(x, backend=backend)
        return evjax.binary_csrmv_active(d, i, p, ids, count, x, shape=shape, backend=backend)

    return OpSpec(
        fn=fn,
        reference=lambda d, i, p, x, shape: structural_matmul(d, i, p, x, shape, True, True),
        diff_argnums=(0, 3) if float_spikes else (0,),
        static_argnums=(4,),
        backend=backend,
        resample=csr_resampler(indices=1, indptr=2, shape=4),
        smooth=False,
        batch_size=2,
        name=f"binary_csrmv_active[{backend}{', float spikes' if float_spikes else ''}]",
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_active_properties(backend):
    property_test(active_spec(backend), csr_args(rank=1, transpose=True, event=True))()


@pytest.mark.parametrize("backend", ("numba", "warp"))
def test_active_float_spikes_straight_through(backend):
    property_test(active_spec(backend, float_spikes=True),
                  csr_args(rank=1, transpose=True, event=True, float_spikes=True))()


def _structure(rng, n_rows, n_cols, k, *, nan_silent=True, spikes=None):
    indices = np.sort(rng.integers(0, n_cols, (n_rows, k)), axis=1).astype(np.int32).ravel()
    indptr = (np.arange(n_rows + 1) * k).astype(np.int32)
    data = rng.standard_normal(n_rows * k).astype(np.float32)
    if nan_silent and spikes is not None:
        data.reshape(n_rows, k)[~spikes] = np.nan  # a silent row's weights never reach the output
    return data, indices, indptr


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rate", [0.0, 0.02, 0.8])
def test_active_bitwise_equal_to_binary_csrmv(backend, rate):
    """The same bits as the scan over the spikes, through the split (parallel) paths of numba too."""
    rng = np.random.default_rng(5)
    n_rows, n_cols, k = 3000, 1500, 40  # 0.8: about 96k synapses, above the vector split threshold
    s = rng.random(n_rows) < rate
    data, indices, indptr = _structure(rng, n_rows, n_cols, k, spikes=s)
    w = evjax.CSR((data, indices, indptr), shape=(n_rows, n_cols))
    cb = evjax.CompactBinary.from_array(s)
    with evjax.use_backend(backend):
        got = jax.jit(lambda c, w: c @ w)(cb, w)
        want = jax.jit(lambda s, w: evjax.BinaryArray(s) @ w)(s, w)
    assert not np.any(np.isnan(np.asarray(got)))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("pool", [1, 2, 3])
def test_active_kernel_same_parts_as_the_scan(pool):
    """Called directly with each pool size: the listed kernel's parts hold the rows of the scan's."""
    rng = np.random.default_rng(pool)
    n_rows, n_cols, k = 3000, 1500, 40
    s = rng.random(n_rows) < 0.8
    data, indices, indptr = _structure(rng, n_rows, n_cols, k, spikes=s)
    ids = np.zeros(n_rows, np.int32)
    ids[:s.sum()] = np.flatnonzero(s)
    want = np.full(n_cols, np.nan, np.float32)
    csr_numba.scatter_mv(pool, data, indices, indptr, s, want)
    got = np.full(n_cols, np.nan, np.float32)
    csr_numba.scatter_active_mv(pool, data, indices, indptr, ids, np.array([s.sum()], np.int32), got)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_active_homogeneous_and_csc(backend):
    rng = np.random.default_rng(2)
    a = (rng.random((30, 20)) < 0.3).astype(np.float32) * 0.5
    s = rng.random(30) < 0.4
    cb = evjax.CompactBinary.from_array(s)
    csr = evjax.CSR.fromdense(a)
    homo = evjax.CSR((jnp.float32(0.5), csr.indices, csr.indptr), shape=csr.shape)
    csc = evjax.CSC.fromdense(a.T)  # stored as the CSR of a: W @ spikes scatters it
    with evjax.use_backend(backend):
        for got in (cb @ csr, cb @ homo, csc @ cb):
            np.testing.assert_allclose(np.asarray(got), s.astype(np.float32) @ a, rtol=1e-6)
        g = jax.grad(lambda w: jnp.sum(jnp.sin(cb @ homo.with_data(w))))(homo.data)
        g_dense = jax.grad(lambda w: jnp.sum(jnp.sin(evjax.BinaryArray(s) @ homo.with_data(w))))(homo.data)
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_dense), rtol=1e-6)


def test_batch_and_gather_orientation_read_the_value():
    """A batch (n, batch) and the gather orientation use the spikes as a BinaryArray does."""
    rng = np.random.default_rng(3)
    a = rng.random((30, 20)).astype(np.float32) * (rng.random((30, 20)) < 0.3)
    w = evjax.CSR.fromdense(a)
    S = rng.random((30, 5)) < 0.3
    np.testing.assert_allclose(np.asarray(w.T @ evjax.CompactBinary.from_array(S)), a.T @ S, rtol=1e-6)
    s = rng.random(20) < 0.3
    np.testing.assert_allclose(np.asarray(w @ evjax.CompactBinary.from_array(s)), a @ s, rtol=1e-6)
    dense = jnp.asarray(a)
    np.testing.assert_allclose(np.asarray(evjax.CompactBinary.from_array(s[:20]) @ dense.T), a @ s, rtol=1e-6)


def test_lists_are_data_no_retrace():
    rng = np.random.default_rng(4)
    w = evjax.CSR.fromdense(rng.random((30, 20)).astype(np.float32))
    traces = []

    @jax.jit
    def f(cb, w):
        traces.append(1)
        return cb @ w

    for _ in range(3):
        f(evjax.CompactBinary.from_array(rng.random(30) < 0.3), w)
    assert len(traces) == 1


# ---------------------------------------------------------------------------
# binary_csrmv_indexed / binary_csrmm_indexed
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rank", [1, 2])
def test_indexed_through_the_csc_view(backend, rank):
    rng = np.random.default_rng(6)
    a = rng.standard_normal((12, 9)).astype(np.float32) * (rng.random((12, 9)) < 0.4)
    w = evjax.CSR.fromdense(a)
    csc_indptr, csc_indices, perm = evjax.csr_to_csc_index(w.indptr, w.indices, shape=w.shape)
    x = rng.random((9,) if rank == 1 else (9, 3)) < 0.5  # columns of a: the gather of the transposed structure
    fn = evjax.binary_csrmv_indexed if rank == 1 else evjax.binary_csrmm_indexed

    def through_perm(data):
        return fn(data, csc_indices, csc_indptr, perm, x, shape=(9, 12), transpose=True, backend=backend)

    np.testing.assert_allclose(np.asarray(through_perm(w.data)), a @ x.astype(np.float32), rtol=1e-5, atol=1e-6)
    ct = rng.standard_normal((12,) if rank == 1 else (12, 3)).astype(np.float32)
    g = jax.grad(lambda d: jnp.sum(ct * through_perm(d)))(w.data)
    g_ref = jax.grad(lambda d: jnp.sum(ct * (dense_matrix(d, w.indices, w.indptr, w.shape) @ x.astype(np.float32))))(
        w.data)
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), rtol=1e-5, atol=1e-6)
    homo = fn(jnp.array([2.0], jnp.float32), csc_indices, csc_indptr, perm, x, shape=(9, 12), transpose=True)
    np.testing.assert_allclose(np.asarray(homo), 2.0 * (a != 0) @ x.astype(np.float32), rtol=1e-6)


def test_indexed_bad_perm():
    w = evjax.CSR.fromdense(np.eye(3, dtype=np.float32))
    with pytest.raises(ValueError, match=r"perm must hold weight positions in \[0, 3\)"):
        evjax.binary_csrmv_indexed(w.data, w.indices, w.indptr, jnp.array([0, 1, 5]), jnp.ones(3, bool),
                                   shape=w.shape)
    with pytest.raises(ValueError, match="perm has 2 entries, expected 3"):
        evjax.binary_csrmv_indexed(w.data, w.indices, w.indptr, jnp.array([0, 1]), jnp.ones(3, bool),
                                   shape=w.shape)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fixed_fan_out_scatter_reads_the_list(backend):
    """``CompactBinary @ FixedPostNumConn`` (and ``FixedPreNumConn @ ...``) run the listed scatter on the
    table's CSR structure: the same bits as the spikes."""
    rng = np.random.default_rng(8)
    table = rng.integers(0, 30, (40, 6)).astype(np.int32)
    s = rng.random(40) < 0.2
    cb = evjax.CompactBinary.from_array(s)
    for weights in (rng.standard_normal((40, 6)).astype(np.float32), np.float32(0.5)):
        post = evjax.FixedPostNumConn((weights, table), shape=(40, 30), backend=backend)
        pre = evjax.FixedPreNumConn((weights, table), shape=(30, 40), backend=backend)
        for got, want in ((cb @ post, evjax.BinaryArray(s) @ post), (pre @ cb, pre @ evjax.BinaryArray(s))):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        jaxpr = str(jax.make_jaxpr(lambda c, m: c @ m)(cb, post))
        assert "evjax_binary_csrmv_active" in jaxpr
        g = jax.grad(lambda w: jnp.sum(jnp.sin(cb @ post.with_data(w))))(post.data)
        g_ref = jax.grad(lambda w: jnp.sum(jnp.sin(evjax.BinaryArray(s) @ post.with_data(w))))(post.data)
        np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), rtol=1e-6)

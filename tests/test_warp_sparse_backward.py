"""The sparse-backward family with ``backend="warp"`` (Warp's CPU device here; CUDA where a GPU exists).

Each op against the Numba CPU backend (the same bits: one thread per output
entry adds its terms in the Numba kernels' order, no atomics, no FMA) and
against a dense NumPy product; float32 and float64, int32 indices, a batch of
1 and of 3, sorted and unsorted rows (duplicates, empty rows), shared
weights, the zero entries skipped whatever the weights hold; and gradients
through :func:`evjax.sparse_backward_matmul` under ``evjax.use_backend("warp")``.
"""
import glob
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

wp = pytest.importorskip("warp")

import evjax  # noqa: E402
from evjax.primitives import sparse_backward as sb  # noqa: E402
from evjax.primitives.grouping import transposed_view  # noqa: E402
from evjax.primitives.sparse_backward import warp as sb_warp  # noqa: E402  (importing it registers the kernels)

wp.config.quiet = True

CPU = jax.devices("cpu")[0]
DTYPES = [np.float32, np.float64]
LAYOUTS = ["sorted", "sorted_unflagged", "unsorted"]  # unflagged: sorted rows, sorted_rows=False


def _x64(dtype):
    return jax.enable_x64(np.dtype(dtype) == np.float64)


def structure(rng, m, n, *, sort: bool, max_row: int = 9):
    """A CSR structure with an empty row (row 1), duplicate columns, rows of up to ``max_row`` entries;
    each row's columns shuffled unless ``sort``."""
    lengths = rng.integers(0, max_row + 1, m)
    lengths[1] = 0
    lengths[0] = max_row
    rows = []
    for length in lengths:
        cols = rng.integers(0, n, length)
        rows.append(np.sort(cols) if sort else cols)
    rows[0][:3] = rows[0][2]  # a column three times
    if sort:
        rows[0] = np.sort(rows[0])
    else:  # and a step down
        rows[0][3], rows[0][4] = n - 1, 0
    indices = np.concatenate(rows).astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    if not sort:
        assert not sb.rows_sorted(indices, indptr)
    return indices, indptr


def sparse_rows(rng, shape, dtype, density=0.5):
    """A batch of vectors with about ``density`` of their entries nonzero."""
    return ((rng.random(shape) < density) * rng.standard_normal(shape)).astype(dtype)


def dense_of(data, indices, indptr, shape):
    a = np.zeros(shape, np.float64)
    w = np.broadcast_to(data, indices.shape) if data.shape[0] == 1 else data
    for i in range(shape[0]):
        for e in range(indptr[i], indptr[i + 1]):
            a[i, indices[e]] += w[e]
    return a


def both(fn):
    """``fn(backend)`` with Warp and with Numba, as NumPy arrays."""
    return np.asarray(fn("warp")), np.asarray(fn("numba"))


def tolerance(dtype):
    return dict(rtol=1e-5, atol=1e-5) if np.dtype(dtype) == np.float32 else dict(rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------
# registration
# ---------------------------------------------------------------------------
def test_warp_is_registered_on_cpu_and_gpu_and_not_the_cpu_default():
    for op, generator in ((sb.csrmv_nonzero_p, sb_warp.csrmv_nonzero_warp),
                          (sb.csr_sddmm_nonzero_p, sb_warp.csr_sddmm_nonzero_warp),
                          (sb.densemv_nonzero_p, sb_warp.densemv_nonzero_warp),
                          (sb.dense_outer_nonzero_p, sb_warp.dense_outer_nonzero_warp)):
        assert "warp" in op.backends("cpu") and "warp" in op.backends("gpu")
        assert op.kernel_generator("cpu", "warp") is generator
        assert op.default_backend("cpu") == "numba"


# ---------------------------------------------------------------------------
# csrmv_nonzero
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("transpose", [False, True])
def test_csrmv_nonzero(dtype, layout, transpose):
    rng = np.random.default_rng(2 * LAYOUTS.index(layout) + transpose)
    m, n = 6, 8
    indices, indptr = structure(rng, m, n, sort=layout != "unsorted")
    sorted_rows = layout == "sorted"
    with _x64(dtype):
        view = transposed_view(jnp.asarray(indices), jnp.asarray(indptr), n)
        for homogeneous in (False, True):
            data = rng.standard_normal(1 if homogeneous else indices.size).astype(dtype)
            a = dense_of(data, indices, indptr, (m, n))
            for batch in (1, 3):
                v = sparse_rows(rng, (batch, m if transpose else n), dtype)
                got, want = both(lambda backend: sb.csrmv_nonzero(
                    jnp.asarray(data), indices, indptr, view, jnp.asarray(v), shape=(m, n), transpose=transpose,
                    sorted_rows=sorted_rows, backend=backend))
                assert got.dtype == dtype and got.shape == (batch, n if transpose else m)
                np.testing.assert_array_equal(got, want)  # the same bits as Numba
                np.testing.assert_allclose(got, v @ (a if transpose else a.T), **tolerance(dtype))
        # a single vector
        v = sparse_rows(rng, (m if transpose else n,), dtype)
        got, want = both(lambda backend: sb.csrmv_nonzero(
            jnp.asarray(data), indices, indptr, view, jnp.asarray(v), shape=(m, n), transpose=transpose,
            sorted_rows=sorted_rows, backend=backend))
        assert got.shape == (n if transpose else m,)
        np.testing.assert_array_equal(got, want)


def test_csrmv_nonzero_unsorted_rows_add_in_column_order():
    """A row whose stored order is not its column order: the terms are added in column order (the
    Numba order), which gives other bits than the stored order here."""
    big, small = np.float32(1e8), np.float32(1.0)
    data = np.array([small, big, -big], np.float32)  # stored: col 2, col 0, col 1
    indices = np.array([2, 0, 1], np.int32)
    indptr = np.array([0, 3], np.int32)
    view = transposed_view(jnp.asarray(indices), jnp.asarray(indptr), 3)
    v = jnp.ones((1, 3), jnp.float32)
    got, want = both(lambda backend: sb.csrmv_nonzero(jnp.asarray(data), indices, indptr, view, v, shape=(1, 3),
                                                      transpose=False, sorted_rows=False, backend=backend))
    np.testing.assert_array_equal(got, want)
    assert got[0, 0] == 1.0  # (1e8 - 1e8) + 1; the stored order, (1 + 1e8) - 1e8, gives 0


def test_csrmv_nonzero_skips_zero_entries_whatever_the_weight():
    rng = np.random.default_rng(5)
    m, n = 5, 7
    indices, indptr = structure(rng, m, n, sort=False)
    view = transposed_view(jnp.asarray(indices), jnp.asarray(indptr), n)
    for transpose in (False, True):
        data = rng.standard_normal(indices.size).astype(np.float32)
        e = int(indptr[0])  # a synapse of row 0, at column indices[e]
        data[e] = np.nan
        v = sparse_rows(rng, (3, m if transpose else n), np.float32, density=0.8)
        v[:, 0 if transpose else indices[e]] = 0  # its source entry is zero
        got, want = both(lambda backend: sb.csrmv_nonzero(
            jnp.asarray(data), indices, indptr, view, jnp.asarray(v), shape=(m, n), transpose=transpose,
            sorted_rows=False, backend=backend))
        assert np.all(np.isfinite(got))
        np.testing.assert_array_equal(got, want)
        clean = np.where(np.isnan(data), 0, data)
        a = dense_of(clean, indices, indptr, (m, n))
        np.testing.assert_allclose(got, v @ (a if transpose else a.T), rtol=1e-5, atol=1e-5)
        # a nonzero source entry meets the nan weight: IEEE
        v[:, 0 if transpose else indices[e]] = 1
        got = np.asarray(sb.csrmv_nonzero(jnp.asarray(data), indices, indptr, view, jnp.asarray(v), shape=(m, n),
                                          transpose=transpose, sorted_rows=False, backend="warp"))
        assert np.isnan(got[:, indices[e] if transpose else 0]).all()


def test_empty_structures_and_sizes():
    indices, indptr = np.zeros(0, np.int32), np.zeros(4, np.int32)
    view = transposed_view(jnp.asarray(indices), jnp.asarray(indptr), 5)
    for transpose in (False, True):
        v = jnp.ones((2, 3 if transpose else 5), jnp.float32)
        got, want = both(lambda backend: sb.csrmv_nonzero(
            jnp.zeros(0, jnp.float32), indices, indptr, view, v, shape=(3, 5), transpose=transpose,
            sorted_rows=True, backend=backend))
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, 0)
    g = sb.csr_sddmm_nonzero(indices, indptr, view, jnp.ones((2, 3)), jnp.ones((2, 5)), shape=(3, 5), backend="warp")
    assert g.shape == (0,)
    got, want = both(lambda backend: sb.densemv_nonzero(jnp.ones((4, 0)), jnp.ones((2, 0)), transpose=False,
                                                        backend=backend))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, np.zeros((2, 4)))


# ---------------------------------------------------------------------------
# csr_sddmm_nonzero
# ---------------------------------------------------------------------------
def sddmm_numpy(indices, indptr, r, q):
    rows = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
    a, b = r[..., rows], q[..., indices]
    return np.sum(np.where((a != 0) & (b != 0), a * b, 0), axis=-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sort", [True, False])
def test_csr_sddmm_nonzero(dtype, sort):
    rng = np.random.default_rng(int(sort))
    m, n = 6, 8
    indices, indptr = structure(rng, m, n, sort=sort)
    with _x64(dtype):
        view = transposed_view(jnp.asarray(indices), jnp.asarray(indptr), n)
        for shape in [(m,), (1, m), (3, m)]:
            r = sparse_rows(rng, shape, dtype)
            q = sparse_rows(rng, shape[:-1] + (n,), dtype)
            r.reshape(-1)[0] = np.inf  # (row 0) an inf meets zeros of q: those terms skipped
            got, want = both(lambda backend: sb.csr_sddmm_nonzero(indices, indptr, view, jnp.asarray(r), jnp.asarray(q),
                                                                  shape=(m, n), backend=backend))
            assert got.dtype == dtype and got.shape == (indices.size,)
            np.testing.assert_array_equal(got, want)
            with np.errstate(invalid="ignore"):
                expected = sddmm_numpy(indices, indptr, np.atleast_2d(r), np.atleast_2d(q))
            np.testing.assert_allclose(got, expected, **tolerance(dtype))
        # vmap: groups (G = 2) of batches of 3
        r = sparse_rows(rng, (2, 3, m), dtype)
        q = sparse_rows(rng, (2, 3, n), dtype)
        got, want = both(lambda backend: jax.vmap(lambda a, b: sb.csr_sddmm_nonzero(
            indices, indptr, view, a, b, shape=(m, n), backend=backend))(jnp.asarray(r), jnp.asarray(q)))
        np.testing.assert_array_equal(got, want)
        np.testing.assert_allclose(got, [sddmm_numpy(indices, indptr, r[k], q[k]) for k in range(2)],
                                   **tolerance(dtype))


# ---------------------------------------------------------------------------
# densemv_nonzero and dense_outer_nonzero
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("transpose", [False, True])
def test_densemv_nonzero(dtype, transpose):
    rng = np.random.default_rng(7 + transpose)
    m, n = 5, 9
    with _x64(dtype):
        w = rng.standard_normal((m, n)).astype(dtype)
        for shape in [(m if transpose else n,), (1, m if transpose else n), (3, m if transpose else n)]:
            v = sparse_rows(rng, shape, dtype)
            got, want = both(lambda backend: sb.densemv_nonzero(jnp.asarray(w), jnp.asarray(v), transpose=transpose,
                                                                backend=backend))
            assert got.dtype == dtype
            np.testing.assert_array_equal(got, want)
            np.testing.assert_allclose(got, v @ (w if transpose else w.T), **tolerance(dtype))
        # a nan weight meets only zero entries: skipped
        v = sparse_rows(rng, (3, m if transpose else n), dtype)
        v[:, 2] = 0
        w_nan = w.copy()
        if transpose:
            w_nan[2, :] = np.nan
        else:
            w_nan[:, 2] = np.nan
        got, want = both(lambda backend: sb.densemv_nonzero(jnp.asarray(w_nan), jnp.asarray(v), transpose=transpose,
                                                            backend=backend))
        assert np.all(np.isfinite(got))
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dense_outer_nonzero(dtype):
    rng = np.random.default_rng(11)
    m, n = 5, 6
    with _x64(dtype):
        for shape in [(m,), (1, m), (3, m)]:
            r = sparse_rows(rng, shape, dtype)
            q = sparse_rows(rng, shape[:-1] + (n,), dtype)
            r.reshape(-1)[0] = np.nan  # a nan meets zeros of q only where they are: those terms skipped
            got, want = both(lambda backend: sb.dense_outer_nonzero(jnp.asarray(r), jnp.asarray(q), backend=backend))
            assert got.dtype == dtype and got.shape == (m, n)
            np.testing.assert_array_equal(got, want)
            r2, q2 = np.atleast_2d(r), np.atleast_2d(q)
            with np.errstate(invalid="ignore"):
                a, b = r2[:, :, None], q2[:, None, :]
                expected = np.sum(np.where((a != 0) & (b != 0), a * b, 0), axis=0)
            np.testing.assert_allclose(got, expected, **tolerance(dtype))
        r = sparse_rows(rng, (2, 3, m), dtype)
        q = sparse_rows(rng, (2, 3, n), dtype)
        got, want = both(lambda backend: jax.vmap(lambda a, b: sb.dense_outer_nonzero(a, b, backend=backend))(
            jnp.asarray(r), jnp.asarray(q)))
        assert got.shape == (2, m, n)
        np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------------------
# gradients through sparse_backward_matmul
# ---------------------------------------------------------------------------
def _grads(W, spikes, c, backend, params):
    def loss(p, s):
        return jnp.sum(evjax.sparse_backward_matmul(s, W(p)) * c)

    with evjax.use_backend(backend):
        return jax.jit(jax.grad(loss, argnums=(0, 1)))(params, spikes)


@pytest.mark.parametrize("kind", ["csr", "csr_unsorted", "csc", "dense"])
def test_gradients_of_sparse_backward_matmul(kind):
    rng = np.random.default_rng(3)
    n_pre, n_post = 7, 6
    spikes = jnp.asarray((rng.random((3, n_pre)) < 0.5).astype(np.float32))
    c = jnp.asarray(sparse_rows(rng, (3, n_post), np.float32, density=0.4))  # zero cotangents: skipped
    if kind == "dense":
        params = jnp.asarray(rng.standard_normal((n_pre, n_post)).astype(np.float32))
        W = lambda p: p  # noqa: E731
        expected = (np.asarray(spikes).T @ np.asarray(c), np.asarray(c) @ np.asarray(params).T)
    else:
        cls = evjax.CSC if kind == "csc" else evjax.CSR
        stored = (n_post, n_pre) if kind == "csc" else (n_pre, n_post)
        indices, indptr = structure(rng, stored[0], stored[1], sort=kind != "csr_unsorted")
        params = jnp.asarray(rng.standard_normal(indices.size).astype(np.float32))
        W = lambda p: cls((p, indices, indptr), shape=(n_pre, n_post))  # noqa: E731
        a = dense_of(np.asarray(params), indices, indptr, stored)
        dense = a.T if kind == "csc" else a
        rows = np.repeat(np.arange(stored[0]), np.diff(indptr))
        pre, post = (indices, rows) if kind == "csc" else (rows, indices)
        expected = ((np.asarray(spikes)[:, pre] * np.asarray(c)[:, post]).sum(0), np.asarray(c) @ dense.T)
    got = _grads(W, spikes, c, "warp", params)
    want = _grads(W, spikes, c, "numba", params)
    for g, h, e in zip(got, want, expected):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(h))
        np.testing.assert_allclose(np.asarray(g), e, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------
# no FMA in the CUDA code (compiled to PTX with NVRTC; no GPU needed)
# ---------------------------------------------------------------------------
def test_warp_modules_compile_to_ptx_without_fma():
    modules = [sb_warp.csr_kernels("float32", ("int32",) * 5)["select"].module,
               sb_warp.dense_kernels("float64")["outer"].module]
    for module in modules:
        assert module.options["fuse_fp"] is False
        out = tempfile.mkdtemp()
        try:
            wp.compile_aot_module(module, arch=90, module_dir=out, use_ptx=True)
        except Exception as err:  # noqa: BLE001 - no NVRTC here
            pytest.skip(f"Warp cannot compile CUDA here: {err}")
        (path,) = glob.glob(out + "/*.ptx")
        ptx = open(path).read()
        assert "fma." not in ptx and "mul.rn." in ptx and "atom." not in ptx


# ---------------------------------------------------------------------------
# on a GPU: the Warp CUDA kernels against Numba on the CPU
# ---------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_kernels_match_numba_cpu_bits():
    gpu = jax.devices("gpu")[0]
    rng = np.random.default_rng(21)
    m, n = 40, 50
    indices, indptr = structure(rng, m, n, sort=False, max_row=30)
    data = rng.standard_normal(indices.size).astype(np.float32)
    r = sparse_rows(rng, (4, m), np.float32, 0.3)
    q = sparse_rows(rng, (4, n), np.float32, 0.3)
    w = rng.standard_normal((m, n)).astype(np.float32)

    def run(device, backend):
        with jax.default_device(device):
            view = transposed_view(jnp.asarray(indices), jnp.asarray(indptr), n)
            d, rr, qq = jnp.asarray(data), jnp.asarray(r), jnp.asarray(q)
            outs = [sb.csrmv_nonzero(d, indices, indptr, view, x, shape=(m, n), transpose=t, sorted_rows=False,
                                     backend=backend) for x, t in ((qq, False), (rr, True))]
            outs.append(sb.csr_sddmm_nonzero(indices, indptr, view, rr, qq, shape=(m, n), backend=backend))
            outs += [sb.densemv_nonzero(jnp.asarray(w), x, transpose=t, backend=backend)
                     for x, t in ((qq, False), (rr, True))]
            outs.append(sb.dense_outer_nonzero(rr, qq, backend=backend))
            return [np.asarray(o) for o in outs]

    for got, want in zip(run(gpu, "warp"), run(CPU, "numba")):
        np.testing.assert_array_equal(got, want)

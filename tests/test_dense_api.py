"""`evjax.Dense` and the `@` forms of events with dense matrices: which op runs, and its result.

The dense event ops themselves are checked under every transform by the
harness (tests/test_dense_ops.py). Here: every `@` form with events binds
the event-driven op (never a float matmul) with the right orientation and
`weighted` setting; float operands go to XLA's dot; `Dense` behaves as a
pytree; vmap over events becomes one matrix kernel; bad operands raise.
"""
from __future__ import annotations

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

import evjax
from evjax.testing import OpSpec, check_all

N_ROWS, N_COLS = 7, 5


def primitives(fn, *args):
    """The primitives of ``fn``'s jaxpr, nested jaxprs (pjit) included."""
    names = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            names.append(eqn.primitive.name)
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return names


def event_eqns(fn, *args):
    """The dense event op equations of ``fn``'s jaxpr (outermost level)."""
    return [e for e in jax.make_jaxpr(fn)(*args).eqns if e.primitive.name.startswith("evjax_binary_dense")]


@pytest.fixture(scope="module")
def operands():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((N_ROWS, N_COLS)).astype(np.float32)
    s = rng.random(N_ROWS) < 0.5
    s[:2] = True, False
    S = rng.random((3, N_ROWS)) < 0.5
    counts = (rng.integers(0, 3, N_ROWS) * s).astype(np.float32)  # graded events
    return w, s, S, counts


# (name, expression(w, s, S, counts), reference(w, s, S, counts), primitive, transpose, weighted)
EVENT_FORMS = [
    ("BinaryArray @ array", lambda w, s, S, c: evjax.BinaryArray(s) @ w,
     lambda w, s, S, c: s @ w, "evjax_binary_densemv", True, False),
    ("array @ BinaryArray", lambda w, s, S, c: w.T @ evjax.BinaryArray(s),
     lambda w, s, S, c: w.T @ s, "evjax_binary_densemv", False, False),
    ("BinaryArray matrix @ array", lambda w, s, S, c: evjax.BinaryArray(S) @ w,
     lambda w, s, S, c: S @ w, "evjax_binary_densemm", True, False),
    ("WeightedArray @ array", lambda w, s, S, c: evjax.WeightedArray(c) @ w,
     lambda w, s, S, c: c @ w, "evjax_binary_densemv", True, True),
    ("bool @ Dense", lambda w, s, S, c: s @ evjax.Dense(w),
     lambda w, s, S, c: s @ w, "evjax_binary_densemv", True, False),
    ("bool matrix @ Dense", lambda w, s, S, c: S @ evjax.Dense(w),
     lambda w, s, S, c: S @ w, "evjax_binary_densemm", True, False),
    ("Dense @ bool", lambda w, s, S, c: evjax.Dense(w).T @ s,
     lambda w, s, S, c: w.T @ s, "evjax_binary_densemv", False, False),
    ("Dense @ bool matrix", lambda w, s, S, c: evjax.Dense(w).T @ S.T,
     lambda w, s, S, c: w.T @ S.T, "evjax_binary_densemm", False, False),
    ("BinaryArray @ Dense", lambda w, s, S, c: evjax.BinaryArray(s) @ evjax.Dense(w),
     lambda w, s, S, c: s @ w, "evjax_binary_densemv", True, False),
    ("Dense @ BinaryArray", lambda w, s, S, c: evjax.Dense(w).T @ evjax.BinaryArray(s),
     lambda w, s, S, c: w.T @ s, "evjax_binary_densemv", False, False),
    ("WeightedArray @ Dense", lambda w, s, S, c: evjax.WeightedArray(c) @ evjax.Dense(w),
     lambda w, s, S, c: c @ w, "evjax_binary_densemv", True, True),
    ("Dense @ WeightedArray matrix", lambda w, s, S, c: evjax.Dense(w).T @ evjax.WeightedArray(S.T * 2.0),
     lambda w, s, S, c: w.T @ (S.T * 2.0), "evjax_binary_densemm", False, True),
]


@pytest.mark.parametrize("form", EVENT_FORMS, ids=[f[0] for f in EVENT_FORMS])
def test_event_products_run_the_event_op(operands, form):
    _, expression, reference, primitive, transpose, weighted = form
    w, s, S, c = operands
    args = (jnp.asarray(w), jnp.asarray(s), jnp.asarray(S), jnp.asarray(c))
    eqns = event_eqns(expression, *args)
    assert [e.primitive.name for e in eqns] == [primitive]
    assert eqns[0].params["transpose"] is transpose and eqns[0].params["weighted"] is weighted
    assert "dot_general" not in primitives(expression, *args)
    expected = reference(w.astype(np.float64), s.astype(np.float64), S.astype(np.float64), c.astype(np.float64))
    np.testing.assert_allclose(np.asarray(expression(*args)), expected, rtol=1e-5, atol=1e-5)


def test_numpy_operands_run_the_event_op(operands):
    w, s, _, _ = operands
    D = evjax.Dense(w)
    np.testing.assert_allclose(np.asarray(s @ D), s.astype(np.float64) @ w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(w.T @ evjax.BinaryArray(s)), w.T @ s.astype(np.float64), rtol=1e-5,
                               atol=1e-5)
    assert event_eqns(lambda s: s @ D, s)  # a NumPy bool vector is an event operand too


@pytest.mark.parametrize("side", ["left", "right"])
def test_float_operands_go_to_the_dot(operands, side):
    w, s, _, _ = operands
    x = jnp.asarray(s, jnp.float32) * 1.5
    D = evjax.Dense(w)
    fn = (lambda x: x @ D) if side == "left" else (lambda x: D.T @ x)
    assert not event_eqns(fn, x)
    assert "dot_general" in primitives(fn, x)
    np.testing.assert_allclose(np.asarray(fn(x)), np.asarray(x, np.float64) @ w, rtol=1e-5, atol=1e-5)


def test_dense_is_a_pytree_new_weights_do_not_retrace(operands):
    w, s, _, _ = operands
    traces = []

    @jax.jit
    def forward(D, s):
        traces.append(1)
        return s @ D

    forward(evjax.Dense(w), s)
    out = forward(evjax.Dense(2 * w), s)
    assert len(traces) == 1
    np.testing.assert_allclose(np.asarray(out), 2 * (s.astype(np.float64) @ w), rtol=1e-5, atol=1e-5)


def test_grad_wrt_dense_is_a_dense_of_active_rows(operands):
    w, s, _, _ = operands
    g = np.arange(N_COLS, dtype=np.float32) + 1
    grad = jax.grad(lambda D: jnp.sum((s @ D) * g))(evjax.Dense(w))
    assert isinstance(grad, evjax.Dense)
    np.testing.assert_allclose(np.asarray(grad.todense()), np.outer(s, g), rtol=0, atol=0)


def test_dense_attributes_and_with_data(operands):
    w, _, _, _ = operands
    D = evjax.Dense(w, backend="reference")
    assert D.shape == (N_ROWS, N_COLS) and D.ndim == 2 and D.dtype == jnp.float32
    assert D.T.shape == (N_COLS, N_ROWS) and D.transpose().shape == (N_COLS, N_ROWS)
    np.testing.assert_array_equal(np.asarray(D.T.todense()), w.T)
    E = D.with_data(jnp.zeros_like(D.data))
    assert E.backend == "reference" and D.T.backend == "reference"
    assert float(jnp.abs(E.todense()).sum()) == 0.0
    assert "Dense(shape=(7, 5)" in repr(D)
    assert evjax.Dense(w, shape=(N_ROWS, N_COLS)).shape == (N_ROWS, N_COLS)


def test_backend_of_dense_reaches_the_op(operands):
    w, s, _, _ = operands
    eqns = event_eqns(lambda s: s @ evjax.Dense(w, backend="reference"), s)
    assert eqns[0].params["backend"].per_call == "reference"


@pytest.mark.parametrize("bad, error, words", [
    (np.ones((3, 4), np.int32), TypeError, "2-d float"),
    (np.ones(4, np.float32), TypeError, "2-d float"),
])
def test_dense_rejects_bad_data(bad, error, words):
    with pytest.raises(error, match=words):
        evjax.Dense(bad)


def test_dense_rejects_a_wrong_shape_and_bad_operands(operands):
    w, s, _, _ = operands
    with pytest.raises(ValueError, match="does not match"):
        evjax.Dense(w, shape=(N_COLS, N_ROWS))
    D = evjax.Dense(w)
    with pytest.raises(TypeError, match="Dense @ Dense"):
        D @ D.T
    with pytest.raises(ValueError, match="vector or a matrix"):
        np.ones((2, 2, N_ROWS), bool) @ D


@pytest.mark.parametrize("transpose", [True, False])
def test_vmap_over_events_is_one_matrix_kernel(operands, transpose):
    w, _, S, _ = operands
    W = jnp.asarray(w if transpose else w.T)
    fn = jax.vmap(lambda s: evjax.binary_densemv(W, s, transpose=transpose))
    assert [e.primitive.name for e in event_eqns(fn, S)] == ["evjax_binary_densemm"]
    np.testing.assert_allclose(np.asarray(fn(S)), S.astype(np.float64) @ w, rtol=1e-5, atol=1e-5)


WEIGHT_DTYPES = [jnp.float16, jnp.bfloat16, jnp.float64]
EVENT_KINDS = ["bool", "uint8", "float 0/1", "graded"]


@pytest.mark.parametrize("backend", ["numba", "warp"])
@pytest.mark.parametrize("weight_dtype", WEIGHT_DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_event_and_weight_dtypes(backend, weight_dtype):
    """Each weight dtype with each event kind, both ranks and orientations (the harness runs float32)."""
    rng = np.random.default_rng(5)
    k, m = 9, 4
    with jax.enable_x64(True):
        for kind in EVENT_KINDS:
            for rank, transpose in ((1, True), (2, False)):
                shape = (k,) if rank == 1 else (k, 3)
                active = rng.random(shape) < 0.5
                events = {"bool": active, "uint8": (active * rng.integers(1, 3, shape)).astype(np.uint8),
                          "float 0/1": active.astype(np.float32),
                          "graded": (active * rng.uniform(0.5, 2, shape)).astype(np.float32)}[kind]
                weighted = kind == "graded"
                w = jnp.asarray(rng.standard_normal((k, m) if transpose else (m, k)), weight_dtype)
                fn = evjax.binary_densemv if rank == 1 else evjax.binary_densemm
                y = fn(w, events, transpose=transpose, weighted=weighted, backend=backend)
                rows = np.asarray(w.astype(jnp.float64))
                rows = rows if transpose else rows.T
                values = events.astype(np.float64) if weighted else active.astype(np.float64)
                want = rows.T @ values
                expected_dtype = jnp.result_type(weight_dtype, events.dtype) if weighted else jnp.dtype(weight_dtype)
                assert y.dtype == expected_dtype, (kind, rank)
                tol = 2e-2 if jnp.dtype(y.dtype).itemsize == 2 else 1e-6
                np.testing.assert_allclose(np.asarray(y.astype(jnp.float64)), want, rtol=tol, atol=tol,
                                           err_msg=f"{kind}, rank {rank}")


# ---------------------------------------------------------------------------
# brainevent's everyday methods of Dense (plain JAX on the weights)
# ---------------------------------------------------------------------------
def test_dense_methods_match_numpy(operands):
    w, s, _, _ = operands
    rng = np.random.default_rng(11)
    m = rng.uniform(1.0, 2.0, w.shape).astype(np.float32)
    row = rng.uniform(1.0, 2.0, N_COLS).astype(np.float32)
    D = evjax.Dense.fromdense(w, backend="reference")
    assert isinstance(D, evjax.Dense) and D.backend == "reference" and D.nse == N_ROWS * N_COLS
    cases = {
        "D + 1": (D + 1, w + 1), "2 * D": (2 * D, 2 * w), "D - m": (D - m, w - m), "m - D": (m - D, m - w),
        "D * row": (D * row, w * row), "D / m": (D / m, w / m), "1 / D": (1 / (D * 0 + m), 1 / m),
        "D + D": (D + D, w + w), "-D": (-D, -w), "abs(D)": (abs(D), np.abs(w)),
        "apply": (D.apply(jnp.sin), np.sin(w)), "T": (D.transpose((1, 0)), w.T),
        "slice_rows(int)": (D.slice_rows(1), w[1:2]), "slice_rows(list)": (D.slice_rows([4, 0, 4]), w[[4, 0, 4]]),
        "slice_rows(slice)": (D.slice_rows(slice(2, 5)), w[2:5]), "slice_rows(mask)": (D.slice_rows(s), w[s]),
        "diag_add": (D.diag_add(np.arange(5.0)), w + np.pad(np.diag(np.arange(5.0)), ((0, 2), (0, 0)))),
        "diag_add(scalar)": (D.diag_add(3.0), w + 3.0 * np.eye(N_ROWS, N_COLS)),
    }
    for name, (got, want) in cases.items():
        assert isinstance(got, evjax.Dense) and got.backend == "reference", name
        np.testing.assert_allclose(np.asarray(got.todense()), want, rtol=1e-6, err_msg=name)
    np.testing.assert_array_equal(np.asarray(D[1]), w[1])
    np.testing.assert_array_equal(np.asarray(D[[2, 0]]), w[[2, 0]])
    rows = list(D)  # its rows, and an end (JAX clamps D[i] past the last row: no IndexError to stop at)
    assert len(rows) == N_ROWS
    np.testing.assert_array_equal(np.asarray(rows[-1]), w[-1])
    sparse = np.where(np.abs(w) > 0.5, w, 0).astype(np.float32)
    S = evjax.Dense(sparse)
    for conversion in (S.tocsr(), S.tocsc(), S.tocsr(nse=int((sparse != 0).sum()))):
        np.testing.assert_array_equal(np.asarray(conversion.todense()), sparse)
    assert type(S.tocsr()) is evjax.CSR and type(S.tocsc()) is evjax.CSC
    np.testing.assert_array_equal(np.asarray(S.tocoo().todense()), sparse)
    with_view = S.tocsr(precompute_weight_indices=True)
    assert with_view.other_view is not None
    for got, want in zip(with_view.other_view, S.tocsr().build_weight_indices().other_view):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_dense_solve_and_plasticity_match_numpy(operands):
    w, _, _, _ = operands
    rng = np.random.default_rng(12)
    a = (rng.standard_normal((6, 6)) + 6 * np.eye(6)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    np.testing.assert_allclose(np.asarray(evjax.Dense(a).solve(b)), np.linalg.solve(a, b), rtol=1e-5)
    pre = np.array([True, False, True, False, False, True, False])
    post_trace = rng.uniform(-0.5, 0.5, N_COLS).astype(np.float32)
    got = evjax.Dense(w).update_on_pre(pre, post_trace, w_min=-1.0, w_max=1.0).todense()
    want = np.where(pre[:, None], np.clip(w + post_trace, -1.0, 1.0), w)  # only the rows that fired move
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    post = np.array([False, True, True, False, True])
    pre_trace = rng.uniform(-0.5, 0.5, N_ROWS).astype(np.float32)
    got = evjax.Dense(w).update_on_post(pre_trace, post, w_min=-1.0).todense()
    want = np.where(post[None, :], np.maximum(w + pre_trace[:, None], -1.0), w)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)


def test_dense_method_errors_name_the_fix(operands):
    w, _, _, _ = operands
    D = evjax.Dense(w)
    with pytest.raises(ValueError, match=r"broadcasts to \(7, 5\).*got shape \(7, 4\)"):
        D + np.ones((N_ROWS, 4), np.float32)
    with pytest.raises(ValueError, match="got shape"):
        D * evjax.Dense(w.T)
    W = evjax.CSR.fromdense(w)
    for bad in (lambda: D * W, lambda: D + evjax.BinaryArray(np.ones(N_ROWS, bool))):
        with pytest.raises(NotImplementedError, match="todense"):  # brainevent's exception ...
            bad()
        with pytest.raises(TypeError):  # ... and a TypeError, as evjax's other unsupported operations
            bad()
    with pytest.raises(ValueError, match="keep the shape"):
        D.apply(lambda d: d[:2])
    with pytest.raises(ValueError, match="min\\(shape\\) = 5"):
        D.diag_add(np.ones(4))
    with pytest.raises(ValueError, match="axes must be None or"):
        D.transpose((0, 1))
    with pytest.raises(IndexError, match="Dense.slice_rows: row 7 is out of range for 7 rows"):
        D.slice_rows([0, 7])  # JAX's gather would have given row 6 in its place
    traced = jax.jit(lambda rows: D.slice_rows(rows).todense())(jnp.array([4, 1]))
    np.testing.assert_array_equal(np.asarray(traced), w[[4, 1]])
    with pytest.raises(ValueError, match="nse = 3 but the matrix has"):
        D.tocsr(nse=3)


def test_dense_methods_through_harness():
    rng = np.random.default_rng(13)
    w = rng.standard_normal((5, 5)).astype(np.float32) + 5 * np.eye(5, dtype=np.float32)
    m = rng.uniform(1.0, 2.0, (5, 5)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)

    def fn(w, m, b):
        D = evjax.Dense(w)
        return ((-(D * m) + 1) / 2).todense(), D.diag_add(m[0]).slice_rows([3, 1]).todense(), D.solve(b)

    def reference(w, m, b):
        return (-(w * m) + 1) / 2, (w + jnp.diag(m[0]))[jnp.array([3, 1])], jnp.linalg.solve(w, b)

    check_all(OpSpec(fn=fn, reference=reference, diff_argnums=(0, 1, 2), vmap_argnums=(0, 1, 2),
                     name="Dense.methods"), (w, m, b))

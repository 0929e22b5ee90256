"""NaN and inf through every CSR op and backend (docs/semantics.md), and the gradient of a shared weight
(CSR, fixed and every JITC law) when the cotangent is nan or inf on outputs no active event reaches.

Two rules, checked against structural NumPy/SciPy oracles with nan positions equal:

* event ops: an inactive event contributes nothing, whatever its weights hold;
  an active one adds its weights as IEEE arithmetic does (a select, never
  ``w * e``), in both orientations, forward and every gradient;
* float ops: IEEE and structural like scipy: every stored entry contributes
  ``w * x`` (a nan weight beside ``x = 0`` gives nan), a structural zero never
  does (``x = inf`` with no stored entry in a row leaves that row finite).

Backends: numba, warp (Warp's CPU device; skipped if warp is missing) and the
reference.  The JITC parameters' gradients are compared with a dense jax.numpy
gradient.  The Numba CUDA kernels are checked in tests/cudasim/test_sim_csr.py.
"""
from __future__ import annotations

import functools
import importlib.util
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

import evjax
from evjax.primitives import csr
from tests import doc_runner
from tests.helpers import THOROUGH, csr_from_coo, sddmm_numpy

HAS_WARP = importlib.util.find_spec("warp") is not None
BACKENDS = ("numba", "reference") + (("warp",) if HAS_WARP else ())
nan, inf = np.nan, np.inf
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

if HAS_WARP:
    import warp

    warp.config.quiet = True


def assert_same(got, want, err_msg=""):
    """Equal up to rounding, nan exactly where the oracle has nan, infinities of the same sign."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"nan positions {err_msg}")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=err_msg)


# 6 x 5, row 3 empty, non-finite weights in distinct rows
S = csr_from_coo([0, 0, 1, 1, 1, 2, 4, 4, 5, 5], [0, 1, 1, 2, 4, 3, 0, 4, 2, 3], (6, 5))
WEIGHTS = np.array([1.0, nan, 2.0, inf, 0.5, -inf, 3.0, nan, -1.0, 2.0], np.float32)
HOMOGENEOUS = [np.array([w], np.float32) for w in (nan, inf, -inf, 1.5)]
WEIGHT_CASES = [WEIGHTS] + HOMOGENEOUS
WEIGHT_IDS = ["per-synapse", "nan", "inf", "-inf", "finite"]


# ---------------------------------------------------------------------------
# oracles
# ---------------------------------------------------------------------------
def synapse_weights(s, data):
    return np.broadcast_to(np.asarray(data, np.float64), s.rows.shape)


def event_oracle(s, data, x, transpose):
    """y_out = sum of w over the synapses whose input event is active (np.where: selected, not multiplied)."""
    src, dst = (s.rows, s.cols) if transpose else (s.cols, s.rows)
    x = np.asarray(x)
    x2 = (x if x.ndim == 2 else x[:, None]) != 0
    w = synapse_weights(s, data)[:, None]
    y = np.zeros((s.shape[1] if transpose else s.shape[0], x2.shape[1]))
    np.add.at(y, dst, np.where(x2[src], w, 0.0))
    return y if x.ndim == 2 else y[:, 0]


def float_oracle(s, data, x, transpose):
    """scipy.sparse: every stored entry adds w * x (IEEE), structural zeros add nothing."""
    a = sp.csr_matrix((synapse_weights(s, data), s.indices, s.indptr), shape=s.shape)
    return (a.T if transpose else a) @ np.asarray(x, np.float64)


def oracle(event, data, x, transpose, s=S):
    return event_oracle(s, data, x, transpose) if event else float_oracle(s, data, x, transpose)


def sddmm_oracle(r, q, s=S):
    """g_k = sum_c term(r[i_k, c], q[j_k, c]): a bool operand selects, two floats multiply (IEEE)."""
    return sddmm_numpy(s.indices, s.indptr, r, q)


# ---------------------------------------------------------------------------
# operands
# ---------------------------------------------------------------------------
def n_in(transpose):
    return S.shape[0] if transpose else S.shape[1]


def spikes(transpose, rank, as_float):
    """Events: the first input silent (it carries a nan weight both ways), the second active;
    float spikes are 0, 2.5 or inf (nonzero = spike)."""
    rng = np.random.default_rng(3 + transpose + 2 * rank)
    shape = (n_in(transpose),) if rank == 1 else (n_in(transpose), 3)
    active = rng.random(shape) < 0.5
    active[0], active[1] = False, True
    if not as_float:
        return active
    return np.where(active, np.where(rng.random(shape) < 0.3, inf, 2.5), 0.0).astype(np.float32)


def values(transpose, rank):
    """Float operands: 0 beside nan weights, inf on an empty row (scatter) or where only
    some rows store an entry (gather: column 3, rows 2 and 5)."""
    if transpose:
        v = np.array([0.0, 1.5, 0.0, inf, 2.0, -1.0], np.float32)
    else:
        v = np.array([2.0, 0.0, 1.0, inf, -3.0], np.float32)
    return v if rank == 1 else np.stack([v, np.where(v == 0, 1.0, 0.0).astype(np.float32), np.ones_like(v)], 1)


def operand(rank, event, transpose, float_spikes=False):
    return spikes(transpose, rank, float_spikes) if event else values(transpose, rank)


OPS = {(1, False): csr.csrmv, (2, False): csr.csrmm, (1, True): csr.binary_csrmv, (2, True): csr.binary_csrmm}
MATMULS = list(itertools.product((1, 2), (True, False), (False, True)))  # rank, event, transpose
MATMUL_IDS = [f"{'binary_' if e else ''}csrm{'v' if r == 1 else 'm'}-{'scatter' if t else 'gather'}"
              for r, e, t in MATMULS]


def matmul(rank, event, transpose, backend, s=S):
    return lambda data, x: OPS[(rank, event)](data, s.indices, s.indptr, x, shape=s.shape, transpose=transpose,
                                              backend=backend)


# ---------------------------------------------------------------------------
# the issue's examples
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_issue_examples(backend):
    s = csr_from_coo([0, 0, 1], [0, 1, 2], (2, 3))
    data = np.array([1, nan, 2], np.float32)
    W = evjax.CSR(data, s.indices, s.indptr, shape=s.shape)
    gather_events, scatter_events = np.array([True, False, True]), np.array([False, True])
    with evjax.use_backend(backend):
        gather = W @ evjax.BinaryArray(gather_events)
        scatter = evjax.BinaryArray(scatter_events) @ W
    want_gather = event_oracle(s, data, gather_events, transpose=False)
    want_scatter = event_oracle(s, data, scatter_events, transpose=True)
    np.testing.assert_array_equal(want_gather, [1, 2])  # the oracle gives the issue's answers
    np.testing.assert_array_equal(want_scatter, [0, 0, 2])
    assert_same(gather, want_gather)
    assert_same(scatter, want_scatter)

    # the float scatter x @ W keeps a nan weight on a row where x == 0 (scipy's answer)
    s2 = csr_from_coo([0, 1, 1, 2], [0, 1, 2, 2], (3, 5))
    w2 = np.array([nan, 2, 4, 4], np.float32)
    x = np.array([0, 3, 6], np.float32)
    want = float_oracle(s2, w2, x, transpose=True)
    np.testing.assert_array_equal(want, [nan, 6, 36, 0, 0])
    with evjax.use_backend(backend):
        assert_same(x @ evjax.CSR(w2, s2.indices, s2.indptr, shape=s2.shape), want)
        # and its weight gradient: 0 * inf is nan, not 0
        ct = np.array([inf, 1, 1, 0, 0], np.float32)
        _, vjp = jax.vjp(lambda w: x @ evjax.CSR(w, s2.indices, s2.indptr, shape=s2.shape), w2)
        (g,) = vjp(ct)
    assert_same(g, sddmm_oracle(x, ct, s2))
    assert np.isnan(g[0])


# ---------------------------------------------------------------------------
# forward: every matmul, both orientations, per-synapse and homogeneous weights, bool and float spikes
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rank, event, transpose", MATMULS, ids=MATMUL_IDS)
def test_forward(rank, event, transpose, backend):
    f = jax.jit(matmul(rank, event, transpose, backend))
    for float_spikes in ((False, True) if event else (False,)):
        x = operand(rank, event, transpose, float_spikes)
        for data, name in zip(WEIGHT_CASES, WEIGHT_IDS):
            assert_same(f(data, x), oracle(event, data, x, transpose), f"{name} weights, x={x.dtype}")


# ---------------------------------------------------------------------------
# gradients: w.r.t. the weights (cotangents with nan, inf and 0), w.r.t. float inputs, jvp
# ---------------------------------------------------------------------------
def cotangent(rank, transpose):
    n_out = S.shape[1] if transpose else S.shape[0]
    ct = np.array([inf, 0.0, nan, 1.0, -2.0, 0.5][:n_out], np.float32)
    return ct if rank == 1 else np.stack([ct, ct[::-1].copy(), np.ones_like(ct)], axis=1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rank, event, transpose", MATMULS, ids=MATMUL_IDS)
def test_weight_gradient(rank, event, transpose, backend):
    # w_bar_k = term(ct_out, x_in): selected by an event (only active rows touched in the scatter),
    # the IEEE product for a float input (0 * inf is nan)
    f = matmul(rank, event, transpose, backend)
    ct = cotangent(rank, transpose)
    finite_ct = np.nan_to_num(ct, nan=0.5, posinf=3.0)
    for float_spikes in ((False, True) if event else (False,)):
        x = operand(rank, event, transpose, float_spikes)
        x_oracle = np.asarray(x) != 0 if event else x  # float spikes are events: nonzero = spike
        _, vjp = jax.vjp(lambda w: f(w, x), WEIGHTS)
        (got,) = jax.jit(vjp)(ct)
        assert_same(got, sddmm_oracle(*((x_oracle, ct) if transpose else (ct, x_oracle))), f"x {x.dtype}")
        # homogeneous weights (nan/inf included), finite cotangents: the sum of the per-synapse gradients
        want = np.sum(sddmm_oracle(*((x_oracle, finite_ct) if transpose else (finite_ct, x_oracle))))
        for data in HOMOGENEOUS:
            _, vjp = jax.vjp(lambda w: f(w, x), data)
            (got,) = vjp(finite_ct)
            assert_same(got, [want], f"homogeneous {data}, x {x.dtype}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rank, event, transpose", MATMULS, ids=MATMUL_IDS)
def test_input_gradient_is_the_ieee_float_op(rank, event, transpose, backend):
    # float ops: x_bar = A.T ct (or A ct); event ops given float spikes: the same (straight-through)
    f = matmul(rank, event, transpose, backend)
    x = operand(rank, event, transpose, float_spikes=True)
    ct = np.nan_to_num(cotangent(rank, transpose), nan=0.0, posinf=0.0)  # zeros meet the nan weights
    for data in (WEIGHTS, HOMOGENEOUS[0]):
        _, vjp = jax.vjp(lambda v: f(data, v), x)
        (got,) = vjp(ct)
        assert_same(got, float_oracle(S, data, ct, transpose=not transpose), f"weights {data}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rank, event, transpose", MATMULS, ids=MATMUL_IDS)
def test_jvp(rank, event, transpose, backend):
    # dy = A(dw) x (events selected) + A(w) dx (float inputs; the float op for float spikes)
    f = matmul(rank, event, transpose, backend)
    x = operand(rank, event, transpose, float_spikes=event)
    dw = np.where(np.arange(WEIGHTS.size) % 3 == 0, nan, 1.0).astype(np.float32)  # nan tangents on some synapses
    dx = np.where(np.asarray(x) == 0, 1.0, 0.0).astype(np.float32)
    _, tangent = jax.jit(lambda w, v, t_w, t_v: jax.jvp(f, (w, v), (t_w, t_v)))(WEIGHTS, x, dw, dx)
    want = oracle(event, dw, x, transpose) + float_oracle(S, WEIGHTS, dx, transpose)
    assert_same(tangent, want)


# ---------------------------------------------------------------------------
# vmap: batched spikes (the matrix op) and batched homogeneous weights (nan and inf in the batch)
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("event, transpose", [(True, True), (False, True), (True, False), (False, False)])
def test_vmap(event, transpose, backend):
    f = matmul(1, event, transpose, backend)
    batch = np.asarray(operand(2, event, transpose)).T  # (batch, n_in)
    got = jax.vmap(f, in_axes=(None, 0))(WEIGHTS, batch)
    assert_same(got, np.stack([oracle(event, WEIGHTS, b, transpose) for b in batch]))
    weights = np.stack(HOMOGENEOUS)  # (4, 1): nan, inf, -inf, 1.5
    x = operand(1, event, transpose)
    got = jax.jit(jax.vmap(f, in_axes=(0, None)))(weights, x)
    assert_same(got, np.stack([oracle(event, w, x, transpose) for w in weights]))
    finite = np.array([[1.5], [-2.0]], np.float32)  # the one-call path: w_b * op(1, x)
    assert_same(jax.vmap(f, in_axes=(0, None))(finite, x), np.stack([oracle(event, w, x, transpose) for w in finite]))


# ---------------------------------------------------------------------------
# csr_sddmm: every combination of bool and float operands, vectors and matrices
# ---------------------------------------------------------------------------
def sddmm_operand(n, width, kind, seed):
    rng = np.random.default_rng(seed)
    shape = (n,) if width is None else (n, width)
    if kind == "bool":
        out = rng.random(shape) < 0.5
        out[0] = False
        out[1] = True
        return out
    v = rng.choice(np.array([0.0, 1.5, -2.0, nan, inf, -inf], np.float32), size=shape)
    v[0] = 0  # a zero row of r beside non-finite q: 0 * inf is nan for two floats
    return v


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("width", [None, 3])
def test_sddmm(width, backend):
    for r_kind, q_kind in itertools.product(("float", "bool"), repeat=2):
        r = sddmm_operand(S.shape[0], width, r_kind, 1)
        q = sddmm_operand(S.shape[1], width, q_kind, 2)
        got = jax.jit(lambda r, q: csr.csr_sddmm(S.indices, S.indptr, r, q, shape=S.shape, dtype=jnp.float32,
                                                 backend=backend))(r, q)
        assert_same(got, sddmm_oracle(r, q), f"r {r_kind}, q {q_kind}")


# ---------------------------------------------------------------------------
# a shared weight's gradient: non-finite cotangents on outputs that no active event reaches
# (CSR, fixed and every JITC law; the dense family has no shared-weight form: its weights are a matrix)
# ---------------------------------------------------------------------------
MODES = ("binary", "float_spikes", "weighted", "float")  # bool spikes, float spikes, graded events, float values


def mode_operand(mode, n, rank, seed, silent=(0,)):
    """The operand of ``mode``: events are sparse (about a third active, the inputs ``silent`` silent, the
    second active), so that some outputs are reached by no active event; float values hold zeros."""
    rng = np.random.default_rng(seed)
    shape = (n,) if rank == 1 else (n, 3)
    active = rng.random(shape) < 0.35
    active[1] = True
    active[list(silent)] = False
    if mode == "binary":
        return active
    if mode == "float_spikes":
        return np.where(active, np.where(rng.random(shape) < 0.3, inf, 2.5), 0.0).astype(np.float32)
    if mode == "weighted":  # finite graded events, signs mixed
        return np.where(active, rng.choice(np.array([1.5, -2.0, 0.5], np.float32), size=shape), 0).astype(np.float32)
    return np.where(rng.random(shape) < 0.4, 0.0, rng.standard_normal(shape)).astype(np.float32)


def reached_outputs(src, dst, n_out, x, mode):
    """Which outputs (``(n_out[, k])``) a synapse ``src -> dst`` reaches: from an active (nonzero) event, or,
    for float values, from any input (structural: an output with no synapse is never reached)."""
    x2 = np.asarray(x) if np.ndim(x) == 2 else np.asarray(x)[:, None]
    live = np.ones(x2.shape, bool) if mode == "float" else x2 != 0
    out = np.zeros((n_out, x2.shape[1]), bool)
    np.logical_or.at(out, dst, live[src])
    return out if np.ndim(x) == 2 else out[:, 0]


def synapse_gradient(src, dst, x, ct, mode):
    """g_k per synapse ``src -> dst`` (docs/semantics.md): an event selects ``ct``, a graded event selects then
    scales it (``where(v != 0, v * ct, 0)``), a float value multiplies it (IEEE)."""
    x2 = np.asarray(x, np.float64) if np.ndim(x) == 2 else np.asarray(x, np.float64)[:, None]
    ct2 = np.asarray(ct, np.float64) if np.ndim(ct) == 2 else np.asarray(ct, np.float64)[:, None]
    xs, cs = x2[src], ct2[dst]
    if mode in ("binary", "float_spikes"):
        terms = np.where(xs != 0, cs, 0.0)
    elif mode == "weighted":
        terms = np.where(xs != 0, xs * cs, 0.0)
    else:
        terms = xs * cs
    return terms.sum(axis=1)


def nonfinite_cotangents(reach, seed):
    """Cotangents for the shared weight's gradient: (1) nan, inf and -inf only on unreached outputs, finite
    values elsewhere (the answer is finite: the defect gave nan); (2) besides, nan and 0 on reached outputs.
    (An infinite cotangent on a reached output gives inf times the sum of the terms into it, which can be
    +-inf where the sum of the per-synapse gradients is nan: docs/semantics.md; not compared here.)"""
    rng = np.random.default_rng(seed)
    finite = rng.choice(np.array([1.0, -2.0, 0.5, 3.0], np.float32), size=reach.shape)
    poison = rng.choice(np.array([nan, inf, -inf], np.float32), size=reach.shape)
    poison.reshape(-1)[0] = nan
    only_unreached = np.where(reach, finite, poison).astype(np.float32)
    on_reached = np.where(rng.random(reach.shape) < 0.5, np.float32(nan), np.float32(0.0))
    everywhere = np.where(reach & (rng.random(reach.shape) < 0.3), on_reached, only_unreached).astype(np.float32)
    return only_unreached, everywhere


def check_shared_weight_gradient(f, x, src, dst, n_out, mode, seed, err):
    """The shared weight's gradient of ``f(data, x)`` is the sum of the per-synapse gradients, whatever the
    cotangent holds on the outputs no active event (float: no synapse) reaches; for a finite and a nan weight,
    for each cotangent and for a batch of them (vmap of the transpose), all in one compiled program."""
    reach = reached_outputs(src, dst, n_out, x, mode)
    # events: some outputs unreached; float values: structural (the CSR scatter stores every column)
    assert reach.any() and (mode == "float" or not reach.all()), "the case needs reached and unreached outputs"

    @jax.jit
    def grads(data, cts):
        _, vjp = jax.vjp(lambda w: f(w, x), data)
        return [vjp(ct)[0] for ct in cts], jax.vmap(vjp)(cts)[0]

    cts = np.stack(nonfinite_cotangents(reach, seed))
    want = np.array([[np.sum(synapse_gradient(src, dst, x, ct, mode))] for ct in cts])
    for data in (np.array([1.5], np.float32), np.array([nan], np.float32)):  # the weight is never read
        one_by_one, batched = grads(data, cts)
        for ct, got, w in zip(cts, one_by_one, want):
            assert_same(got, w, f"{err}, weight {data[0]}, ct {ct.tolist()}")
        assert_same(batched, want, f"{err}, weight {data[0]}, vmap")


def event_call(fn, mode, **kw):
    """``fn`` with the operand as ``mode`` passes it: ``weighted=True`` for graded events."""
    return functools.partial(fn, **kw, **({"weighted": True} if mode == "weighted" else {}))


# 6 x 5 CSR with an empty row (3) and an unreferenced-by-events mix; every column stored
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rank, transpose", list(itertools.product((1, 2), (False, True))),
                         ids=lambda v: str(v))
def test_csr_shared_weight_gradient_nan_cotangent(rank, transpose, backend):
    src, dst = (S.rows, S.cols) if transpose else (S.cols, S.rows)
    n_out = S.shape[1] if transpose else S.shape[0]
    for i, mode in enumerate(MODES):
        # silent inputs 0 and 4 leave column 0 unreached in the scatter; row 3 is empty
        x = mode_operand(mode, n_in(transpose), rank, seed=11 + i, silent=(0, 4))
        fn = OPS[(rank, mode != "float")]
        call = event_call(fn, mode, shape=S.shape, transpose=transpose, backend=backend)
        f = lambda w, v: call(w, S.indices, S.indptr, v)  # noqa: E731
        check_shared_weight_gradient(f, x, src, dst, n_out, mode, seed=i, err=mode)


# fixed fan: 5 rows x 2 synapses into 6 columns, column 5 never referenced, a duplicate in row 2
FIXED = np.array([[0, 1], [1, 2], [3, 3], [0, 4], [2, 4]], np.int32)
FIXED_SHAPE = (5, 6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rank, transpose", list(itertools.product((1, 2), (False, True))),
                         ids=lambda v: str(v))
def test_fixed_shared_weight_gradient_nan_cotangent(rank, transpose, backend):
    rows = np.repeat(np.arange(FIXED.shape[0]), FIXED.shape[1])
    cols = FIXED.reshape(-1)
    src, dst = (rows, cols) if transpose else (cols, rows)
    n_out = FIXED_SHAPE[1] if transpose else FIXED_SHAPE[0]
    n = FIXED_SHAPE[0] if transpose else FIXED_SHAPE[1]
    fns = {(1, False): evjax.fcnmv, (2, False): evjax.fcnmm, (1, True): evjax.binary_fcnmv,
           (2, True): evjax.binary_fcnmm}
    for i, mode in enumerate(MODES):
        # column 5 is never referenced (scatter); a silent input 3 leaves row 2 unreached (gather)
        x = mode_operand(mode, n, rank, seed=21 + i, silent=(0, 3))
        call = event_call(fns[(rank, mode != "float")], mode, shape=FIXED_SHAPE, transpose=transpose,
                          backend=backend)
        f = lambda w, v: call(w, FIXED, v)  # noqa: E731
        check_shared_weight_gradient(f, x, src, dst, n_out, mode, seed=i, err=mode)


JITC_LAWS = {"scalar": (0.7,), "normal": (0.3, 1.2), "uniform": (-1.0, 2.0)}
JITC_SHAPE, JITC_PROB, JITC_SEED = (9, 8), 0.25, 5


def jitc_dense(law, params, transpose, corder):
    """``(D, mask)``: the matrix the op applies (``M`` or ``M.T``), dense and differentiable in the parameters."""
    from evjax.primitives.jitc.generation import dense_generated
    from evjax.primitives.jitc.ops import generated_shape

    n_outer, n_inner = generated_shape(JITC_SHAPE, transpose, corder)
    w, mask = dense_generated(law, [jnp.asarray(p, jnp.float32).reshape(1) for p in params],
                              jnp.asarray(JITC_SEED, jnp.uint32), JITC_PROB, n_outer, n_inner, jnp.float32)
    return (w, mask) if corder else (w.T, mask.T)


@functools.lru_cache(maxsize=None)
def jitc_synapses(transpose, corder):
    """The synapses ``(n_out, n_in)`` of the matrix the op applies (the same for every law and backend)."""
    return np.asarray(jax.jit(jitc_dense, static_argnums=(0, 2, 3))("scalar", (1.0,), transpose, corder)[1])


@functools.lru_cache(maxsize=None)
def jitc_basis(law, transpose, corder):
    """``D(e_p)`` for each parameter p: the law's weights are linear in its parameters jointly,
    ``D(theta) = sum_p theta_p D(e_p)`` (scalar: ``w``; normal: ``loc + scale z``; uniform:
    ``low (1 - u) + high u``)."""
    n = len(JITC_LAWS[law])
    dense = jax.jit(jitc_dense, static_argnums=(0, 2, 3))
    return [np.asarray(dense(law, tuple(float(j == p) for j in range(n)), transpose, corder)[0]) for p in range(n)]


def jitc_reference(law, params, x, transpose, corder, mode):
    """``y_o = sum over the synapses (o, i) of term(w_oi, x_i)`` in jax.numpy, with ``w = sum_p theta_p D(e_p)``:
    structural (a ``where`` on the synapses), an event selects (``where``), a graded one selects then scales, a
    float value multiplies (IEEE)."""
    w = sum(jnp.reshape(p, ()) * d for p, d in zip(params, jitc_basis(law, transpose, corder)))
    mask = jitc_synapses(transpose, corder)
    x = jnp.asarray(x)
    if x.ndim == 2:
        w, mask = w[:, :, None], mask[:, :, None]
    xs = x[None].astype(jnp.float32)
    if mode == "float":
        terms = w * xs
    elif mode == "weighted":
        terms = jnp.where(xs != 0, w * xs, 0.0)
    else:
        terms = jnp.where(xs != 0, w, 0.0)
    return jnp.sum(jnp.where(mask, terms, 0.0), axis=1)


JITC_ORIENTATIONS = ((False, True), (False, False), (True, True), (True, False))  # (transpose, corder)


def _jitc_case_runs(backend: str, rank: int, orientation: tuple, mode_index: int) -> bool:
    """CI budget: every case on numba (the CPU default, one compiled kernel per orientation); the other
    backends on a diagonal of (rank, orientation, mode) that still runs each orientation, each mode and
    both ranks (the rules are the same Python for every backend; the reference compiles one XLA program
    per case, ~2 s each); the whole product under the thorough profile."""
    if backend == "numba" or THOROUGH:
        return True
    return (JITC_ORIENTATIONS.index(orientation) + rank) % len(MODES) == mode_index


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("law", list(JITC_LAWS))
def test_jitc_parameter_gradient_nan_cotangent(law, backend):
    """Every law's parameters: the gradient equals the dense jax.numpy one, which never sees the cotangent of an
    output no active event reaches (float operands: an output with no synapse), in every orientation, for
    vectors and matrices, each cotangent and a batch of them (vmap of the transpose)."""
    params = [np.array(p, np.float32) for p in JITC_LAWS[law]]
    n = len(params)
    letter = law[0]
    for rank, (transpose, corder) in itertools.product((1, 2), JITC_ORIENTATIONS):
        mask = jitc_synapses(transpose, corder)
        jitc_basis(law, transpose, corder)  # computed here, not under the trace of grads
        out_idx, in_idx = np.nonzero(mask)
        for i, mode in enumerate(MODES):
            if not _jitc_case_runs(backend, rank, (transpose, corder), i):
                continue
            x = mode_operand(mode, mask.shape[1], rank, seed=31 + i + 4 * rank)
            name = f"{'binary_' if mode != 'float' else ''}jit{letter}m{'v' if rank == 1 else 'm'}"
            call = event_call(getattr(evjax, name), mode, shape=JITC_SHAPE, transpose=transpose, corder=corder,
                              backend=backend)
            reach = reached_outputs(in_idx, out_idx, mask.shape[0], x, mode)
            assert reach.any() and (mode == "float" or not reach.all()), (rank, transpose, corder, mode)

            @jax.jit
            def grads(params, cts, x=x, call=call, transpose=transpose, corder=corder, mode=mode):
                _, vjp = jax.vjp(lambda *p: call(*p, JITC_PROB, x, JITC_SEED), *params)
                _, vjp_want = jax.vjp(lambda *p: jitc_reference(law, p, x, transpose, corder, mode), *params)
                return vjp(cts[0]), jax.vmap(vjp)(cts), jax.vmap(vjp_want)(cts)

            cts = np.stack(nonfinite_cotangents(reach, seed=i))
            first, batched, want = grads(params, cts)
            for j in range(n):
                err = f"{name} param {j}, {mode}, transpose={transpose}, corder={corder}"
                assert_same(first[j], want[j][0], f"{err}, ct {cts[0].tolist()}")
                assert_same(batched[j], want[j], f"{err}, vmap, cts {cts.tolist()}")
    # the materialiser (jits / jitn / jitu): a cotangent off the synapses is never read
    for transpose, corder in JITC_ORIENTATIONS[:3]:
        mask = jitc_synapses(transpose, corder)
        ct = np.where(mask, np.float32(1.5), np.float32(nan))
        fn = getattr(evjax, f"jit{letter}")
        _, vjp = jax.vjp(lambda *p: fn(*p, JITC_PROB, JITC_SEED, shape=JITC_SHAPE, transpose=transpose,
                                       corder=corder, backend=backend), *params)
        basis = jitc_basis(law, transpose, corder)
        _, vjp_want = jax.vjp(lambda *p: jnp.where(mask, sum(jnp.reshape(q, ()) * d for q, d in zip(p, basis)), 0.0),
                              *params)
        got, want = vjp(ct), vjp_want(ct)
        for j in range(n):
            assert_same(got[j], want[j], f"jit{letter} param {j}, transpose={transpose}, corder={corder}")


# ---------------------------------------------------------------------------
# the page that states the rules
# ---------------------------------------------------------------------------
def test_semantics_page_runs():
    doc_runner.run_markdown("docs/semantics.md")

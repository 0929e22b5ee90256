"""The JITC generation scheme: bit-exact against a pure-Python implementation, identical on every
backend, the same matrix in both orientations and through ``.T``, and the promised statistics.

The pure-Python implementation below is written from the scheme's description
(evjax/primitives/jitc/generation.py and docs/jit_connectivity.md) with
arbitrary-precision integers, so the JAX uint32 emulation of the 64-bit
product and the kernels' uint64 arithmetic are both checked against exact maths.
"""
from __future__ import annotations

import decimal
import math

import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import evjax
from tests.helpers import THOROUGH
from evjax import registry
from evjax.primitives.jitc import generation

M32 = 0xFFFFFFFF


# ---------------------------------------------------------------------------
# the scheme in pure Python (exact integers)
# ---------------------------------------------------------------------------
def mix32(x):
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    return x ^ (x >> 16)


def stream_keys(seed, o):
    s = mix32(seed)
    ka = mix32((o * 0x9E3779B9 + s) & M32)
    return ka, mix32(ka ^ mix32(seed ^ 0x85EBCA6B))


def draw(ka, kb, c):
    return mix32((mix32(c ^ ka) + kb) & M32)


def neg_log2_q24(h):
    h = max(h, 1)
    e = 32 - h.bit_length()  # leading zeros
    u = h << e
    table = generation.log2_table()
    idx, frac = (u >> 21) & 1023, (u >> 5) & 0xFFFF
    lo, hi = int(table[idx]), int(table[idx + 1])
    return ((e + 1) << 24) - (lo + (((hi - lo) * frac) >> 16))


def python_rows(seed, prob, n_outer, n_inner):
    """{outer index: [(inner index, synapse number k)]} by the scheme, exactly."""
    r, s = generation.gap_multiplier(prob)
    rows = {}
    for o in range(n_outer):
        ka, kb = stream_keys(seed, o)
        pos, k, row = -1, 0, []
        while True:
            pos += 1 + min((neg_log2_q24(draw(ka, kb, 4 * k)) * r) >> s, n_inner)
            if pos >= n_inner:
                break
            row.append((pos, k))
            k += 1
        rows[o] = row
    return rows


def python_dense(law, params, seed, prob, n_outer, n_inner):
    g = np.zeros((n_outer, n_inner), np.float32)
    for o, row in python_rows(seed, prob, n_outer, n_inner).items():
        ka, kb = stream_keys(seed, o)
        for pos, k in row:
            if law == "scalar":
                w = np.float32(params[0])
            elif law == "uniform":
                u = np.float32(draw(ka, kb, 4 * k + 1) >> 8) * np.float32(2.0 ** -24)
                w = np.float32(params[0]) + (np.float32(params[1]) - np.float32(params[0])) * u
            else:
                radius = np.sqrt(np.float32(generation.TWO_LN2)
                                 * (np.float32(neg_log2_q24(draw(ka, kb, 4 * k + 1))) * np.float32(2.0 ** -24)))
                h2 = draw(ka, kb, 4 * k + 2)
                idx, frac = h2 >> 22, (h2 >> 14) & 255
                table = generation.cos_table()
                c = (int(table[idx]) * (256 - frac) + int(table[idx + 1]) * frac) >> 8
                z = radius * (np.float32(c - (1 << 22)) * np.float32(2.0 ** -22))
                w = np.float32(params[0]) + np.float32(params[1]) * z
            g[o, pos] = w
    return g


# ---------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------
def test_tables_and_multiplier_are_exact():
    k = np.arange(1025)
    assert np.max(np.abs(generation.log2_table().astype(np.int64) - np.round(np.log2(1 + k / 1024) * 2**24))) <= 1
    cos = np.round((np.cos(2 * np.pi * k / 1024) + 1) * 2**22)
    assert np.max(np.abs(generation.cos_table().astype(np.int64) - cos)) <= 1
    for p in (1e-6, 1e-3, 0.1, 0.5, 0.99):
        r, s = generation.gap_multiplier(p)
        assert 2**31 <= r < 2**32 or s == 63
        exact = 1 / (2**24 * -math.log2(1 - p))
        assert abs(r / 2**s - exact) <= 1e-9 * exact
    assert generation.gap_multiplier(1.0) == (0, 32)


@pytest.mark.parametrize("prob", [1e-4, 0.05, 0.5, 0.97])
def test_jax_gap_matches_exact_integers(prob):
    """The uint32-only JAX gap (64-bit product in 16-bit halves) equals floor(E2 * R / 2^S) exactly."""
    h = np.random.default_rng(0).integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32)
    h[:3] = [0, 1, 2**32 - 1]
    r, s = generation.gap_multiplier(prob)
    cap = 10**6
    got = np.asarray(generation.gap(jnp.asarray(h), r, s, cap))
    want = [min((neg_log2_q24(int(x)) * r) >> s, cap) for x in h]
    np.testing.assert_array_equal(got, np.array(want, np.uint32))


@pytest.mark.parametrize("law,params", [("scalar", (0.7,)), ("normal", (0.3, 1.2)), ("uniform", (-1.0, 2.0))])
def test_reference_matches_pure_python(law, params):
    """The JAX reference's generated matrix equals the pure-Python scheme: structure bitwise, weights
    within one rounding of the final product (:func:`assert_within_one_product_rounding`)."""
    seed, prob, n_outer, n_inner = 123456789, 0.3, 9, 13
    want = python_dense(law, params, seed, prob, n_outer, n_inner)
    fn = {"scalar": evjax.jits, "normal": evjax.jitn, "uniform": evjax.jitu}[law]
    got = np.asarray(fn(*params, prob, seed, shape=(n_outer, n_inner), corder=True, backend="reference"))
    np.testing.assert_array_equal(got != 0, want != 0)
    assert_within_one_product_rounding(got, want, params[0])
    if law == "scalar":
        np.testing.assert_array_equal(got, want)


def assert_within_one_product_rounding(got, want, offset):
    """``|got - want| <= ulp(want - offset) + ulp(want)``: the weights' last step, ``loc + scale * z``
    (``low + (high - low) * u``), rounds the product first in the pure-Python scheme and Numba, while
    XLA's CPU backend may contract it into an FMA (one rounding fewer).  Near a cancelling sum that is
    many ulps of the weight (25 measured, loc 0.3, scale 1.2), but never more than the product's."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    bound = np.spacing(np.abs(want - np.float32(offset))) + np.spacing(np.abs(want))
    excess = np.abs(got.astype(np.float64) - want.astype(np.float64)) - bound.astype(np.float64)
    assert excess.max() <= 0, f"weights differ by more than one rounding of the product: {excess.max()}"


def _backends():
    names = ["numba", "reference"]
    if registry.missing_library("warp") is None:
        names.append("warp")
    return names


@pytest.mark.parametrize("law,params", [("scalar", (1.5,)), ("normal", (0.5, 0.25)), ("uniform", (0.1, 0.9))])
def test_todense_identical_across_backends_and_orientations(law, params):
    """Same (shape, prob, seed): the same structure bitwise and weights within 1 ulp on every CPU backend,
    for both ways of computing each orientation, and M.T is the same matrix transposed."""
    fn = {"scalar": evjax.jits, "normal": evjax.jitn, "uniform": evjax.jitu}[law]
    shape, prob, seed = (37, 23), 0.2, 2024
    dense = {}
    for backend in _backends():
        for corder in (True, False):
            m = np.asarray(fn(*params, prob, seed, shape=shape, transpose=False, corder=corder, backend=backend))
            mt = np.asarray(fn(*params, prob, seed, shape=shape, transpose=True, corder=not corder, backend=backend))
            np.testing.assert_array_equal(m, mt.T)  # (transpose, corder) ~ (not transpose, not corder)
            dense[(backend, corder)] = m
    for corder in (True, False):
        want = dense[("reference", corder)]
        for backend in _backends():
            got = dense[(backend, corder)]
            np.testing.assert_array_equal(got != 0, want != 0, err_msg=f"{backend} corder={corder}")
            np.testing.assert_array_max_ulp(got, want, maxulp=1)
    cls = {"scalar": evjax.JITCScalarR, "normal": evjax.JITCNormalR, "uniform": evjax.JITCUniformR}[law]
    for corder in (True, False):
        m = cls(*params, prob=prob, seed=seed, shape=shape, corder=corder)
        np.testing.assert_array_equal(np.asarray(m.T.todense()), np.asarray(m.todense()).T)
        np.testing.assert_array_max_ulp(np.asarray(m.tocsr().todense()), np.asarray(m.todense()), maxulp=1)


def test_products_agree_with_todense_on_every_orientation():
    rng = np.random.default_rng(3)
    for cls in (evjax.JITCNormalR, evjax.JITCNormalC):
        for corder in (True, False):
            m = cls(0.2, 1.0, prob=0.3, seed=11, shape=(17, 29), corder=corder)
            d = np.asarray(m.todense(), np.float64)
            v, u = rng.standard_normal(29).astype(np.float32), rng.standard_normal(17).astype(np.float32)
            spikes = rng.random(17) < 0.3
            np.testing.assert_allclose(m @ v, d @ v, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(u @ m, u @ d, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(spikes @ m, spikes @ d, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(evjax.BinaryArray(spikes) @ m, spikes @ d, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(m.T @ u, d.T @ u, rtol=1e-5, atol=1e-5)
            B = rng.standard_normal((29, 3)).astype(np.float32)
            np.testing.assert_allclose(m @ B, d @ B, rtol=1e-5, atol=1e-5)


def test_statistics():
    """Fan-out is Binomial(n_inner, prob) (mean and variance); weights follow their laws (KS tests)."""
    n_outer, n_inner, prob = 2000, 1000, 0.05
    m = evjax.JITCNormalR(0.0, 1.0, prob=prob, seed=99, shape=(n_outer, n_inner), corder=True).tocsr()
    counts = np.diff(np.asarray(m.indptr))
    mean, var = n_inner * prob, n_inner * prob * (1 - prob)
    assert abs(counts.mean() - mean) < 5 * math.sqrt(var / n_outer)
    assert abs(counts.var() / var - 1) < 0.1
    cols = np.bincount(np.asarray(m.indices), minlength=n_inner)  # every inner index equally likely
    assert stats.chisquare(cols).pvalue > 1e-4
    z = np.asarray(m.data, np.float64)
    assert stats.kstest(z, "norm").pvalue > 1e-4
    u = np.asarray(evjax.JITCUniformR(2.0, 5.0, prob=prob, seed=7, shape=(400, 1000), corder=True).tocsr().data)
    assert u.min() >= 2.0 and u.max() < 5.0 and stats.kstest(u, "uniform", args=(2.0, 3.0)).pvalue > 1e-4
    # a new seed is a new draw: overlap of two structures is chance level (prob^2 of the entries)
    a = evjax.jits(1.0, 0.1, 1, shape=(200, 300)) != 0
    b = evjax.jits(1.0, 0.1, 2, shape=(200, 300)) != 0
    assert abs(float(jnp.mean(a & b)) - 0.01) < 0.004


@pytest.mark.parametrize("backend", [b for b in _backends() if b != "reference"])
def test_kernel_products_agree_with_todense(backend):
    """Every kernel kind of a backend (gather/scatter, mv/mm, float/spikes/weighted) against its own todense."""
    rng = np.random.default_rng(5)
    shape, prob, seed = (23, 31), 0.25, 9
    for transpose, corder in ((False, True), (False, False), (True, True), (True, False)):
        d = np.asarray(evjax.jitu(-0.5, 1.0, prob, seed, shape=shape, transpose=transpose, corder=corder,
                                  backend=backend), np.float64)
        n_in = d.shape[1]
        x = rng.standard_normal((n_in, 3)).astype(np.float32) * (rng.random((n_in, 3)) < 0.5)
        kw = dict(shape=shape, transpose=transpose, corder=corder, backend=backend)
        np.testing.assert_allclose(evjax.jitumv(-0.5, 1.0, prob, x[:, 0], seed, **kw), d @ x[:, 0], rtol=1e-5,
                                   atol=1e-5)
        np.testing.assert_allclose(evjax.jitumm(-0.5, 1.0, prob, x, seed, **kw), d @ x, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(evjax.binary_jitumv(-0.5, 1.0, prob, x[:, 0] != 0, seed, **kw),
                                   d @ (x[:, 0] != 0), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(evjax.binary_jitumm(-0.5, 1.0, prob, evjax.WeightedArray(x), seed, **kw),
                                   d @ x, rtol=1e-5, atol=1e-5)


def _float_term(w, x):
    return w * x


def _binary_term(w, x):
    return jnp.where(x != 0, w, jnp.zeros((), w.dtype))


@pytest.mark.parametrize("n_outer,n_inner,prob", [(37, 53, 0.2), (5, 200, 0.05), (1, 1, 1.0), (9, 7, 1.0),
                                                  (0, 5, 0.5), (4, 0, 0.5), (64, 3, 0.01)])
@pytest.mark.parametrize("width,rows", [(None, None), (3, 4), (1, 1)])
def test_streamed_product_equals_the_dense_product(n_outer, n_inner, prob, width, rows):
    """The O(synapses) reference (streams walked `width` synapses at a time, `rows` streams per block,
    so several steps and a padded last block) computes G @ x and G.T @ x of dense_generated's G."""
    rng = np.random.default_rng(n_outer + n_inner)
    params = [jnp.asarray([0.3]), jnp.asarray([1.2])]
    w, _ = generation.dense_generated("normal", params, jnp.uint32(77), prob, n_outer, n_inner, jnp.float32)
    w = np.asarray(w, np.float64)
    for scatter in (False, True):
        n_in = n_outer if scatter else n_inner
        for x in (rng.standard_normal(n_in), rng.standard_normal((n_in, 3))):
            want = (w.T if scatter else w) @ x
            got = generation.streamed_product("normal", params, jnp.uint32(77), prob, n_outer, n_inner,
                                              jnp.asarray(x, jnp.float32), _float_term, scatter=scatter,
                                              dtype=jnp.float32, width=width, rows=rows)
            assert got.shape == want.shape
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_streamed_product_walks_only_active_streams():
    """With outer_active, the scatter equals the product over the active outer indices alone, for no,
    one, some (fewer and more than a block) and all active."""
    rng = np.random.default_rng(9)
    params = [jnp.asarray([-0.5]), jnp.asarray([1.0])]
    w, _ = generation.dense_generated("uniform", params, jnp.uint32(3), 0.3, 30, 20, jnp.float32)
    x = rng.standard_normal(30)
    for active in (np.zeros(30, bool), np.eye(30, dtype=bool)[29], rng.random(30) < 0.2, rng.random(30) < 0.8,
                   np.ones(30, bool)):
        want = np.asarray(w, np.float64).T @ (x * active)
        got = generation.streamed_product("uniform", params, jnp.uint32(3), 0.3, 30, 20, jnp.asarray(x, jnp.float32),
                                          _float_term, scatter=True, dtype=jnp.float32,
                                          outer_active=jnp.asarray(active), rows=4)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_streamed_product_inactive_events_ignore_nan_weights():
    """NaN weights (law parameters) reach the output only through active events, in both orientations."""
    params = [jnp.asarray([jnp.nan])]
    events = np.zeros(40, bool)
    events[[3, 17]] = True
    w, mask = generation.dense_generated("scalar", [jnp.asarray([1.0])], jnp.uint32(5), 0.1, 40, 40, jnp.float32)
    mask = np.asarray(mask)
    for scatter, active in ((False, None), (True, None), (True, jnp.asarray(events))):
        # with outer_active (scatter only) just the active events' streams are generated
        got = np.asarray(generation.streamed_product("scalar", params, jnp.uint32(5), 0.1, 40, 40,
                                                     jnp.asarray(events), _binary_term, scatter=scatter,
                                                     dtype=jnp.float32, outer_active=active, width=2, rows=8))
        reached = ((mask.T if scatter else mask) @ events) > 0
        np.testing.assert_array_equal(np.isnan(got), reached)
        assert reached.any() and not reached.all()


def test_reference_product_at_a_size_whose_matrix_would_not_fit():
    """The reference backend at 2e5 x 2e5 (4e10 entries, 160 GB dense) generates only its ~1e6 synapses,
    and agrees with the Numba kernel."""
    n, prob = 200_000, 2.5e-5
    spikes = jnp.asarray(np.random.default_rng(0).random(n) < 0.2)
    kw = dict(shape=(n, n), transpose=True, corder=False)
    ref = evjax.binary_jitnmv(0.0, 1.0, prob, spikes, 42, backend="reference", **kw)
    kernel = evjax.binary_jitnmv(0.0, 1.0, prob, spikes, 42, backend="numba", **kw)
    np.testing.assert_allclose(np.asarray(ref), np.asarray(kernel), rtol=1e-5, atol=1e-5)
    assert float(jnp.sum(ref != 0)) > 1000


# ---------------------------------------------------------------------------
# a tiny prob: below the floor the scheme can represent, an empty matrix (docs/jit_connectivity.md)
# ---------------------------------------------------------------------------
# below PROB_FLOOR: the multiplier wrapped modulo 2^32 to R = 0 at the first two (gaps of 0: a full matrix),
# 1 - prob rounded to 1 at the next ones (decimal.DivisionByZero)
TINY = (float(np.nextafter(generation.PROB_FLOOR, 0.0)), 1.923869898279155e-17, 9.619349491395775e-18, 1e-29,
        1e-60, 5e-324)


def test_probability_floor_and_the_multiplier_around_it():
    """PROB_FLOOR is 1 - 2^(-2^-54) (the prob whose multiplier R / 2^S is 2^30) rounded up to a float; below it
    the multiplier is 2^30 (every gap >= 2^30 > n_inner), at and above it the exact one, which never wraps."""
    floor = generation.PROB_FLOOR
    exact = -math.expm1(-math.log(2) * 2.0 ** -54)
    assert abs(floor - exact) <= 2 * math.ulp(exact) and floor >= exact
    assert generation.EMPTY_MULTIPLIER == (2**31, 1)
    for p in TINY:
        assert generation.gap_multiplier(p) == generation.EMPTY_MULTIPLIER, p
    probs = [floor, float(np.nextafter(floor, 1.0)), 4e-17, 1e-16, 1e-12]
    probs += list(10.0 ** np.random.default_rng(0).uniform(np.log10(floor), 0, 2000))
    for p in probs:
        r, s = generation.gap_multiplier(p)
        assert 1 <= s <= 63 and (2**31 <= r < 2**32 or s == 63) and r > 0, (p, r, s)
        want = 1 / (2**24 * -math.log1p(-p) / math.log(2))
        assert abs(r / 2**s - want) <= 1e-9 * want, p
        assert r / 2**s <= 2**30 * (1 + 1e-9), p
    # the host's decimal context does not change the constants
    with decimal.localcontext() as ctx:
        ctx.prec = 6
        low_precision = generation.gap_multiplier(0.3)
    assert low_precision == generation.gap_multiplier(0.3)


def test_below_the_floor_every_gap_passes_the_largest_inner_size():
    """With the floor's multiplier every gap is at least 2^30, so even n_inner = 2^30 - 1 (the largest
    dimension) generates nothing: the exact integers, the JAX uint32 emulation and the scheme in Python."""
    r, s = generation.gap_multiplier(TINY[1])
    h = np.random.default_rng(1).integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32)
    h[:3] = [0, 1, 2**32 - 1]  # 2^32 - 1: the smallest -log2 (E2 = 1)
    cap = 2**30 - 1
    assert min(neg_log2_q24(int(x)) for x in h) >= 1
    assert all(min((neg_log2_q24(int(x)) * r) >> s, cap) == cap for x in h)
    np.testing.assert_array_equal(np.asarray(generation.gap(jnp.asarray(h), r, s, cap)), np.full(h.shape, cap))
    assert all(not row for row in python_rows(99, TINY[1], 64, cap).values())


@pytest.mark.parametrize("backend", _backends())
def test_tiny_prob_is_an_empty_matrix(backend):
    """prob below PROB_FLOOR: an empty matrix on every backend, in every orientation, for every product and the
    materialisers, as prob = 0 (it was a full matrix below 1.9e-17, and decimal.DivisionByZero below 1e-28)."""
    shape = (30, 40)
    orientations = ((False, True), (False, False), (True, True), (True, False))
    probs = TINY[:2] + TINY[3:4]  # just below the floor, wrapped to R = 0, DivisionByZero (prob is static)
    # CI budget: numba runs every prob in every orientation; the other backends (a compile per prob and op,
    # the floor handled by the same host code) each prob in one orientation, all of them under thorough
    cases = [(p, o) for p in probs for o in orientations] if backend == "numba" or THOROUGH else list(
        zip(probs, orientations))
    for prob in probs:
        for transpose, corder in (o for p, o in cases if p == prob):
            kw = dict(shape=shape, transpose=transpose, corder=corder, backend=backend)
            n_in, n_out = (shape[0], shape[1]) if transpose else (shape[1], shape[0])
            np.testing.assert_array_equal(evjax.jitu(-1.0, 2.0, prob, 3, **kw), 0.0, err_msg=f"{prob} jitu")
            ones = jnp.ones(n_in, jnp.float32)
            for y in (evjax.jitsmv(1.0, prob, ones, 3, **kw), evjax.binary_jitsmv(1.0, prob, ones > 0, 3, **kw),
                      evjax.binary_jitnmv(0.5, 1.0, prob, ones, 3, weighted=True, **kw),
                      evjax.jitumm(-1.0, 2.0, prob, jnp.ones((n_in, 2)), 3, **kw),
                      evjax.binary_jitnmm(0.5, 1.0, prob, jnp.ones((n_in, 2), bool), 3, **kw)):
                assert y.shape[0] == n_out
                np.testing.assert_array_equal(y, 0.0, err_msg=f"prob {prob}, {transpose}, {corder}")
        W = evjax.JITCNormalR(0.5, 1.0, prob=prob, seed=3, shape=shape, corder=True, backend=backend)
        assert W.tocsr().nnz == 0
        np.testing.assert_array_equal(jnp.ones(shape[0], bool) @ W, 0.0)
    # at the floor and above it the matrix is generated as usual (here, at 1200 entries, still empty)
    for prob in (generation.PROB_FLOOR, 1e-12):
        np.testing.assert_array_equal(evjax.jits(1.0, prob, 3, shape=shape, backend=backend), 0.0)

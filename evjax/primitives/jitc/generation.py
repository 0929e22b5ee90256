"""The just-in-time connectivity generation scheme, and its pure-JAX form.

A JITC matrix is generated one *outer* index at a time (a row, or a column,
see :mod:`.ops` for which); outer index ``o`` owns a counter-based random
stream keyed by ``(seed, o)``, so any thread can start any outer index, and
the same ``(shape, prob, seed)`` gives the same matrix on every backend, for
every thread count and both orientations of the op.

Every step that decides the *structure* is integer arithmetic on ``uint32``
(``uint64`` products on the kernels, the same 64-bit product emulated with
16-bit halves in JAX, which has no ``uint64`` without x64), so the structure
is bitwise identical everywhere: no float, no libm, no FMA contraction.

* Hash: ``mix32`` is a 32-bit integer finaliser (xorshift-multiply, two
  rounds).  Keys of outer index ``o``::

      s  = mix32(seed)
      ka = mix32(o * 0x9E3779B9 + s)        # distinct for distinct o (a bijection)
      kb = mix32(ka ^ mix32(seed ^ 0x85EBCA6B))
      draw(c) = mix32(mix32(c ^ ka) + kb)   # the c-th draw of o's stream

  Synapse ``k`` of ``o`` uses counters ``4k`` (its gap), ``4k + 1`` and
  ``4k + 2`` (its weight).

* Gap (geometric skipping): the inner index of synapse ``k`` is
  ``pos_k = pos_{k-1} + 1 + gap_k`` (``pos_{-1} = -1``), and the stream ends
  at the first ``pos_k >= n_inner``; the cost is proportional to the synapses
  generated, not to ``n_inner``.  ``gap = floor(E / lambda)`` with
  ``E = -ln u`` exponential and ``lambda = -ln(1 - prob)``, so
  ``P(gap >= g) = (1 - prob)^g``: every inner index is a synapse with
  probability ``prob`` independently, and the expected fan-out is
  ``prob * n_inner``.  In integers: ``E2 = -log2 u`` in Q24 fixed point from
  the leading-zero count of the draw and a 1025-entry table of ``log2`` on
  ``[1, 2]`` with linear interpolation (error below ``2e-7``), then
  ``gap = min((E2 * R) >> S, n_inner)`` with ``R / 2^S = 1 / (2^24 log2(1 / (1 - prob)))``
  computed once on the host in exact decimal arithmetic (:func:`gap_multiplier`); a ``prob`` below
  :data:`PROB_FLOOR` (about 3.85e-17) gets ``R / 2^S = 2^30``, an empty matrix at every supported size.

* Weights (floats, within one rounding of the last product across backends): uniform
  ``u = (draw(4k + 1) >> 8) * 2^-24`` (exact in float32), ``w = low + (high - low) u``;
  normal by Box-Muller, ``z = sqrt(2 ln 2 * E2) * cos(2 pi v)`` with ``E2`` the
  integer ``-log2`` above of ``draw(4k + 1)`` and the cosine from a 1025-entry
  integer table of ``draw(4k + 2)`` (Q22, interpolated in integers), so ``z``
  takes one int->float conversion, one product, one ``sqrt`` and one product,
  each correctly rounded by IEEE 754 everywhere, and nothing a compiler can
  contract into an FMA.  Only ``loc + scale * z`` (and ``low + (high - low) u``)
  may be contracted on one backend (XLA's CPU backend does) and not another
  (Numba does not): one rounding of the product, which near a cancelling sum
  is many ulps of the weight (docs/jit_connectivity.md).
"""
from __future__ import annotations

import decimal
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "log2_table", "cos_table", "TWO_LN2", "PROB_FLOOR", "EMPTY_MULTIPLIER", "gap_multiplier", "keys", "draw",
    "neg_log2_q24", "gap",
    "unit_uniform", "standard_normal", "dense_generated", "streamed_product",
]

LOG2_BITS = 10  # the log2 table has 2^10 + 1 entries on [1, 2]
COS_BITS = 10  # the cosine table has 2^10 + 1 entries on [0, 2 pi]
TWO_LN2 = float(np.float32(2.0 * math.log(2.0)))  # the float32 constant of Box-Muller's radius


@functools.lru_cache(maxsize=None)
def log2_table() -> np.ndarray:
    """``T[k] = round(2^24 log2(1 + k / 1024))``, k = 0..1024 (uint32; made on first use, not at import)."""
    # T[k] = round(2^24 log2(1 + k / 1024)), computed in 40-digit decimals: the same integers on any host
    ctx = decimal.Context(prec=40)
    ln2 = ctx.ln(decimal.Decimal(2))
    size = 1 << LOG2_BITS
    values = [ctx.ln(decimal.Decimal(size + k) / size) / ln2 * (1 << 24) for k in range(size + 1)]
    return np.array([int(v.to_integral_value(decimal.ROUND_HALF_EVEN)) for v in values], np.uint32)


@functools.lru_cache(maxsize=None)
def cos_table() -> np.ndarray:
    """``C[k] = round(2^22 (cos(2 pi k / 1024) + 1))``, k = 0..1024 (uint32)."""
    # C[k] = round(2^22 (cos(2 pi k / 1024) + 1)) in [0, 2^23]; integers, so a libm ulp cannot change them
    size = 1 << COS_BITS
    return np.array([round((math.cos(2.0 * math.pi * k / size) + 1.0) * (1 << 22)) for k in range(size + 1)],
                    np.uint32)


# The smallest multiplier R / 2^S the scheme uses is 2^30: every gap is then >= 2^30 (E2 >= 1 for every draw), at
# least n_inner (< 2^30 for every supported shape), so no synapse is generated.  R / 2^S = 2^30 is the multiplier
# of prob = 1 - 2^(-2^-54) ~ ln(2) 2^-54 ~ 3.85e-17; below it the exact multiplier would need S < 1 (it wrapped
# modulo 2^32 below 1.9e-17, giving gaps of 0: a full matrix) and 1 - prob rounds to 1 in decimal arithmetic
# below 1e-50 (DivisionByZero).  So every prob below that floor gets the floor's multiplier: an empty matrix.
EMPTY_MULTIPLIER = (1 << 31, 1)  # R / 2^S = 2^30


def _probability_floor() -> float:
    """The smallest float64 ``p`` with ``1 / (2^24 log2(1 / (1 - p))) <= 2^30``: ``1 - 2^(-2^-54)``, rounded up."""
    ctx = decimal.Context(prec=80)
    exact = ctx.subtract(1, ctx.exp(ctx.minus(ctx.multiply(ctx.ln(2), ctx.power(2, -54)))))
    p = float(exact)
    return p if decimal.Decimal(p) >= exact else float(np.nextafter(p, 1.0))


PROB_FLOOR = _probability_floor()  # ~3.8474e-17: a prob below it gives an empty matrix (EMPTY_MULTIPLIER)


def gap_multiplier(prob: float) -> tuple[int, int]:
    """``(R, S)`` with ``R / 2^S = 1 / (2^24 * log2(1 / (1 - prob)))``, ``R < 2^32`` (exact decimal maths).

    ``prob = 1`` gives ``(0, 32)`` (every gap 0: a dense matrix).  ``0 < prob < PROB_FLOOR`` (about 3.85e-17)
    gives :data:`EMPTY_MULTIPLIER`, ``R / 2^S = 2^30``: every gap is at least ``2^30 > n_inner``, an empty
    matrix (the expected number of synapses of a row is below ``2^30 * PROB_FLOOR ~ 4e-8`` at any supported
    size).  Otherwise ``S >= 1`` and ``2^31 <= R < 2^32`` (or ``S = 63``).  ``prob`` must be in ``(0, 1]``.
    The decimal arithmetic runs in its own 50-digit context (not the caller's ``decimal`` context).
    """
    if prob >= 1.0:
        return 0, 32
    if prob < PROB_FLOOR:
        return EMPTY_MULTIPLIER
    ctx = decimal.Context(prec=50)
    lam2 = ctx.divide(ctx.minus(ctx.ln(ctx.subtract(1, decimal.Decimal(prob)))), ctx.ln(2))  # log2(1/(1-p)) > 0
    inv = ctx.divide(1, ctx.multiply(lam2, 1 << 24))
    shift = 63
    while shift > 1 and int(ctx.multiply(inv, 1 << shift)) >= (1 << 32):
        shift -= 1
    r = int(ctx.multiply(inv, 1 << shift).to_integral_value(decimal.ROUND_HALF_EVEN))
    if r >= (1 << 32):  # rounded up to 2^32: one bit less (never wraps to 0)
        shift -= 1
        r = int(ctx.multiply(inv, 1 << shift).to_integral_value(decimal.ROUND_HALF_EVEN))
    return r, shift


# ---------------------------------------------------------------------------
# pure JAX (uint32 only): the reference backend's generation
# ---------------------------------------------------------------------------
def _u32(x):
    return jnp.asarray(x, jnp.uint32)


def mix32(x):
    """The 32-bit finaliser: two xorshift-multiply rounds (a bijection of uint32)."""
    x = x ^ (x >> 16)
    x = x * _u32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * _u32(0x846CA68B)
    return x ^ (x >> 16)


def keys(seed, outer):
    """``(ka, kb)`` of outer indices ``outer`` (uint32 arrays) for ``seed`` (uint32 scalar)."""
    s = mix32(_u32(seed))
    ka = mix32(_u32(outer) * _u32(0x9E3779B9) + s)
    kb = mix32(ka ^ mix32(_u32(seed) ^ _u32(0x85EBCA6B)))
    return ka, kb


def draw(ka, kb, counter):
    """The ``counter``-th uint32 of the stream keyed by ``(ka, kb)``."""
    return mix32(mix32(_u32(counter) ^ ka) + kb)


def neg_log2_q24(h):
    """``-log2(h / 2^32)`` in Q24 fixed point (``h = 0`` read as 1), integers only."""
    u = jnp.maximum(h, _u32(1))
    e = jnp.zeros_like(u)
    for bits in (16, 8, 4, 2, 1):  # leading zeros, by halving
        small = u < _u32(1 << (32 - bits))
        u = jnp.where(small, u << bits, u)
        e = jnp.where(small, e + _u32(bits), e)
    table = jnp.asarray(log2_table())
    idx = (u >> 21) & _u32(1023)
    frac = (u >> 5) & _u32(0xFFFF)
    lo = table[idx]
    log2_m = lo + (((table[idx + 1] - lo) * frac) >> 16)  # log2(u / 2^31) in [0, 1), Q24
    return ((e + _u32(1)) << 24) - log2_m


def _mul_shift(a, r: int, s: int):
    """``(floor(a * r / 2^s), overflow)`` for uint32 ``a < 2^29``, ``r < 2^32``: the 64-bit product in halves."""
    r0, r1 = _u32(r & 0xFFFF), _u32(r >> 16)
    a0, a1 = a & _u32(0xFFFF), a >> 16
    p00, p01, p10, p11 = a0 * r0, a0 * r1, a1 * r0, a1 * r1
    mid = (p00 >> 16) + (p01 & _u32(0xFFFF)) + (p10 & _u32(0xFFFF))
    lo = (p00 & _u32(0xFFFF)) | (mid << 16)
    hi = p11 + (p01 >> 16) + (p10 >> 16) + (mid >> 16)
    if s >= 32:
        return hi >> (s - 32), jnp.zeros(a.shape, bool)
    return (hi << (32 - s)) | (lo >> s), (hi >> s) != 0


def gap(h, r: int, s: int, cap):
    """The geometric gap of draw ``h``: ``min(floor(E2 * r / 2^s), cap)``."""
    q, over = _mul_shift(neg_log2_q24(h), r, s)
    cap = _u32(cap)
    return jnp.where(over, cap, jnp.minimum(q, cap))


def unit_uniform(h, dtype):
    """``(h >> 8) * 2^-24`` in [0, 1): exact in float32 and float64."""
    return (h >> 8).astype(jnp.float32).astype(dtype) * jnp.asarray(2.0 ** -24, dtype)


def standard_normal(h1, h2):
    """Box-Muller ``z`` (float32) from two draws: radius from the integer ``-log2``, cosine from a table."""
    radius2 = neg_log2_q24(h1).astype(jnp.float32) * jnp.float32(2.0 ** -24)
    radius = jnp.sqrt(jnp.float32(TWO_LN2) * radius2)
    table = jnp.asarray(cos_table())
    idx = h2 >> 22
    frac = (h2 >> 14) & _u32(255)
    c = (table[idx] * (_u32(256) - frac) + table[idx + 1] * frac) >> 8
    cosine = (c.astype(jnp.int32) - jnp.int32(1 << 22)).astype(jnp.float32) * jnp.float32(2.0 ** -22)
    return radius * cosine


def _saturating_cumsum(steps, cap):
    """``min(cumsum(steps, axis=1), cap)`` without overflow (entries <= cap < 2^31): Hillis-Steele,
    log2(width) shifted adds, each saturated.  Saturating addition is associative for entries >= 0,
    ``min(min(a + b, cap) + c, cap) = min(a + b + c, cap)``, so any scan order gives the same result;
    this one compiles to a few fused loops (``lax.associative_scan``'s slices took XLA 0.3 s)."""
    shift = 1
    while shift < steps.shape[1]:
        before = jnp.pad(steps[:, :-shift], ((0, 0), (shift, 0)))  # 0: the identity
        steps = jnp.minimum(steps + before, cap)
        shift *= 2
    return steps


def _stream_ends(ka, kb, k, r: int, s: int, n_inner: int, base=None):
    """``pos_k + 1`` of synapses ``k`` (a row per stream), saturated at ``n_inner + 1`` (past the end):
    ``pos_k = pos_{k-1} + 1 + gap_k``, starting after ``base`` (each stream's previous ``pos + 1``; 0)."""
    cap = jnp.uint32(n_inner + 1)
    steps = gap(draw(ka, kb, k * 4), r, s, n_inner) + jnp.uint32(1)
    if base is not None:
        steps = steps.at[:, 0].set(jnp.minimum(steps[:, 0] + base, cap))
    return _saturating_cumsum(steps, cap)


def dense_generated(law: str, params, seed, prob: float, n_outer: int, n_inner: int, dtype):
    """The generated matrix ``G`` (``n_outer x n_inner``) as ``(weights, mask)``, dense.

    Row ``o`` of ``G`` is outer index ``o``'s stream; ``mask`` marks the synapses
    and ``weights`` holds their values (0 elsewhere).  O(n_outer * n_inner): the
    materialisers' reference (``jitn`` ...) and the tests' oracle.
    """
    zeros = jnp.zeros((n_outer, n_inner), dtype)
    if n_outer == 0 or n_inner == 0:
        return zeros, jnp.zeros((n_outer, n_inner), bool)
    r, s = gap_multiplier(prob)
    ka, kb = keys(seed, jnp.arange(n_outer, dtype=jnp.uint32))
    ka, kb = ka[:, None], kb[:, None]
    k = jnp.arange(n_inner, dtype=jnp.uint32)[None, :]  # at most n_inner synapses per outer index
    # inner index of synapse k, saturated at n_inner (past the end: no synapse)
    pos = _stream_ends(ka, kb, k, r, s, n_inner) - jnp.uint32(1)
    valid = pos < jnp.uint32(n_inner)
    w = _weights(law, params, ka, kb, k, dtype)
    rows = jnp.broadcast_to(jnp.arange(n_outer)[:, None], pos.shape)
    cols = jnp.where(valid, pos, 0).astype(jnp.int32)
    weights = zeros.at[rows, cols].add(jnp.where(valid, w, jnp.zeros((), dtype)))
    mask = jnp.zeros((n_outer, n_inner), bool).at[rows, cols].max(valid)
    return weights, mask


def _weights(law: str, params, ka, kb, k, dtype):
    """Synapse ``k``'s weight: the law's formula on counters ``4k + 1`` and ``4k + 2``."""
    if law == "scalar":  # w
        return jnp.broadcast_to(params[0].astype(dtype), k.shape)
    h1 = draw(ka, kb, k * 4 + jnp.uint32(1))
    if law == "uniform":  # w = low + (high - low) u
        low, high = params[0].astype(dtype), params[1].astype(dtype)
        return low + (high - low) * unit_uniform(h1, dtype)
    z = standard_normal(h1, draw(ka, kb, k * 4 + jnp.uint32(2)))  # w = loc + scale z
    return params[0].astype(dtype) + params[1].astype(dtype) * z.astype(dtype)


# ---------------------------------------------------------------------------
# pure JAX, O(synapses): the product generated stream by stream, in blocks
# ---------------------------------------------------------------------------
STREAM_BLOCK_ENTRIES = 1 << 20  # rows x synapses x columns of one block (bounds the memory)


def streamed_product(law: str, params, seed, prob: float, n_outer: int, n_inner: int, x, term, *,
                     scatter: bool, dtype, outer_active=None, width: int | None = None, rows: int | None = None,
                     first_outer=0):
    """``G @ x`` (gather) or ``G.T @ x`` (``scatter``), generating only the synapses.

    The same streams as :func:`dense_generated`, walked ``width`` synapses at a
    time for ``rows`` outer indices at a time (a ``while_loop`` per block of rows
    runs until every stream of the block has ended), so the cost is
    O(synapses + n_outer) and the memory one block, not the ``n_outer x n_inner``
    matrix.  ``term(w, x_values)`` is a synapse's contribution (0 where it must be
    nothing, e.g. an inactive event); ``x`` is ``(n_in,)`` or ``(n_in, k)``.

    Args:
        outer_active: for ``scatter``, a bool ``(n_outer,)`` of the outer indices that can contribute
            (active events): only their streams are generated, the others contribute nothing.
        width: synapses per stream and step (default: a few standard deviations past the mean fan-out).
        rows: outer indices per block (default: ``STREAM_BLOCK_ENTRIES`` entries per block).
        first_outer: the global index of outer index 0 (a slice ``[first, first + n_outer)`` of a
            larger matrix's outer indices: their streams are keyed by their global index).
    """
    n_out = n_inner if scatter else n_outer
    y = jnp.zeros((n_out,) + x.shape[1:], dtype)
    if n_outer == 0 or n_inner == 0:
        return y
    r, s = gap_multiplier(prob)
    mean = prob * n_inner
    width = int(width or min(n_inner, max(8, math.ceil(mean + 4.0 * math.sqrt(mean) + 4))))
    cols = max(1, math.prod(x.shape[1:]))
    rows = int(rows or max(1, min(n_outer, STREAM_BLOCK_ENTRIES // (width * cols))))
    if outer_active is None:
        order, count = jnp.arange(n_outer), n_outer
    else:  # event-driven: the active outer indices first, then walk only those
        order = jnp.nonzero(outer_active, size=n_outer, fill_value=n_outer - 1)[0]
        count = jnp.sum(outer_active, dtype=jnp.int32)
    k_step = jnp.arange(width, dtype=jnp.uint32)[None, :]

    def block(b, y):
        slot = b * rows + jnp.arange(rows)
        live = slot < count  # the last block is padded
        outer = order[jnp.minimum(slot, n_outer - 1)]
        ka, kb = keys(seed, (outer + first_outer).astype(jnp.uint32))
        ka, kb = ka[:, None], kb[:, None]
        x_outer = x[outer][:, None] if scatter else None

        def step(carry):
            k0, base, y = carry  # base: the position after each stream's last synapse (saturated)
            k = k0 + k_step
            end = _stream_ends(ka, kb, k, r, s, n_inner, base)  # pos_k + 1
            valid = (end <= jnp.uint32(n_inner)) & live[:, None]
            pos = jnp.where(valid, end - jnp.uint32(1), 0).astype(jnp.int32)
            w = _weights(law, params, ka, kb, k, dtype)
            if x.ndim == 2:
                w, valid_x = w[:, :, None], valid[:, :, None]
            else:
                valid_x = valid
            zero = jnp.zeros((), dtype)
            if scatter:
                contrib = jnp.where(valid_x, term(w, x_outer), zero)
                y = y.at[pos].add(contrib)
            else:
                contrib = jnp.where(valid_x, term(w, x[pos]), zero)
                y = y.at[outer].add(jnp.sum(contrib, axis=1))
            return k0 + jnp.uint32(width), end[:, -1], y

        def more(carry):
            return jnp.any((carry[1] < jnp.uint32(n_inner)) & live)

        start = (jnp.uint32(0), jnp.zeros((rows,), jnp.uint32), y)
        return jax.lax.while_loop(more, step, start)[2]

    def more_blocks(carry):
        return carry[0] * rows < count

    def next_block(carry):
        return carry[0] + 1, block(carry[0], carry[1])

    return jax.lax.while_loop(more_blocks, next_block, (jnp.int32(0), y))[1]

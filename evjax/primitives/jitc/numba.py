"""Numba CPU backend of the JITC ops in :mod:`evjax.primitives.jitc.ops`.

Imported by the ops the first time they lower with ``backend="numba"``; it
registers its generators on them (:mod:`.kernel_args`'s, with :func:`_launcher`).  The generation scheme is
:mod:`.generation`'s, in Numba in :mod:`.numba_stream` (bitwise the
reference's structure; no kernel uses ``fastmath``, so LLVM contracts nothing).

Kernels (one per kind and weight law, :data:`KERNELS`): each walks a
stream in blocks of :data:`BLOCK` synapses, whose gaps (one vectorised loop)
and weights (the law's block function, ``_wb_scalar``/``_wb_normal``/
``_wb_uniform``, passed to the shared row loops, so each kernel compiles only
its own law) are drawn together, then visits the synapses of the block in order:

* ``gather_mv``/``gather_mm`` (``corder=True``): ``y[o] = sum_i G[o, i] x[i]``,
  parallel over outer indices, every synapse generated;
* ``scatter_mv``/``scatter_mm`` (``corder=False``): ``y[i] += G[o, i] x[o]``;
  with events (``cfg[2] = 1``) a zero ``x[o]`` is skipped before its stream
  is even keyed, so the cost follows the synapses of active inputs.  Parallel
  runs split the outer indices into per-thread ranges of equal active count,
  each thread scattering into a private copy of ``y``, summed at the end;
* ``dense``: ``G`` (gather) or ``G.T`` (scatter) written into a zeroed matrix.

Every kernel takes ``threads`` (the thread count in force, an int64 its handler passes), ``params`` (the two
weight parameters, compute dtype), ``seed`` (one uint32) and ``cfg`` (uint32:
the gap multiplier ``R``, its shift ``S``, whether zeros are skipped, the
expected fan-out).  Events are passed as floats (1.0 for a spike, the value
for weighted events) with ``cfg[2] = 1``: a zero entry is skipped (select),
a nonzero one multiplies (``w * 1.0 == w`` exactly, NaN and inf included).
"""
from __future__ import annotations

import numba
import numpy as np
from numba import prange

from ..._kernel_compat import COMPILED_CODE_ONLY, prange_only
from ...backends import numba_cpu
from ...backends.threads import add_parts, part_done, pool_chunks, region_done, start_region
from ...dtypes import compute_dtype
from . import ops
from .kernel_args import config, dense_generator, matmul_generator
from .numba_stream import (  # the generation scheme, inlined: keys, gaps, weights, blocks of synapses
    BLOCK,
    stack_array,
    _U1,
    _gap,
    _keys,
    _next_block,
    _scratch,
    _w_normal,
    _w_scalar,
    _w_uniform,
    _wb_normal,
    _wb_scalar,
    _wb_uniform,
)

__all__ = ["KERNELS", "SERIAL_TIERS", "generated_structure"]

# Below this many synapses (expected) a kernel stays on the calling thread.
PARALLEL_MIN_WORK = 65536
_PARALLEL = prange_only()  # a ParallelOptions: Numba would empty a shared dict on the first compile
DONE, SPLITTABLE, DECLINED = numba_cpu.DONE, numba_cpu.SPLITTABLE, numba_cpu.DECLINED
_INLINE = dict(cache=True, nogil=True, inline="always", **COMPILED_CODE_ONLY)
_KERNEL = dict(parallel=_PARALLEL, cache=True, nogil=True)


# ---------------------------------------------------------------------------
# row loops (inlined into the kernels): one outer index's synapses
# ---------------------------------------------------------------------------
@numba.njit(**_INLINE)
def _first_outer(seed):
    """The global index of the first outer index a gather computes: ``seed[1]`` when the seed operand
    carries it (a device's slice of the outputs, see ``ops._matmul_partition``), else 0."""
    return np.int64(seed[1]) if seed.shape[0] > 1 else np.int64(0)


@numba.njit(**_INLINE)
def _gather_rows(weights, params, seed, cfg, x, out, lo, hi):
    """``out[o] = sum_{i in row o} w_oi x[i]`` for o in [lo, hi); skip zero x when cfg[2]."""
    n_inner = x.shape[0]
    r, s, skip = np.uint64(cfg[0]), np.uint64(cfg[1]), cfg[2] != 0
    sd = np.uint64(seed[0])
    first = _first_outer(seed)
    p0, p1 = params[0], params[1]
    at, w = _scratch(out)
    for o in range(lo, hi):
        ka, kb = _keys(sd, first + o)
        acc = out.dtype.type(0)
        pos, k, count = np.int64(-1), np.uint64(0), BLOCK
        while count == BLOCK:
            count, pos = _next_block(weights, ka, kb, k, pos, r, s, n_inner, p0, p1, at, w)
            for j in range(count):
                xi = x[at[j]]
                if not (skip and xi == 0):
                    acc += w[j] * xi
            k += np.uint64(BLOCK)
        out[o] = acc


@numba.njit(**_INLINE)
def _scatter_rows(weights, params, seed, cfg, x, out, lo, hi):
    """``out[i] += w_oi x[o]`` for o in [lo, hi); a zero x[o] generates nothing when cfg[2]."""
    n_inner = out.shape[0]
    r, s, skip = np.uint64(cfg[0]), np.uint64(cfg[1]), cfg[2] != 0
    sd = np.uint64(seed[0])
    p0, p1 = params[0], params[1]
    at, w = _scratch(out)
    for o in range(lo, hi):
        xo = x[o]
        if skip and xo == 0:
            continue
        ka, kb = _keys(sd, o)
        pos, k, count = np.int64(-1), np.uint64(0), BLOCK
        while count == BLOCK:
            count, pos = _next_block(weights, ka, kb, k, pos, r, s, n_inner, p0, p1, at, w)
            for j in range(count):
                out[at[j]] += w[j] * xo
            k += np.uint64(BLOCK)


@numba.njit(**_INLINE)
def _add_scaled(target, w, v, skip):
    """``target[c] += w * v[c]``; entries with ``v[c] == 0`` skipped when ``skip`` (events select)."""
    for c in range(v.shape[0]):
        if not (skip and v[c] == 0):
            target[c] += w * v[c]


@numba.njit(**_INLINE)
def _gather_mm_rows(weights, params, seed, cfg, x, out, lo, hi):
    """``out[o, c] = sum_{i in row o} w_oi x[i, c]`` for o in [lo, hi)."""
    n_inner = x.shape[0]
    r, s, skip = np.uint64(cfg[0]), np.uint64(cfg[1]), cfg[2] != 0
    sd = np.uint64(seed[0])
    first = _first_outer(seed)
    p0, p1 = params[0], params[1]
    width = x.shape[1]
    at, w = _scratch(out)
    for o in range(lo, hi):
        row = out[o]
        for c in range(width):
            row[c] = 0
        ka, kb = _keys(sd, first + o)
        pos, k, count = np.int64(-1), np.uint64(0), BLOCK
        while count == BLOCK:
            count, pos = _next_block(weights, ka, kb, k, pos, r, s, n_inner, p0, p1, at, w)
            for j in range(count):
                _add_scaled(row, w[j], x[at[j]], skip)
            k += np.uint64(BLOCK)


@numba.njit(**_INLINE)
def _scatter_mm_rows(weights, params, seed, cfg, x, out, lo, hi):
    """``out[i, c] += w_oi x[o, c]`` for o in [lo, hi); all-zero rows of x skipped when cfg[2]."""
    n_inner = out.shape[0]
    r, s, skip = np.uint64(cfg[0]), np.uint64(cfg[1]), cfg[2] != 0
    sd = np.uint64(seed[0])
    p0, p1 = params[0], params[1]
    at, w = _scratch(out)
    for o in range(lo, hi):
        xo = x[o]
        if skip and _all_zero(xo):
            continue
        ka, kb = _keys(sd, o)
        pos, k, count = np.int64(-1), np.uint64(0), BLOCK
        while count == BLOCK:
            count, pos = _next_block(weights, ka, kb, k, pos, r, s, n_inner, p0, p1, at, w)
            for j in range(count):
                _add_scaled(out[at[j]], w[j], xo, skip)
            k += np.uint64(BLOCK)


@numba.njit(**_INLINE)
def _dense_rows(weights, params, seed, cfg, out, n_outer, n_inner, direct, lo, hi):
    """``G[o, i] = w_oi`` (``direct``) or ``G.T`` into ``out`` (zeroed) for o in [lo, hi)."""
    r, s = np.uint64(cfg[0]), np.uint64(cfg[1])
    sd = np.uint64(seed[0])
    p0, p1 = params[0], params[1]
    at, w = _scratch(out)
    for o in range(lo, hi):
        ka, kb = _keys(sd, o)
        pos, k, count = np.int64(-1), np.uint64(0), BLOCK
        while count == BLOCK:
            count, pos = _next_block(weights, ka, kb, k, pos, r, s, n_inner, p0, p1, at, w)
            for j in range(count):
                if direct:
                    out[o, at[j]] = w[j]
                else:
                    out[at[j], o] = w[j]
            k += np.uint64(BLOCK)


@numba.njit(**_INLINE)
def _all_zero(v):
    for c in range(v.shape[0]):
        if v[c] != 0:
            return False
    return True


@numba.njit(**_INLINE)
def _fill_zero(flat):
    for j in range(flat.shape[0]):
        flat[j] = 0


# ---------------------------------------------------------------------------
# the kernels' bodies: serial below PARALLEL_MIN_WORK, else split over the pool
# ---------------------------------------------------------------------------
@numba.njit(**_INLINE)
def _threads(threads, work):
    return 1 if threads < 2 or work < PARALLEL_MIN_WORK else threads


@numba.njit(**_INLINE)
def _nonzero(v):
    return v != 0


@numba.njit(**_INLINE)
def _nonzero_row(v):
    return not _all_zero(v)


@numba.njit(**_INLINE)
def _gather(rows, weight, threads, params, seed, cfg, x, out):
    n_outer = out.shape[0]
    width = x.size // max(x.shape[0], 1)
    threads = _threads(threads, n_outer * np.int64(cfg[3]) * width)
    if threads == 1:
        rows(weight, params, seed, cfg, x, out, 0, n_outer)
        return
    chunks = 4 * threads  # outer indices have equal expected work: contiguous chunks
    ends, t0 = start_region(chunks)
    for t in prange(chunks):
        rows(weight, params, seed, cfg, x, out, (n_outer * t) // chunks, (n_outer * (t + 1)) // chunks)
        part_done(ends, t)
    region_done(ends, t0)


@numba.njit(**_INLINE)
def _active_count(is_active, x, skip):
    """The outer indices a scatter visits: the active (nonzero) ones when skipping, else all."""
    total = 0
    for o in range(x.shape[0]):
        total += 1 if (not skip) or is_active(x[o]) else 0
    return total


@numba.njit(**_INLINE)
def _active_bounds(is_active, x, skip, parts, total):
    """``parts`` outer ranges with equal numbers of the ``total`` visited rows (no array of ``n`` counts)."""
    n = x.shape[0]
    bounds = np.full(parts + 1, n, np.int64)
    bounds[0] = 0
    t, seen = 1, 0
    for o in range(n):
        if t >= parts:
            break
        seen += 1 if (not skip) or is_active(x[o]) else 0
        while t < parts and seen * parts > total * t:
            bounds[t] = o + 1
            t += 1
    return bounds


@numba.njit(**_INLINE)
def _scatter_part(rows, weight, params, seed, cfg, x, out, private, bounds, part):
    """Part ``part`` of a split scatter into ``out`` (part 0) or its private copy (inlined: ``rows`` and
    ``weight`` stay static calls, which Numba can cache)."""
    target = out if part == 0 else private[part - 1]
    rows(weight, params, seed, cfg, x, target, bounds[part], bounds[part + 1])


@numba.njit(**_INLINE)
def _scatter_serially(rows, is_active, weight, threads, params, seed, cfg, x, out):
    """A scatter in one pass (DONE), or DECLINED (nothing written) where :func:`_scatter` splits its
    sum into parts (other bits)."""
    flat = out.reshape(-1)
    pool = np.int64(pool_chunks())
    active = _active_count(is_active, x, cfg[2] != 0)
    work = active * np.int64(cfg[3]) * (x.size // max(x.shape[0], 1))
    if not (_threads(pool, work) == 1 or 4 * work < flat.shape[0]):  # (else private copies would dominate)
        return DECLINED
    _fill_zero(flat)
    rows(weight, params, seed, cfg, x, out, 0, x.shape[0])
    return DONE


@numba.njit(**_INLINE)
def _scatter_plan(is_active, cfg, x, out):
    """The parts a split scatter's sum has (Numba's pool size at most, each with at least 4 synapses an
    output) and their outer ranges of equal active count."""
    flat = out.reshape(-1)
    pool = np.int64(pool_chunks())
    active = _active_count(is_active, x, cfg[2] != 0)
    work = active * np.int64(cfg[3]) * (x.size // max(x.shape[0], 1))
    parts = min(pool, max(np.int64(2), work // (4 * flat.shape[0])))
    return parts, _active_bounds(is_active, x, cfg[2] != 0, parts, active)


@numba.njit(**_INLINE)
def _scatter_in_parts(rows, is_active, weight, threads, params, seed, cfg, x, out):
    """A scatter on this thread: in one pass (:func:`_scatter_serially`), or its parts in turn, each
    into its own copy of ``out``, summed in order: the bits of the parallel run (SPLITTABLE on
    several threads)."""
    if _scatter_serially(rows, is_active, weight, threads, params, seed, cfg, x, out) == DONE:
        return DONE
    flat = out.reshape(-1)
    _fill_zero(flat)
    parts, bounds = _scatter_plan(is_active, cfg, x, out)
    private = np.zeros((parts - 1,) + out.shape, out.dtype)
    for t in range(parts):
        _scatter_part(rows, weight, params, seed, cfg, x, out, private, bounds, t)
    add_parts(flat, private.reshape(parts - 1, -1), 0, flat.shape[0])
    return SPLITTABLE if threads > 1 else DONE


@numba.njit(**_INLINE)
def _scatter(rows, is_active, weight, threads, params, seed, cfg, x, out):
    """A scatter over the active outer indices: on this thread (:func:`_scatter_in_parts`), or above
    the thresholds its sum split into parts (Numba's pool size at most: a function of the inputs and
    the pool, never of the threads that run them, so one thread gives the same bits), each part into
    its own copy of ``out`` on the pool, summed in order."""
    if threads < 2:
        _scatter_in_parts(rows, is_active, weight, threads, params, seed, cfg, x, out)
        return
    if _scatter_serially(rows, is_active, weight, threads, params, seed, cfg, x, out) == DONE:
        return
    flat = out.reshape(-1)
    _fill_zero(flat)
    parts, bounds = _scatter_plan(is_active, cfg, x, out)
    private = np.zeros((parts - 1,) + out.shape, out.dtype)
    others = private.reshape(parts - 1, -1)
    n = flat.shape[0]
    ends, t0 = start_region(parts)
    for t in prange(parts):
        _scatter_part(rows, weight, params, seed, cfg, x, out, private, bounds, t)
        part_done(ends, t)
    region_done(ends, t0)
    ends, t0 = start_region(parts)
    for t in prange(parts):  # sum the private copies, each thread a slice
        add_parts(flat, others, (n * t) // parts, (n * (t + 1)) // parts)
        part_done(ends, t)
    region_done(ends, t0)


@numba.njit(**_INLINE)
def _dense(weight, threads, params, seed, cfg, out):
    _fill_zero(out.reshape(-1))
    direct = cfg[2] != 0
    n_outer, n_inner = (out.shape[0], out.shape[1]) if direct else (out.shape[1], out.shape[0])
    threads = _threads(threads, n_outer * np.int64(cfg[3]))
    if threads == 1 or not direct:  # G.T: rows of out are shared between outer indices
        _dense_rows(weight, params, seed, cfg, out, n_outer, n_inner, direct, 0, n_outer)
        return
    ends, t0 = start_region(threads)
    for t in prange(threads):
        lo, hi = (n_outer * t) // threads, (n_outer * (t + 1)) // threads
        _dense_rows(weight, params, seed, cfg, out, n_outer, n_inner, direct, lo, hi)
        part_done(ends, t)
    region_done(ends, t0)


# ---------------------------------------------------------------------------
# kernels: one per (kind, law), each made by a factory.  The kind and the law are the closure's
# constants, strings (Numba keys a closure's disk cache on its constants, pickled: a dispatcher would
# pickle differently in every process), on which Numba prunes the branches before typing: each kernel
# compiles only its own row loop and block function.  A row loop is named in the call that passes it
# (Numba inlines only a function it resolves to a global); a block function may come through a
# variable (its call is not inlined).
# ---------------------------------------------------------------------------
MATMUL_KINDS = ("gather_mv", "gather_mm", "scatter_mv", "scatter_mm")


def _named(function, name: str, options: dict):
    """``numba.njit(**options)`` of a factory's closure under ``name`` (Numba's cache files and evjax's
    log name it)."""
    function.__name__ = function.__qualname__ = name
    return numba.njit(**options)(function)


def _matmul_kernel(kind: str, law: str):
    """The kernel ``{kind}_{law}`` (``kind`` in :data:`MATMUL_KINDS`, ``law`` in ``ops.LAWS``): the
    gather or scatter driver (:func:`_gather`, :func:`_scatter`) with the kind's row loop and the law's
    block function."""

    def kernel(threads, params, seed, cfg, x, out):
        weight = _wb_scalar if law == "scalar" else (_wb_normal if law == "normal" else _wb_uniform)
        if kind == "gather_mv":
            _gather(_gather_rows, weight, threads, params, seed, cfg, x, out)
        elif kind == "gather_mm":
            _gather(_gather_mm_rows, weight, threads, params, seed, cfg, x, out)
        elif kind == "scatter_mv":
            _scatter(_scatter_rows, _nonzero, weight, threads, params, seed, cfg, x, out)
        else:
            _scatter(_scatter_mm_rows, _nonzero_row, weight, threads, params, seed, cfg, x, out)

    return _named(kernel, f"{kind}_{law}", _KERNEL)


def _dense_kernel(law: str):
    """The kernel ``dense_{law}``: :func:`_dense` with the law's block function."""

    def kernel(threads, params, seed, cfg, out):
        weight = _wb_scalar if law == "scalar" else (_wb_normal if law == "normal" else _wb_uniform)
        _dense(weight, threads, params, seed, cfg, out)

    return _named(kernel, f"dense_{law}", _KERNEL)


KERNELS = {**{(kind, law): _matmul_kernel(kind, law) for kind in MATMUL_KINDS for law in ops.LAWS},
           **{("dense", law): _dense_kernel(law) for law in ops.LAWS}}


# ---------------------------------------------------------------------------
# serial tiers (numba_cpu.call's ``serial``): a kernel's one-pass path alone, and a scatter's parts in
# turn, with no parallel region (Numba's parallel passes cost a JITC kernel most of its 3 s compile)
# ---------------------------------------------------------------------------
def _plain_gather_tier(law: str, batched: bool):
    """The serial tier ``serial_gather_mv_{law}`` of a vector gather, or ``serial_gather_mm_{law}`` of a
    batch gather (``batched``: a vmap over trials), as one loop (``law``: "scalar", "normal" or
    "uniform"): what :func:`_gather` does on one thread with :func:`_gather_rows` (:func:`_gather_mm_rows`),
    :func:`_next_block` (and :func:`_add_scaled`) written out: the same draws, and each output's terms
    in the same order, so the kernel's bits (``tests/test_serial_tiers.py``).  Only the stream's own
    helpers are inlined into it (:func:`_keys`, :func:`_gap`); the law and ``batched`` are constants
    of the closure, so Numba prunes the other branches.  Helpers inlining helpers, four levels deep,
    cost the vector tier's first compile 0.2 s more; the batch gather's tier compiled in 1.7 s as
    :func:`_gather` with :func:`_gather_mm_rows` (``benchmarks/cold_start.py``, ``jitc_vmap``, 2026-11-29).
    DONE, or SPLITTABLE where :func:`_gather` would split the outputs over threads (each one row's
    own sum: the same bits)."""

    def tier(threads, params, seed, cfg, x, out):
        n_outer = out.shape[0]
        n_inner = x.shape[0]
        r, s, skip = np.uint64(cfg[0]), np.uint64(cfg[1]), cfg[2] != 0
        sd = np.uint64(seed[0])
        first = np.int64(seed[1]) if seed.shape[0] > 1 else np.int64(0)  # (as _first_outer)
        p0, p1 = params[0], params[1]
        cap = np.uint64(n_inner)
        at, w = stack_array(BLOCK, numba.int64), stack_array(BLOCK, out.dtype)  # (as _scratch)
        for o in range(n_outer):
            ka, kb = _keys(sd, first + o)
            acc = out.dtype.type(0)
            if batched:
                row = out[o]
                for c in range(row.shape[0]):
                    row[c] = 0
            pos, k, count = np.int64(-1), np.uint64(0), BLOCK
            while count == BLOCK:  # (as _next_block)
                for j in range(BLOCK):
                    at[j] = _gap(ka, kb, k + np.uint64(j), r, s, cap)
                if law == "scalar":
                    _wb_scalar(ka, kb, k, p0, p1, w)
                elif law == "normal":
                    _wb_normal(ka, kb, k, p0, p1, w)
                else:
                    _wb_uniform(ka, kb, k, p0, p1, w)
                count = 0
                for j in range(BLOCK):
                    pos += 1 + at[j]
                    if pos >= n_inner:
                        break
                    at[j] = pos
                    count += 1
                for j in range(count):
                    if batched:  # (as _add_scaled)
                        xv = x[at[j]]
                        wj = w[j]
                        for c in range(xv.shape[0]):
                            if not (skip and xv[c] == 0):
                                row[c] += wj * xv[c]
                    else:
                        xi = x[at[j]]
                        if not (skip and xi == 0):
                            acc += w[j] * xi
                k += np.uint64(BLOCK)
            if not batched:
                out[o] = acc
        work = n_outer * np.int64(cfg[3]) * (x.size // (n_inner if n_inner > 1 else 1))  # (as _gather)
        split = threads >= 2 and work >= PARALLEL_MIN_WORK  # (as _threads)
        return SPLITTABLE if split else DONE

    kind = "gather_mm" if batched else "gather_mv"
    return _named(tier, f"serial_{kind}_{law}", dict(cache=True, nogil=True))


def _serial_tier(kind: str, law: str):
    """The first serial tier ``serial_{kind}_{law}`` of a scatter: its one-pass path,
    :func:`_scatter_serially`, with the kind's row loop and the law's block function."""

    def tier(threads, params, seed, cfg, x, out):
        weight = _wb_scalar if law == "scalar" else (_wb_normal if law == "normal" else _wb_uniform)
        if kind == "scatter_mv":
            return _scatter_serially(_scatter_rows, _nonzero, weight, threads, params, seed, cfg, x, out)
        return _scatter_serially(_scatter_mm_rows, _nonzero_row, weight, threads, params, seed, cfg, x, out)

    return _named(tier, f"serial_{kind}_{law}", dict(cache=True, nogil=True))


def _parts_tier(kind: str, law: str):
    """The second serial tier ``parts_{kind}_{law}`` of a scatter: :func:`_scatter_in_parts` with the
    kind's row loop and the law's block function."""

    def tier(threads, params, seed, cfg, x, out):
        weight = _wb_scalar if law == "scalar" else (_wb_normal if law == "normal" else _wb_uniform)
        if kind == "scatter_mv":
            return _scatter_in_parts(_scatter_rows, _nonzero, weight, threads, params, seed, cfg, x, out)
        return _scatter_in_parts(_scatter_mm_rows, _nonzero_row, weight, threads, params, seed, cfg, x, out)

    return _named(tier, f"parts_{kind}_{law}", dict(cache=True, nogil=True))


def _serial_tiers(kind: str, law: str) -> tuple:
    """The serial tiers of the kernel ``{kind}_{law}``, cheapest first: a gather's one, a scatter's two (the
    first declines a sum in parts, which the second does in turn on one thread)."""
    if kind in ("gather_mv", "gather_mm"):
        return (_plain_gather_tier(law, batched=kind == "gather_mm"),)
    return (_serial_tier(kind, law), _parts_tier(kind, law))


# kernel -> its serial tiers (the matmul kernels; the dense materialisation has none)
SERIAL_TIERS = {KERNELS[(kind, law)]: _serial_tiers(kind, law) for kind in MATMUL_KINDS for law in ops.LAWS}


# ---------------------------------------------------------------------------
# the structure on the host (``tocsr``): the same row loop, called from Python
# ---------------------------------------------------------------------------
@numba.njit(cache=True, nogil=True)  # called from Python
def _structure(law, params, seed, cfg, n_outer, n_inner, data):
    """Count (``data`` empty) or fill: returns ``(counts per outer index, indices)`` and fills ``data``."""
    cap = np.uint64(n_inner)
    r, s = np.uint64(cfg[0]), np.uint64(cfg[1])
    sd = np.uint64(seed)
    p0, p1 = params[0], params[1]
    counts = np.zeros(n_outer, np.int64)
    fill = data.shape[0] > 0
    indices = np.zeros(data.shape[0], np.int32)
    at = 0
    for o in range(n_outer):
        ka, kb = _keys(sd, o)
        pos = np.int64(-1)
        k = np.uint64(0)
        while True:
            pos += 1 + _gap(ka, kb, k, r, s, cap)
            if pos >= n_inner:
                break
            if fill:
                w = _w_scalar(ka, kb, k, p0, p1) if law == 0 else (
                    _w_normal(ka, kb, k, p0, p1) if law == 1 else _w_uniform(ka, kb, k, p0, p1))
                data[at] = w
                indices[at] = pos
            at += 1
            counts[o] += 1
            k += _U1
    return counts, indices


def generated_structure(law: str, params, seed: int, prob: float, n_outer: int, n_inner: int, dtype):
    """``(data, indices, indptr)`` of the generated matrix ``G`` (NumPy, for ``tocsr``)."""
    dtype = compute_dtype(dtype)
    values = np.array([float(p) for p in params] + [0.0] * (2 - len(params)), dtype)
    cfg = config(prob, False, n_inner)
    code = {"scalar": 0, "normal": 1, "uniform": 2}[law]
    if prob == 0.0 or n_inner == 0:
        return np.zeros(0, dtype), np.zeros(0, np.int32), np.zeros(n_outer + 1, np.int32)
    counts, _ = _structure(code, values, seed, cfg, n_outer, n_inner, np.zeros(0, dtype))
    data = np.empty(int(counts.sum()), dtype)
    _, indices = _structure(code, values, seed, cfg, n_outer, n_inner, data)
    indptr = np.zeros(n_outer + 1, np.int64)
    np.cumsum(counts, out=indptr[1:])
    return data, indices, indptr.astype(np.int32 if indptr[-1] < 2**31 else np.int64)


# ---------------------------------------------------------------------------
# the generators' launcher (the ops' backend slot: kernel_args.matmul_generator and dense_generator)
# ---------------------------------------------------------------------------


def _launcher(law: str, kind: str, dtype, out_shape: tuple, launch: int):
    """``call(params, seed, cfg, *operand)`` of the kernel of ``kind`` and ``law`` through its FFI handler,
    with its serial tiers (``kernel_args.matmul_generator``'s launcher; ``launch`` unused: the kernel
    splits its outer indices itself)."""
    kernel = KERNELS[(kind, law)]

    def call(*args):
        return numba_cpu.call(kernel, args, out_shape, dtype, serial=SERIAL_TIERS.get(kernel))

    return call


for (_law, _rank, _event), _op in ops.MATMUL_OPS.items():
    _op.def_numba_kernel(matmul_generator(_law, _event, _launcher))
for _law, _op in ops.DENSE_OPS.items():
    _op.def_numba_kernel(dense_generator(_law, _launcher))



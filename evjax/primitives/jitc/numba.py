"""Numba CPU backend of the JITC ops in :mod:`evjax.primitives.jitc.ops`.

Imported by the ops the first time they lower with ``backend="numba"``; it
registers its generators on them.  The generation scheme is
:mod:`.generation`'s, in Numba in :mod:`.numba_stream` (bitwise the
reference's structure; no kernel uses ``fastmath``, so LLVM contracts nothing).

Kernels (one per kind and weight law, :data:`KERNELS`, each one line): a
kernel passes its law as a value (:class:`.numba_stream.Normal` and the
others: the two weight parameters; the type selects the law, so each kernel
compiles only its own) to its kind's driver (``_gather``, ``_scatter``,
``_dense``: a few lines, inlined into the kernel at Numba's IR level so that
its ``prange`` runs in the kernel itself), which runs the kind's row loop
(``_gather_rows``, ``_scatter_rows``, ``_dense_rows``; a vector or a batch by
the operand's rank) over the outer indices on the calling thread or, above
:data:`PARALLEL_MIN_WORK`, over parts of them on the pool: the serial and the
parallel path call one compiled loop.  The row loops are called, not inlined
at Numba's IR level, and take positions as ``np.int64`` values, never
literals; the stream's few-line helpers are inlined into them
(:mod:`.numba_stream`).  A row loop walks a stream in blocks of :data:`BLOCK`
synapses, whose gaps (one vectorised loop) and weights (the law's loop, a
call) are drawn together (``_draw_block``), then walks their positions and
visits the synapses of the block in order:

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

import jax.numpy as jnp
import numba
import numpy as np
from numba import prange

from ..._kernel_compat import COMPILED_CODE_ONLY, prange_only
from ...backends import numba_cpu
from ...backends.threads import add_parts, part_done, pool_chunks, region_done, start_region
from ...dtypes import compute_dtype
from . import ops
from .kernel_args import config, operand_values, params_array
from .numba_stream import (  # the generation scheme: keys, gaps, the laws' weights, blocks of synapses
    BLOCK,
    _U1,
    Normal,
    Scalar,
    Uniform,
    _gap,
    _keys,
    _draw_block,
    _w_normal,
    _w_scalar,
    _w_uniform,
)

__all__ = ["KERNELS", "matmul_generator", "dense_generator", "generated_structure"]

# Below this many synapses (expected) a kernel stays on the calling thread.
PARALLEL_MIN_WORK = 65536
_PARALLEL = prange_only()  # a ParallelOptions: Numba would empty a shared dict on the first compile
_KERNEL = dict(cache=True, nogil=True)
# Called from compiled code only: no Python entry point is built for them.
_HELPER = dict(cache=True, nogil=True, **COMPILED_CODE_ONLY)
_DRIVER = dict(cache=True, nogil=True, inline="always")  # see the drivers' section
I0 = np.int64(0)
_UBLOCK = np.uint64(BLOCK)


# ---------------------------------------------------------------------------
# row loops: one outer index's synapses at a time, for the outer indices [lo, hi)
# (``x.ndim`` is a constant to Numba: each compiled loop keeps one of its branches)
# ---------------------------------------------------------------------------
@numba.njit(**_HELPER)
def _gather_rows(law, seed, cfg, x, out, lo, hi):
    """``out[o] = sum_{i in row o} w_oi x[i]`` (x a vector) or ``out[o, c] = sum_i w_oi x[i, c]`` (x a
    batch) for o in [lo, hi); zero entries of x skipped when cfg[2] (events select)."""
    n_inner = x.shape[0]
    r, s, skip = np.uint64(cfg[0]), np.uint64(cfg[1]), cfg[2] != 0
    sd = np.uint64(seed[0])
    cap = np.uint64(n_inner)
    at = np.empty(BLOCK, np.int64)  # a block's positions and weights
    w = np.empty(BLOCK, out.dtype)
    if x.ndim == 1:
        for o in range(lo, hi):
            ka, kb = _keys(sd, o)
            acc = out.dtype.type(0)
            pos, k, count = np.int64(-1), np.uint64(0), np.int64(BLOCK)
            while count == BLOCK:
                _draw_block(law, ka, kb, k, r, s, cap, at, w)
                count = 0
                for j in range(BLOCK):  # positions: pos_k = pos_(k-1) + 1 + gap_k, below n_inner
                    pos += 1 + at[j]
                    if pos >= n_inner:
                        break
                    at[j] = pos
                    count += 1
                for j in range(count):
                    xi = x[at[j]]
                    if not (skip and xi == 0):
                        acc += w[j] * xi
                k += _UBLOCK
            out[o] = acc
    else:
        width = x.shape[1]
        for o in range(lo, hi):
            row = out[o]
            for c in range(width):
                row[c] = 0
            ka, kb = _keys(sd, o)
            pos, k, count = np.int64(-1), np.uint64(0), np.int64(BLOCK)
            while count == BLOCK:
                _draw_block(law, ka, kb, k, r, s, cap, at, w)
                count = 0
                for j in range(BLOCK):  # positions: pos_k = pos_(k-1) + 1 + gap_k, below n_inner
                    pos += 1 + at[j]
                    if pos >= n_inner:
                        break
                    at[j] = pos
                    count += 1
                for j in range(count):
                    xr = x[at[j]]
                    wj = w[j]
                    for c in range(width):
                        if not (skip and xr[c] == 0):
                            row[c] += wj * xr[c]
                k += _UBLOCK


@numba.njit(**_HELPER)
def _scatter_rows(law, seed, cfg, x, out, lo, hi):
    """``out[i] += w_oi x[o]`` (x a vector) or ``out[i, c] += w_oi x[o, c]`` (x a batch) for o in
    [lo, hi); when cfg[2] (events select) a zero x[o] (an all-zero row) generates nothing and a zero
    x[o, c] adds nothing."""
    n_inner = out.shape[0]
    r, s, skip = np.uint64(cfg[0]), np.uint64(cfg[1]), cfg[2] != 0
    sd = np.uint64(seed[0])
    cap = np.uint64(n_inner)
    at = np.empty(BLOCK, np.int64)  # a block's positions and weights
    w = np.empty(BLOCK, out.dtype)
    if x.ndim == 1:
        for o in range(lo, hi):
            xo = x[o]
            if not _visited(x, o, skip):
                continue
            ka, kb = _keys(sd, o)
            pos, k, count = np.int64(-1), np.uint64(0), np.int64(BLOCK)
            while count == BLOCK:
                _draw_block(law, ka, kb, k, r, s, cap, at, w)
                count = 0
                for j in range(BLOCK):  # positions: pos_k = pos_(k-1) + 1 + gap_k, below n_inner
                    pos += 1 + at[j]
                    if pos >= n_inner:
                        break
                    at[j] = pos
                    count += 1
                for j in range(count):
                    out[at[j]] += w[j] * xo
                k += _UBLOCK
    else:
        width = x.shape[1]
        for o in range(lo, hi):
            xo = x[o]
            if not _visited(x, o, skip):
                continue
            ka, kb = _keys(sd, o)
            pos, k, count = np.int64(-1), np.uint64(0), np.int64(BLOCK)
            while count == BLOCK:
                _draw_block(law, ka, kb, k, r, s, cap, at, w)
                count = 0
                for j in range(BLOCK):  # positions: pos_k = pos_(k-1) + 1 + gap_k, below n_inner
                    pos += 1 + at[j]
                    if pos >= n_inner:
                        break
                    at[j] = pos
                    count += 1
                for j in range(count):
                    target = out[at[j]]
                    wj = w[j]
                    for c in range(width):
                        if not (skip and xo[c] == 0):
                            target[c] += wj * xo[c]
                k += _UBLOCK


@numba.njit(**_HELPER)
def _dense_rows(law, seed, cfg, out, n_inner, direct, lo, hi):
    """``G[o, i] = w_oi`` (``direct``) or ``G.T`` into ``out`` (zeroed) for o in [lo, hi)."""
    r, s = np.uint64(cfg[0]), np.uint64(cfg[1])
    sd = np.uint64(seed[0])
    cap = np.uint64(n_inner)
    at = np.empty(BLOCK, np.int64)
    w = np.empty(BLOCK, out.dtype)
    for o in range(lo, hi):
        ka, kb = _keys(sd, o)
        pos, k, count = np.int64(-1), np.uint64(0), np.int64(BLOCK)
        while count == BLOCK:
            _draw_block(law, ka, kb, k, r, s, cap, at, w)
            count = 0
            for j in range(BLOCK):  # positions: pos_k = pos_(k-1) + 1 + gap_k, below n_inner
                pos += 1 + at[j]
                if pos >= n_inner:
                    break
                at[j] = pos
                count += 1
            for j in range(count):
                if direct:
                    out[o, at[j]] = w[j]
                else:
                    out[at[j], o] = w[j]
            k += _UBLOCK


@numba.njit(**_HELPER)
def _visited(x, o, skip):
    """Whether a scatter visits outer index ``o``: every one unless ``skip``, else a nonzero ``x[o]``
    (a row of a batch with any nonzero entry)."""
    if not skip:
        return True
    if x.ndim == 1:
        return x[o] != 0
    xo = x[o]
    for c in range(xo.shape[0]):
        if xo[c] != 0:
            return True
    return False


@numba.njit(**_HELPER)
def _active_bounds(x, skip, parts, total):
    """``parts`` outer ranges with equal numbers of the ``total`` visited rows (no array of ``n`` counts)."""
    n = x.shape[0]
    bounds = np.full(parts + 1, n, np.int64)
    bounds[0] = 0
    t, seen = 1, 0
    for o in range(n):
        if t >= parts:
            break
        seen += 1 if _visited(x, o, skip) else 0
        while t < parts and seen * parts > total * t:
            bounds[t] = o + 1
            t += 1
    return bounds


# ---------------------------------------------------------------------------
# drivers: serial below PARALLEL_MIN_WORK, else split over the pool, the serial
# and parallel paths calling one compiled row loop.  A driver is inlined into
# its kernels at Numba's IR level: a few lines, so Numba's parallel passes see
# little, the law's value stays a local of the kernel, and its ``prange`` runs
# in the kernel (a parallel function of its own would be one more library in
# which LLVM optimises the row loop again: measured slower to compile).
# Everything a driver calls is a compiled call.
# ---------------------------------------------------------------------------
@numba.njit(**_DRIVER)
def _gather(law, threads, seed, cfg, x, out):
    """A gather: every outer index's own sum, in contiguous chunks (equal expected work) on the pool."""
    n_outer = out.shape[0]
    width = x.size // max(x.shape[0], 1)
    if threads < 2 or n_outer * np.int64(cfg[3]) * width < PARALLEL_MIN_WORK:
        _gather_rows(law, seed, cfg, x, out, I0, np.int64(n_outer))
        return
    chunks = 4 * np.int64(threads)
    ends, t0 = start_region(chunks)
    for t in prange(chunks):
        part = np.int64(t)
        _gather_rows(law, seed, cfg, x, out, (n_outer * part) // chunks, (n_outer * (part + 1)) // chunks)
        part_done(ends, t)
    region_done(ends, t0)


@numba.njit(**_HELPER)
def _scatter_plan(cfg, x, out):
    """``out`` zeroed, and how a scatter's sum is split: ``(parts, bounds)``, one part (one pass into
    ``out``) below the thresholds, else up to Numba's pool size (a function of the inputs and the pool,
    never of the threads that run them, so one thread gives the same bits), ``bounds`` the parts'
    outer ranges of equal numbers of visited rows."""
    flat = out.reshape(-1)
    n = flat.shape[0]
    for j in range(n):
        flat[j] = 0
    pool = np.int64(pool_chunks())
    skip = cfg[2] != 0
    active = 0
    for o in range(x.shape[0]):
        active += 1 if _visited(x, o, skip) else 0
    work = active * np.int64(cfg[3]) * (x.size // max(x.shape[0], 1))
    if pool < 2 or work < PARALLEL_MIN_WORK or 4 * work < n:  # summing private copies would dominate
        return np.int64(1), np.zeros(0, np.int64)
    parts = min(pool, max(np.int64(2), work // (4 * n)))  # >= 4 synapses an output a part
    return parts, _active_bounds(x, skip, parts, np.int64(active))


@numba.njit(**_DRIVER)
def _scatter(law, threads, seed, cfg, x, out):
    """A scatter over the active outer indices, in one pass or split into parts (``_scatter_plan``),
    each part into its own copy of ``out``, then summed, every output's terms in part order."""
    parts, bounds = _scatter_plan(cfg, x, out)
    if parts == 1:
        _scatter_rows(law, seed, cfg, x, out, I0, np.int64(x.shape[0]))
        return
    private = np.zeros((parts - 1,) + out.shape, out.dtype)
    flat = out.reshape(-1)
    n = np.int64(flat.shape[0])
    others = private.reshape(parts - 1, n)
    if threads < 2:
        for t in range(parts):
            _scatter_rows(law, seed, cfg, x, out if t == 0 else private[t - 1], bounds[t], bounds[t + 1])
        add_parts(flat, others, I0, n)
        return
    ends, t0 = start_region(parts)
    for t in prange(parts):
        part = np.int64(t)
        _scatter_rows(law, seed, cfg, x, out if part == 0 else private[part - 1], bounds[part], bounds[part + 1])
        part_done(ends, t)
    region_done(ends, t0)
    ends, t0 = start_region(parts)
    for t in prange(parts):  # sum the private copies, each thread a slice
        part = np.int64(t)
        add_parts(flat, others, (n * part) // parts, (n * (part + 1)) // parts)
        part_done(ends, t)
    region_done(ends, t0)


@numba.njit(**_DRIVER)
def _dense(law, threads, seed, cfg, out):
    """``G`` (cfg[2]) or ``G.T`` written into ``out``; ``G`` by ranges of rows on the pool above the
    threshold (``G.T``'s rows are shared between outer indices: serial)."""
    direct = _zero_all(out, cfg)
    n_outer, n_inner = (out.shape[0], out.shape[1]) if direct else (out.shape[1], out.shape[0])
    if threads < 2 or n_outer * np.int64(cfg[3]) < PARALLEL_MIN_WORK or not direct:
        _dense_rows(law, seed, cfg, out, np.int64(n_inner), direct, I0, np.int64(n_outer))
        return
    parts = np.int64(threads)
    ends, t0 = start_region(parts)
    for t in prange(parts):
        part = np.int64(t)
        _dense_rows(law, seed, cfg, out, np.int64(n_inner), direct, (n_outer * part) // parts,
                    (n_outer * (part + 1)) // parts)
        part_done(ends, t)
    region_done(ends, t0)


@numba.njit(**_HELPER)
def _zero_all(out, cfg):
    """``out`` zeroed; whether ``G`` is written directly (cfg[2]) rather than transposed."""
    flat = out.reshape(-1)
    for j in range(flat.shape[0]):
        flat[j] = 0
    return cfg[2] != 0


# ---------------------------------------------------------------------------
# kernels: one per (kind, law), each one line: the law's value (its named tuple) picks its weights
# ---------------------------------------------------------------------------
@numba.njit(parallel=_PARALLEL, **_KERNEL)
def gather_mv_scalar(threads, params, seed, cfg, x, out):
    _gather(Scalar(params[0], params[1]), threads, seed, cfg, x, out)


@numba.njit(parallel=_PARALLEL, **_KERNEL)
def gather_mm_scalar(threads, params, seed, cfg, x, out):
    _gather(Scalar(params[0], params[1]), threads, seed, cfg, x, out)


@numba.njit(parallel=_PARALLEL, **_KERNEL)
def scatter_mv_scalar(threads, params, seed, cfg, x, out):
    _scatter(Scalar(params[0], params[1]), threads, seed, cfg, x, out)


@numba.njit(parallel=_PARALLEL, **_KERNEL)
def scatter_mm_scalar(threads, params, seed, cfg, x, out):
    _scatter(Scalar(params[0], params[1]), threads, seed, cfg, x, out)


@numba.njit(parallel=_PARALLEL, **_KERNEL)
def dense_scalar(threads, params, seed, cfg, out):
    _dense(Scalar(params[0], params[1]), threads, seed, cfg, out)


@numba.njit(parallel=_PARALLEL, **_KERNEL)
def gather_mv_normal(threads, params, seed, cfg, x, out):
    _gather(Normal(params[0], params[1]), threads, seed, cfg, x, out)


@numba.njit(parallel=_PARALLEL, **_KERNEL)
def gather_mm_normal(threads, params, seed, cfg, x, out):
    _gather(Normal(params[0], params[1]), threads, seed, cfg, x, out)


@numba.njit(parallel=_PARALLEL, **_KERNEL)
def scatter_mv_normal(threads, params, seed, cfg, x, out):
    _scatter(Normal(params[0], params[1]), threads, seed, cfg, x, out)


@numba.njit(parallel=_PARALLEL, **_KERNEL)
def scatter_mm_normal(threads, params, seed, cfg, x, out):
    _scatter(Normal(params[0], params[1]), threads, seed, cfg, x, out)


@numba.njit(parallel=_PARALLEL, **_KERNEL)
def dense_normal(threads, params, seed, cfg, out):
    _dense(Normal(params[0], params[1]), threads, seed, cfg, out)


@numba.njit(parallel=_PARALLEL, **_KERNEL)
def gather_mv_uniform(threads, params, seed, cfg, x, out):
    _gather(Uniform(params[0], params[1]), threads, seed, cfg, x, out)


@numba.njit(parallel=_PARALLEL, **_KERNEL)
def gather_mm_uniform(threads, params, seed, cfg, x, out):
    _gather(Uniform(params[0], params[1]), threads, seed, cfg, x, out)


@numba.njit(parallel=_PARALLEL, **_KERNEL)
def scatter_mv_uniform(threads, params, seed, cfg, x, out):
    _scatter(Uniform(params[0], params[1]), threads, seed, cfg, x, out)


@numba.njit(parallel=_PARALLEL, **_KERNEL)
def scatter_mm_uniform(threads, params, seed, cfg, x, out):
    _scatter(Uniform(params[0], params[1]), threads, seed, cfg, x, out)


@numba.njit(parallel=_PARALLEL, **_KERNEL)
def dense_uniform(threads, params, seed, cfg, out):
    _dense(Uniform(params[0], params[1]), threads, seed, cfg, out)


KERNELS = {(kind, law): globals()[f"{kind}_{law}"]
           for kind in ("gather_mv", "gather_mm", "scatter_mv", "scatter_mm", "dense")
           for law in ("scalar", "normal", "uniform")}


# ---------------------------------------------------------------------------
# the structure on the host (``tocsr``): the same row loop, called from Python
# ---------------------------------------------------------------------------
@numba.njit(cache=True, nogil=True)
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
# generators (the ops' backend slot)
# ---------------------------------------------------------------------------


def matmul_generator(law: str, event: bool):
    """The generator of the matmul ops of ``law``: mv and mm, float or events."""
    n = ops.LAWS[law]

    def generator(outs, ins, shape, prob, transpose, corder, weighted=False):
        out = outs[0]
        dtype = compute_dtype(out.dtype)
        _, n_inner = ops.generated_shape(shape, transpose, corder)
        rank = len(ins[n + 1].shape)
        kernel = KERNELS[(("gather_" if corder else "scatter_") + ("mv" if rank == 1 else "mm"), law)]
        cfg = config(prob, event, n_inner)

        def run(*args):
            x = operand_values(args[n + 1], event, weighted, dtype)
            y = numba_cpu.call(kernel, (params_array(args[:n], n, dtype), args[n], jnp.asarray(cfg), x),
                               out.shape, dtype)
            return [y.astype(out.dtype)]

        return run

    return generator


def dense_generator(law: str):
    """The generator of the materialiser of ``law``."""
    n = ops.LAWS[law]

    def generator(outs, ins, shape, prob, transpose, corder):
        out = outs[0]
        dtype = compute_dtype(out.dtype)
        _, n_inner = ops.generated_shape(shape, transpose, corder)
        cfg = config(prob, corder, n_inner)  # flag: G written directly (corder) or transposed

        def run(*args):
            y = numba_cpu.call(KERNELS[("dense", law)], (params_array(args[:n], n, dtype), args[n], jnp.asarray(cfg)),
                     out.shape, dtype)
            return [y.astype(out.dtype)]

        return run

    return generator


for (_law, _rank, _event), _op in ops.MATMUL_OPS.items():
    _op.def_numba_kernel(matmul_generator(_law, _event))
for _law, _op in ops.DENSE_OPS.items():
    _op.def_numba_kernel(dense_generator(_law))



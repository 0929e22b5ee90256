"""Variants of the delay delivery loop, kernel alone: where the step's time goes, and what did not help.

    python benchmarks/delay_variants.py            # n = 20000, p = 0.005, 1 % active, L = 32
    python benchmarks/delay_variants.py --out FILE

``csr_delay_deliver``'s Numba kernel (``evjax/primitives/delay/numba.py``,
``_deliver``) adds each active row's weights into the arrival ring in two
passes per 256 edges: the slots and columns first, then the additions.  This
script times copies of that loop, called from Python on NumPy arrays over 50
steps of different spikes (the ring updated in place, as in ``lax.scan``), and
variants of it: smaller rings (how much is the ring's size), no delay array
(how much is reading it), software prefetches (of the ring cells, of the next
active rows' arrays), and two threads that each own the columns of half the
ring (the same bits: each output's additions stay in edge order).  Every
variant's ring is checked bit for bit against the two-pass copy's.  Prints a
markdown table of medians and ratios and writes it with a PNG to
``benchmarks/results/delay_variants.{md,png}``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numba
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.common import fmt_time, markdown_table, provenance, save_bar_plot  # noqa: E402

CHUNK = 256  # edges listed before they are added (evjax's SCRATCH)


def _prefetch(rw: int, rank: int):
    """``llvm.prefetch`` of ``arr[i]`` (rank 1) or ``arr[i, j]`` (rank 2); ``rw`` 1 for a write hint."""
    def build(typingctx, arr, *idx):
        sig = types.void(arr, *idx)

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            ptr = cgutils.get_item_pointer(context, builder, signature.args[0], ary, list(args[1:]),
                                           wraparound=False, boundscheck=False)
            i8p = ir.IntType(8).as_pointer()
            fnty = ir.FunctionType(ir.VoidType(), [i8p] + [ir.IntType(32)] * 3)
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
            builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(ir.IntType(32), rw),
                              ir.Constant(ir.IntType(32), 3), ir.Constant(ir.IntType(32), 1)])
            return context.get_dummy_value()
        return sig, codegen

    if rank == 1:
        return intrinsic(lambda typingctx, arr, i: build(typingctx, arr, i))
    return intrinsic(lambda typingctx, arr, i, j: build(typingctx, arr, i, j))


prefetch_write_2d, prefetch_read_2d, prefetch_read_1d = _prefetch(1, 2), _prefetch(0, 2), _prefetch(0, 1)


@numba.njit(inline="always")
def _slot(tm, d, n_slots):
    s = tm + min(max(np.int64(d), 0), np.int64(n_slots - 1))
    return s - n_slots if s >= n_slots else s


@numba.njit(inline="always")
def _next_active(events, i):
    while i < events.shape[0] and events[i] == 0:
        i += 1
    return i


@numba.njit(inline="always")
def _prefetch_row(indices, data, delays, a, b):
    for e in range(a, b, 16):
        prefetch_read_1d(indices, e)
        prefetch_read_1d(data, e)
        prefetch_read_1d(delays, e)


def make_two_pass(ring_prefetch: int, rows_ahead: int):
    """The shipped loop (``ring_prefetch`` 0, ``rows_ahead`` 0); ``ring_prefetch`` 1/2: a write/read hint
    for each ring cell as it is listed, 3: a write hint 24 edges ahead of the additions; ``rows_ahead``:
    prefetch that many next active rows' arrays."""
    @numba.njit(nogil=True)
    def deliver(out, events, data, indices, indptr, delays, tm, scratch, parts):
        n_slots, n_post = out.shape
        n = events.shape[0]
        slots, columns = scratch[0], scratch[1]
        i = _next_active(events, 0)
        ahead = i
        for _ in range(rows_ahead):
            ahead = _next_active(events, ahead + 1) if ahead < n else n
            if ahead < n:
                _prefetch_row(indices, data, delays, indptr[ahead], indptr[ahead + 1])
        while i < n:
            if rows_ahead:
                ahead = _next_active(events, ahead + 1) if ahead < n else n
                if ahead < n:
                    _prefetch_row(indices, data, delays, indptr[ahead], indptr[ahead + 1])
            f = events[i]
            start, stop = indptr[i], indptr[i + 1]
            while start < stop:
                m = min(stop - start, CHUNK)
                for q in range(m):
                    e = start + q
                    j = np.int64(indices[e])
                    s = _slot(tm, delays[e], n_slots)
                    slots[q] = s if (j >= 0) & (j < n_post) else n_slots
                    columns[q] = j
                    if ring_prefetch == 1:
                        prefetch_write_2d(out, min(s, n_slots - 1), min(max(j, 0), n_post - 1))
                    elif ring_prefetch == 2:
                        prefetch_read_2d(out, min(s, n_slots - 1), min(max(j, 0), n_post - 1))
                for q in range(m):
                    if ring_prefetch == 3 and q + 24 < m:
                        prefetch_write_2d(out, min(slots[q + 24], n_slots - 1),
                                          min(max(columns[q + 24], 0), n_post - 1))
                    s = slots[q]
                    if s < n_slots:
                        out[np.uint64(s), np.uint64(columns[q])] += data[start + q] * f
                start += m
            i = _next_active(events, i + 1)
    return deliver


@numba.njit(nogil=True)
def one_pass_row(out, events, data, indices, indptr, delays, tm, scratch, parts):
    """One pass into the ring row of ``tm`` (no delay read): the rows' index and weight streams and
    the read-modify-writes, nothing else."""
    row = out[tm]
    for i in range(events.shape[0]):
        f = events[i]
        if f == 0:
            continue
        for e in range(indptr[i], indptr[i + 1]):
            row[indices[e]] += data[e] * f


@numba.njit(inline="always")
def _columns(out, events, data, indices, indptr, delays, tm, scratch, lo, hi, compact):
    """The two-pass loop restricted to the ring's columns ``[lo, hi)``, the listed edges compacted
    (``compact``) or tested one by one."""
    n_slots = out.shape[0]
    slots, columns, position = scratch[0], scratch[1], scratch[2]
    for i in range(events.shape[0]):
        f = events[i]
        if f == 0:
            continue
        start, stop = indptr[i], indptr[i + 1]
        while start < stop:
            m = min(stop - start, CHUNK)
            for q in range(m):
                e = start + q
                j = np.int64(indices[e])
                s = _slot(tm, delays[e], n_slots)
                slots[q] = s if (j >= lo) & (j < hi) else n_slots
                columns[q] = j
            if compact:
                k = 0
                for q in range(m):
                    s = slots[q]
                    slots[k] = s
                    columns[k] = columns[q]
                    position[k] = q
                    k += s < n_slots
                for q in range(k):
                    out[np.uint64(slots[q]), np.uint64(columns[q])] += data[start + position[q]] * f
            else:
                for q in range(m):
                    s = slots[q]
                    if s < n_slots:
                        out[np.uint64(s), np.uint64(columns[q])] += data[start + q] * f
            start += m


@numba.njit(nogil=True, parallel=True)
def column_halves_compacted(out, events, data, indices, indptr, delays, tm, scratch, parts):
    n_post = out.shape[1]
    for p in prange(parts):
        _columns(out, events, data, indices, indptr, delays, tm, scratch[3 * p:3 * p + 3],
                 n_post * p // parts, n_post * (p + 1) // parts, True)


@numba.njit(nogil=True, parallel=True)
def column_halves_tested(out, events, data, indices, indptr, delays, tm, scratch, parts):
    n_post = out.shape[1]
    for p in prange(parts):
        _columns(out, events, data, indices, indptr, delays, tm, scratch[3 * p:3 * p + 3],
                 n_post * p // parts, n_post * (p + 1) // parts, False)


@numba.njit(nogil=True)
def steps(fn, out, spikes, data, indices, indptr, delays, scratch, parts):
    """``fn`` for each row of ``spikes`` in turn, at steps 0, 1, ... (the ring in place)."""
    for k in range(spikes.shape[0]):
        fn(out, spikes[k], data, indices, indptr, delays, np.int64(k % out.shape[0]), scratch, parts)


def structure(n: int, p: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    indptr = np.concatenate([[0], np.cumsum(rng.binomial(n, p, n))]).astype(np.int32)
    return rng.integers(0, n, indptr[-1]).astype(np.int32), indptr


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--p", type=float, default=0.005)
    parser.add_argument("--rate", type=float, default=0.01)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "delay_variants.md"))
    args = parser.parse_args(argv)
    rng = np.random.default_rng(1)
    indices, indptr = structure(args.n, args.p)
    nnz = len(indices)
    data = rng.uniform(0, 1, nnz).astype(np.float32)
    delays = rng.integers(1, args.slots, nnz).astype(np.int32)
    spikes = (rng.random((args.steps, args.n)) < args.rate).astype(np.float32)
    shipped = make_two_pass(0, 0)
    # name: (kernel, slots, delays, threads, compare with the shipped loop's ring)
    variants = {
        "two passes (the shipped loop)": (shipped, args.slots, delays, 1, True),
        "two passes, every delay 1 (one ring row a step)": (shipped, args.slots, np.ones_like(delays), 1, False),
        "two passes, a 2-slot ring": (shipped, 2, delays % 2, 1, False),
        "one pass, no delay read, one ring row": (one_pass_row, args.slots, delays, 1, False),
        "prefetch each ring cell as listed (write hint)": (make_two_pass(1, 0), args.slots, delays, 1, True),
        "prefetch each ring cell as listed (read hint)": (make_two_pass(2, 0), args.slots, delays, 1, True),
        "prefetch ring cells 24 edges ahead": (make_two_pass(3, 0), args.slots, delays, 1, True),
        "prefetch the next active row's arrays": (make_two_pass(0, 1), args.slots, delays, 1, True),
        "prefetch the next 4 active rows' arrays": (make_two_pass(0, 4), args.slots, delays, 1, True),
        "two threads, half the columns each, compacted": (column_halves_compacted, args.slots, delays, 2, True),
        "two threads, half the columns each, tested": (column_halves_tested, args.slots, delays, 2, True),
    }
    want = None
    for name, (fn, slots, d, parts, compare) in variants.items():  # compile, and check the bits
        out = np.zeros((slots, args.n), np.float32)
        steps(fn, out, spikes, data, indices, indptr, d, np.zeros((3 * parts, CHUNK), np.int64), parts)
        if want is None:
            want = out
        elif compare:
            np.testing.assert_array_equal(out.view(np.int32), want.view(np.int32), err_msg=name)
    times = {name: [] for name in variants}
    for _ in range(args.rounds):  # round-robin: each round times every variant
        for name, (fn, slots, d, parts, _) in variants.items():
            out = np.zeros((slots, args.n), np.float32)
            scratch = np.zeros((3 * parts, CHUNK), np.int64)
            for _ in range(5):
                start = time.perf_counter()
                steps(fn, out, spikes, data, indices, indptr, d, scratch, parts)
                times[name].append((time.perf_counter() - start) / args.steps)
    medians = {name: float(np.median(t)) for name, t in times.items()}
    base = medians["two passes (the shipped loop)"]
    rows = [[name, fmt_time(t), f"{t / base:.2f}x"] for name, t in medians.items()]
    text = "\n".join([
        provenance(argv), "# csr_delay_deliver's loop and its variants, kernel alone", "",
        f"n = {args.n}, p = {args.p} ({nnz} synapses), {args.rate:.0%} active, L = {args.slots}; per step, the "
        f"median of {args.rounds} rounds x 5 runs of {args.steps} steps (the ring in place), Numba "
        f"{numba.__version__}, threading layer {numba.threading_layer()}; ratio to the shipped loop's copy.",
        "", markdown_table(["variant", "per step", "ratio"], rows), ""])
    print(text)
    with open(args.out, "w") as f:
        f.write(text)
    save_bar_plot(os.path.splitext(args.out)[0] + ".png", [name[:28] for name in medians],
                  {"per step, us": [t * 1e6 for t in medians.values()]}, ylabel="us per step",
                  title="csr_delay_deliver's loop, kernel alone", log=False)


if __name__ == "__main__":
    main()

"""Where a parallel evjax kernel runs, and what JAX's CPU dispatch mode costs it.

Under JAX's default (asynchronous) CPU dispatch a program that is a lone
kernel call runs on the calling thread, and one with arithmetic on JAX's
worker thread. This script times a lone ``BinaryArray @ CSR`` (n = 20000,
100 synapses per row) in fresh processes, four ways: default or synchronous
dispatch, and with or without first running a float ``W @ (x * 2)`` (a
program with arithmetic, so its kernels run on the worker thread). It prints
a markdown table of medians, with each row's ratio to the synchronous clean
run, writes ``benchmarks/results/dispatch_threads.md`` and a PNG next to it.
docs/performance.md ("Synchronous CPU dispatch") quotes it.

A second table shows the cause without JAX: a parallel Numba kernel called
from the main thread, in a fresh process, alone and while another live
thread holds an OpenMP pool of its own (it ran the kernel with all of
Numba's threads, or with one). libgomp keeps one pool per thread that starts
parallel regions and counts all their threads; once they outnumber the CPUs,
an idle pool thread spins only briefly before sleeping, so every parallel
region pays to wake its threads.

Usage: ``python benchmarks/dispatch_threads.py [--quick]``. Set
``NUMBA_THREADING_LAYER`` to compare Numba's layers (``omp``, ``tbb``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchmarks.common import RESULTS, markdown_table, provenance, save_bar_plot  # noqa: E402

CHILD = r"""
import json, sys, time
import numpy as np, jax, jax.numpy as jnp
mode, worker_first, rate, rounds = sys.argv[1], sys.argv[2] == "1", float(sys.argv[3]), int(sys.argv[4])
if mode == "sync":
    jax.config.update("jax_cpu_enable_async_dispatch", False)
import numba, scipy.sparse as sp, evjax
n = 20000
m = sp.random(n, n, density=0.005, format="csr", random_state=0, dtype=np.float32)
W = evjax.CSR((jnp.asarray(m.data), jnp.asarray(m.indices), jnp.asarray(m.indptr)), shape=(n, n))
rng = np.random.default_rng(0)
spikes = [evjax.BinaryArray(jnp.asarray(rng.random(n) < rate)) for _ in range(8)]
lone = jax.jit(lambda s: s @ W)
for s in spikes:
    lone(s).block_until_ready()
if worker_first:
    with_arithmetic = jax.jit(lambda s: W @ (s.value.astype(jnp.float32) * 2))
    for s in spikes:
        with_arithmetic(s).block_until_ready()
medians = []
for _ in range(rounds):
    times = []
    for _ in range(40):
        for s in spikes:
            t = time.perf_counter(); lone(s).block_until_ready(); times.append(time.perf_counter() - t)
    medians.append(float(np.median(times)) * 1e6)
print(json.dumps({"medians": medians, "layer": numba.threading_layer()}))
"""

NUMBA_CHILD = r"""
import json, sys, threading, time
import numpy as np, numba
from numba import njit, prange

@njit(parallel=True, nogil=True)
def halves(x, out):
    parts = out.size
    for t in prange(parts):
        acc = 0.0
        for i in range(t * x.size // parts, (t + 1) * x.size // parts):
            acc += x[i]
        out[t] = acc

other_threads, calls = int(sys.argv[1]), int(sys.argv[2])
x, out = np.ones(200_000), np.zeros(numba.get_num_threads())
halves(x, out)
release = threading.Event()

def hold_a_pool():
    numba.set_num_threads(other_threads)  # Numba's thread count is per thread
    halves(x, out[:other_threads])
    release.wait()

if other_threads:
    holder = threading.Thread(target=hold_a_pool)
    holder.start()
    time.sleep(0.2)
for _ in range(200):
    halves(x, out)
times = []
for _ in range(calls):
    t = time.perf_counter(); halves(x, out); times.append(time.perf_counter() - t)
    time.sleep(0.0002)  # an idle gap between calls, as between the steps of a program
release.set()
print(json.dumps({"median": float(np.median(times)) * 1e6, "threads": numba.get_num_threads(),
                  "layer": numba.threading_layer()}))
"""

CASES = [("sync", False), ("sync", True), ("default", False), ("default", True)]


def run_case(mode: str, worker_first: bool, rate: float, rounds: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, mode, "1" if worker_first else "0", str(rate), str(rounds)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_numba_case(other_threads: int, calls: int) -> dict:
    out = subprocess.run([sys.executable, "-c", NUMBA_CHILD, str(other_threads), str(calls)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def numba_only_table(calls: int, repeats: int) -> tuple[str, int]:
    """Numba alone: the main thread's parallel kernel, alone or beside another thread's pool."""
    alone = [run_numba_case(0, calls) for _ in range(repeats)]
    threads = alone[0]["threads"]
    medians = {"none": [res["median"] for res in alone]}
    for label, other in ((f"{threads} threads", threads), ("1 thread", 1)):
        medians[label] = [run_numba_case(other, calls)["median"] for _ in range(repeats)]
    base = min(medians["none"])
    rows = [[label, f"{min(m):.0f}-{max(m):.0f}", f"{min(m) / base:.2f}x"] for label, m in medians.items()]
    table = markdown_table(["another live thread holds an OpenMP pool of", "median (us)", "ratio"], rows)
    return table, threads


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one rate, two rounds per case")
    args = parser.parse_args(argv)
    rates = [0.2] if args.quick else [0.05, 0.2, 0.5]
    rounds = 2 if args.quick else 3
    rows, layer = [], "?"
    for rate in rates:
        results = {case: run_case(*case, rate, rounds) for case in CASES}
        layer = results[CASES[0]]["layer"]
        base = min(results[("sync", False)]["medians"])
        for (mode, worker_first), res in results.items():
            lo, hi = min(res["medians"]), max(res["medians"])
            rows.append((rate, mode, worker_first, lo, hi, lo / base))
    numba_calls, numba_repeats = (1000, 2) if args.quick else (2000, 3)
    numba_table, numba_threads = numba_only_table(numba_calls, numba_repeats)
    table = markdown_table(
        ["active", "dispatch", "kernels first run on JAX's worker thread", "median (us)", "ratio"],
        [[f"{rate:.0%}", mode, "yes" if worker_first else "no", f"{lo:.0f}-{hi:.0f}", f"{ratio:.2f}x"]
         for rate, mode, worker_first, lo, hi, ratio in rows])
    text = "\n".join([
        provenance(),
        "# A lone `BinaryArray @ CSR` under JAX's CPU dispatch modes",
        "",
        f"n = 20000, 100 synapses per row; Numba threading layer: {layer}; fresh process per row; "
        f"medians of {rounds} rounds of 320 calls (lowest-highest); ratio: lowest median over the "
        "synchronous clean run's.",
        "",
        table,
        "",
        "## The cause, without JAX",
        "",
        f"A parallel Numba kernel (sum of 200 000 floats in {numba_threads} parts) called from the main thread, "
        f"{numba_calls} calls with 0.2 ms idle between them, in a fresh process per row ({numba_repeats} processes; "
        "lowest-highest median); ratio over the lowest median alone.",
        "",
        numba_table,
    ]) + "\n"
    print(text)
    stem = os.path.join(RESULTS, "dispatch_threads_quick" if args.quick else "dispatch_threads")
    os.makedirs(RESULTS, exist_ok=True)
    with open(stem + ".md", "w") as f:
        f.write(text)
    series = {f"{mode}{', worker first' if worker_first else ''}":
              [row[3] for row in rows if row[1:3] == (mode, worker_first)] for mode, worker_first in CASES}
    save_bar_plot(stem + ".png", [f"{rate:.0%}" for rate in rates], series, ylabel="median us per call",
                  title=f"lone BinaryArray @ CSR, n = 20000, layer {layer}", log=False)
    print(f"wrote {stem}.md and .png")


if __name__ == "__main__":
    main()

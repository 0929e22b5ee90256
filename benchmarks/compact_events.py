"""Compact events: ``CompactBinary @ CSR`` (a list of the active rows) against ``BinaryArray @ CSR`` and peers.

    PYTHONPATH=. /tmp/v312/bin/python benchmarks/compact_events.py    # with brainevent (Python >= 3.12)
    python benchmarks/compact_events.py --quick                        # fewer repetitions
    python benchmarks/compact_events.py --busy                         # 2 spinning processes per core beside it

The goal (issue "Compatibility and correctness v3"): at 1 % activity and
n = 10^5, ``CompactBinary @ CSR`` costs at most 0.5x ``BinaryArray @ CSR``.

Cases: ``spikes (n,) @ W (n, n)``, ``W`` CSR with ``k`` synapses per row
(columns sorted), float32 per-synapse weights, 1 % of the rows active, for
``k`` = 10 and 100, each twice: with new spikes at each call (64 spike vectors
taken in turn, as a network's spikes are new at each step: the active rows'
synapses are then mostly not in the caches) and with the same spikes at every
call (they stay there).  Candidates, jitted where they are JAX, timed round-robin
in one process, each block of calls after one untimed call (medians of wall
time and of the process's CPU time, all threads; ratio = wall /
``BinaryArray @ CSR``'s):

* evjax ``CompactBinary @ CSR``, the list made beforehand (made once, used by
  several layers or steps: what the goal measures);
* evjax ``CompactBinary.from_array(s) @ CSR``, the listing inside the call;
* evjax ``BinaryArray(s) @ CSR`` (the baseline);
* brainevent 0.3.0 ``BinaryArray(s) @ CSR`` (its ``CompactBinary @ CSR``
  raises ``NotImplementedError`` in 0.3.0; the script checks and says so);
* scipy: ``W.T @ s`` with ``W.T`` stored as CSR (a gather over every synapse);
* ``jax.experimental.sparse``: ``s @ BCOO`` (every stored entry);
* the limit: a serial Numba loop from NumPy over the list of active rows;
* dense XLA is left out: the matrix would be 40 GB.

First calls: each of the three evjax forms in a fresh process with empty
``NUMBA_CACHE_DIR`` and ``EVJAX_CACHE_DIR`` (import excluded, first jitted
call: trace, compile, run), wall and CPU.

Writes ``benchmarks/results/compact_events.{md,png}`` (``--busy``: ``compact_events_busy.md``).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import warnings

import numpy as np

warnings.filterwarnings("ignore")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numba  # noqa: E402

jax.config.update("jax_cpu_enable_async_dispatch", False)  # synchronous, as the loop from NumPy

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchmarks.common import (  # noqa: E402
    fmt_time, freeze_import_heap, markdown_table, median_wall_cpu, provenance, save_bar_plot,
)
import evjax  # noqa: E402

try:
    import brainevent  # noqa: E402
except Exception:  # noqa: BLE001 - optional peer
    brainevent = None

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
N, RATE = 100_000, 0.01
SPIKE_SETS = 64  # spike vectors taken in turn, one per call (a network's spikes are new at each step)


@numba.njit(cache=True, nogil=True)
def listed_loop(data, indices, indptr, ids, count, n_out):
    out = np.zeros(n_out, data.dtype)
    for a in range(count):
        i = ids[a]
        for k in range(indptr[i], indptr[i + 1]):
            out[indices[k]] += data[k]
    return out


def structure(n: int, k: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    indices = np.sort(rng.integers(0, n, (n, k)), axis=1).astype(np.int32).ravel()
    indptr = (np.arange(n + 1) * k).astype(np.int32)
    data = rng.standard_normal(n * k).astype(np.float32)
    return data, indices, indptr


def brainevent_compact_works(W_be, s) -> str:
    try:
        brainevent.CompactBinary.from_array(jnp.asarray(s)) @ W_be
        return "works"
    except Exception as e:  # noqa: BLE001 - recorded
        return f"raises {type(e).__name__}: {e}"


@functools.lru_cache(maxsize=None)
def brainevent_matrix(k: int):
    """brainevent's CSR of :func:`structure` at ``k``, one object per ``k``: jax compares the static
    fields of two of its CSRs of the same shapes, which brainevent 0.3.0's do not support (an error)."""
    data, indices, indptr = structure(N, k)
    return brainevent.CSR((jnp.asarray(data), jnp.asarray(indices), jnp.asarray(indptr)), shape=(N, N))


def in_turn(fn, inputs):
    """A call of ``fn`` on the next of ``inputs`` each time (one input: the same every call)."""
    position = [0]

    def call():
        x = inputs[position[0] % len(inputs)]
        position[0] += 1
        return fn(x)

    return call


def measure(k: int, *, rounds: int, calls: int, spike_sets: int):
    """The candidates' medians at ``k`` synapses per row; each call takes the next of ``spike_sets``
    spike vectors (1: the same spikes at every call, so the active rows stay in the caches; 64: new
    spikes at each call, as a network's at each step)."""
    import scipy.sparse as sp
    from jax.experimental import sparse as jsparse

    rng = np.random.default_rng(1)
    data, indices, indptr = structure(N, k)
    spikes = [rng.random(N) < RATE for _ in range(spike_sets)]
    W = evjax.CSR((jnp.asarray(data), jnp.asarray(indices), jnp.asarray(indptr)), shape=(N, N))
    s_j = [jnp.asarray(s) for s in spikes]
    cb = [evjax.CompactBinary.from_array(s) for s in s_j]
    compact = jax.jit(lambda c, W: c @ W)
    listing = jax.jit(lambda s, W: evjax.CompactBinary.from_array(s) @ W)
    binary = jax.jit(lambda s, W: evjax.BinaryArray(s) @ W)
    ids = [np.flatnonzero(s).astype(np.int32) for s in spikes]
    at = sp.csr_matrix((data, indices, indptr), shape=(N, N)).T.tocsr()
    s32 = [s.astype(np.float32) for s in spikes]
    bcoo = jsparse.BCOO.from_scipy_sparse(sp.csr_matrix((data, indices, indptr), shape=(N, N)))
    bcoo_mv = jax.jit(lambda s, m: s @ m)
    s32_j = [jnp.asarray(s) for s in s32]
    candidates = {
        "evjax CompactBinary @ CSR (list made)": in_turn(lambda c: compact(c, W), cb),
        "evjax CompactBinary.from_array(s) @ CSR": in_turn(lambda s: listing(s, W), s_j),
        "evjax BinaryArray @ CSR": in_turn(lambda s: binary(s, W), s_j),
    }
    note = ""
    if brainevent is not None:
        W_be = brainevent_matrix(k)
        be = jax.jit(lambda s, W: brainevent.BinaryArray(s) @ W)
        candidates["brainevent 0.3.0 BinaryArray @ CSR"] = in_turn(lambda s: be(s, W_be), s_j)
        note = f"brainevent 0.3.0's `CompactBinary @ CSR` {brainevent_compact_works(W_be, spikes[0])}."
    candidates["scipy W.T @ s (CSR of W.T)"] = in_turn(lambda s: at @ s, s32)
    candidates["jax.experimental.sparse s @ BCOO"] = in_turn(lambda s: bcoo_mv(s, bcoo), s32_j)
    candidates["hand-written Numba (list)"] = in_turn(
        lambda i: listed_loop(data, indices, indptr, i, i.size, N), ids)
    for q in range(min(spike_sets, 2)):  # every candidate's q-th call against the float64 loop
        want = listed_loop(data.astype(np.float64), indices, indptr, ids[q], ids[q].size, N)
        exact = np.asarray(binary(s_j[q], W))
        for name, fn in candidates.items():
            got = np.asarray(fn())
            if name.startswith("evjax"):  # the same bits as the scan
                np.testing.assert_array_equal(got, exact, err_msg=name)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=name)
    return median_wall_cpu(candidates, rounds=rounds, calls=calls, warmup=3, settle=True), note


FIRST_CALL = r"""
import json, os, sys, time
import numpy as np
t_import = time.perf_counter()
import jax, jax.numpy as jnp
import evjax
form, n, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(0)
indices = np.sort(rng.integers(0, n, (n, k)), axis=1).astype(np.int32).ravel()
W = evjax.CSR((jnp.asarray(rng.standard_normal(n * k).astype(np.float32)), jnp.asarray(indices),
               jnp.asarray((np.arange(n + 1) * k).astype(np.int32))), shape=(n, n))
s = jnp.asarray(rng.random(n) < 0.01)
cb = evjax.CompactBinary.from_array(s)
jax.block_until_ready(cb.active_ids)
f = {"compact": jax.jit(lambda c, W: c @ W), "listing": jax.jit(lambda s, W: evjax.CompactBinary.from_array(s) @ W),
     "binary": jax.jit(lambda s, W: evjax.BinaryArray(s) @ W)}[form]
arg = cb if form == "compact" else s
w0, c0 = time.perf_counter(), time.process_time()
jax.block_until_ready(f(arg, W))
print(json.dumps({"wall": time.perf_counter() - w0, "cpu": time.process_time() - c0}))
"""


def first_calls(k: int) -> dict:
    out = {}
    for form in ("compact", "listing", "binary"):
        with tempfile.TemporaryDirectory() as numba_dir, tempfile.TemporaryDirectory() as evjax_dir:
            env = dict(os.environ, NUMBA_CACHE_DIR=numba_dir, EVJAX_CACHE_DIR=evjax_dir)
            run = subprocess.run([sys.executable, "-c", FIRST_CALL, form, str(N), str(k)], env=env,
                                 capture_output=True, text=True, check=True)
            out[form] = json.loads(run.stdout.strip().splitlines()[-1])
    return out


def spin_forever():  # a busy-machine neighbour
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--busy", action="store_true", help="2 spinning processes per core beside the timing")
    parser.add_argument("--no-first-calls", action="store_true")
    args = parser.parse_args()
    rounds, calls = (3, 10) if args.quick else (9, 20)
    neighbours = []
    if args.busy:
        import multiprocessing as mp

        neighbours = [mp.Process(target=spin_forever, daemon=True) for _ in range(2 * os.cpu_count())]
        for p in neighbours:
            p.start()
    freeze_import_heap()
    versions = f"jax {jax.__version__}, numba {numba.__version__}, Python {sys.version.split()[0]}" + (
        f", brainevent {brainevent.__version__}" if brainevent is not None else ", brainevent not importable")
    load = f"; busy: {len(neighbours)} spinning processes beside it" if neighbours else ""
    lines = [provenance(), "# Compact events: CompactBinary @ CSR", "",
             f"{versions}; {os.cpu_count()} CPUs{load}. n = {N}, {RATE:.0%} of the rows active, float32; medians of "
             f"{rounds} x {calls} synchronous calls, candidates interleaved; wall = elapsed time, CPU = the "
             f"process's CPU time (all threads); ratio = wall / evjax BinaryArray @ CSR's wall.", ""]
    labels, series, goals = [], {}, []
    for k in (10, 100):
        for spike_sets, how in ((SPIKE_SETS, f"new spikes at each call ({SPIKE_SETS} vectors in turn)"),
                                (1, "the same spikes at every call")):
            times, note = measure(k, rounds=rounds, calls=calls, spike_sets=spike_sets)
            base = times["evjax BinaryArray @ CSR"][0]
            lines += [f"## {k} synapses per row ({N * k:,} synapses; {int(N * RATE) * k:,} of active rows), {how}", "",
                      markdown_table(["method", "wall", "CPU", "ratio"],
                                     [[name, fmt_time(t), fmt_time(c), f"{t / base:.2f}x"]
                                      for name, (t, c) in times.items()]), ""]
            if note:
                lines += [note, ""]
            ratio = times["evjax CompactBinary @ CSR (list made)"][0] / base
            goals.append(f"k = {k}, {how}: CompactBinary @ CSR / BinaryArray @ CSR = {ratio:.2f}x "
                         f"({'met' if ratio <= 0.5 else 'NOT met'})")
            labels.append(f"k = {k}, {'new' if spike_sets > 1 else 'same'} spikes")
            for name, (t, _) in times.items():
                series.setdefault(name, []).append(t * 1e6)
            print("\n".join(lines[-8:]), flush=True)
    for p in neighbours:
        p.terminate()
    lines += ["## Goal: CompactBinary @ CSR <= 0.5x BinaryArray @ CSR", ""] + [f"- {g}" for g in goals] + [""]
    if not args.no_first_calls and not args.busy:
        lines += ["## First call in a fresh process (empty NUMBA_CACHE_DIR and EVJAX_CACHE_DIR)", ""]
        rows = []
        for k in (10,):
            fc = first_calls(k)
            rows += [[form, fmt_time(v["wall"]), fmt_time(v["cpu"])] for form, v in fc.items()]
        lines += [markdown_table(["form (k = 10)", "wall", "CPU"], rows), ""]
    text = "\n".join(lines) + "\n"
    print(text)
    out = os.path.join(RESULTS, "compact_events_busy.md" if args.busy else "compact_events.md")
    with open(out, "w") as f:
        f.write(text)
    if not args.busy:
        save_bar_plot(os.path.splitext(out)[0] + ".png", labels, series, ylabel="us per call (wall)",
                      title=f"spikes @ CSR, n = {N}, {RATE:.0%} active")


if __name__ == "__main__":
    main()

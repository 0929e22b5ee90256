"""The first 200 calls of a jitted training step, evjax against brainevent, each in a fresh process with empty caches.

    python benchmarks/first_calls.py                                   # evjax, and brainevent where found
    python benchmarks/first_calls.py --brainevent-python /path/to/py312/bin/python --rounds 3

A new user's first script: build a CSR (n = 20000 neurons, 1 % connectivity,
per-synapse weights), then call a jitted ``value_and_grad`` of
``sum((spikes @ W) ** 2)`` w.r.t. the weights 200 times, each call with its
own spike vector (5 % active), blocking on each result.  Every run is a
fresh process with new, empty ``NUMBA_CACHE_DIR`` and ``EVJAX_CACHE_DIR``
(temporary folders), so every compile is paid; the two libraries run in
alternate rounds.  Reported per library: the wall time and the process's CPU
time (all threads) of the 200 calls, the first call alone, and the median of
the last 100 calls.  Goal (issue 29): evjax's total wall time at most 1.5x
brainevent's.

brainevent 0.3.0 needs Python 3.12 or later: give its interpreter with
``--brainevent-python`` (or ``$BRAINEVENT_PYTHON``; a virtualenv with
``pip install brainevent==0.3.0``).  Writes ``benchmarks/results/first_calls.{md,png}``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.common import RESULTS, markdown_table, save_bar_plot  # noqa: E402

N, P_CONN, RATE, CALLS = 20000, 0.01, 0.05, 200
GOAL = 1.5


def child(library: str, n: int, calls: int) -> dict:
    """One fresh process: the structure, then ``calls`` calls of the jitted training step."""
    import time

    import jax
    import jax.numpy as jnp

    lib = __import__(library)
    rng = np.random.default_rng(0)
    counts = rng.binomial(n, P_CONN, n)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    indices = np.concatenate([np.sort(rng.choice(n, c, replace=False)) for c in counts]).astype(np.int32)
    data = rng.standard_normal(indices.size).astype(np.float32)
    W = lib.CSR((jnp.asarray(data), jnp.asarray(indices), jnp.asarray(indptr)), shape=(n, n))
    spikes = [jnp.asarray(rng.random(n) < RATE) for _ in range(calls)]

    def loss(d, s):
        return jnp.sum((lib.BinaryArray(s) @ W.with_data(d)) ** 2)

    step = jax.jit(jax.value_and_grad(loss))
    times = []
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for s in spikes:
        t = time.perf_counter()
        jax.block_until_ready(step(W.data, s))
        times.append(time.perf_counter() - t)
    return {"wall": time.perf_counter() - wall0, "cpu": time.process_time() - cpu0, "first": times[0],
            "steady": float(np.median(times[-100:])), "version": getattr(lib, "__version__", "?")}


def run(python: str, library: str, n: int, calls: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="evjax-first-calls-") as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": os.path.join(cache, "numba"),
               "EVJAX_CACHE_DIR": os.path.join(cache, "evjax"), "PYTHONPATH": ROOT}
        res = subprocess.run([python, os.path.abspath(__file__), "--child", library, "--n", str(n),
                              "--calls", str(calls)], env=env, capture_output=True, text=True, timeout=3600)
    if res.returncode != 0:
        raise RuntimeError(f"{library} run failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=N)
    parser.add_argument("--calls", type=int, default=CALLS)
    parser.add_argument("--rounds", type=int, default=2, help="fresh processes per library (default 2)")
    parser.add_argument("--brainevent-python", default=os.environ.get("BRAINEVENT_PYTHON"),
                        help="a Python (3.12+) with brainevent 0.3.0 installed")
    parser.add_argument("--out", default=None, help="markdown output (default benchmarks/results/first_calls.md)")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.n, args.calls)))
        return 0

    libraries = [("evjax", sys.executable)]
    if args.brainevent_python:
        libraries.append(("brainevent", args.brainevent_python))
    runs = {name: [] for name, _ in libraries}
    for r in range(args.rounds):
        for name, python in (libraries if r % 2 == 0 else libraries[::-1]):
            runs[name].append(run(python, name, args.n, args.calls))
            print(name, runs[name][-1], flush=True)

    def med(name, key):
        return float(np.median([x[key] for x in runs[name]]))

    rows = [[name, runs[name][0]["version"], f"{med(name, 'wall'):.2f} s", f"{med(name, 'cpu'):.2f} s",
             f"{med(name, 'first'):.2f} s", f"{med(name, 'steady') * 1e3:.2f} ms"] for name in runs]
    lines = [f"<!-- run {__import__('datetime').date.today()} on {os.cpu_count()} CPU cores, no GPU, "
             f"{os.uname().machine}: python benchmarks/first_calls.py {' '.join(argv or sys.argv[1:])} -->",
             "# The first 200 calls of a training step, empty caches", "",
             f"CSR n = {args.n}, {P_CONN:.0%} connectivity, per-synapse weights; a jitted value_and_grad of "
             f"sum((spikes @ W)**2) w.r.t. the weights, {args.calls} calls, each with its own spike vector "
             f"({RATE:.0%} active). Each run a fresh process with empty NUMBA_CACHE_DIR and EVJAX_CACHE_DIR; "
             f"medians of {args.rounds} runs per library, alternating. Load average at start: "
             f"{os.getloadavg()[0]:.2f}.", "",
             markdown_table(["library", "version", f"{args.calls} calls, wall", "CPU (all threads)", "first call",
                             "median of the last 100"], rows), ""]
    if "brainevent" in runs:
        ratio = med("evjax", "wall") / med("brainevent", "wall")
        lines.append(f"evjax / brainevent, total wall: {ratio:.2f}x (goal <= {GOAL}x: "
                     f"{'met' if ratio <= GOAL else 'NOT met'}).")
    else:
        lines.append("brainevent not run (no --brainevent-python): the goal is not measured.")
    text = "\n".join(lines) + "\n"
    print(text)
    out = args.out or os.path.join(RESULTS, "first_calls.md")
    with open(out, "w") as f:
        f.write(text)
    save_bar_plot(os.path.splitext(out)[0] + ".png", ["wall", "CPU"],
                  {name: [med(name, "wall"), med(name, "cpu")] for name in runs},
                  title=f"first {args.calls} calls of a training step, empty caches", ylabel="seconds", log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

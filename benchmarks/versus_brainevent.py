"""evjax against brainevent 0.3.0, side by side in alternating fresh processes, on a quiet and a busy machine.

    python benchmarks/versus_brainevent.py --brainevent-python /path/to/py312/bin/python
    python benchmarks/versus_brainevent.py --brainevent-python ... --quick

brainevent 0.3.0 needs Python 3.12 and jax 0.12, evjax pins jax < 0.12, so the two cannot share a process:
each child process runs one library (``--brainevent-python``, or ``$BRAINEVENT_PYTHON``: an interpreter
with ``pip install brainevent==0.3.0``), the libraries alternate, and each child also times XLA's dense
product on the same data, a yardstick for the two jax versions.

Cases (the ones issue 29 names):

* ``csr forward``: ``BinaryArray(spikes) @ W``, CSR n = 4000 at 2 %, 5 % of neurons spiking; evjax with
  its default threads, brainevent as it ships (serial kernels).  Goal: under load, at most 1.0x
  brainevent's time.
* ``dense weight gradient``: ``jit(grad)`` of ``sum(binary_densemv(W, spikes, transpose=True))`` w.r.t.
  ``W``, n = 4000, 1 %, 5 % and 20 % spiking.  Goal: at most 1.0x brainevent's time (quiet machine).

The load is ``benchmarks/contention.py``'s: neighbours running a parallel Numba kernel with 1 ms pauses,
and spinners.  Each cell is the median of ``calls`` calls in one child, the best of ``rounds``
alternating children.  Writes ``benchmarks/results/versus_brainevent.{md,png}``.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks import side_by_side  # noqa: E402
from benchmarks.common import RESULTS, fmt_time, markdown_table, provenance, save_bar_plot  # noqa: E402

N = 4000
CSR_PROB, CSR_RATE = 0.02, 0.05
DENSE_RATES = (0.01, 0.05, 0.2)
CSR_GOAL = 1.0  # evjax / brainevent under load, CSR forward
DENSE_GOAL = 1.0  # evjax / brainevent, dense weight gradient, quiet


def _cases(lib):
    """``{name: (library call, XLA yardstick)}``, each a function of no arguments that waits for its result."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    dense = ((rng.random((N, N)) < CSR_PROB) * rng.standard_normal((N, N))).astype(np.float32)
    W = lib.CSR.fromdense(dense)
    spikes = jnp.asarray(rng.random(N) < CSR_RATE)
    dense_j, spikes_f = jnp.asarray(dense), spikes.astype(jnp.float32)
    forward = jax.jit(lambda d, s: lib.BinaryArray(s) @ W.with_data(d))
    dot = jax.jit(lambda w, x: x @ w)

    def waited(f, *args):
        return lambda: jax.block_until_ready(f(*args))

    cases = {"csr forward": (waited(forward, W.data, spikes), waited(dot, dense_j, spikes_f))}
    D = jnp.asarray(rng.standard_normal((N, N)).astype(np.float32))
    grad = jax.jit(jax.grad(lambda w, s: jnp.sum(lib.binary_densemv(w, s, transpose=True))))
    grad_dot = jax.jit(jax.grad(lambda w, x: jnp.sum(x @ w)))
    for rate in DENSE_RATES:
        s = jnp.asarray(rng.random(N) < rate)
        cases[f"dense weight gradient, {rate:.0%}"] = (waited(grad, D, s), waited(grad_dot, D, s.astype(jnp.float32)))
    return cases


def child(library: str, calls: int) -> dict:
    lib = __import__(library)
    from benchmarks.common import freeze_import_heap

    cases = _cases(lib)
    for call, yardstick in cases.values():
        call(), yardstick()
    if library == "evjax":
        from benchmarks.common import settle_kernels

        settle_kernels()  # the full kernels, not the first calls' serial tiers
    freeze_import_heap()
    out = {"version": getattr(lib, "__version__", "?")}
    for name, pair in cases.items():
        for which, call in zip(("lib", "xla"), pair):
            for _ in range(3):
                call()
            samples = []
            for _ in range(calls):
                start = time.perf_counter()
                call()
                samples.append(time.perf_counter() - start)
            out[f"{name}|{which}"] = float(np.median(samples))
    return out


def measure(pythons: dict, rounds: int, calls: int) -> dict:
    """``{library: {key: best median over the rounds}}``, the libraries alternating."""
    best: dict = {}
    for _ in range(rounds):
        for library, python in pythons.items():
            for key, value in side_by_side.run_child(__file__, python, library, calls).items():
                mine = best.setdefault(library, {})
                mine[key] = value if key == "version" else min(value, mine.get(key, float("inf")))
    return best


def main(argv=None):
    started = side_by_side.run(__file__, __doc__, argv, child, measure)
    if started is None:
        return
    args, calls, rounds, quiet, loaded, load_avg = started

    lines = [provenance(argv), "# evjax and brainevent side by side", "",
             f"evjax {quiet['evjax']['version']} (jax < 0.12, this interpreter), brainevent "
             f"{quiet['brainevent']['version']} (`{args.brainevent_python}`), {os.cpu_count()} CPUs. Each library "
             f"in its own fresh processes, alternating; each cell the median of {calls} calls, the best of {rounds} "
             f"rounds. 'XLA' is the dense product (`x @ W`, or its weight gradient) timed in the same process: a "
             f"yardstick for the two jax versions. Loaded: {args.neighbours} neighbour processes running a parallel "
             f"Numba kernel with 1 ms pauses and {args.spinners} spinners (`benchmarks/contention.py`); 1-minute "
             f"load average about {load_avg:.1f}.", ""]
    rows, labels, plot, goals = [], [], {"evjax": [], "brainevent": []}, []
    for name in (k.split("|")[0] for k in quiet["evjax"] if k.endswith("|lib")):
        for state, res in (("quiet", quiet), ("loaded", loaded)):
            ev, be = res["evjax"][f"{name}|lib"], res["brainevent"][f"{name}|lib"]
            ev_x, be_x = res["evjax"][f"{name}|xla"], res["brainevent"][f"{name}|xla"]
            rows.append([name, state, fmt_time(ev), fmt_time(be), f"{ev / be:.2f}x", fmt_time(ev_x), fmt_time(be_x)])
            labels.append(f"{name} ({state})")
            plot["evjax"].append(ev)
            plot["brainevent"].append(be)
            if name == "csr forward" and state == "loaded":
                goals.append((f"CSR forward under load: <= {CSR_GOAL}x brainevent", ev / be, CSR_GOAL))
            if name.startswith("dense weight gradient") and state == "quiet":
                goals.append((f"{name}, quiet: <= {DENSE_GOAL}x brainevent", ev / be, DENSE_GOAL))
    lines.append(markdown_table(["case", "machine", "evjax", "brainevent", "evjax / brainevent",
                                 "XLA (evjax's jax)", "XLA (brainevent's jax)"], rows))
    lines += ["", "## Goals (issue 29)", ""]
    lines.append(markdown_table(["goal", "measured", ""],
                                [[g, f"{r:.2f}x", "met" if r <= limit else "NOT met"] for g, r, limit in goals]))
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(RESULTS, exist_ok=True)
    with open(args.out or os.path.join(RESULTS, "versus_brainevent.md"), "w") as f:
        f.write(text)
    save_bar_plot(os.path.join(RESULTS, "versus_brainevent.png"), labels, plot, ylabel="seconds per call",
                  title="evjax and brainevent 0.3.0, quiet and loaded", log=True)


if __name__ == "__main__":
    main()

"""Data-parallel scaling over processes: ``examples/distributed_snn.py`` in 1 and 2 processes on this machine.

    python benchmarks/scaling.py                    # 1 and 2 processes, 3 rounds, alternating
    python benchmarks/scaling.py --processes 1 2 4 --rounds 1

Each process has 1 Numba thread and one XLA CPU device, so 2 processes use
the 2 cores without oversubscribing them.  The global batch is the same in
every run (the processes split it), so the ideal time per step of N
processes is the 1-process time / N.  Reported per N: the median time per
training step (the best round's median), the throughput (trials per second)
against 1 process, the efficiency (throughput ratio / N), and the overhead:
the share of a step beyond the ideal split (communication, the processes'
synchronisation, and whatever does not split).  Also the final loss, which
must equal the 1-process run's.  Wall time; a busy machine distorts it.

Writes ``benchmarks/results/scaling.{md,png}``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchmarks.common import RESULTS, markdown_table, provenance, save_bar_plot  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THROUGHPUT_GOAL = 1.6  # issue 33: 2 processes on 2 cores, against 1 process with 1 thread


def run(processes: int, args) -> dict:
    """One run of the example; its JSON result."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = [sys.executable, os.path.join(ROOT, "examples", "distributed_snn.py"), "--processes", str(processes),
               "--threads", "1", "--hidden", str(args.hidden), "--n-steps", str(args.n_steps), "--batch",
               str(args.batch), "--train-steps", str(args.train_steps), "--out", out]
        env = dict(os.environ, NUMBA_NUM_THREADS="1")
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
        if proc.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        with open(out) as f:
            return json.load(f)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--hidden", type=int, default=2000)
    p.add_argument("--n-steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--train-steps", type=int, default=12)
    args = p.parse_args(argv)

    results: dict[int, list[dict]] = {n: [] for n in args.processes}
    for r in range(args.rounds):
        for n in args.processes:  # alternating, so that a change of load hits every N alike
            results[n].append(run(n, args))
            print(f"round {r}: {n} process(es): {results[n][-1]['step_time_s'] * 1e3:.1f} ms per step", flush=True)

    base = min(x["step_time_s"] for x in results[args.processes[0]]) * args.processes[0]
    rows, times = [], []
    load = os.getloadavg()[0]
    for n in args.processes:
        best = min(results[n], key=lambda x: x["step_time_s"])
        t = best["step_time_s"]
        speedup = base / t
        ideal = base / n
        verdict = ""
        if n == 2:
            verdict = "met" if speedup >= THROUGHPUT_GOAL else "NOT met"
        rows.append([str(n), f"{t * 1e3:.1f} ms", f"{args.batch / t:.1f}", f"{speedup:.2f}x", f"{speedup / n:.2f}",
                     f"{max(0.0, (t - ideal) / t):.0%}", f"{best['losses'][-1]:.6f}", verdict])
        times.append(t * 1e3)
    lines = [
        provenance(argv),
        "# Data-parallel scaling over processes",
        "",
        f"`examples/distributed_snn.py`: the main example's network ({args.hidden} LIF neurons, "
        f"{args.n_steps} time steps per trial), a global batch of {args.batch} trials split among the processes, "
        f"Adam; 1 Numba thread and one CPU device per process, jax.distributed with gloo collectives on "
        f"localhost. Best of {args.rounds} alternating rounds of the median step after 2 warm-up steps. "
        f"Load average at the end: {load:.2f}.",
        "",
        markdown_table(["processes", "time per step", "trials / s", "throughput vs 1 process "
                        f"(goal for 2: >= {THROUGHPUT_GOAL}x)", "efficiency", "overhead beyond the ideal split",
                        "final loss", ""], rows),
        "",
        "The final losses agree across the process counts (the same seed, the same batches).",
    ]
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "scaling.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    save_bar_plot(os.path.join(RESULTS, "scaling.png"), [f"{n} proc" for n in args.processes],
                  {"ms per training step": times}, ylabel="ms per step", title="distributed_snn.py", log=False)
    print("\n".join(lines))


if __name__ == "__main__":
    main()

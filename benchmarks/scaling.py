"""Data-parallel scaling over processes: ``examples/distributed_snn.py`` in 1 and 2 processes on this machine.

    python benchmarks/scaling.py                    # 1 and 2 processes, 3 rounds, alternating
    python benchmarks/scaling.py --processes 1 2 4 --rounds 1

Each process has 1 Numba thread and one XLA CPU device, so 2 processes use
the 2 cores without oversubscribing them.  The global batch is the same in
every run of a table (the processes split it), so the ideal time per step of
N processes is the 1-process time / N.  Reported per run: the median time per
training step (the best round's median), the throughput (trials per second)
against 1 process, the efficiency (throughput ratio / N), and the final loss,
which must equal the 1-process run's.  A control row runs two unrelated
one-process jobs of half the batch at the same time: what the machine gives
two jobs at once, the ceiling of any split.  Wall time; a busy machine
distorts it.

``--model`` runs the model-parallel part instead: ``examples/large_network.py``
(JITC connectivity generated output by output) in 1 and 2 processes at 10^6
neurons x 1000 synapses, the event-driven one-process run beside them, and
10^7 neurons x 1000 synapses over 4 processes; time per step and peak RSS
of every process.  Writes ``benchmarks/results/scaling_model.md``.

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


def _command(processes: int, batch: int, args, out: str) -> list[str]:
    return [sys.executable, os.path.join(ROOT, "examples", "distributed_snn.py"), "--processes", str(processes),
            "--threads", "1", "--hidden", str(args.hidden), "--n-steps", str(args.n_steps), "--batch", str(batch),
            "--train-steps", str(args.train_steps), "--out", out]


def run(processes: int, batch: int, args) -> dict:
    """One run of the example; its JSON result."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = _command(processes, batch, args, out)
        proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, NUMBA_NUM_THREADS="1"), capture_output=True,
                              text=True, timeout=3600)
        if proc.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        with open(out) as f:
            return json.load(f)


def run_independent(copies: int, batch: int, args) -> dict:
    """``copies`` one-process runs of ``batch / copies`` trials each, at the same time, with no
    communication: what this machine gives two unrelated jobs (its ceiling for any split)."""
    with tempfile.TemporaryDirectory() as tmp:
        outs = [os.path.join(tmp, f"r{i}.json") for i in range(copies)]
        procs = [subprocess.Popen(_command(1, batch // copies, args, out), cwd=ROOT, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, env=dict(os.environ, NUMBA_NUM_THREADS="1"))
                 for out in outs]
        for proc in procs:
            _, err = proc.communicate(timeout=3600)
            if proc.returncode:
                raise RuntimeError(f"an independent run failed:\n{err[-3000:]}")
        results = []
        for out in outs:
            with open(out) as f:
                results.append(json.load(f))
    slowest = max(results, key=lambda r: r["step_time_s"])
    return dict(slowest, processes=copies)


def table(batch: int, results: dict) -> list[str]:
    """The markdown rows of one batch size."""
    base = min(x["step_time_s"] for x in results[1])
    rows = []
    for label, runs in results.items():
        best = min(runs, key=lambda x: x["step_time_s"])
        t = best["step_time_s"]
        n = 2 if label == "independent" else label
        speedup = base / t
        verdict = ("met" if speedup >= THROUGHPUT_GOAL else "NOT met") if label == 2 else ""
        name = (f"2 unrelated processes, {batch // 2} trials each, no communication (this machine's ceiling)"
                if label == "independent" else f"{label} process{'es' if label > 1 else ''}")
        rows.append([name, f"{t * 1e3:.1f} ms", f"{batch / t:.1f}", f"{speedup:.2f}x", f"{speedup / n:.2f}",
                     "" if label == "independent" else f"{best['losses'][-1]:.6f}", verdict])
    return [f"## Global batch {batch}", "",
            markdown_table(["run", "time per step", "trials / s",
                            f"throughput vs 1 process (goal for 2: >= {THROUGHPUT_GOAL}x)", "efficiency",
                            "final loss", ""], rows), ""]


def simulate(processes: int, n: int, k: int, steps: int, by_output: bool = True) -> list[dict]:
    """One run of ``examples/large_network.py``; every process's JSON record (process 0 first)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run.json")
        cmd = [sys.executable, os.path.join(ROOT, "examples", "large_network.py"), "--n", str(n), "--k", str(k),
               "--duration", str(steps * 0.5), "--png", "", "--processes", str(processes), "--threads", "1",
               "--out", out, "--timeout", "7200"] + (["--by-output"] if by_output else [])
        proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, NUMBA_NUM_THREADS="1"), capture_output=True,
                              text=True, timeout=7200)
        if proc.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        records = []
        for i in range(processes):
            with open(out if i == 0 else f"{out}.{i}") as f:
                records.append(json.load(f))
        return records


def model_parallel(argv, steps: int) -> None:
    rows = []
    cases = [("10^6 x 1000, input by input (event-driven), 1 process", 1, 10**6, False),
             ("10^6 x 1000, output by output, 1 process", 1, 10**6, True),
             ("10^6 x 1000, output by output, 2 processes", 2, 10**6, True),
             ("10^7 x 1000, output by output, 4 processes", 4, 10**7, True)]
    per_step = {}
    for label, processes, n, by_output in cases:
        records = simulate(processes, n, 1000, steps, by_output)
        t = max(r["per_step_s"] for r in records)
        per_step[label] = t
        rss = ", ".join(f"{r['peak_rss_mb']:.0f}" for r in records)
        rows.append([label, f"{t:.2f} s", rss, f"{records[0]['compile_s']:.1f} s",
                     str(sum(records[0]["counts"]))])
        print(label, f"{t:.2f} s per step", flush=True)
    one = per_step["10^6 x 1000, output by output, 1 process"]
    two = per_step["10^6 x 1000, output by output, 2 processes"]
    ratio = two / (one / 2)
    lines = [provenance(argv), "# Model-parallel scaling over processes", "",
             f"`examples/large_network.py`: the CUBA network with JITC connectivity, {steps} steps of 0.5 ms; "
             f"1 Numba thread and one CPU device per process (2 cores). Output by output (`--by-output`, "
             f"`corder=False`): each process generates only its own neurons' input synapses, every synapse each "
             f"step; the spikes are all-gathered every step. Peak RSS per process (process 0 first).", "",
             markdown_table(["run", "time per step", "peak RSS per process (MB)", "compile", "spikes"], rows), "",
             f"- 10^6 neurons over 2 processes: {two:.2f} s per step, {ratio:.2f}x the ideal split of the "
             f"1-process time ({one / 2:.2f} s); goal <= 1.3x: {'met' if ratio <= 1.3 else 'NOT met'}.",
             "- 10^7 neurons x 1000 synapses (10^10) over 4 processes: it runs (row above).",
             f"- Load average at the end: {os.getloadavg()[0]:.2f}."]
    with open(os.path.join(RESULTS, "scaling_model.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", action="store_true", help="the model-parallel runs (scaling_model.md)")
    p.add_argument("--model-steps", type=int, default=2, help="time steps of each model-parallel run")
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batches", type=int, nargs="+", default=[16, 64])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--hidden", type=int, default=2000)
    p.add_argument("--n-steps", type=int, default=50)
    p.add_argument("--train-steps", type=int, default=10)
    args = p.parse_args(argv)
    if args.model:
        model_parallel(argv, args.model_steps)
        return

    lines = [provenance(argv), "# Data-parallel scaling over processes", "",
             f"`examples/distributed_snn.py` (shard_map over the batch, one gradient all-reduce per step): the main "
             f"example's network ({args.hidden} LIF neurons, {args.n_steps} time steps per trial), the global batch "
             f"split among the processes, Adam; 1 Numba thread and one CPU device per process, jax.distributed with "
             f"gloo collectives on localhost. Best of {args.rounds} alternating rounds of the median step after 2 "
             f"warm-up steps. The ceiling row runs two unrelated one-process jobs of half the batch at once: what "
             f"this machine's 2 cores give any split of the work.", ""]
    plot_labels, plot_times = [], []
    for batch in args.batches:
        results: dict = {n: [] for n in args.processes}
        results["independent"] = []
        for r in range(args.rounds):
            for n in args.processes:  # alternating, so that a change of load hits every run alike
                results[n].append(run(n, batch, args))
                print(f"batch {batch}, round {r}: {n} process(es): {results[n][-1]['step_time_s'] * 1e3:.1f} ms",
                      flush=True)
            results["independent"].append(run_independent(2, batch, args))
            print(f"batch {batch}, round {r}: 2 unrelated: {results['independent'][-1]['step_time_s'] * 1e3:.1f} ms",
                  flush=True)
        lines += table(batch, results)
        for label, runs in results.items():
            plot_labels.append(f"b{batch} {label}")
            plot_times.append(min(x["step_time_s"] for x in runs) * 1e3)
    lines += [f"Load average at the end: {os.getloadavg()[0]:.2f}. The final losses agree across the process "
              f"counts (the same seed, the same batches)."]
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "scaling.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    save_bar_plot(os.path.join(RESULTS, "scaling.png"), plot_labels, {"ms per training step": plot_times},
                  ylabel="ms per step", title="distributed_snn.py", log=False)
    print("\n".join(lines))


if __name__ == "__main__":
    main()

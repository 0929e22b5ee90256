"""Neuron ops: the pure-JAX ops (fused by XLA) against the Numba kernels they replaced, in one run.

    python benchmarks/neuron_ops.py            # n = 2000 and 100000; the example's default configuration
    python benchmarks/neuron_ops.py --quick    # fewer rounds, the example at 500 hidden neurons

The old implementation is read from git (``--old-ref``, by default the last
commit that had the Numba kernels) into a temporary package, so both run in
this process, on the same inputs, timed round-robin (``benchmarks.common``):

* a jitted neuron step, ``lif_step`` + ``exp_trace`` (an STDP trace) +
  ``spike`` (a readout threshold on the trace), forward and ``jax.grad`` of
  it, at n = 2000 and n = 100000 (float32, CPU; the old path forced to
  ``backend="numba"``, its CPU default);
* the jitted Adam step of ``examples/train_sparse_snn.py`` with the new ops
  and with the old ones (the example module loaded twice), in paired rounds;
* all of it again in a child process pinned to one core, where XLA does
  not split a loop over threads (on a busy 2-core machine that split, not
  the loop, can dominate a small step).

The old ops must still run on today's evjax core (``XLACustomKernel``); a
``--old-ref`` whose ops do not is an error.

It also checks (asserts) that the HLO of ``jax.jit(lif_step + spike)`` has no
custom call (the old one has), that the example's training step calls no
neuron kernel, and reports how far the new forward is from the old one
(XLA contracts ``a * b + c`` into one fused multiply-add: last-bit differences).
Writes ``benchmarks/results/neuron_ops.{md,png}``.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))
from benchmarks.common import (  # noqa: E402
    RESULTS, fmt_time, freeze_import_heap, markdown_table, median_times, provenance, save_bar_plot,
)

# The last commit whose neuron ops were XLACustomKernels with Numba (CPU), Warp and Numba CUDA kernels.
OLD_REF = "6e27669e5a0a998aa0477411ead28187cb47120d"
OLD_FILES = ("ops.py", "numba.py")  # the CPU path: the ops and their Numba kernels
OLD_PACKAGE = "evjax_neuron_old"


def load_old(ref: str = OLD_REF):
    """The old neuron ops (``evjax.primitives.neuron`` at ``ref``) as the package ``evjax_neuron_old``.

    Their relative imports of evjax's core are rewritten to absolute ones, so
    they register on today's ``XLACustomKernel`` like they did then.
    """
    folder = tempfile.mkdtemp(prefix="evjax_neuron_old_")
    package = os.path.join(folder, OLD_PACKAGE)
    os.makedirs(package)
    for name in OLD_FILES:
        try:
            text = subprocess.run(["git", "show", f"{ref}:evjax/primitives/neuron/{name}"], cwd=ROOT, check=True,
                                  capture_output=True, text=True).stdout
        except (OSError, subprocess.CalledProcessError) as err:
            raise SystemExit(f"cannot read the old neuron ops at {ref} from git ({err}); pass --old-ref") from None
        text = re.sub(r"^from \.\.\. import ", "from evjax import ", text, flags=re.M)
        text = re.sub(r"^from \.\.\.(\w[\w.]*) import ", r"from evjax.\1 import ", text, flags=re.M)
        with open(os.path.join(package, name), "w") as f:
            f.write(text)
    with open(os.path.join(package, "__init__.py"), "w") as f:
        f.write("")
    sys.path.insert(0, folder)
    return importlib.import_module(f"{OLD_PACKAGE}.ops")


class Ops:
    """One implementation of the ops, with ``backend`` fixed."""

    def __init__(self, module, backend):
        self.module, self.backend = module, backend

    def lif_step(self, *args, **kwargs):
        return self.module.lif_step(*args, backend=self.backend, **kwargs)

    def exp_trace(self, *args, **kwargs):
        return self.module.exp_trace(*args, backend=self.backend, **kwargs)

    def spike(self, *args, **kwargs):
        return self.module.spike(*args, backend=self.backend, **kwargs)


# ---------------------------------------------------------------------------
# the neuron step
# ---------------------------------------------------------------------------
DECAY = float(np.exp(-1.0 / 20.0))


def neuron_step(ops):
    """``(v, trace, i_ext) -> (v, trace, spikes, burst)``: LIF, STDP trace, a threshold on the trace."""

    def step(v, trace, i_ext):
        v, spikes = ops.lif_step(v, i_ext, tau=10.0, v_th=1.0, v_reset=0.0, dt=1.0, detach_reset=True)
        trace = ops.exp_trace(trace, spikes, DECAY)
        burst = ops.spike(trace - 1.5, "arctan")
        return v, trace, spikes, burst

    return step


def neuron_grad(ops):
    step = neuron_step(ops)

    def loss(v, trace, i_ext):
        v, trace, spikes, burst = step(v, trace, i_ext)
        return (v * v).sum() + trace.sum() + spikes.sum() + burst.sum()

    return jax.grad(loss, argnums=(0, 1, 2))


def inputs(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    v = jnp.asarray(rng.uniform(-0.2, 1.1, n), jnp.float32)
    trace = jnp.asarray(rng.uniform(0.0, 3.0, n), jnp.float32)
    i_ext = jnp.asarray(rng.uniform(0.0, 0.3, n), jnp.float32)
    return v, trace, i_ext


def custom_calls(text: str) -> list[str]:
    return re.findall(r'custom_call_target="([^"]+)"', text) + re.findall(r"stablehlo\.custom_call @(\w+)", text)


def compare_forward(new, old, n: int) -> dict:
    """How the new forward differs from the old: spike mismatches and the largest gap of v and trace."""
    args = inputs(n, seed=1)
    got = [np.asarray(a) for a in jax.jit(neuron_step(new))(*args)]
    want = [np.asarray(a) for a in jax.jit(neuron_step(old))(*args)]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    return {"spike_mismatches": int((got[2] != want[2]).sum() + (got[3] != want[3]).sum()),
            "v_gap": float(np.max(np.abs(got[0] - want[0]))), "trace_gap": float(np.max(np.abs(got[1] - want[1]))),
            "v_differ": int((got[0] != want[0]).sum()), "trace_differ": int((got[1] != want[1]).sum())}


def micro(new, old, rounds: int, calls: int) -> tuple[list, dict]:
    """The neuron step, forward and grad, at n = 2000 and 100000: table rows and forward comparisons."""
    rows, accuracy = [], {}
    for n in (2000, 100_000):
        accuracy[n] = compare_forward(new, old, n)
        data = inputs(n)
        for kind, make in (("forward", neuron_step), ("grad", neuron_grad)):
            fns = {name: jax.jit(make(ops)) for name, ops in (("old", old), ("new", new))}
            fns["floor"] = jax.jit(lambda v, t, i: (v + 1.0, t + 1.0, i + 1.0))  # a trivial call on the same arrays
            times = median_times({name: (lambda f=f: f(*data)) for name, f in fns.items()}, rounds=rounds,
                                 calls=calls)
            rows.append([f"step {kind}, n = {n:,}", times["old"], times["new"], times["floor"]])
            print(f"{rows[-1][0]}: old {fmt_time(times['old'])}, new {fmt_time(times['new'])}", flush=True)
    return rows, accuracy


def paired_rounds(candidates: dict, *, rounds: int, calls: int) -> dict:
    """Per-round median seconds of each candidate; the order alternates round by round, so rounds pair up."""
    names = list(candidates)
    for fn in candidates.values():
        jax.block_until_ready(fn())
    out = {name: [] for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            times = []
            for _ in range(calls):
                start = time.perf_counter()
                jax.block_until_ready(candidates[name]())
                times.append(time.perf_counter() - start)
            out[name].append(float(np.median(times)))
    return out


def table_rows(rows: list) -> list:
    return [[label, fmt_time(t_old), fmt_time(t_new), f"{t_old / t_new:.2f}", fmt_time(floor)]
            for label, t_old, t_new, floor in rows]


# ---------------------------------------------------------------------------
# the example's training step
# ---------------------------------------------------------------------------
def load_example(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "examples", "train_sparse_snn.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look the module up
    spec.loader.exec_module(module)
    return module


class _EvjaxWithOps:
    """``evjax`` as the example sees it, with the neuron ops of ``ops``."""

    def __init__(self, evjax, ops):
        self._evjax, self._ops = evjax, ops

    def __getattr__(self, name):
        if name in ("lif_step", "exp_trace", "spike"):
            return getattr(self._ops, name)
        return getattr(self._evjax, name)


def example_steps(old_ops, quick: bool) -> dict:
    """``{"old": (step, args), "new": (step, args)}``: the example's jitted Adam step, compiled."""
    import optax

    import evjax

    out = {}
    for label in ("new", "old"):
        ex = load_example(f"train_sparse_snn_{label}")
        if label == "old":
            ex.evjax = _EvjaxWithOps(evjax, old_ops)  # the trial looks evjax.lif_step up when it is traced
        cfg = ex.Config(n_hidden=500) if quick else ex.Config()
        params, s_in, s_rec = ex.init_params(cfg)
        x, y = ex.make_randman(cfg, cfg.batch, seed=1)
        optimizer = optax.adam(cfg.lr)
        step = ex.make_train_step(ex.make_loss(cfg, ex.make_trial(cfg, ex.make_synapses(s_in, s_rec, False))),
                                  optimizer)
        args = (params, optimizer.init(params), jnp.asarray(x), jnp.asarray(y))
        out[label] = (step, args, cfg)
    return out


def measure(new, old, quick: bool) -> dict:
    """Every measurement of one process: the step's rows, the example's row and paired round ratios."""
    rounds, calls = (5, 20) if quick else (15, 40)
    freeze_import_heap()
    rows, accuracy = micro(new, old, rounds, calls)

    steps = example_steps(old, quick)
    kernels = {}
    for label, (step, step_args, cfg) in steps.items():
        targets = custom_calls(step.lower(*step_args).as_text())
        kernels[label] = sorted({t for t in targets if re.search(r"lif|trace|spike", t)})
    assert not kernels["new"], f"the example's step still calls neuron kernels: {kernels['new']}"
    assert kernels["old"], "the old example step should call the Numba neuron kernels"
    ex_rounds, ex_calls = (4, 5) if quick else (20, 5)
    rounds_s = paired_rounds({label: (lambda s=s, a=a: s(*a)) for label, (s, a, _) in steps.items()},
                             rounds=ex_rounds, calls=ex_calls)
    cfg = steps["new"][2]
    rows.append([f"example training step ({cfg.n_hidden} hidden, batch {cfg.batch}, {cfg.n_steps} steps)",
                 float(np.median(rounds_s["old"])), float(np.median(rounds_s["new"])), float("nan")])
    ratios = [o / n for o, n in zip(rounds_s["old"], rounds_s["new"])]
    return dict(rows=rows, accuracy=accuracy, kernels=kernels, ratios=ratios, rounds=rounds, calls=calls,
                ex_rounds=ex_rounds, ex_calls=ex_calls)


def ratio_line(ratios: list) -> str:
    r = np.array(ratios)
    return (f"old / new per round (paired): median {np.median(r):.2f}, range {r.min():.2f} to {r.max():.2f}; "
            f"new faster in {int((r > 1).sum())} of {len(r)} rounds")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds; the example at 500 hidden neurons")
    parser.add_argument("--old-ref", default=OLD_REF, help="git commit of the old (Numba) neuron ops")
    parser.add_argument("--out", default=RESULTS, help="folder of neuron_ops.md and neuron_ops.png")
    parser.add_argument("--no-one-core", action="store_true", help="skip the rerun on one core")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # the one-core rerun: JSON out
    parser.add_argument("--pin-cpu", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.pin_cpu is not None:  # before JAX starts its CPU client, which sizes its thread pool from the affinity
        os.sched_setaffinity(0, {args.pin_cpu})

    import evjax

    old = Ops(load_old(args.old_ref), "numba")
    new = Ops(evjax, None)

    # -- the HLO: the new lif_step + spike update is plain XLA, the old one two custom calls
    v0, _, i0 = inputs(2000)
    update = {name: jax.jit(lambda v, i, ops=ops: ops.spike(ops.lif_step(v, i)[0] - 0.5))
              for name, ops in (("new", new), ("old", old))}
    assert "custom_call" not in update["new"].lower(v0, i0).as_text(), "the new update lowers to a custom call"
    old_calls = custom_calls(update["old"].lower(v0, i0).as_text())
    assert old_calls, "the old update should call its Numba kernels (is the old path really the old one?)"

    result = measure(new, old, args.quick)
    if args.child:
        print(json.dumps({"rows": result["rows"], "ratios": result["ratios"]}))
        return result["rows"]

    # -- everything again on one core (no intra-op threads in XLA), in a child process
    one_core = None
    if not args.no_one_core and hasattr(os, "sched_setaffinity"):
        cpu = min(os.sched_getaffinity(0))
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--pin-cpu", str(cpu),
                               "--old-ref", args.old_ref, *(["--quick"] if args.quick else [])],
                              capture_output=True, text=True)
        if done.returncode == 0:
            one_core = json.loads(done.stdout.strip().splitlines()[-1])
        else:
            print(f"(the one-core run failed: {done.stderr[-2000:]})")

    header = ["case", "old (Numba)", "new (pure JAX)", "old / new", "floor"]
    rows = result["rows"]
    lines = [
        provenance(argv), "# Neuron ops: pure JAX (fused by XLA) against the old Numba kernels", "",
        f"One process, float32, CPU (jax {jax.__version__}); old = `evjax.primitives.neuron` at "
        f"`{args.old_ref[:12]}` with `backend=\"numba\"` (its CPU default), new = the pure-JAX ops. "
        f"Medians of {result['rounds']} x {result['calls']} calls, candidates interleaved round-robin (the "
        f"example's step: {result['ex_rounds']} rounds of {result['ex_calls']} steps, alternating which goes "
        "first; the median of the round medians). The step: `lif_step` + `exp_trace` + `spike` (a threshold on "
        "the trace), jitted; grad = `jax.grad` of a loss over its outputs. Floor: a jitted `x + 1` on the same "
        "three arrays (the cost of any call).", "",
        markdown_table(header, table_rows(rows)), "",
        f"- The example's step, {ratio_line(result['ratios'])}.", "",
    ]
    if one_core is not None:
        lines += ["The same, in a child process pinned to one core (`sched_setaffinity`), where XLA runs every "
                  "fusion on one thread:", "", markdown_table(header, table_rows(one_core["rows"])), "",
                  f"- The example's step, {ratio_line(one_core['ratios'])}.", ""]
    lines += [
        "Notes:", "",
        "- HLO of `jax.jit(lambda v, i: spike(lif_step(v, i)[0] - 0.5))`: new, no custom call (asserted); "
        f"old: {', '.join(sorted(set(old_calls)))}.",
        f"- The example's training step: neuron custom calls old: {', '.join(result['kernels']['old'])}; new: "
        "none (asserted; the CSR event ops stay custom calls).",
        "- With several cores XLA splits a compute-heavy fusion over threads (`outer_dimension_partitions` in "
        "the compiled HLO); the backward fusion of the new step at n = 2000 is one (the old backward, fed by "
        "the kernels' outputs, was memory-bound and stayed whole), and on a busy machine the hand-off can cost "
        "more than the loop: compare the one-core table.",
    ]
    for n, acc in result["accuracy"].items():
        lines.append(f"- Forward, new vs old at n = {n:,}: {acc['spike_mismatches']} spike mismatches; v differs "
                     f"in {acc['v_differ']} of {n:,} neurons by at most {acc['v_gap']:.1e}, the trace in "
                     f"{acc['trace_differ']} by at most {acc['trace_gap']:.1e}: XLA contracts `a * b + c` into one "
                     "fused multiply-add (one rounding), the Numba kernels rounded twice.")
    lines.append("")
    print("\n".join(lines))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "neuron_ops.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    plot_rows = rows[:-1]
    save_bar_plot(os.path.join(args.out, "neuron_ops.png"), [r[0] for r in plot_rows],
                  {"old: Numba kernels": [r[1] * 1e6 for r in plot_rows],
                   "new: pure JAX": [r[2] * 1e6 for r in plot_rows]},
                  ylabel="us per call (median)", title="neuron step: old Numba kernels vs pure JAX", log=True)
    return rows


if __name__ == "__main__":
    main()

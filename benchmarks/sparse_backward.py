"""Sparse backward: backward-pass time, skipped work and memory of the example's network, A/B in one run.

The network is ``examples/train_sparse_snn.py``'s (hidden size 2000 by
default, batch 16 by ``vmap``, BPTT through ``lax.scan``).  Variants, all on
the same weights and inputs:

* ``dense-support``: today's example, the ``fast_sigmoid`` surrogate;
* ``compact``: the same surrogate clipped to its band (``clipped_fast_sigmoid``),
  nothing else changed (the event ops' usual backward);
* ``sparse backward``: ``compact`` plus :func:`evjax.sparse_backward_gate` on
  the neuron state and :func:`evjax.sparse_backward_matmul` for both layers
  (``--sparse-backward`` of the example).

For each: the forward (the loss) and the gradient (``value_and_grad``), both
jitted, timed round-robin; the backward pass is their difference.  Wall and
process CPU time (all threads) are medians.  The run also reports the
fraction of zero entries in the cotangent of the layers' output (the work the
sparse backward skips; Perez-Nieves and Goodman report > 98 %), the backward
time against the band width, and the peak memory of a training step's
gradient at ``n_steps = 100`` with ``evjax.bptt_scan``'s memory modes ``"full"``,
``"carry"`` and ``"segments"`` (XLA's
own accounting of the compiled program: arguments, outputs and temporaries).

Run::

    python benchmarks/sparse_backward.py                 # hidden 2000
    python benchmarks/sparse_backward.py --hidden 500 --rounds 3 --bands 0.3   # quick look

Prints markdown tables, writes ``benchmarks/results/sparse_backward.md`` and
``sparse_backward.png``.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import pathlib
import sys

import jax
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import common  # noqa: E402


def _example():
    spec = importlib.util.spec_from_file_location("train_sparse_snn", ROOT / "examples" / "train_sparse_snn.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


snn = _example()


def variants(cfg) -> dict:
    """The configurations compared (see the module docstring)."""
    sparse = snn.sparse_backward_config(cfg)
    return {"dense-support": cfg,
            "compact": dataclasses.replace(sparse, sparse_backward=False),
            "sparse backward": sparse}


class CotangentProbe:
    """An identity on the layers' summed output whose backward counts the zero entries of its cotangent."""

    def __init__(self):
        self.zeros, self.total = 0, 0

        @jax.custom_vjp
        def probe(y):
            return y

        def fwd(y):
            return y, None

        def bwd(_, ct):
            jax.debug.callback(self._count, ct)
            return (ct,)

        probe.defvjp(fwd, bwd)
        self.probe = probe

    def _count(self, ct):
        ct = np.asarray(ct)
        self.zeros += int(ct.size - np.count_nonzero(ct))
        self.total += int(ct.size)

    def synapses(self, base):
        """``base``'s layers with the probe on the recurrent one's output (both layers' outputs are summed
        into one synaptic input, so they share that cotangent)."""
        def synapses(params):
            input_current, recurrent_current = base(params)
            return input_current, (lambda s: self.probe(recurrent_current(s)))
        return synapses


def build(cfg, x, y, params, s_in, s_rec, probe: CotangentProbe | None = None):
    """``(forward, gradient)``: the jitted loss and ``value_and_grad`` of the configuration."""
    synapses = snn.make_synapses(s_in, s_rec, False, cfg.sparse_backward)
    if probe is not None:
        synapses = probe.synapses(synapses)
    loss = snn.make_loss(cfg, snn.make_trial(cfg, synapses))
    forward = jax.jit(lambda p: loss(p, x, y)[0])
    gradient = jax.jit(jax.value_and_grad(lambda p: loss(p, x, y)[0]))
    return forward, gradient


def time_variants(cfgs: dict, data, rounds: int) -> dict:
    """``{name: {"fwd": (wall, cpu), "grad": (wall, cpu)}}``, every function timed round-robin."""
    candidates = {}
    for name, cfg in cfgs.items():
        forward, gradient = build(cfg, *data)
        params = data[2]
        candidates[(name, "fwd")] = lambda f=forward: f(params)
        candidates[(name, "grad")] = lambda g=gradient: g(params)
    measured = common.median_wall_cpu(candidates, rounds=rounds, calls=1, warmup=2)
    out: dict = {}
    for (name, kind), value in measured.items():
        out.setdefault(name, {})[kind] = value
    return out


def zero_fraction(cfg, data) -> float:
    probe = CotangentProbe()
    _, gradient = build(cfg, *data, probe=probe)
    jax.block_until_ready(gradient(data[2]))
    return probe.zeros / max(probe.total, 1)


def peak_memory(cfg, data) -> dict:
    """XLA's accounting of the compiled gradient: argument, output and temporary bytes."""
    _, gradient = build(cfg, *data)
    analysis = gradient.lower(data[2]).compile().memory_analysis()
    temp = int(analysis.temp_size_in_bytes)
    total = temp + int(analysis.argument_size_in_bytes) + int(analysis.output_size_in_bytes)
    return {"temp": temp, "total": total}


def main(argv=None) -> dict:
    defaults = snn.Config()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=defaults.n_hidden)
    parser.add_argument("--batch", type=int, default=defaults.batch)
    parser.add_argument("--steps", type=int, default=defaults.n_steps)
    parser.add_argument("--memory-steps", type=int, default=100, help="time steps of the memory comparison")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--bands", type=float, nargs="*", default=[0.1, 0.2, 0.3, 0.5, 1.0],
                        help="band half-widths of the sweep (the default band is 3 / alpha = 0.3)")
    parser.add_argument("--out", default=common.RESULTS)
    args = parser.parse_args(argv)

    cfg = dataclasses.replace(defaults, n_hidden=args.hidden, batch=args.batch, n_steps=args.steps)
    x, y = snn.make_randman(cfg, cfg.batch, seed=cfg.seed + 3)
    params, s_in, s_rec = snn.init_params(cfg)
    data = (x, y, params, s_in, s_rec)
    print(f"jax {jax.__version__}, {os.cpu_count()} CPU cores; hidden {cfg.n_hidden}, batch {cfg.batch}, "
          f"{cfg.n_steps} steps, {s_in.nnz + s_rec.nnz:,} synapses", flush=True)
    cfgs = variants(cfg)

    times = time_variants(cfgs, data, args.rounds)
    zeros = {name: zero_fraction(c, data) for name, c in cfgs.items()}
    base_bwd = times["dense-support"]["grad"][0] - times["dense-support"]["fwd"][0]
    rows = []
    for name in cfgs:
        (fw, fc), (gw, gc) = times[name]["fwd"], times[name]["grad"]
        bwd = gw - fw
        rows.append([name, common.fmt_time(fw), common.fmt_time(gw), common.fmt_time(bwd),
                     common.fmt_time(gc - fc), f"{base_bwd / bwd:.2f}x" if bwd > 0 else "-", f"{100 * zeros[name]:.1f} %"])
    header = ["variant", "forward (wall)", "gradient (wall)", "backward = gradient - forward (wall)",
              "backward (CPU)", "backward speed-up vs dense-support", "zero cotangent entries"]
    table = common.markdown_table(header, rows)
    print("\n" + table, flush=True)

    sweep_rows, sweep = [], []
    for band in args.bands:
        sb = dataclasses.replace(cfgs["sparse backward"], band=band)
        measured = time_variants({"dense-support": cfg, "sparse backward": sb}, data, max(3, args.rounds // 2))
        b0 = measured["dense-support"]["grad"][0] - measured["dense-support"]["fwd"][0]
        b1 = measured["sparse backward"]["grad"][0] - measured["sparse backward"]["fwd"][0]
        z = zero_fraction(sb, data)
        sweep.append((band, b0 / b1, z))
        sweep_rows.append([f"{band:g}", common.fmt_time(b0), common.fmt_time(b1), f"{b0 / b1:.2f}x", f"{100 * z:.1f} %"])
        print(f"band {band:g}: backward {common.fmt_time(b1)} vs {common.fmt_time(b0)} ({b0 / b1:.2f}x), "
              f"zero cotangent entries {100 * z:.1f} %", flush=True)
    sweep_table = common.markdown_table(["band half-width", "backward, dense-support", "backward, sparse",
                                         "speed-up", "zero cotangent entries"], sweep_rows)
    print("\n" + sweep_table, flush=True)

    mcfg = dataclasses.replace(cfg, n_steps=args.memory_steps)
    mx, my = snn.make_randman(mcfg, mcfg.batch, seed=mcfg.seed + 3)
    mdata = (mx, my, params, s_in, s_rec)
    mem_rows, mem = [], {}
    for name, c in (("dense-support, memory='full'", mcfg),
                    ("sparse backward, memory='full'", snn.sparse_backward_config(mcfg)),
                    ("sparse backward, memory='carry'", dataclasses.replace(snn.sparse_backward_config(mcfg),
                                                                            memory="carry")),
                    ("sparse backward, memory='segments'", dataclasses.replace(snn.sparse_backward_config(mcfg),
                                                                               memory="segments")),
                    ("dense-support, memory='carry'", dataclasses.replace(mcfg, memory="carry")),
                    ("dense-support, memory='segments'", dataclasses.replace(mcfg, memory="segments"))):
        mem[name] = peak_memory(c, mdata)
    ref = mem["dense-support, memory='full'"]["total"]
    for name, m in mem.items():
        mem_rows.append([name, f"{m['temp'] / 2**20:.1f} MiB", f"{m['total'] / 2**20:.1f} MiB",
                         f"{m['total'] / ref:.2f}x"])
    mem_table = common.markdown_table(["variant", "temporaries", "peak (args + outputs + temporaries)",
                                       "vs dense-support full"], mem_rows)
    print("\n" + mem_table, flush=True)

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "sparse_backward.md"), "w") as f:
        f.write(common.provenance(argv) + "\n# Sparse backward\n\n")
        f.write(f"Example network: hidden {cfg.n_hidden}, batch {cfg.batch} (vmap), {cfg.n_steps} steps, "
                f"{s_in.nnz + s_rec.nnz:,} synapses; medians of {args.rounds} round-robin rounds.\n\n")
        speedup = base_bwd / (times["sparse backward"]["grad"][0] - times["sparse backward"]["fwd"][0])
        carry = min(mem[f"sparse backward, memory='{m}'"]["total"] for m in ("carry", "segments")) / ref
        best = f"; best of the band sweep {max(s for _, s, _ in sweep):.2f}x" if sweep else ""
        f.write(f"## Goals\n\n- backward pass >= 3x faster with the sparse backward: "
                f"{'met' if speedup >= 3 else 'not met'} ({speedup:.2f}x at the default band{best})\n"
                f"- peak memory of the gradient <= 0.5x at {args.memory_steps} steps with the sparse backward "
                f"and bptt_scan's best memory mode: "
                f"{'met' if carry <= 0.5 else 'not met'} ({carry:.2f}x)\n\n")
        f.write("## Backward pass\n\n" + table + "\n\n## Band width\n\n" + sweep_table + f"\n\n## Peak memory of the gradient, "
                f"{args.memory_steps} steps\n\n" + mem_table + "\n")
    _plot(os.path.join(args.out, "sparse_backward.png"), sweep, mem, ref)
    return {"times": times, "zeros": zeros, "sweep": sweep, "memory": mem}


def accuracy_by_band(path: pathlib.Path) -> tuple[dict[float, float], float | None]:
    """``({band: mean accuracy}, default accuracy)`` on Randman from the accuracy results file, if any: the
    runs of the current code, before its section ``## Earlier runs``."""
    if not path.exists():
        return {}, None
    by_band, default = {}, None
    for line in path.read_text().split("\n## Earlier runs")[0].splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != 5 or cells[0] != "randman":
            continue
        mean = float(cells[4].split()[0])
        if cells[1].startswith("fast_sigmoid (default)"):
            default = mean
        elif cells[1].startswith("sparse backward") and "band" in cells[1]:
            by_band[float(cells[1].rsplit("band", 1)[1])] = mean
    return by_band, default


def _plot(path: str, sweep, mem, ref) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is in the examples extra
        return
    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    bands = [b for b, _, _ in sweep]
    axes[0].plot(bands, [s for _, s, _ in sweep], "o-", label="backward speed-up")
    axes[0].set(xlabel="band half-width", ylabel="speed-up vs dense-support surrogate", xscale="log",
                title="backward pass")
    twin = axes[0].twinx()
    twin.plot(bands, [100 * z for _, _, z in sweep], "s--", color="tab:orange", label="zero cotangent entries (%)")
    twin.set(ylabel="zero cotangent entries (%)")
    accuracy, default = accuracy_by_band(pathlib.Path(common.RESULTS) / "sparse_backward_accuracy.md")
    if accuracy:
        widths = sorted(accuracy)
        axes[1].plot(widths, [accuracy[w] for w in widths], "o-", label="sparse backward")
        if default is not None:
            axes[1].axhline(default, color="gray", ls="--", label="dense-support surrogate")
        axes[1].legend()
    axes[1].set(xlabel="band half-width", ylabel="test accuracy (Randman)", xscale="log",
                title="accuracy (sparse_backward_accuracy.md)")
    axes[2].barh(list(mem), [m["total"] / ref for m in mem.values()])
    axes[2].set(xlabel="peak memory vs dense-support, memory='full'", title="gradient memory")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    if os.path.abspath(os.path.dirname(path)) == os.path.abspath(common.RESULTS):  # the docs page shows it
        os.makedirs(ROOT / "docs" / "images", exist_ok=True)
        fig.savefig(ROOT / "docs" / "images" / "sparse_backward.png", dpi=110)
    plt.close(fig)
    print(f"saved {path}")


if __name__ == "__main__":
    main()

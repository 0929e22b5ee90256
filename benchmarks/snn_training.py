"""Training-step time of the example's spiking network: sparse-event (evjax CSR) against dense.

For each hidden size it builds the model of ``examples/train_sparse_snn.py``
(same connectivity in both variants: the dense one holds it as a masked
``(n, n)`` matrix), compiles one training step (BPTT through ``lax.scan``,
``jax.vmap`` over the batch, Adam update) and reports the median wall time.

Run::

    python benchmarks/snn_training.py                      # n = 2000 and 8000
    python benchmarks/snn_training.py --sizes 2000 --repeats 10

It prints a markdown table and saves ``benchmarks/results/snn_training.png``
(and ``.json``).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import pathlib
import sys
import time

import jax
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _example():
    spec = importlib.util.spec_from_file_location("train_sparse_snn", ROOT / "examples" / "train_sparse_snn.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


snn = _example()


def measure(cfg, repeats: int) -> dict:
    """Both variants compiled, then timed alternately (load drift cancels in the ratio)."""
    import optax

    x, y = snn.make_randman(cfg, cfg.batch, seed=cfg.seed + 3)
    params, s_in, s_rec = snn.init_params(cfg)
    optimizer = optax.adam(cfg.lr)
    runs, info = {}, {}
    for name, dense in (("sparse", False), ("dense", True)):
        p = snn.to_dense_params(params, s_in, s_rec) if dense else params
        step = snn.make_train_step(snn.make_loss(cfg, snn.make_trial(cfg, snn.make_synapses(s_in, s_rec, dense))),
                                   optimizer)
        args = (p, optimizer.init(p), x, y)
        t0 = time.perf_counter()
        out = jax.block_until_ready(step(*args))
        info[f"{name}_compile_s"] = time.perf_counter() - t0
        info["rate"] = float(np.mean(np.asarray(out[4])))
        runs[name] = (step, args)
    times = {"sparse": [], "dense": []}
    for _ in range(repeats):
        for name, (step, args) in runs.items():
            t0 = time.perf_counter()
            jax.block_until_ready(step(*args))
            times[name].append(time.perf_counter() - t0)
    ratios = np.asarray(times["dense"]) / np.asarray(times["sparse"])
    return {**info, "synapses": int(s_in.nnz + s_rec.nnz),
            "sparse_ms": 1e3 * float(np.median(times["sparse"])), "dense_ms": 1e3 * float(np.median(times["dense"])),
            "speedup": float(np.median(ratios)), "speedup_min": float(np.min(ratios)),
            "speedup_max": float(np.max(ratios))}


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 8000])
    parser.add_argument("--p-rec", type=float, default=snn.Config().p_rec)
    parser.add_argument("--steps", type=int, default=snn.Config().n_steps, help="time steps per trial")
    parser.add_argument("--batch", type=int, default=snn.Config().batch)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args(argv)

    print(f"jax {jax.__version__}, {os.cpu_count()} CPU cores, devices {jax.devices()}")
    rows = []
    for n in args.sizes:
        cfg = dataclasses.replace(snn.Config(), n_hidden=n, p_rec=args.p_rec, n_steps=args.steps, batch=args.batch)
        repeats = args.repeats if n <= 4000 else max(2, args.repeats // 2)
        row = {"n_hidden": n, "p_rec": args.p_rec, "steps": args.steps, "batch": args.batch,
               "repeats": repeats, **measure(cfg, repeats)}
        rows.append(row)
        print(f"n={n}: sparse {row['sparse_ms']:.1f} ms, dense {row['dense_ms']:.1f} ms, "
              f"speedup {row['speedup']:.1f}x (hidden rate {row['rate']:.3f})", flush=True)

    print("\n| hidden n | synapses | hidden rate | sparse-event step (ms) | dense step (ms) | dense / sparse "
          "(median, range) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n_hidden']} | {r['synapses']:,} | {r['rate']:.3f} | {r['sparse_ms']:.1f} | "
              f"{r['dense_ms']:.1f} | {r['speedup']:.1f}x ({r['speedup_min']:.1f}-{r['speedup_max']:.1f}) |")
    print(f"\nmedians over alternating training steps (BPTT over {args.steps} time steps, batch {args.batch} by "
          f"vmap, Adam), p_rec = {args.p_rec}; ratio = median of per-pair dense/sparse")

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "snn_training.json"), "w") as f:
        json.dump(rows, f, indent=2)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is in the examples extra
        return rows
    fig, ax = plt.subplots(figsize=(6, 4))
    ns = [r["n_hidden"] for r in rows]
    ax.plot(ns, [r["sparse_ms"] for r in rows], "o-", label="sparse-event (evjax CSR)")
    ax.plot(ns, [r["dense_ms"] for r in rows], "s-", label="dense (jnp)")
    for r in rows:
        ax.annotate(f"{r['speedup']:.1f}x", (r["n_hidden"], r["sparse_ms"]), textcoords="offset points",
                    xytext=(6, 6))
    ax.margins(x=0.12, y=0.15)
    ax.set(xscale="log", yscale="log", xlabel="hidden neurons", ylabel="training step (ms)",
           title=f"SNN training step, p_rec={args.p_rec}, batch {args.batch}, {args.steps} steps")
    ax.legend()
    fig.tight_layout()
    path = os.path.join(args.out, "snn_training.png")
    fig.savefig(path, dpi=110)
    print(f"saved {path}")
    return rows


if __name__ == "__main__":
    main()

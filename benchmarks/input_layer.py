"""The README example's input layer as ``evjax.CSR`` or ``evjax.Dense``: its own training step, timed.

    python benchmarks/input_layer.py            # 10 alternating rounds of 15 steps
    python benchmarks/input_layer.py --quick    # 3 rounds

``examples/train_sparse_snn.py`` (default configuration: 100 inputs to 2000
hidden LIF neurons at 10 % connectivity, 20 recurrent synapses per neuron, a
batch of 16 trials by ``jax.vmap``, 50 time steps) with its input layer as
the example has it (``examples/train_sparse_snn.make_synapses``: bool spikes
``@ evjax.CSR``) and as ``evjax.BinaryArray(x_t) @ evjax.Dense(w_in * mask)``
(the same model: absent synapses held at zero).
The jitted Adam step of each, after its kernels are compiled, alternating
round by round.  Writes ``benchmarks/results/input_layer.{md,png}``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))
from benchmarks.common import RESULTS, fmt_time, markdown_table, provenance, save_bar_plot  # noqa: E402


def steps():
    """``{name: (step, args)}``: the example's training step with either input layer, compiled."""
    import jax
    import jax.numpy as jnp
    import optax
    import train_sparse_snn as ex

    import evjax

    cfg = ex.Config()
    params, s_in, s_rec = ex.init_params(cfg)
    x, y = ex.make_randman(cfg, cfg.batch, seed=1)
    idx_rec, ptr_rec = jnp.asarray(s_rec.indices), jnp.asarray(s_rec.indptr)
    mask_in = jnp.asarray(s_in.mask())
    csr_input = ex.make_synapses(s_in, s_rec, dense=False)  # the example's own layers

    def dense_input(p):  # (n_in, n_hidden) weights, absent synapses held at 0; the recurrent layer as the example's
        w_in = evjax.Dense(p["w_in"] * mask_in)
        w_rec = evjax.CSR((p["w_rec"], idx_rec, ptr_rec), shape=s_rec.shape)
        return lambda x: evjax.BinaryArray(x) @ w_in, lambda s: evjax.BinaryArray(s) @ w_rec

    optimizer = optax.adam(cfg.lr)
    out = {}
    for name, synapses, p in (("CSR", csr_input, params),
                              ("Dense", dense_input, dict(params, w_in=s_in.to_dense(params["w_in"])))):
        args = (p, optimizer.init(p), jnp.asarray(x), jnp.asarray(y))
        step = ex.make_train_step(ex.make_loss(cfg, ex.make_trial(cfg, synapses)), optimizer)
        jax.block_until_ready(step(*args))  # the first call compiles the kernels
        out[name] = (step, args)
    return out


def main(argv=None):
    import jax

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds instead of 10")
    args = parser.parse_args(argv)
    rounds, calls = (3, 10) if args.quick else (10, 15)
    candidates = steps()
    medians = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, (step, step_args) in candidates.items():
            times = []
            for _ in range(calls):
                start = time.perf_counter()
                jax.block_until_ready(step(*step_args))
                times.append(time.perf_counter() - start)
            medians[name].append(float(np.median(times)))
    overall = {name: float(np.median(v)) for name, v in medians.items()}
    lines = [provenance(argv), "# The example's input layer: CSR or Dense", "",
             f"`examples/train_sparse_snn.py` default configuration, one jitted Adam step of a batch of 16; "
             f"{rounds} alternating rounds of {calls} steps, median of the round medians.", "",
             markdown_table(["input layer", "step (median)", "round medians", "/ CSR"],
                            [[name, fmt_time(t), ", ".join(fmt_time(r) for r in medians[name]),
                              f"{t / overall['CSR']:.2f}"] for name, t in overall.items()]), ""]
    print("\n".join(lines))
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "input_layer.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    save_bar_plot(os.path.join(RESULTS, "input_layer.png"), ["training step"],
                  {name: [t * 1e3] for name, t in overall.items()}, ylabel="ms (median)",
                  title="example input layer: CSR or Dense", log=False)


if __name__ == "__main__":
    main()

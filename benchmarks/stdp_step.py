"""An STDP training step of examples/stdp.py: sparse (evjax CSR) against the same network with dense weights.

    python benchmarks/stdp_step.py           # the example's full network: 10000 inputs -> 200 outputs, p = 0.1
    python benchmarks/stdp_step.py --quick   # fewer repetitions

One step is what ``examples/stdp.py`` trains with: given the step's input
spikes (the example's data, drawn beforehand with NumPy; the time to draw them
is reported beside the table), propagate them, update the LIF outputs, the
traces and the homeostatic thresholds, and apply pair-based STDP on the pre-
and the postsynaptic spikes (weights clipped to [0, 1]).  The candidates run the same step on the same network (200 000
synapses of 2 million pairs):

* ``evjax CSR`` (the example's step): ``binary_csrmv`` and
  ``update_csr_on_binary_pre`` / ``_post`` (the column view computed once);
* ``dense, evjax ops``: a dense ``(10000, 200)`` weight matrix with evjax's
  dense event ops (propagation ``BinaryArray(pre) @ W`` (``binary_densemv``) and
  ``update_dense_on_binary_pre`` / ``_post``), then ``W * mask`` so that the
  absent synapses stay absent (the same network);
* ``dense, jax.numpy``: the dense step written in jax.numpy
  (``pre @ W``, the two outer-product updates, ``clip`` and ``* mask``), which
  XLA fuses.

Each candidate is one jitted ``jax.lax.scan`` over a chunk of steps (as the
example trains); the time per step is the chunk's median divided by its
steps.  Wall and CPU time (all threads) are both reported.  Goal (issue 32):
the sparse step >= 5x faster than the dense network.  Writes
``benchmarks/results/stdp_step.{md,png}``.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
import warnings

import numpy as np

warnings.filterwarnings("ignore")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
import evjax  # noqa: E402
from benchmarks.common import fmt_time, markdown_table, provenance, save_bar_plot  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results")
GOAL = 5.0


def _example():
    spec = importlib.util.spec_from_file_location("stdp_example", os.path.join(ROOT, "examples", "stdp.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def dense_run(ex, dense_w, mask, threshold, use_evjax: bool):
    """The example's training chunk on a dense weight matrix (the same maths as ``ex.make_run``)."""
    mask = jnp.asarray(mask)
    decay_m, decay_plus, decay_minus = (np.exp(-ex.DT / tau) for tau in (ex.TAU_M, ex.TAU_PLUS, ex.TAU_MINUS))
    eta = 0.02 * threshold

    def step(carry, pre):
        w, v, theta, x_pre, x_post = carry
        current = evjax.BinaryArray(pre) @ w if use_evjax else pre.astype(w.dtype) @ w
        v = v * decay_m + current
        post = v >= theta
        v = jnp.where(post, 0.0, v)
        x_pre = x_pre * decay_plus + pre
        x_post = x_post * decay_minus + post
        theta = theta + eta * (post - ex.TARGET_RATE)
        if use_evjax:
            w = evjax.update_dense_on_binary_pre(w, pre, -ex.A_MINUS * x_post, 0.0, ex.W_MAX)
            w = evjax.update_dense_on_binary_post(w, ex.A_PLUS * x_pre, post, 0.0, ex.W_MAX) * mask
        else:
            w = w + jnp.where(pre[:, None], -ex.A_MINUS * x_post[None, :], 0.0)
            w = jnp.where(pre[:, None], jnp.clip(w, 0.0, ex.W_MAX), w)
            w = w + jnp.where(post[None, :], ex.A_PLUS * x_pre[:, None], 0.0)
            w = jnp.where(post[None, :], jnp.clip(w, 0.0, ex.W_MAX), w) * mask
        return (w, v, theta, x_pre, x_post), post

    @jax.jit
    def run(w, state, inputs):
        (w, *state), post = jax.lax.scan(step, (w, *state), inputs)
        return w, tuple(state), post

    return run


def timed(fn, rounds: int) -> tuple[float, float]:
    """Median wall and CPU (all threads) seconds of ``fn()`` over ``rounds`` calls, after one warm call."""
    jax.block_until_ready(fn())
    wall, cpu = [], []
    for _ in range(rounds):
        w0, c0 = time.perf_counter(), time.process_time()
        jax.block_until_ready(fn())
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return float(np.median(wall)), float(np.median(cpu))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--windows", type=int, default=8, help="50-step windows per timed chunk")
    args = parser.parse_args(argv)
    rounds = 5 if args.quick else 15
    ex = _example()
    n_in, n_out, p = 10000, 200, 0.1
    W, view, involved, pattern = ex.build(n_in, n_out, p, seed=0)
    threshold = float(np.mean(np.asarray(W.data)) * n_in * p * ex.RATE / (1 - np.exp(-ex.DT / ex.TAU_M)))
    init = (jnp.zeros(n_out), jnp.full(n_out, threshold), jnp.zeros(n_in), jnp.zeros(n_out))
    rng = np.random.default_rng(0)
    windows = ex.random_windows(rng, args.windows)
    steps = args.windows * ex.WINDOW
    drawing = time.perf_counter()
    inputs = jnp.asarray(ex.make_inputs(rng, windows, involved, pattern))
    draw_time = time.perf_counter() - drawing
    dense = np.asarray(W.todense())
    mask = (dense != 0).astype(np.float32)
    sparse_run = ex.make_run(W, view, threshold, learn=True)
    runs = {
        "evjax CSR": lambda: sparse_run(W.data, init, inputs),
        "dense, evjax ops": (lambda r: lambda: r(jnp.asarray(dense), init, inputs))(
            dense_run(ex, dense, mask, threshold, use_evjax=True)),
        "dense, jax.numpy": (lambda r: lambda: r(jnp.asarray(dense), init, inputs))(
            dense_run(ex, dense, mask, threshold, use_evjax=False)),
    }
    # the same network: the dense steps reach the sparse step's weights and spikes
    w_sparse, _, post_sparse = runs["evjax CSR"]()
    w_sparse = np.asarray(W.with_data(w_sparse).todense())
    for name in ("dense, evjax ops", "dense, jax.numpy"):
        w_dense, _, post_dense = runs[name]()
        np.testing.assert_allclose(np.asarray(w_dense), w_sparse, rtol=1e-4, atol=1e-5, err_msg=name)
        assert np.array_equal(np.asarray(post_dense), np.asarray(post_sparse)), name
    times = {name: timed(fn, rounds) for name, fn in runs.items()}
    base_wall, base_cpu = times["evjax CSR"]
    rows = [[name, fmt_time(w / steps), f"{w / base_wall:.2f}x", fmt_time(c / steps), f"{c / base_cpu:.2f}x"]
            for name, (w, c) in times.items()]
    best_dense = min(times[n][0] for n in runs if n.startswith("dense"))
    verdict = "met" if best_dense / base_wall >= GOAL else "NOT met"
    table = markdown_table(["candidate", "wall per step", "wall / evjax CSR", "CPU per step",
                            "CPU / evjax CSR"], rows)
    text = (f"{provenance(argv)}\n# STDP training step: sparse against dense weights\n\n"
            f"examples/stdp.py's network: {n_in} inputs -> {n_out} outputs, p = {p} ({W.nnz} synapses), "
            f"chunks of {steps} steps (one jitted scan over the input spikes), medians of {rounds}.  Not in the "
            f"step: drawing the input spikes (the example's data, NumPy: {draw_time / steps * 1e6:.0f} us per step, "
            f"the same for every candidate).\n\n{table}\n\n"
            f"Goal: the sparse step >= {GOAL:.0f}x faster than the fastest dense network: "
            f"{best_dense / base_wall:.1f}x ({verdict}).\n")
    print(text)
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "stdp_step.md"), "w") as f:
        f.write(text)
    save_bar_plot(os.path.join(RESULTS, "stdp_step.png"), list(runs),
                  {"wall per step (us)": [times[n][0] / steps * 1e6 for n in runs],
                   "CPU per step (us)": [times[n][1] / steps * 1e6 for n in runs]},
                  ylabel="microseconds per step", title="STDP step: sparse vs dense weights")


if __name__ == "__main__":
    main()

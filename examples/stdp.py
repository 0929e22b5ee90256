"""Spike-timing-dependent plasticity finds a hidden spatio-temporal pattern.

    python examples/stdp.py            # 10000 inputs -> 200 outputs (200 000 synapses), 16 s of model time
    python examples/stdp.py --small    # 2000 inputs -> 20 outputs, 16 s (what the tests run)

After Masquelier, Guyonneau & Thorpe (2008).  Each input neuron fires as a
Poisson process at 40 Hz.  Half of the inputs hide a 50 ms spike pattern:
in about a quarter of the 50 ms windows, chosen at random, they replay the
same frozen spike train instead of fresh noise (the other half stay noise).
The pattern has the noise's rate, so nothing but its timing tells it apart.

The outputs are leaky integrate-and-fire neurons that receive the inputs
through a sparse random connection (:class:`evjax.CSR`), and learn by
pair-based additive STDP with traces, depression-dominated:

* a presynaptic spike depresses its synapses by ``A_minus * post_trace``
  (:func:`evjax.update_csr_on_binary_pre`: the rows of the inputs that fired);
* a postsynaptic spike potentiates its synapses by ``A_plus * pre_trace``
  (:func:`evjax.update_csr_on_binary_post`: the columns of the outputs that
  fired, through the column view computed once);
* weights stay in ``[0, w_max]``; a homeostatic threshold holds each output
  near 5 Hz while it learns.

Inputs that fire just before an output's spikes, again and again, are those of
the pattern; their synapses grow, the others shrink, and the outputs end up
firing at the start of the pattern's windows and rarely in the noise.  The
script prints the selectivity (output rate in the pattern's windows / in the
noise windows, on a test run without learning) before and after, and saves
``stdp_weights.png`` (the mean weight of the pattern's and the noise's synapses
over training, and the final weights) and ``stdp_raster.png`` (inputs and
outputs before and after), with matplotlib.  A training chunk is one jitted
``jax.lax.scan``.
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import evjax

DT = 1.0  # ms
RATE = 40e-3  # spikes per ms (40 Hz)
WINDOW = 50  # steps per window (the pattern's length)
TAU_M, TAU_PLUS, TAU_MINUS = 20.0, 16.8, 33.7  # ms
W_MAX = 1.0
A_PLUS = 0.05 * W_MAX
A_MINUS = 0.85 * A_PLUS  # A_MINUS * TAU_MINUS > A_PLUS * TAU_PLUS: depression-dominated
TARGET_RATE = 5e-3  # spikes per ms: the homeostatic threshold holds each output near 5 Hz


def build(n_in: int, n_out: int, p: float, seed: int):
    """The connection (a CSR matrix, per-synapse weights), its column view, and the frozen pattern."""
    rng = np.random.default_rng(seed)
    mask = rng.random((n_in, n_out)) < p
    weights = np.where(mask, rng.uniform(0.3, 0.5, (n_in, n_out)), 0.0).astype(np.float32)
    W = evjax.CSR.fromdense(weights)
    csc_indptr, csc_indices, weight_indices = evjax.csr_to_csc_index(np.asarray(W.indptr), np.asarray(W.indices),
                                                                   shape=W.shape)
    involved = np.zeros(n_in, bool)
    involved[rng.permutation(n_in)[: n_in // 2]] = True
    pattern = rng.random((WINDOW, n_in)) < RATE
    return W, (csc_indices, csc_indptr, weight_indices), involved, pattern


def make_inputs(rng, windows, involved, pattern):
    """The input spikes of ``len(windows) * WINDOW`` steps, ``(steps, n_in)`` bool: Poisson noise, with
    the pattern replayed by the involved inputs in the windows where ``windows[k]`` is set (NumPy: the data
    the network learns from, drawn once, as a data set would be)."""
    steps, n_in = len(windows) * WINDOW, involved.shape[0]
    spikes = rng.random((steps, n_in), dtype=np.float32) < RATE
    for k in np.flatnonzero(windows):
        spikes[k * WINDOW:(k + 1) * WINDOW, involved] = pattern[:, involved]
    return spikes


def make_run(W, column_view, threshold: float, learn: bool):
    """A jitted ``run(weights, state, inputs) -> (weights, state, output spikes)`` over the input spikes
    ``inputs`` ``(steps, n_in)``: one ``jax.lax.scan`` step per row."""
    indices, indptr, shape = W.indices, W.indptr, W.shape
    csc_indices, csc_indptr, weight_indices = column_view
    decay_m, decay_plus, decay_minus = np.exp(-DT / TAU_M), np.exp(-DT / TAU_PLUS), np.exp(-DT / TAU_MINUS)
    eta = 0.02 * threshold  # the threshold's step per output spike (homeostasis, learning runs only)

    def step(carry, pre):
        w, v, theta, x_pre, x_post = carry
        current = evjax.binary_csrmv(w, indices, indptr, pre, shape=shape, transpose=True)  # pre @ W: rows that fired
        v = v * decay_m + current
        post = v >= theta
        v = jnp.where(post, 0.0, v)
        x_pre = x_pre * decay_plus + pre
        x_post = x_post * decay_minus + post
        if learn:
            theta = theta + eta * (post - TARGET_RATE)  # fires more than 5 Hz: a higher threshold
            # pre spike: depression by the post trace; post spike: potentiation by the pre trace
            w = evjax.update_csr_on_binary_pre(w, indices, indptr, pre, -A_MINUS * x_post, 0.0, W_MAX, shape=shape)
            w = evjax.update_csr_on_binary_post(w, csc_indices, csc_indptr, weight_indices, A_PLUS * x_pre, post,
                                                0.0, W_MAX, shape=shape)
        return (w, v, theta, x_pre, x_post), post

    @jax.jit
    def run(w, state, inputs):
        (w, *state), post = jax.lax.scan(step, (w, *state), inputs)
        return w, tuple(state), post

    return run


def selectivity(post, windows) -> tuple[float, float]:
    """Output spikes per neuron and second in the pattern's windows and in the noise windows."""
    per_window = np.asarray(post).reshape(len(windows), WINDOW, -1).sum(axis=(1, 2))
    n_out = np.asarray(post).shape[1]
    seconds = WINDOW * DT / 1000.0
    shown = np.asarray(windows, bool)
    return (per_window[shown].mean() / n_out / seconds, per_window[~shown].mean() / n_out / seconds)


def random_windows(rng, n: int):
    """About a quarter of ``n`` windows show the pattern (a third are drawn, never two in a row)."""
    windows = rng.random(n) < 1 / 3
    windows[1:] &= ~windows[:-1]
    return windows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a small network and a short run (the tests')")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=".", help="folder for the figures")
    args = parser.parse_args(argv)
    n_in, n_out, chunks, windows_per_chunk = (2000, 20, 8, 40) if args.small else (10000, 200, 8, 40)
    p = 0.5 if args.small else 0.1
    rng = np.random.default_rng(args.seed)
    W, view, involved, pattern = build(n_in, n_out, p, args.seed)
    # the threshold: the mean free membrane potential, so that the outputs start firing on the input's fluctuations
    threshold = float(np.mean(np.asarray(W.data)) * n_in * p * RATE / (1 - np.exp(-DT / TAU_M)))
    init = (jnp.zeros(n_out), jnp.full(n_out, threshold), jnp.zeros(n_in), jnp.zeros(n_out))
    train = make_run(W, view, threshold, learn=True)
    test = make_run(W, view, threshold, learn=False)
    print(f"STDP: {n_in} inputs -> {n_out} outputs, {W.nnz} synapses; "
          f"{chunks * windows_per_chunk * WINDOW / 1000:.0f} s of training in {chunks} chunks")

    test_windows = random_windows(np.random.default_rng(10**6), 60)
    test_inputs = make_inputs(np.random.default_rng(10**6 + 1), test_windows, involved, pattern)
    _, _, post_before = test(W.data, init, test_inputs)
    before = selectivity(post_before, test_windows)
    print(f"before: {before[0]:.1f} Hz in the pattern's windows, {before[1]:.1f} Hz in the noise: "
          f"selectivity {before[0] / max(before[1], 1e-9):.2f}")

    w, state = W.data, init
    rows = np.repeat(np.arange(n_in), np.diff(np.asarray(W.indptr)))
    on_pattern = involved[rows]
    history = [(0.0, float(np.mean(np.asarray(w)[on_pattern])), float(np.mean(np.asarray(w)[~on_pattern])))]
    start, in_steps = time.perf_counter(), 0.0
    for chunk in range(chunks):
        inputs = make_inputs(rng, random_windows(rng, windows_per_chunk), involved, pattern)
        stepped = time.perf_counter()
        w, state, post = train(w, state, inputs)
        w_np = np.asarray(w)
        in_steps += time.perf_counter() - stepped
        seconds = (chunk + 1) * windows_per_chunk * WINDOW / 1000
        history.append((seconds, float(w_np[on_pattern].mean()), float(w_np[~on_pattern].mean())))
        print(f"  {seconds:5.1f} s: output rate {np.asarray(post).mean() * 1000:5.1f} Hz, mean weight "
              f"pattern {history[-1][1]:.3f} / noise {history[-1][2]:.3f}  ({time.perf_counter() - start:.1f} s)")
    elapsed = time.perf_counter() - start
    steps = chunks * windows_per_chunk * WINDOW
    print(f"training: {elapsed:.1f} s wall for {steps} steps, {in_steps / steps * 1e6:.0f} us per step in the "
          f"network (first chunk's compile included), the rest drawing the inputs")

    learned = (init[0], state[1], init[2], init[3])  # the learned weights and thresholds, fresh potentials
    _, _, post_after = test(w, learned, test_inputs)
    after = selectivity(post_after, test_windows)
    gain = after[0] / max(after[1], 1e-9)
    print(f"after:  {after[0]:.1f} Hz in the pattern's windows, {after[1]:.1f} Hz in the noise: "
          f"selectivity {gain:.2f}")
    print("selective" if gain > 2.0 else "NOT selective")
    _figures(args.out, history, np.asarray(w), on_pattern, test_windows, (test_inputs, post_before),
             (test_inputs, post_after))
    return before, after


def _figures(out, history, w, on_pattern, windows, before, after):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no figures)")
        return
    history = np.asarray(history)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.5))
    a.plot(history[:, 0], history[:, 1], label="synapses from the pattern's inputs")
    a.plot(history[:, 0], history[:, 2], label="synapses from noise-only inputs")
    a.set_xlabel("training time (s of model time)")
    a.set_ylabel("mean weight")
    a.legend()
    b.hist([w[on_pattern], w[~on_pattern]], bins=30, label=["pattern", "noise"], stacked=True)
    b.set_xlabel("final weight")
    b.legend()
    fig.tight_layout()
    fig.savefig(f"{out}/stdp_weights.png", dpi=100)
    fig, axes = plt.subplots(2, 2, figsize=(11, 5), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    shown = np.repeat(np.asarray(windows, bool), WINDOW)
    steps = min(1000, shown.shape[0])
    for col, (title, (pre, post)) in enumerate((("before learning", before), ("after learning", after))):
        pre, post = np.asarray(pre)[:steps, :200], np.asarray(post)[:steps]
        for ax in axes[:, col]:
            for start in np.flatnonzero(np.diff(np.concatenate([[0], shown[:steps].astype(int)])) == 1):
                ax.axvspan(start, start + WINDOW, color="tab:orange", alpha=0.15)
        t, i = np.nonzero(pre)
        axes[0, col].plot(t, i, "k.", markersize=1)
        axes[0, col].set_title(f"{title}: 200 inputs (pattern windows shaded)")
        t, i = np.nonzero(post)
        axes[1, col].plot(t, i, "r.", markersize=1)
        axes[1, col].set_xlabel("time (ms)")
    axes[1, 0].set_ylabel("outputs")
    fig.tight_layout()
    fig.savefig(f"{out}/stdp_raster.png", dpi=100)
    print(f"saved {out}/stdp_weights.png and {out}/stdp_raster.png")


if __name__ == "__main__":
    main()

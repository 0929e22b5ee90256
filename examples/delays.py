"""Heterogeneous synaptic delays make neurons detect spike *sequences* (polychrony).

    python examples/delays.py            # 400 inputs -> 200 detectors, 40 trials
    python examples/delays.py --small    # 100 inputs -> 40 detectors, 16 trials (what the tests run)

Each detector neuron receives 20 inputs through synapses whose delays are drawn
between 1 and 20 steps (:func:`evjax.csr_delay_deliver`: each synapse adds its
weight into an arrival ring ``(L, n_detectors)`` at the slot
``(t + delay) mod L``).  A detector is a leaky integrate-and-fire neuron with a
short membrane time constant and a threshold of 15 coincident inputs, so it
fires only when most of its inputs *arrive* together.

A detector's preferred sequence fires its inputs in the order that compensates
their delays (input ``i`` at step ``20 - d_i``): all 20 spikes arrive at the same
step and the detector fires.  The control trial fires the same inputs at the same
times, shuffled among them: the same spikes, a different order, and the arrivals
spread over 20 steps.  The script prints how often each kind of trial makes the
target detector fire (and how many other detectors fire), and saves
``delays.png`` (inputs, arrivals and detector spikes of a preferred and a
control trial), with matplotlib.  The whole run is one jitted ``jax.lax.scan``.
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import evjax

FAN_IN, MAX_DELAY = 20, 20
SLOTS = MAX_DELAY + 1  # the ring: delays 1..20 ahead of the current step
TRIAL = 40  # steps per trial (a sequence spans 20 steps, then the network rests)
TAU_M, THRESHOLD = 2.0, 15.0


def build(n_in: int, n_out: int, seed: int):
    """Each detector's 20 inputs and their delays, as a CSR connection ``(n_in, n_out)`` with delays per synapse."""
    rng = np.random.default_rng(seed)
    sources = np.stack([rng.choice(n_in, FAN_IN, replace=False) for _ in range(n_out)])  # (n_out, FAN_IN)
    delays = rng.integers(1, MAX_DELAY + 1, (n_out, FAN_IN))
    dense_delay = np.zeros((n_in, n_out), np.int32)
    mask = np.zeros((n_in, n_out), bool)
    for j in range(n_out):
        mask[sources[j], j] = True
        dense_delay[sources[j], j] = delays[j]
    W = evjax.CSR.fromdense(mask.astype(np.float32))  # weight 1 per synapse
    rows = np.repeat(np.arange(n_in), np.diff(np.asarray(W.indptr)))
    syn_delays = dense_delay[rows, np.asarray(W.indices)].astype(np.int32)  # in the CSR's synapse order
    return W, syn_delays, sources, delays


def stimulus(rng, sources, delays, trials: int, n_in: int):
    """Input spikes ``(trials * TRIAL, n_in)``: each trial plays one detector's sequence, in its preferred
    order (even trials) or shuffled among its inputs (odd trials).  Returns the spikes and each trial's
    target detector."""
    spikes = np.zeros((trials * TRIAL, n_in), bool)
    targets = rng.integers(0, sources.shape[0], trials)
    for k, j in enumerate(targets):
        times = MAX_DELAY - delays[j]  # input i fires at 20 - d_i: every spike arrives at step 20
        if k % 2:
            times = rng.permutation(times)  # the same spike times, given to other inputs
        spikes[k * TRIAL + times, sources[j]] = True
    return spikes, targets


def make_run(W, syn_delays):
    """A jitted ``run(inputs) -> (detector spikes, arrivals)`` over input spikes ``(steps, n_in)``."""
    n_out = W.shape[1]
    decay = np.exp(-1.0 / TAU_M)

    def step(carry, xs):
        ring, v = carry
        t, pre = xs
        arrived = ring[t % SLOTS]  # the input that arrives now
        ring = ring.at[t % SLOTS].set(0.0)  # the slot is free for t + SLOTS
        ring = evjax.csr_delay_deliver(ring, pre, W.data, W.indices, W.indptr, syn_delays, t, shape=W.shape)
        v = v * decay + arrived
        fired = v >= THRESHOLD
        v = jnp.where(fired, 0.0, v)
        return (ring, v), (fired, arrived)

    @jax.jit
    def run(inputs):
        steps = inputs.shape[0]
        init = (jnp.zeros((SLOTS, n_out)), jnp.zeros(n_out))
        _, (fired, arrived) = jax.lax.scan(step, init, (jnp.arange(steps, dtype=jnp.int32), inputs))
        return fired, arrived

    return run


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a small network and few trials (the tests')")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=".", help="folder for the figure")
    args = parser.parse_args(argv)
    n_in, n_out, trials = (100, 40, 16) if args.small else (400, 200, 40)
    rng = np.random.default_rng(args.seed)
    W, syn_delays, sources, delays = build(n_in, n_out, args.seed)
    print(f"delays: {n_in} inputs -> {n_out} detectors, {W.nnz} synapses, delays 1-{MAX_DELAY} steps, "
          f"ring of {SLOTS} slots; {trials} trials")
    inputs, targets = stimulus(rng, sources, delays, trials, n_in)
    run = make_run(W, syn_delays)
    start = time.perf_counter()
    fired, arrived = jax.block_until_ready(run(jnp.asarray(inputs)))
    print(f"simulated {inputs.shape[0]} steps in {time.perf_counter() - start:.2f} s (compile included)")
    fired = np.asarray(fired).reshape(trials, TRIAL, n_out)
    hit = np.array([fired[k, :, j].any() for k, j in enumerate(targets)])
    others = np.array([np.delete(fired[k].any(axis=0), j).sum() for k, j in enumerate(targets)])
    preferred, control = hit[0::2].mean(), hit[1::2].mean()
    print(f"preferred order: the target fires in {preferred:.0%} of the trials "
          f"(other detectors firing: {others[0::2].mean():.1f} per trial)")
    print(f"shuffled order:  the target fires in {control:.0%} of the trials "
          f"(other detectors firing: {others[1::2].mean():.1f} per trial)")
    _figure(args.out, inputs, np.asarray(arrived), fired, targets, sources)
    return preferred, control


def _figure(out, inputs, arrived, fired, targets, sources):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no figure)")
        return
    fig, axes = plt.subplots(3, 2, figsize=(10, 6), sharex=True)
    for col, (k, title) in enumerate(((0, "preferred order"), (1, "shuffled order"))):
        j = targets[k]
        window = slice(k * TRIAL, (k + 1) * TRIAL)
        t, i = np.nonzero(inputs[window][:, sources[j]])
        axes[0, col].plot(t, i, "k|", markersize=8)
        axes[0, col].set_title(f"{title}: detector {j}'s 20 inputs")
        axes[0, col].set_ylabel("input")
        axes[1, col].step(np.arange(TRIAL), arrived[window][:, j], where="post")
        axes[1, col].axhline(15, color="tab:red", linestyle=":", label="threshold (coincident arrivals)")
        axes[1, col].set_ylabel("spikes arriving")
        t, i = np.nonzero(fired[k])
        axes[2, col].plot(t, i, "r.", markersize=4)
        axes[2, col].axhline(j, color="0.8", zorder=0)
        axes[2, col].set_ylabel("detector")
        axes[2, col].set_xlabel("step in the trial")
    axes[1, 0].legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(f"{out}/delays.png", dpi=100)
    print(f"saved {out}/delays.png")


if __name__ == "__main__":
    main()

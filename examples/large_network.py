"""A balanced E/I network of a million LIF neurons with just-in-time connectivity.

    python examples/large_network.py            # 10^6 neurons x 1000 synapses (10^9), 1 s of model time
    python examples/large_network.py --small    # 4000 neurons x 80 synapses, 0.2 s (what the tests run)
    python examples/large_network.py --processes 2 --duration 10    # model parallel over 2 processes

The current-based benchmark network of Vogels & Abbott (2005, "CUBA"), 80%
excitatory and 20% inhibitory leaky integrate-and-fire neurons, scaled up:
each neuron sends ``K`` synapses (``prob = K / n``) and the weights are scaled
by ``80 / K`` so that the summed input matches the original's.  The two
projections are :class:`evjax.JITCScalarR` matrices: their 10^9 synapses are
never stored, and ``spikes @ W`` generates only the rows of the neurons that
spiked in the step (``corder=True``).  The simulation is one ``jax.lax.scan``.

It prints the mean firing rate and the time per step, and saves a raster of
the first 1000 neurons (``large_network.png``, needs matplotlib).

**Model parallel** (``--processes N``, on JAX's distributed runtime; see
``docs/distributed.md``): each process owns a slice of the neurons (their
state) and computes their input currents; the spikes are all-gathered every
step.  The matrices are then generated output by output (``corder=False``:
each neuron's incoming synapses are one stream keyed by the seed and its
index), so a process generates only its own neurons' synapses, and the
spikes are bit for bit those of one process with ``--by-output``.  That
orientation generates every synapse each step (not only those of active
neurons), which the split then divides among the processes.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import evjax
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # examples/, also when loaded by path
import launch  # noqa: E402  (examples/launch.py: starts the processes on this machine)

# Vogels & Abbott (2005), CUBA: mV and ms
TAU_M, TAU_E, TAU_I = 20.0, 5.0, 10.0
V_REST, V_TH, V_RESET, T_REF = -49.0, -50.0, -60.0, 5.0
W_E, W_I = 1.62, -9.0  # per synapse, for the original 80 synapses per neuron


def build(n: int, k: int, seed: int = 0, by_output: bool = False):
    """The two projections: excitatory (first 80%) and inhibitory presynaptic neurons onto all ``n``.

    ``by_output``: generated output by output (``corder=False``), the orientation that splits by
    neuron across devices; else input by input, only the rows of spiking neurons (event-driven)."""
    n_e = int(0.8 * n)
    prob, scale = k / n, 80.0 / k
    corder = not by_output
    w_e = evjax.JITCScalarR(W_E * scale, prob=prob, seed=seed, shape=(n_e, n), corder=corder)
    w_i = evjax.JITCScalarR(W_I * scale, prob=prob, seed=seed + 1, shape=(n - n_e, n), corder=corder)
    return w_e, w_i


def simulate(w_e, w_i, n: int, steps: int, dt: float, raster_size: int, seed: int = 0, sharding=None):
    """``steps`` Euler steps of the network; returns spike counts per step and the raster of the first neurons.

    ``sharding``: the neurons' state split over devices by it (model parallel), else on one device."""
    n_e = w_e.shape[0]
    decay_e, decay_i = np.exp(-dt / TAU_E), np.exp(-dt / TAU_I)

    def placed(state):
        return state if sharding is None else jax.lax.with_sharding_constraint(state, sharding)

    def step(state, _):
        v, ge, gi, refractory, spikes = placed(state)
        ge = ge * decay_e + spikes[:n_e] @ w_e  # event-driven: rows of spiking neurons only
        gi = gi * decay_i + spikes[n_e:] @ w_i
        v = jnp.where(refractory > 0, v, v + dt * (V_REST - v + ge + gi) / TAU_M)
        fired = v > V_TH
        v = jnp.where(fired, V_RESET, v)
        refractory = jnp.where(fired, T_REF, jnp.maximum(refractory - dt, 0.0))
        return placed((v, ge, gi, refractory, fired)), (jnp.sum(fired), fired[:raster_size])

    key = jax.random.PRNGKey(seed)
    v0 = jax.random.uniform(key, (n,), jnp.float32, V_RESET, V_TH)
    zeros = jnp.zeros((n,), jnp.float32)
    state = placed((v0, zeros, zeros, zeros, jnp.zeros((n,), bool)))
    _, (counts, raster) = jax.lax.scan(step, state, None, length=steps)
    return counts, raster


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="4000 neurons, 80 synapses each, 0.2 s")
    parser.add_argument("--n", type=int, default=None, help="neurons (default 10^6, or 4000 with --small)")
    parser.add_argument("--k", type=int, default=None, help="synapses per neuron (default 1000, or 80)")
    parser.add_argument("--duration", type=float, default=None, help="model time in ms (default 1000, or 200)")
    parser.add_argument("--dt", type=float, default=0.5, help="time step in ms")
    parser.add_argument("--png", default="large_network.png", help="raster plot ('' for none)")
    parser.add_argument("--by-output", action="store_true",
                        help="generate the matrices output by output (implied by --processes > 1)")
    parser.add_argument("--out", default=None, help="JSON file: spike counts per step, time per step, peak RSS")
    launch.add_arguments(parser, processes=1)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    status = launch.resolve(__file__, args, argv)
    if status is not None:
        return status
    launch.initialize(args)
    n = args.n or (4000 if args.small else 10**6)
    k = args.k or (80 if args.small else 1000)
    duration = args.duration or (200.0 if args.small else 1000.0)
    steps = int(round(duration / args.dt))
    parallel = jax.device_count() > 1
    if parallel and n % jax.device_count():
        raise SystemExit(f"--n {n} must divide evenly among {jax.device_count()} devices")
    sharding = None
    if parallel:
        from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

        mesh = jax.make_mesh((jax.device_count(),), ("neurons",), axis_types=(AxisType.Auto,))
        sharding = NamedSharding(mesh, P("neurons"))
    w_e, w_i = build(n, k, by_output=args.by_output or parallel)
    run = jax.jit(lambda we, wi: simulate(we, wi, n, steps, args.dt, min(n, 1000), sharding=sharding))
    t = time.perf_counter()
    compiled = run.lower(w_e, w_i).compile()
    compile_s = time.perf_counter() - t
    t = time.perf_counter()
    counts, raster = jax.block_until_ready(compiled(w_e, w_i))
    wall = time.perf_counter() - t
    if parallel:  # replicated results: this process's copy
        counts, raster = counts.addressable_data(0), raster.addressable_data(0)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes
    rate = float(np.sum(counts)) / n / (duration / 1000.0)
    if args.out:
        path = args.out if args.process_id == 0 else f"{args.out}.{args.process_id}"
        with open(path, "w") as f:
            json.dump({"processes": jax.process_count(), "n": n, "k": k, "steps": steps, "counts":
                       np.asarray(counts).tolist(), "per_step_s": wall / steps, "compile_s": compile_s,
                       "peak_rss_mb": rss_mb, "process": args.process_id}, f)
    if args.process_id:
        return {"rate": rate, "per_step": wall / steps, "counts": np.asarray(counts)}
    print(f"{n:,} neurons x {k} synapses ({n * k:.2e} synapses, never stored), {steps} steps of {args.dt} ms")
    print(f"mean firing rate: {rate:.2f} Hz")
    print(f"time per step: {wall / steps * 1e3:.2f} ms ({wall:.1f} s for {duration:.0f} ms of model time; "
          f"compile {compile_s:.1f} s); {jax.process_count()} process(es), peak RSS {rss_mb:.0f} MB (process 0)")
    if args.png:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("(matplotlib not installed: no raster)")
        else:
            times, neurons = np.nonzero(np.asarray(raster))
            fig, ax = plt.subplots(figsize=(8, 4))
            ax.plot(times * args.dt, neurons, ",k")
            ax.set_xlabel("time (ms)")
            ax.set_ylabel("neuron")
            ax.set_title(f"{n:,} LIF neurons, JITC connectivity: {rate:.1f} Hz")
            fig.tight_layout()
            fig.savefig(args.png, dpi=120)
            print(f"raster: {args.png}")
    return {"rate": rate, "per_step": wall / steps, "counts": np.asarray(counts), "raster": np.asarray(raster)}


if __name__ == "__main__":
    result = main()
    sys.exit(result if isinstance(result, int) else 0)

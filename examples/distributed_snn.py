"""Data-parallel training of the main example over several processes, on JAX's distributed runtime.

    python examples/distributed_snn.py --processes 2     # two processes on this machine
    python examples/distributed_snn.py --processes 1     # the one-process run, for comparison

Each process owns one CPU device and a slice of every batch; the network
(``examples/train_sparse_snn.py``: LIF neurons, CSR input and recurrent
weights) is replicated.  The training step is ``jax.shard_map`` over the
batch: every process runs the network on its own trials, and the only
communication per step is one all-reduce of the gradients (and the loss).
``--plain-jit`` runs the same step as plain ``jax.jit`` over ``NamedSharding``
arrays instead: the evjax ops' sharding rules split each op by the batch, but
XLA then all-reduces each weight gradient at every time step of the backward
scan (it cannot move a sum out of the loop), which costs more across
processes.  The
loss curve equals the one-process run's to float tolerance, for the same seed.

On this machine the script starts the processes itself (``--processes N``).
On several hosts, start one process per host yourself, with the same
arguments plus ``--process-id i --coordinator host0:port`` (see
``docs/distributed.md`` for SLURM and ``ssh`` recipes).

Writes ``--out`` (JSON: the loss of every step, the time per step, the
number of processes) from process 0.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # examples/, also when loaded by path
import launch  # noqa: E402  (examples/launch.py: starts the processes on this machine)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_example():
    spec = importlib.util.spec_from_file_location("train_sparse_snn", os.path.join(ROOT, "examples",
                                                                                 "train_sparse_snn.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    launch.add_arguments(p, processes=2)
    p.add_argument("--hidden", type=int, default=500, help="recurrent LIF neurons (default 500)")
    p.add_argument("--n-steps", type=int, default=30, help="time steps per trial (default 30)")
    p.add_argument("--batch", type=int, default=16, help="trials per step, all processes together (default 16)")
    p.add_argument("--train-steps", type=int, default=20, help="training steps (default 20)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plain-jit", action="store_true",
                   help="plain jax.jit over the sharded batch instead of shard_map (the weight gradients are then "
                        "all-reduced at every time step of the backward scan: slower across processes)")
    p.add_argument("--out", default=None, help="JSON file for the loss curve and timings (process 0)")
    return p.parse_args(argv)


# ---------------------------------------------------------------------------
# one process
# ---------------------------------------------------------------------------
def worker(args: argparse.Namespace) -> dict:
    launch.initialize(args)
    import jax
    import numpy as np
    import optax
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    snn = _load_example()
    cfg = snn.Config(n_hidden=args.hidden, n_steps=args.n_steps, batch=args.batch, seed=args.seed)
    if args.batch % jax.device_count():
        raise ValueError(f"--batch {args.batch} must divide evenly among {jax.device_count()} devices")
    # Auto axes: XLA propagates the batch split through the model (the evjax ops by their rules)
    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Auto,))
    replicated, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))

    def global_array(value, sharding):  # every process holds the whole value; each device takes its part
        value = np.asarray(value)
        return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])

    params, s_in, s_rec = snn.init_params(cfg)
    x_all, y_all = snn.make_randman(cfg, args.batch * args.train_steps, seed=cfg.seed + 1)
    loss = snn.make_loss(cfg, snn.make_trial(cfg, snn.make_synapses(s_in, s_rec, dense=False)))
    optimizer = optax.adam(cfg.lr)

    def update(params, opt_state, grads, value):
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    def train_step(params, opt_state, x, labels):
        (value, _), grads = jax.value_and_grad(loss, has_aux=True)(params, x, labels)
        return update(params, opt_state, grads, value)

    def local_step(params, opt_state, x, labels):
        # this device's trials; the mean over devices of the local losses is the batch's loss, and the
        # gradients of the replicated weights are summed over the devices once (shard_map's psum)
        def global_loss(params):
            # the weights are cast to "varying over devices" here, once: the transpose of that cast is the
            # psum of their gradients, which then runs once per step, not at every time step of the
            # backward scan (where the weights would otherwise meet the per-device spikes)
            params = jax.lax.pcast(params, "data", to="varying")
            return jax.lax.pmean(loss(params, x, labels)[0], "data")

        value, grads = jax.value_and_grad(global_loss)(params)
        return update(params, opt_state, grads, value)

    params = jax.tree_util.tree_map(lambda a: global_array(a, replicated), params)
    opt_state = jax.tree_util.tree_map(lambda a: global_array(a, replicated), optimizer.init(params))
    if args.plain_jit:  # XLA partitions every op (the evjax ops by their rules)
        step = jax.jit(train_step, out_shardings=(replicated, replicated, replicated))
    else:
        step = jax.jit(jax.shard_map(local_step, mesh=mesh, in_specs=(P(), P(), P("data"), P("data")),
                                     out_specs=(P(), P(), P())))

    losses, times = [], []
    for t in range(args.train_steps):
        batch = slice(t * args.batch, (t + 1) * args.batch)
        x, labels = global_array(x_all[batch], split), global_array(y_all[batch], split)
        start = time.perf_counter()
        params, opt_state, value = step(params, opt_state, x, labels)
        value = float(value.addressable_data(0))  # waits for the step
        times.append(time.perf_counter() - start)
        losses.append(value)
        if jax.process_index() == 0:
            print(f"step {t:3d}  loss {value:.6f}  {times[-1] * 1e3:8.1f} ms", flush=True)
    steady = sorted(times[2:] or times)
    return {"processes": jax.process_count(), "devices": jax.device_count(), "threads": args.threads,
            "mode": "plain jit" if args.plain_jit else "shard_map",
            "hidden": args.hidden, "n_steps": args.n_steps, "batch": args.batch, "losses": losses,
            "step_time_s": steady[len(steady) // 2], "first_step_s": times[0]}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    status = launch.resolve(__file__, args, argv)
    if status is not None:
        return status
    result = worker(args)
    if args.process_id == 0:
        print(f"{result['processes']} process(es): median step {result['step_time_s'] * 1e3:.1f} ms, "
              f"final loss {result['losses'][-1]:.6f}")
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

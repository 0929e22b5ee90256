"""Start an example's processes on this machine, for JAX's distributed runtime (``jax.distributed``).

Used by ``distributed_snn.py`` and ``large_network.py``: with ``--processes N``
and no ``--process-id``, the script starts N copies of itself with their ranks
and a free local coordinator port, and waits for them.  On several hosts,
start one process per host yourself with ``--process-id`` (or
``--process-id-from-env`` under SLURM or MPI) and ``--coordinator host:port``.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time


def add_arguments(p: argparse.ArgumentParser, processes: int) -> None:
    """The options every multi-process example takes."""
    p.add_argument("--processes", type=int, default=processes, help=f"number of processes (default {processes})")
    p.add_argument("--process-id", type=int, default=None,
                   help="this process's rank (set it on each host; without it, start all processes here)")
    p.add_argument("--process-id-from-env", action="store_true",
                   help="read the rank from SLURM_PROCID (or OMPI_COMM_WORLD_RANK, PMI_RANK)")
    p.add_argument("--coordinator", default=None, help="host:port of process 0 (default: a free local port)")
    p.add_argument("--threads", type=int, default=1, help="Numba threads of each process started here (default 1; "
                   "a single process keeps its environment's NUMBA_NUM_THREADS)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds before the launcher gives up")


def rank_from_env() -> int:
    for name in ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if name in os.environ:
            return int(os.environ[name])
    raise SystemExit("--process-id-from-env: none of SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK is set")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(script: str, args: argparse.Namespace, argv: list[str]) -> int:
    """Start ``args.processes`` copies of ``script`` with their ranks; wait for all of them."""
    coordinator = args.coordinator or f"127.0.0.1:{_free_port()}"
    env = dict(os.environ, NUMBA_NUM_THREADS=str(args.threads))
    procs = [subprocess.Popen([sys.executable, os.path.abspath(script), *argv, "--process-id", str(i),
                               "--coordinator", coordinator], env=env)
             for i in range(args.processes)]
    deadline = time.monotonic() + args.timeout
    status = 0
    try:
        for proc in procs:
            status = status or proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        print(f"{os.path.basename(script)}: the processes did not finish within {args.timeout:g} s", file=sys.stderr)
        status = 1
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return status


def resolve(script: str, args: argparse.Namespace, argv: list[str]) -> int | None:
    """Launch the processes here (returns their status), or set this process's rank (returns None)."""
    if args.process_id_from_env:
        args.process_id = rank_from_env()
    if args.process_id is None and args.processes > 1:
        return launch(script, args, argv)
    if args.process_id is None:  # one process: this one, with the threads the environment gives it
        args.process_id = 0
    return None


def initialize(args: argparse.Namespace) -> None:
    """Join the distributed runtime (several processes), with CPU collectives over gloo."""
    import jax

    if args.processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=args.processes,
                                   process_id=args.process_id)

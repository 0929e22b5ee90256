"""Several processes on JAX's distributed runtime (``jax.distributed``, CPU collectives over gloo):
``examples/distributed_snn.py`` trains the main example data-parallel over 2 processes on this machine,
and its loss curve equals the one-process run's for the same seed, with a shard_map step and with a
plain-jit step (the ops partitioned by their sharding rules)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import HANG_GUARD_S, ROOT

SMALL = ["--hidden", "64", "--n-steps", "8", "--batch", "8", "--train-steps", "3", "--seed", "3"]


def _train(processes: int, out, *extra: str) -> dict:
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "distributed_snn.py"), "--processes",
                           str(processes), *SMALL, *extra, "--out", str(out), "--timeout", str(HANG_GUARD_S)],
                          cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, f"STDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr[-6000:]}"
    return json.loads(out.read_text())


@pytest.mark.slow
def test_two_processes_train_like_one(tmp_path):
    two = _train(2, tmp_path / "two.json")
    one = _train(1, tmp_path / "one.json")
    assert (two["processes"], two["devices"]) == (2, 2)
    assert (one["processes"], one["devices"]) == (1, 1)
    assert len(two["losses"]) == len(one["losses"]) == 3
    assert len(set(one["losses"])) > 1  # the weights changed between steps
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-5)
    # plain jit over the two processes' devices: the ops split by their sharding rules, the same curve
    plain = _train(2, tmp_path / "plain.json", "--plain-jit")
    assert plain["mode"] == "plain jit" and two["mode"] == "shard_map"
    np.testing.assert_allclose(plain["losses"], one["losses"], rtol=1e-5)


def _simulate(processes: int, out) -> dict:
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "large_network.py"), "--small", "--duration", "10",
                           "--by-output", "--png", "", "--processes", str(processes), "--out", str(out),
                           "--timeout", str(HANG_GUARD_S)],
                          cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, f"STDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr[-6000:]}"
    return json.loads(out.read_text())


@pytest.mark.slow
def test_large_network_gives_the_same_spikes_in_1_2_and_4_processes(tmp_path):
    # model parallel: each process owns a slice of the 4000 neurons and generates only their input
    # synapses (JITC, output by output); the spike counts of every step are those of one process
    runs = {p: _simulate(p, tmp_path / f"p{p}.json") for p in (1, 2, 4)}
    assert [runs[p]["processes"] for p in (1, 2, 4)] == [1, 2, 4]
    assert sum(runs[1]["counts"]) > 0 and len(runs[1]["counts"]) == 20
    assert runs[2]["counts"] == runs[1]["counts"] and runs[4]["counts"] == runs[1]["counts"]
    # every process wrote its own record (its memory, its time)
    assert json.loads((tmp_path / "p4.json.3").read_text())["process"] == 3

"""Every event family's parallel kernels called concurrently: from Python threads, and per device under shard_map.

Sizes are chosen so that each op takes its multi-threaded path (above the work
thresholds of its ``numba.py``), where concurrent calls share Numba's thread
pools. Each thread's result is compared with the same op run alone beforehand.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import evjax

from tests.helpers import run_on_four_cpu_devices
from tests.threads import check_in_threads

N = 4000


def _matrix(family):
    """The family's N x N matrix (only that one: the dense one alone is 64 MB)."""
    if family == "dense":
        return evjax.Dense(jnp.asarray(np.random.default_rng(0).standard_normal((N, N)), jnp.float32))
    if family == "jitc":
        return evjax.JITCScalarR((0.5, 0.05, 7), shape=(N, N))
    fixed = evjax.FixedPostNumConn.random(jax.random.key(1), N, N, 200, weight=0.5)
    return fixed if family == "fixed" else fixed.tocsr()


@pytest.mark.parametrize("family", ["fixed", "dense", "csr", "jitc"])
def test_concurrent_calls_from_threads(family):
    W = _matrix(family)
    rng = np.random.default_rng(2)
    spikes = [jnp.asarray(rng.random(N) < 0.2) for _ in range(4)]
    forward = jax.jit(lambda W, s: evjax.BinaryArray(s) @ W)
    expected = [np.asarray(forward(W, s)) for s in spikes]

    def worker(k):
        for _ in range(10):
            np.testing.assert_allclose(np.asarray(forward(W, spikes[k])), expected[k], rtol=1e-6, atol=1e-5)

    check_in_threads(worker)


SHARD_MAP_FAMILIES = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import AxisType, PartitionSpec as P
import evjax

assert len(jax.devices()) == 4, jax.devices()
mesh = jax.make_mesh((4,), ("data",), axis_types=(AxisType.Auto,))
n = 2000
rng = np.random.default_rng(0)
matrices = {
    "fixed": evjax.FixedPostNumConn.random(jax.random.key(1), n, n, 100),
    "dense": evjax.Dense(jnp.asarray(rng.standard_normal((n, n)), jnp.float32)),
    "jitc": evjax.JITCScalarR((0.5, 0.05, 7), shape=(n, n)),
}
matrices["csr"] = matrices["fixed"].tocsr()
spikes = jnp.asarray(rng.random((8, n)) < 0.2)
for name, W in matrices.items():
    weights = W.params[0] if name == "jitc" else W.data  # JITC: its one weight parameter

    def loss(w, s):
        return jnp.sum((evjax.BinaryArray(s) @ W.with_data(w)) ** 2)

    def local(w, s):  # each device: its two samples. w is replicated, so the transpose of its implicit
        value, grad = jax.value_and_grad(loss)(w, s)  # broadcast to the devices sums its gradient over them
        return jax.lax.psum(value, "data"), grad

    value4, grad4 = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data")), out_specs=(P(), P())))(
        weights, spikes)
    value1, grad1 = jax.value_and_grad(loss)(weights, spikes)
    np.testing.assert_allclose(value4, value1, rtol=1e-5)
    assert float(jnp.abs(grad1).max()) > 0
    np.testing.assert_allclose(grad4, grad1, rtol=1e-4, atol=1e-2)
    print("OK", name)
"""


def test_shard_map_data_parallel_gradient_of_every_family():
    out = run_on_four_cpu_devices(SHARD_MAP_FAMILIES)
    for family in ("fixed", "dense", "jitc", "csr"):
        assert f"OK {family}" in out, out

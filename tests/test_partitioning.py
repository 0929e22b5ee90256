"""Plain ``jax.jit`` over sharded inputs partitions the event ops (their sharding rules), on 4 virtual
CPU devices: the compiled HLO has no all-gather of the weights or of the matrix, each device's kernel
runs on its own slice, and the results equal one device's.

Each scenario runs in a subprocess started with
``XLA_FLAGS=--xla_force_host_platform_device_count=4`` (the flag must be set before JAX initialises);
the families share one subprocess, so that JAX starts once.
"""
from __future__ import annotations

import pytest

from tests.helpers import EXAMPLE_TRAINING_STEP, run_on_four_cpu_devices

COMMON = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import evjax

assert len(jax.devices()) == 4, jax.devices()
mesh = jax.make_mesh((4,), ("data",), axis_types=(AxisType.Explicit,))
rng = np.random.default_rng(0)
n, K = 96, 8


def kernel_calls(hlo):
    return [l.split("custom-call(")[0] for l in hlo.splitlines() if 'custom_call_target="evjax_' in l]


def check(name, fn, args, sharded_args, *, local, collective_ok=()):
    # fn jitted on the sharded arguments: no all-gather, every kernel on its slice, the same result
    # as on one device (the unsharded arguments)
    jitted = jax.jit(fn)
    hlo = jitted.lower(*sharded_args).compile().as_text()
    calls = kernel_calls(hlo)
    assert calls, (name, hlo[:2000])
    assert "all-gather" not in hlo, (name, [l for l in hlo.splitlines() if "all-gather" in l][:3])
    for bad in ("all-to-all", "collective-permute"):
        assert bad not in hlo, (name, bad)
    assert any(local in c for c in calls), (name, local, calls)
    got = jax.tree_util.tree_leaves(jitted(*sharded_args))
    want = jax.tree_util.tree_leaves(jax.jit(fn)(*args))
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert np.abs(w).max() > 0, name
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * np.abs(w).max(), err_msg=name)
    print("OK", name, calls[0].strip())


batch = NamedSharding(mesh, P("data"))       # the trials split over the devices
replicated = NamedSharding(mesh, P())
S = jnp.asarray(rng.random((K, n)) < 0.3)    # K trials of n input spikes
S_sharded = jax.device_put(S, batch)
"""

FAMILIES = {
    "csr": """
W = evjax.CSR.fromdense(((rng.random((n, 80)) < 0.2) * rng.standard_normal((n, 80))).astype(np.float32))
data = jax.device_put(W.data, replicated)
fwd = lambda s, d: s @ W.with_data(d)
grad = jax.grad(lambda d, s: jnp.sum((s @ W.with_data(d)) ** 2))
vgrad = jax.grad(lambda d, s: jnp.sum(jax.vmap(lambda x: x @ W.with_data(d))(s) ** 2))
check("csr forward", fwd, (S, W.data), (S_sharded, data), local="[2,80]")
check("csr weight gradient", grad, (W.data, S), (data, S_sharded), local="[2,80]")
check("csr vmap gradient", vgrad, (W.data, S), (data, S_sharded), local="[2,80]")
""",
    "fixed": """
C = evjax.FixedPostNumConn.random(jax.random.PRNGKey(0), n, 80, 12,
                                  weight=jnp.asarray(rng.standard_normal((n, 12)).astype(np.float32)))
data = jax.device_put(C.data, replicated)
fwd = lambda s, d: s @ C.with_data(d)
grad = jax.grad(lambda d, s: jnp.sum((s @ C.with_data(d)) ** 2))
check("fixed forward", fwd, (S, C.data), (S_sharded, data), local="[2,80]")
check("fixed weight gradient", grad, (C.data, S), (data, S_sharded), local="[2,80]")
""",
    "dense": """
Wd = jnp.asarray(rng.standard_normal((n, 80)).astype(np.float32))
fwd = lambda s, w: s @ evjax.Dense(w)
grad = jax.grad(lambda w, s: jnp.sum((s @ evjax.Dense(w)) ** 2))
check("dense forward", fwd, (S, Wd), (S_sharded, jax.device_put(Wd, replicated)), local="[2,80]")
check("dense weight gradient", grad, (Wd, S), (jax.device_put(Wd, replicated), S_sharded), local="[96,80]")
# model parallel: the weights split by output neuron, the spikes replicated; no gather of W
W_out = jax.device_put(Wd, NamedSharding(mesh, P(None, "data")))
check("dense forward, outputs split", fwd, (S, Wd), (jax.device_put(S, replicated), W_out), local="[8,20]")
check("dense gradient, outputs split", grad, (Wd, S), (W_out, jax.device_put(S, replicated)), local="[96,20]")
""",
    "jitc": """
loc = jnp.float32(0.05)
fwd = lambda s, loc: s @ evjax.JITCNormalR(loc, 0.1, prob=0.1, seed=7, shape=(n, 80))
grad = jax.grad(lambda loc, s: jnp.sum(fwd(s, loc) ** 2))
check("jitc forward", fwd, (S, loc), (S_sharded, jax.device_put(loc, replicated)), local="[80,2]")
check("jitc parameter gradient", grad, (loc, S), (jax.device_put(loc, replicated), S_sharded), local="[80,2]")
""",
    "sparse_backward": """
Wsb = evjax.CSR.fromdense(((rng.random((n, 80)) < 0.2) * rng.standard_normal((n, 80))).astype(np.float32))
Dsb = jnp.asarray(rng.standard_normal((n, 80)).astype(np.float32))
Sf = jnp.asarray(rng.random((K, n)) < 0.3, jnp.float32)
Sf_sharded = jax.device_put(Sf, batch)
for label, make in (("csr", lambda d: Wsb.with_data(d)), ("dense", lambda d: d)):
    d0 = Wsb.data if label == "csr" else Dsb
    # both cotangents: the weights' (the grouped SDDMM / outer product, summed over the trials) and the
    # spikes' (W @ y_bar over the nonzero entries, per trial)
    grad = jax.grad(lambda d, s: jnp.sum(jnp.tanh(evjax.sparse_backward_matmul(s, make(d))) ** 2), argnums=(0, 1))
    check(f"sparse backward {label} gradients", grad, (d0, Sf), (jax.device_put(d0, replicated), Sf_sharded),
          local="[2,96]")
""",
}


@pytest.mark.slow
def test_plain_jit_partitions_every_family_over_the_batch():
    out = run_on_four_cpu_devices(COMMON + "".join(FAMILIES.values()))
    for name in ("csr forward", "csr weight gradient", "fixed forward", "dense forward, outputs split",
                 "jitc parameter gradient", "sparse backward csr gradients", "sparse backward dense gradients"):
        assert f"OK {name}" in out, out


def test_partition_rule_is_idle_on_one_device():
    # one device: the op lowers as it is, bit for bit (custom_partitioning is not in the HLO)
    code = COMMON + """
W = evjax.CSR.fromdense(((rng.random((n, 80)) < 0.2) * rng.standard_normal((n, 80))).astype(np.float32))
fwd = jax.jit(lambda s, d: s @ W.with_data(d))
one = jax.devices()[0]
hlo = fwd.lower(jax.device_put(S, one), jax.device_put(W.data, one)).compile().as_text()
assert "CustomSPMDPartitioning" not in hlo and "evjax_" in hlo
print("OK idle")
"""
    assert "OK idle" in run_on_four_cpu_devices(code)


TRAINING_STEP = EXAMPLE_TRAINING_STEP + """
mesh = jax.make_mesh((4,), ("data",), axis_types=(AxisType.Auto,))
split, rep = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
sharded = (jax.device_put(params, rep), jax.device_put(state, rep), jax.device_put(x, split),
           jax.device_put(y, split))
hlo = jax.jit(step).lower(*sharded).compile().as_text()
assert "all-gather" not in hlo, [l for l in hlo.splitlines() if "all-gather" in l][:3]
assert "all-reduce" in hlo  # the gradients of the replicated weights
calls = [l.split("custom-call(")[0] for l in hlo.splitlines() if 'custom_call_target="evjax_' in l]
assert calls and not any(",16]" in c or "[16," in c for c in calls), calls   # no kernel sees the 16 trials
assert any("[4,96]" in c or "[96,4]" in c for c in calls), calls   # 4 trials per device
p1, s1, v1, g1 = jax.jit(step)(params, state, x, y)
p4, s4, v4, g4 = jax.jit(step)(*sharded)
np.testing.assert_allclose(float(v4), float(v1), rtol=1e-5)
for name in params:
    np.testing.assert_allclose(p4[name], p1[name], rtol=1e-5, atol=1e-6)
print("OK training step")
"""


SHARDED_CSR = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import AxisType, PartitionSpec as P
import evjax

mesh = jax.make_mesh((4,), ("model",), axis_types=(AxisType.Auto,))
rng = np.random.default_rng(1)
for density, homogeneous in ((0.1, False), (0.02, False), (0.1, True)):
    dense = (rng.random((120, 64)) < density) * (1.0 if homogeneous else rng.standard_normal((120, 64)))
    W = evjax.CSR.fromdense(dense.astype(np.float32))
    if homogeneous:
        W = W.with_data(jnp.full((1,), 0.5, jnp.float32))
    Ws = evjax.ShardedCSR.from_csr(W, mesh, "model")
    assert Ws.data.shape[0] == 4 and Ws.indptr.shape == (4, 121)
    spikes = jnp.asarray(rng.random(120) < 0.3)
    values = jnp.asarray(rng.standard_normal(120).astype(np.float32))
    fwd = jax.jit(lambda s, M: s @ M)
    for x in (spikes, values):
        y = fwd(x, Ws)
        assert y.shape == (64,) and y.sharding.spec == P("model"), y.sharding
        np.testing.assert_array_equal(np.asarray(y), np.asarray(fwd(x, W)))  # the same bits as the whole CSR
    hlo = fwd.lower(spikes, Ws).compile().as_text()
    assert "all-gather" not in hlo and "all-reduce" not in hlo, hlo[:3000]
    # gradients w.r.t. the block weights: the whole CSR's, block by block; batches by vmap
    loss = lambda d, M, s: jnp.sum(jnp.sin(jax.vmap(lambda t: t @ M.with_data(d))(s)))
    batch = jnp.asarray(rng.random((5, 120)) < 0.3)
    g_blocks = jax.jit(jax.grad(loss))(Ws.data, Ws, batch)
    g_whole = jax.jit(jax.grad(loss))(W.data, W, batch)
    if homogeneous:
        np.testing.assert_allclose(float(g_blocks.sum()), float(g_whole[0]), rtol=1e-5)
    else:
        cols = np.asarray(W.indices)
        for b in range(4):
            keep = (cols >= 16 * b) & (cols < 16 * (b + 1))
            n_b = int(keep.sum())
            np.testing.assert_allclose(np.asarray(g_blocks[b, :n_b]), np.asarray(g_whole)[keep], rtol=1e-5,
                                       atol=1e-6)
try:
    evjax.ShardedCSR.from_csr(evjax.CSR.fromdense(np.eye(6, 6, dtype=np.float32)), mesh, "model")
except ValueError as e:
    assert "n_cols = 6" in str(e), e
else:
    raise AssertionError("6 columns over 4 devices must raise")
print("OK sharded csr")
"""


JITC_OUTPUT_SLICES = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import evjax

mesh = jax.make_mesh((4,), ("model",), axis_types=(AxisType.Auto,))
rng = np.random.default_rng(0)
n = 96
laws = {"normal": lambda c: evjax.JITCNormalR(0.05, 0.1, prob=0.1, seed=7, shape=(n, 80), corder=c),
        "uniform": lambda c: evjax.JITCUniformR(-0.1, 0.2, prob=0.1, seed=7, shape=(n, 80), corder=c),
        "scalar": lambda c: evjax.JITCScalarR(0.3, prob=0.1, seed=7, shape=(n, 80), corder=c)}
spikes = jnp.asarray(rng.random(n) < 0.3)
batch = jnp.asarray(rng.random((80, 8)) < 0.3, jnp.float32)   # M @ batch: (96, 8), the outputs split
for backend in ("numba", "warp", "reference"):
    for law, make in laws.items():
        for corder in (False, True):
            M = make(corder)
            with evjax.use_backend(backend):
                split = jax.jit(lambda s, M: s @ M, out_shardings=NamedSharding(mesh, P("model")))
                whole = jax.jit(lambda s, M: s @ M)
                y = split(spikes, M)
                np.testing.assert_array_equal(np.asarray(y), np.asarray(whole(spikes, M)))  # the same bits
                hlo = split.lower(spikes, M).compile().as_text()
                calls = [l for l in hlo.splitlines() if 'custom_call_target="evjax_' in l]
                assert "all-gather" not in hlo, (backend, law, corder)
                if backend != "reference":  # (the reference is XLA's own ops: no custom call)
                    # the class's corder=False generates each output's synapses (the op's gather): a device
                    # generates only its 20 outputs' streams; corder=True scatters the active inputs'
                    # streams into every output, kept whole
                    assert calls and ("[20]" in calls[0]) == (not corder), (backend, law, corder, calls[:1])
                mm = jax.jit(lambda x, M: M @ x, out_shardings=NamedSharding(mesh, P("model", None)))
                np.testing.assert_array_equal(np.asarray(mm(batch, make(corder))),
                                              np.asarray(jax.jit(lambda x, M: M @ x)(batch, make(corder))))
print("OK jitc slices")
"""


SCENARIOS = {
    # the main example's whole training step under plain jit, the batch split over 4 devices: the event
    # ops run on 4 trials each, the only collectives are the gradients' all-reduces
    "training step": TRAINING_STEP,
    # model parallelism: each device holds the synapses onto its quarter of the neurons and computes that
    # quarter of spikes @ W, bit for bit the whole CSR's; no collective moves the matrix
    "sharded csr": SHARDED_CSR,
    # model parallelism for JITC: a device computing a slice of the outputs generates only their streams,
    # keyed by their global index, so the result has the whole matrix's bits on every backend
    "jitc slices": JITC_OUTPUT_SLICES,
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_four_device_scenario(name):
    assert f"OK {name}" in run_on_four_cpu_devices(SCENARIOS[name])

"""evjax ops on several (virtual CPU) devices: shard_map data parallelism, plain jit.

Each test runs in a subprocess started with
``XLA_FLAGS=--xla_force_host_platform_device_count=4`` (the flag must be set
before JAX initialises).
"""
from __future__ import annotations

from tests.helpers import EXAMPLE_TRAINING_STEP, run_on_four_cpu_devices

SHARD_MAP_TRAINING = EXAMPLE_TRAINING_STEP + """
mesh = jax.make_mesh((4,), ("data",), axis_types=(AxisType.Auto,))

def sharded_step(params, state, x, y):
    # the loss of the whole batch: mean over devices of this device's (4 trials) loss; the gradient
    # w.r.t. the replicated params is summed over devices by shard_map's pvary/psum, so it is exact
    global_loss = lambda p: jax.lax.pmean(loss(p, x, y)[0], "data")
    value, grads = jax.value_and_grad(global_loss)(params)
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state, value, grads

dp_step = jax.jit(jax.shard_map(sharded_step, mesh=mesh, in_specs=(P(), P(), P("data"), P("data")),
                                out_specs=(P(), P(), P(), P())))
p1, s1, v1, g1 = jax.jit(step)(params, state, x, y)
p4, s4, v4, g4 = dp_step(params, state, x, y)

# the sharded step really ran the event ops on per-device shards of 4 trials each: no evjax call has
# the whole batch (16) in its result, some have a device's 4 (every call, not picked by kernel name: a
# batch gather's serial tier is the vector gather's, named without "_mm")
hlo = dp_step.lower(params, state, x, y).compile().as_text()
calls = [l for l in hlo.splitlines() if "custom_call_target=\\"evjax_numba_" in l]
assert calls and not any(",16]" in l.split("custom-call(")[0] for l in calls), calls[:3]
assert any(",4]" in l.split("custom-call(")[0] for l in calls), calls[:3]

np.testing.assert_allclose(v4, v1, rtol=1e-5)
for name in params:
    assert float(jnp.abs(g1[name]).max()) > 0, name
    np.testing.assert_allclose(g4[name], g1[name], rtol=2e-4, atol=1e-6 * float(jnp.abs(g1[name]).max()))
    np.testing.assert_allclose(p4[name], p1[name], rtol=1e-5, atol=1e-6)
print("OK loss", float(v1), float(v4))
"""


def test_shard_map_data_parallel_step_matches_one_device():
    out = run_on_four_cpu_devices(SHARD_MAP_TRAINING)
    assert "OK loss" in out


REPLICATED_OPERAND_GRAD = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import AxisType, PartitionSpec as P
import evjax

# A replicated operand (decay) meets per-device data inside shard_map: its gradient must be
# summed over devices (evjax ops track varying mesh axes like JAX primitives), not silently local.
mesh = jax.make_mesh((4,), ("data",), axis_types=(AxisType.Auto,))
rng = np.random.default_rng(0)
trace = jnp.asarray(rng.random((8, 32)), jnp.float32)
spikes = jnp.asarray(rng.random((8, 32)) < 0.3)
decay = jnp.asarray(rng.uniform(0.5, 0.9, 32), jnp.float32)

def loss(decay, trace, spikes):
    out = jax.vmap(lambda t, s: evjax.lif_step(evjax.exp_trace(t, s, decay), t, tau=5.0, v_th=0.8)[0])(trace, spikes)
    return jnp.mean(out ** 2)

def local(decay, trace, spikes):
    return jax.value_and_grad(lambda d: jax.lax.pmean(loss(d, trace, spikes), "data"))(decay)

v4, g4 = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=(P(), P())))(
    decay, trace, spikes)
v1, g1 = jax.value_and_grad(loss)(decay, trace, spikes)
np.testing.assert_allclose(v4, v1, rtol=1e-6)
assert float(jnp.abs(g1).max()) > 0
np.testing.assert_allclose(g4, g1, rtol=1e-5, atol=1e-7)
print("OK replicated-operand gradient")
"""


def test_gradient_of_replicated_operand_under_shard_map():
    assert "OK replicated-operand gradient" in run_on_four_cpu_devices(REPLICATED_OPERAND_GRAD)


def test_sharding_docs_run_on_four_devices():
    out = run_on_four_cpu_devices("""
        import doc_runner
        ns = doc_runner.run_markdown("docs/distributed.md")
        print("OK docs", ns["n_devices"])
    """)
    assert "OK docs 4" in out

"""The README's main path under the defaults a user gets, not the test suite's.

tests/conftest.py compiles every XLA program of the suite at optimisation level 0 (and saves the
XLA_FLAGS it found in EVJAX_USER_XLA_FLAGS).  Here one fresh process runs with that original
XLA_FLAGS (or none), JAX_ENABLE_X64 unset and no backend named: ``BinaryArray @ CSR`` forward,
``jax.grad`` with respect to the weights and ``jax.vmap`` over a batch of spike vectors, each
under ``jax.jit``, then a ``lif_step`` and ``spike`` update, each against dense NumPy computed in
that process.  Tiny shapes: with cold kernel caches the time is the kernels' first compiles.
"""
from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers import HANG_GUARD_S, ROOT

SCRIPT = r'''
import jax
import jax.numpy as jnp
import numpy as np

import evjax

assert not jax.config.jax_enable_x64
rng = np.random.default_rng(0)
n_pre, n_post, batch = 12, 7, 3
dense = rng.standard_normal((n_pre, n_post)).astype(np.float32)
dense[rng.random((n_pre, n_post)) > 0.4] = 0.0
dense[2] = 0.0  # a neuron without synapses
W = evjax.CSR.fromdense(dense)
spikes = rng.random(n_pre) < 0.5
spikes[0], spikes[1] = True, False
ref = dense.astype(np.float64)

# forward: spikes @ W, event-driven
forward = jax.jit(lambda W, s: evjax.BinaryArray(s) @ W)
current = forward(W, spikes)
assert current.shape == (n_post,) and current.dtype == jnp.float32
np.testing.assert_allclose(current, spikes @ ref, rtol=1e-5, atol=1e-5)

# the gradient w.r.t. the weights: ct[j] on the synapses of active rows, 0 elsewhere
ct = rng.standard_normal(n_post).astype(np.float32)
loss = lambda data, s: jnp.vdot(ct, evjax.BinaryArray(s) @ W.with_data(data))
g = jax.jit(jax.grad(loss))(W.data, spikes)
rows = np.repeat(np.arange(n_pre), np.diff(np.asarray(W.indptr)))
np.testing.assert_allclose(g, np.where(spikes[rows], ct[np.asarray(W.indices)], 0.0), rtol=1e-5, atol=1e-6)

# vmap over a batch of spike vectors
S = rng.random((batch, n_pre)) < 0.5
currents = jax.jit(jax.vmap(lambda s: evjax.BinaryArray(s) @ W))(S)
assert currents.shape == (batch, n_post)
np.testing.assert_allclose(currents, S @ ref, rtol=1e-5, atol=1e-5)

# neurons: one LIF step driven by the current, then spikes of the new potentials
v = rng.uniform(0.0, 0.9, n_post).astype(np.float32)
step = jax.jit(lambda v, s: evjax.lif_step(v, evjax.BinaryArray(s) @ W, tau=10.0, v_th=1.0, v_reset=0.0, dt=1.0))
v_new, fired = step(v, spikes)
u = v - (1.0 / 10.0) * v + 1.0 * (spikes @ ref)  # u = v - (dt / tau) (v - v_rest) + dt i
assert np.abs(u - 1.0).min() > 1e-3, "a potential at the threshold: pick another seed"
np.testing.assert_array_equal(fired, (u >= 1.0).astype(np.float32))
np.testing.assert_allclose(v_new, np.where(u >= 1.0, 0.0, u), rtol=1e-5, atol=1e-5)
x = np.asarray(v_new) - 0.5
np.testing.assert_array_equal(jax.jit(evjax.spike)(x), (x >= 0).astype(np.float32))
# the default surrogate (fast_sigmoid, alpha 10): 1 / (1 + alpha |x|)**2
np.testing.assert_allclose(jax.grad(lambda x: evjax.spike(x).sum())(x), 1.0 / (1.0 + 10.0 * np.abs(x)) ** 2,
                           rtol=1e-5, atol=1e-6)
print("OK", jax.default_backend())
'''


def user_environment() -> dict:
    """This process's environment without what the test suite set: XLA_FLAGS back to the value
    tests/conftest.py found (removed if there was none), JAX_ENABLE_X64 unset."""
    assert "EVJAX_USER_XLA_FLAGS" in os.environ, "tests/conftest.py saves XLA_FLAGS there"
    user_flags = os.environ["EVJAX_USER_XLA_FLAGS"]
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_ENABLE_X64", "EVJAX_USER_XLA_FLAGS")}
    if user_flags:
        env["XLA_FLAGS"] = user_flags
    return env


def test_readme_path_under_user_defaults():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=user_environment(), capture_output=True,
                          text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, f"STDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr[-6000:]}"
    assert proc.stdout.startswith("OK"), proc.stdout

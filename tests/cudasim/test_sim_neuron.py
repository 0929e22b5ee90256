"""The Numba CUDA kernels of the neuron ops (evjax.primitives.neuron.numba_cuda) in
Numba's CUDA simulator: each op's "numba_cuda" GPU kernel, run under jax.jit on
the CPU, against the op's pure-JAX reference."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from evjax.backends import numba_cuda as bridge
from evjax.primitives import neuron

assert bridge.simulator_enabled(), "run with NUMBA_ENABLE_CUDASIM=1"


def _cases(dtype):
    rng = np.random.default_rng(0)
    v = rng.uniform(-0.5, 1.5, (2, 5)).astype(dtype)
    i = rng.uniform(-0.5, 1.5, (2, 5)).astype(dtype)
    lif = dict(tau=5.0, dt=1.0, v_th=1.0, v_reset=-0.1, v_rest=0.2, surrogate="arctan", alpha=2.0,
               detach_reset=False)
    return [
        ("spike", (v,), dict(surrogate="fast_sigmoid", alpha=10.0), 1),
        ("lif_step", (v, i), lif, 2),
        ("exp_trace", (v, (i > 0.5).astype(dtype), np.asarray(0.75, dtype)), {}, 1),
        ("exp_trace", (v, i, rng.uniform(0, 1, (2, 5)).astype(dtype)), {}, 1),
        ("detect_spikes", (v, np.asarray(0.5, dtype), np.asarray(-0.3, dtype)),
         dict(surrogate="sigmoid", alpha=4.0, detach_reset=True), 2),
        ("detect_spikes", (v, rng.uniform(0, 1, (2, 5)).astype(dtype), np.asarray(-0.3, dtype)),
         dict(surrogate="sigmoid", alpha=4.0, detach_reset=True), 2),
    ]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numba_cuda_kernels_match_reference(dtype):
    with jax.enable_x64(dtype == np.float64):
        for name, args, params, n_out in _cases(dtype):
            op = neuron.OPS[name][0]
            assert "numba_cuda" in op.backends("gpu")
            outs = tuple(jax.ShapeDtypeStruct(args[0].shape, dtype) for _ in range(n_out))
            want = op(*args, outs=outs, backend="reference", **params)
            avals = [jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype) for a in args]
            kernel = op.kernel_for("gpu", "numba_cuda", avals, outs, params)
            got = jax.jit(kernel)(*args)
            for g, w in zip(got, want):
                assert g.dtype == dtype and g.shape == w.shape
                np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, err_msg=name)

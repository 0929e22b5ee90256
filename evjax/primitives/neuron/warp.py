"""Warp backend of the neuron ops (spike, lif_step, exp_trace, detect_spikes), CPU and GPU.

One thread per element of the flattened arrays; the argument order is that of
:func:`evjax.primitives.neuron.ops.make_generator` (inputs, ``strides``,
static float params, outputs).  Imported by the ops the first time they run
with ``backend="warp"``, which is never their default.  The four kernels of a
float dtype are built together, in one Warp module, so a dtype compiles once.
"""
# No `from __future__ import annotations`: Warp reads the kernels' annotations as objects.

import functools
import threading
from types import SimpleNamespace

from ...backends import warp as bridge
from ...warp_kernel import jaxtype_to_warptype, warp_kernel
from . import ops

__all__ = ["KERNELS", "neuron_kernels"]

wp = bridge.import_warp()
_lock = threading.Lock()


def _spike(t):
    @wp.kernel(**t.opts)
    def spike(x: t.V, strides: t.S, out: t.V):
        k = wp.tid()
        if x[k] >= t.F(0.0):
            out[k] = t.F(1.0)
        else:
            out[k] = t.F(0.0)

    return spike


def _lif_step(t):
    @wp.kernel(**t.opts)
    def lif_step(v: t.V, i_ext: t.V, strides: t.S, p: t.V, v_out: t.V, s_out: t.V):
        # p = (dt / tau, dt, v_rest, v_th, v_reset)
        k = wp.tid()
        u = v[k] - p[0] * (v[k] - p[2]) + p[1] * i_ext[k]
        if u >= p[3]:
            v_out[k] = p[4]
            s_out[k] = t.F(1.0)
        else:
            v_out[k] = u
            s_out[k] = t.F(0.0)

    return lif_step


def _exp_trace(t):
    @wp.kernel(**t.opts)
    def exp_trace(trace: t.V, spikes: t.V, decay: t.V, strides: t.S, out: t.V):
        k = wp.tid()
        out[k] = trace[k] * decay[k * int(strides[2])] + spikes[k]

    return exp_trace


def _detect_spikes(t):
    @wp.kernel(**t.opts)
    def detect_spikes(v: t.V, v_th: t.V, v_rest: t.V, strides: t.S, s_out: t.V, v_out: t.V):
        k = wp.tid()
        if v[k] >= v_th[k * int(strides[1])]:
            s_out[k] = t.F(1.0)
            v_out[k] = v_rest[k * int(strides[2])]
        else:
            s_out[k] = t.F(0.0)
            v_out[k] = v[k]

    return detect_spikes


# op name -> kernel factory (of the dtype's Warp types)
KERNELS = {"spike": _spike, "lif_step": _lif_step, "exp_trace": _exp_trace, "detect_spikes": _detect_spikes}


@functools.lru_cache(maxsize=None)
def neuron_kernels(dtype: str) -> dict:
    """The four Warp kernels for one float dtype (``"float32"`` or ``"float64"``), in one module."""
    F = jaxtype_to_warptype(dtype)
    types = SimpleNamespace(
        F=F, V=wp.array(dtype=F, ndim=1), S=wp.array(dtype=wp.int32, ndim=1),
        opts=dict(enable_backward=False, module=wp.get_module(f"evjax_neuron_{dtype}")),
    )
    return {name: factory(types) for name, factory in KERNELS.items()}


def _make_call(name: str):
    def make_call(size, flat_outs, dtype):
        with _lock:
            kernel = neuron_kernels(str(dtype))[name]
        return warp_kernel(kernel, flat_outs, launch_dims=size)

    return make_call


for _name, (_op, _reference, _kernel_params) in ops.OPS.items():
    _op.def_warp_kernel(ops.make_generator(_make_call(_name), _reference, _kernel_params))

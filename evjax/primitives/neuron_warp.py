"""Warp kernels for the neuron ops (spike, lif_step, exp_trace, detect_spikes).

One thread per element of the flattened arrays; the argument order is that of
:func:`evjax.primitives.neuron.make_generator` (inputs, ``strides``, static
float params, outputs).  :func:`register` adds them as the ``"warp"`` backend
(cpu and gpu) without making it a default: select it with ``backend="warp"``
or :func:`evjax.use_backend`.  Warp is imported when a kernel is first built.
"""
# No `from __future__ import annotations`: Warp reads the kernels' annotations as objects.

import functools
import threading

__all__ = ["neuron_kernels", "register"]

_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def neuron_kernels(dtype: str) -> dict:
    """The four Warp kernels for one float dtype (``"float32"`` or ``"float64"``), in one module."""
    import warp as wp

    from ..warp_kernel import jaxtype_to_warptype

    F = jaxtype_to_warptype(dtype)
    module = wp.get_module(f"evjax_neuron_{dtype}")
    opts = dict(enable_backward=False, module=module)
    V = wp.array(dtype=F, ndim=1)
    S = wp.array(dtype=wp.int32, ndim=1)

    @wp.kernel(**opts)
    def spike(x: V, strides: S, out: V):
        k = wp.tid()
        if x[k] >= F(0.0):
            out[k] = F(1.0)
        else:
            out[k] = F(0.0)

    @wp.kernel(**opts)
    def lif_step(v: V, i_ext: V, strides: S, p: V, v_out: V, s_out: V):
        # p = (dt / tau, dt, v_rest, v_th, v_reset)
        k = wp.tid()
        u = v[k] - p[0] * (v[k] - p[2]) + p[1] * i_ext[k]
        if u >= p[3]:
            v_out[k] = p[4]
            s_out[k] = F(1.0)
        else:
            v_out[k] = u
            s_out[k] = F(0.0)

    @wp.kernel(**opts)
    def exp_trace(trace: V, spikes: V, decay: V, strides: S, out: V):
        k = wp.tid()
        out[k] = trace[k] * decay[k * int(strides[2])] + spikes[k]

    @wp.kernel(**opts)
    def detect_spikes(v: V, v_th: V, v_rest: V, strides: S, s_out: V, v_out: V):
        k = wp.tid()
        if v[k] >= v_th[k * int(strides[1])]:
            s_out[k] = F(1.0)
            v_out[k] = v_rest[k * int(strides[2])]
        else:
            s_out[k] = F(0.0)
            v_out[k] = v[k]

    return {"spike": spike, "lif_step": lif_step, "exp_trace": exp_trace, "detect_spikes": detect_spikes}


def _make_call(name: str):
    def make_call(size, flat_outs, dtype):
        from ..warp_kernel import warp_kernel

        with _lock:
            kernel = neuron_kernels(str(dtype))[name]
        return warp_kernel(kernel, flat_outs, launch_dims=size)

    return make_call


def register() -> None:
    """Add the Warp generators to the neuron ops as backend ``"warp"`` (never the default)."""
    from . import neuron

    for name, (op, reference, kernel_params) in neuron.OPS.items():
        generator = neuron.make_generator(_make_call(name), reference, kernel_params)
        generator.__name__ = f"{name}_warp"
        op.def_warp_kernel(generator, default=False)

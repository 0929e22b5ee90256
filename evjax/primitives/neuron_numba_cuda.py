"""Numba CUDA kernels for the neuron ops (spike, lif_step, exp_trace, detect_spikes).

One thread per element of the flattened arrays; the argument order is that of
:func:`evjax.primitives.neuron.make_generator` (inputs, ``strides``, static
float params, outputs).  :func:`register` adds them as the ``"numba_cuda"`` GPU
backend without making it the GPU default (there the fused pure-JAX reference
stays the default): select it with ``backend="numba_cuda"``.  ``numba.cuda`` is
imported when a kernel is first built, never at import.
"""
from __future__ import annotations

import functools

__all__ = ["neuron_cuda_kernels", "register"]

# ``numba.cuda``, bound on first use; a module global (not a local import)
# because Numba's CUDA simulator swaps the kernels' global ``cuda``.
cuda = None


def _cuda():
    global cuda
    if cuda is None:
        from numba import cuda as module

        cuda = module
    return cuda


@functools.lru_cache(maxsize=None)
def neuron_cuda_kernels() -> dict:
    """The four ``@cuda.jit`` kernels (dtype-generic: Numba specialises them per signature)."""
    _cuda()

    @cuda.jit
    def spike(x, strides, out):
        k = cuda.grid(1)
        if k < out.size:
            out[k] = 1.0 if x[k] >= 0 else 0.0

    @cuda.jit
    def lif_step(v, i_ext, strides, p, v_out, s_out):
        # p = (dt / tau, dt, v_rest, v_th, v_reset)
        k = cuda.grid(1)
        if k < v.size:
            u = v[k] - p[0] * (v[k] - p[2]) + p[1] * i_ext[k]
            if u >= p[3]:
                v_out[k] = p[4]
                s_out[k] = 1.0
            else:
                v_out[k] = u
                s_out[k] = 0.0

    @cuda.jit
    def exp_trace(trace, spikes, decay, strides, out):
        k = cuda.grid(1)
        if k < out.size:
            out[k] = trace[k] * decay[k * strides[2]] + spikes[k]

    @cuda.jit
    def detect_spikes(v, v_th, v_rest, strides, s_out, v_out):
        k = cuda.grid(1)
        if k < v.size:
            if v[k] >= v_th[k * strides[1]]:
                s_out[k] = 1.0
                v_out[k] = v_rest[k * strides[2]]
            else:
                s_out[k] = 0.0
                v_out[k] = v[k]

    return {"spike": spike, "lif_step": lif_step, "exp_trace": exp_trace, "detect_spikes": detect_spikes}


def _make_call(name: str):
    def make_call(size, flat_outs, dtype):
        from ..numba_cuda_kernel import numba_cuda_kernel

        return numba_cuda_kernel(neuron_cuda_kernels()[name], flat_outs, launch_dims=size)

    return make_call


def register() -> None:
    """Add the generators to the neuron ops as GPU backend ``"numba_cuda"`` (never the default)."""
    from . import neuron

    for name, (op, reference, kernel_params) in neuron.OPS.items():
        generator = neuron.make_generator(_make_call(name), reference, kernel_params)
        generator.__name__ = f"{name}_numba_cuda"
        op.def_numba_cuda_kernel(generator, default=False)

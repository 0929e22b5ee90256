"""Numba CUDA backend of the neuron ops (spike, lif_step, exp_trace, detect_spikes).

One thread per element of the flattened arrays; the argument order is that of
:func:`evjax.primitives.neuron.ops.make_generator` (inputs, ``strides``,
static float params, outputs).  Imported by the ops the first time they run
with ``backend="numba_cuda"``, which is never their default (the fused
pure-JAX reference is the GPU default).  The kernels are dtype-generic: Numba
specialises them per signature.
"""
from __future__ import annotations

from numba import cuda

from ...numba_cuda_kernel import numba_cuda_kernel
from . import ops

__all__ = ["KERNELS"]


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


# op name -> kernel
KERNELS = {"spike": spike, "lif_step": lif_step, "exp_trace": exp_trace, "detect_spikes": detect_spikes}


def _make_call(name: str):
    def make_call(size, flat_outs, dtype):
        return numba_cuda_kernel(KERNELS[name], flat_outs, launch_dims=size)

    return make_call


for _name, (_op, _reference, _kernel_params) in ops.OPS.items():
    _op.def_numba_cuda_kernel(ops.make_generator(_make_call(_name), _reference, _kernel_params))

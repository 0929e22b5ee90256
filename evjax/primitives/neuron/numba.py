"""Numba CPU backend of the neuron ops: one serial and one ``prange`` kernel per op.

Imported by the ops the first time they lower with ``backend="numba"``; it
registers its generators on them.  The kernels take the flattened arrays in
the order of :func:`evjax.primitives.neuron.ops.make_generator`; arrays of at
least ``PARALLEL_MIN_SIZE`` elements run the parallel kernel.
"""
from __future__ import annotations

import numba

from ...numba_kernel import numba_kernel
from . import ops

__all__ = ["KERNELS", "PARALLEL_MIN_SIZE"]

# Arrays at least this large run the parallel (prange) variant of a kernel.
PARALLEL_MIN_SIZE = 1 << 16


@numba.njit(cache=True, nogil=True)
def _spike_serial(x, strides, out):
    for k in range(out.size):
        out[k] = 1.0 if x[k] >= 0 else 0.0


@numba.njit(parallel=True, cache=True, nogil=True)
def _spike_parallel(x, strides, out):
    for k in numba.prange(out.size):
        out[k] = 1.0 if x[k] >= 0 else 0.0


@numba.njit(cache=True, nogil=True)
def _lif_serial(v, i_ext, strides, p, v_out, s_out):
    k_leak, dt, v_rest, v_th, v_reset = p[0], p[1], p[2], p[3], p[4]
    for k in range(v.size):
        u = v[k] - k_leak * (v[k] - v_rest) + dt * i_ext[k]
        if u >= v_th:
            v_out[k], s_out[k] = v_reset, 1.0
        else:
            v_out[k], s_out[k] = u, 0.0


@numba.njit(parallel=True, cache=True, nogil=True)
def _lif_parallel(v, i_ext, strides, p, v_out, s_out):
    k_leak, dt, v_rest, v_th, v_reset = p[0], p[1], p[2], p[3], p[4]
    for k in numba.prange(v.size):
        u = v[k] - k_leak * (v[k] - v_rest) + dt * i_ext[k]
        if u >= v_th:
            v_out[k], s_out[k] = v_reset, 1.0
        else:
            v_out[k], s_out[k] = u, 0.0


@numba.njit(cache=True, nogil=True)
def _trace_serial(trace, spikes, decay, strides, out):
    sd = strides[2]
    for k in range(out.size):
        out[k] = trace[k] * decay[k * sd] + spikes[k]


@numba.njit(parallel=True, cache=True, nogil=True)
def _trace_parallel(trace, spikes, decay, strides, out):
    sd = strides[2]
    for k in numba.prange(out.size):
        out[k] = trace[k] * decay[k * sd] + spikes[k]


@numba.njit(cache=True, nogil=True)
def _detect_serial(v, v_th, v_rest, strides, s_out, v_out):
    st, sr = strides[1], strides[2]
    for k in range(v.size):
        if v[k] >= v_th[k * st]:
            s_out[k], v_out[k] = 1.0, v_rest[k * sr]
        else:
            s_out[k], v_out[k] = 0.0, v[k]


@numba.njit(parallel=True, cache=True, nogil=True)
def _detect_parallel(v, v_th, v_rest, strides, s_out, v_out):
    st, sr = strides[1], strides[2]
    for k in numba.prange(v.size):
        if v[k] >= v_th[k * st]:
            s_out[k], v_out[k] = 1.0, v_rest[k * sr]
        else:
            s_out[k], v_out[k] = 0.0, v[k]



# op name -> (serial kernel, parallel kernel)
KERNELS = {
    "spike": (_spike_serial, _spike_parallel),
    "lif_step": (_lif_serial, _lif_parallel),
    "exp_trace": (_trace_serial, _trace_parallel),
    "detect_spikes": (_detect_serial, _detect_parallel),
}


def _make_call(name: str):
    serial, parallel = KERNELS[name]

    def make_call(size, flat_outs, dtype):
        return numba_kernel(parallel if size >= PARALLEL_MIN_SIZE else serial, outs=flat_outs)

    return make_call


for _name, (_op, _reference, _kernel_params) in ops.OPS.items():
    _op.def_numba_kernel(ops.make_generator(_make_call(_name), _reference, _kernel_params))

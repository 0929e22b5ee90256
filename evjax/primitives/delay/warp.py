"""Warp backend of the delay ops (backend ``"warp"``: CPU, and CUDA GPUs).

Imported (through the family's ``BACKEND_LOADERS``) the first time an op needs
this backend; it registers its generators at the bottom.  One thread per row:

* ``deliver``: an active row adds ``w_e * f`` at each of its edges' slots
  with ``wp.atomic_add`` into the in-out ring (the call starts it as a copy
  of the ring); rows that share a target add in an unspecified order on the
  GPU (float sums may differ in the last bits between runs), in row order
  on Warp's serial CPU device.
* ``gather``: each visited row writes its own edges (or its own sum) into
  the zero-filled in-out output: no atomics.

Indices, pointers and delays are int32 here: int64 structures are narrowed
(their values fit, as the shape does); int64 delays are clamped to ``[0,
L - 1]`` by XLA before narrowing (one pass over the delays), which is what the
kernel's own clamp would give.  float16/bfloat16 compute in float32.
"""
# No `from __future__ import annotations`: Warp reads the kernels' annotations as objects.

import functools
import threading

import jax.numpy as jnp
import numpy as np

from ...backends import warp as bridge
from ...warp_kernel import jaxtype_to_warptype, warp_kernel
from . import ops

__all__ = ["delay_kernels", "deliver_warp", "gather_warp"]

wp = bridge.import_warp()
_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def delay_kernels(compute_dt: str) -> dict:
    """The Warp kernels for values in ``compute_dt`` (``"float32"``/``"float64"``), in one module:
    ``"deliver"`` and ``"gather"``, one thread per row."""
    F = jaxtype_to_warptype(compute_dt)  # noqa: N806
    F1, F2 = wp.array(dtype=F, ndim=1), wp.array(dtype=F, ndim=2)  # noqa: N806
    I1 = wp.array(dtype=wp.int32, ndim=1)  # noqa: N806
    module = wp.get_module(f"evjax_delay_{compute_dt}")

    @wp.func(module=module)
    def slot(delays: I1, e: int, tm: int, n_slots: int):  # t mod L + clamp(d, 0, L - 1), wrapped once
        d = delays[0]
        if delays.shape[0] != 1:
            d = delays[e]
        if d < 0:
            d = 0
        if d > n_slots - 1:
            d = n_slots - 1
        s = tm + d
        if s >= n_slots:
            s = s - n_slots
        return s

    @wp.func(module=module)
    def span(indptr: I1, i: int, nnz: int):  # row i's edges, clamped to [0, nnz] (a malformed traced structure)
        return wp.max(indptr[i], 0), wp.min(indptr[i + 1], nnz)

    @wp.func(module=module)
    def weight(data: F1, e: int):
        w = data[0]
        if data.shape[0] != 1:
            w = data[e]
        return w

    @wp.kernel(enable_backward=False, module=module)
    def deliver(events: F1, data: F1, indices: I1, indptr: I1, delays: I1, t_mod: I1, out: F2):
        i = wp.tid()
        if i >= events.shape[0]:  # the one thread of a launch without rows
            return
        f = events[i]
        if f != F(0.0):
            n_slots = out.shape[0]
            n_post = out.shape[1]
            tm = t_mod[0]
            lo, hi = span(indptr, i, indices.shape[0])
            for e in range(lo, hi):
                j = indices[e]
                if j >= 0 and j < n_post:
                    s = slot(delays, e, tm, n_slots)
                    wp.atomic_add(out, s, j, weight(data, e) * f)

    @wp.kernel(enable_backward=False, module=module)
    def gather(g: F2, events: F1, data: F1, indices: I1, indptr: I1, delays: I1, t_mod: I1, flags: I1, out: F1):
        i = wp.tid()
        if i >= events.shape[0]:
            return
        f = events[i]
        by_event = flags[1] != 0
        if (not by_event) or f != F(0.0):
            n_slots = g.shape[0]
            n_post = g.shape[1]
            tm = t_mod[0]
            total = F(0.0)
            lo, hi = span(indptr, i, indices.shape[0])
            for e in range(lo, hi):
                j = indices[e]
                if j >= 0 and j < n_post:
                    s = slot(delays, e, tm, n_slots)
                    term = weight(data, e) * g[s, j]
                    if by_event:
                        term = f * term
                    if flags[0] != 0:
                        out[e] = term
                    else:
                        total = total + term
            if flags[0] == 0:
                out[i] = total

    return {"deliver": deliver, "gather": gather}


def _narrow(indices, indptr, delays, t, n_slots: int):
    """The structure, delays and step as the kernels take them: int32 indices, pointers and delays (delays
    other than int32 clamped first) and ``t mod L`` (``(1,)`` int32)."""
    if delays.dtype != jnp.int32:
        delays = jnp.clip(delays, 0, n_slots - 1).astype(jnp.int32)
    return indices.astype(jnp.int32), indptr.astype(jnp.int32), delays, ops.t_mod(t, n_slots, jnp.int32)


def _rows_call(name: str, dtype, n_rows: int):
    """The kernel ``name`` in ``dtype``, one thread per row (one where there is none), updating its in-out
    ``out``: ``call(*operands) -> out``."""
    with _lock:
        kernel = delay_kernels(str(np.dtype(dtype)))[name]
    launch = warp_kernel(kernel, [], launch_dims=max(n_rows, 1), in_out_argnames=["out"])
    return lambda *operands: launch(*operands)[0]  # an in-out buffer: warp_kernel returns a tuple, here of one


def deliver_warp(outs, ins, shape, weighted: bool):
    """Warp generator for ``csr_delay_deliver_p``: ``run(*operands) -> [ring]``."""
    def build(dtype):
        call = _rows_call("deliver", dtype, int(shape[0]))
        return lambda ring, values, weights, indices, indptr, delays, t: call(
            values, weights, *_narrow(indices, indptr, delays, t, ring.shape[0]), ring)

    return ops.deliver_runner(outs, weighted, build)


def gather_warp(outs, ins, shape, weighted: bool, per_edge: bool, by_event: bool):
    """Warp generator for ``csr_delay_gather_p``: ``run(*operands) -> [cotangent]``."""
    def build(dtype):
        call = _rows_call("gather", dtype, int(shape[0]))
        return lambda g, values, weights, indices, indptr, delays, t, flags: call(
            g, values, weights, *_narrow(indices, indptr, delays, t, g.shape[0]), flags,
            jnp.zeros(outs[0].shape, dtype))

    return ops.gather_runner(outs, ins, weighted, per_edge, by_event, build)


ops.csr_delay_deliver_p.def_warp_kernel(deliver_warp)
ops.csr_delay_gather_p.def_warp_kernel(gather_warp)

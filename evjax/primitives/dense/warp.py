"""Warp backend of the dense event ops (CPU and GPU).

Imported (through the family's ``BACKEND_LOADERS``) the first time its ops run with ``backend="warp"``; it
registers the generators below on ``binary_densemv_p``, ``binary_densemm_p``
and ``binary_dense_outer_p``.  A vector of events is a ``(k, 1)`` matrix.

Kernels (:data:`KERNELS`), for events ``x`` of shape ``(k, n)``:

* ``compact``: one thread per sample ``c`` lists its active events in order
  (``idx[c, :count[c]]`` and their values ``vals``): O(k) once;
* ``scatter`` (``transpose=True``, ``W (k, m)``) and ``gather``
  (``transpose=False``, ``W (m, k)``): one thread per output ``(i, c)`` sums
  ``vals[c, a] * W[idx[c, a], i]`` (resp. ``W[i, idx[c, a]]``) over the listed
  events only, in order (deterministic, no atomics); cost ``m x active``.
  Threads of neighbouring ``i`` read neighbouring weights in the scatter;
* ``outer`` / ``outer_t``: the weight gradient, one thread per entry of
  ``outer(e(x), g)`` (``(k, m)``) or of its transpose (``(m, k)``): an inactive event's entries are written 0 whatever ``g``
  holds, an active one's ``v * g`` (written once: the zeros and the active rows).

Events select (``docs/semantics.md``): binary events arrive as bool and
contribute their weight (value 1); weighted ones arrive as floats and scale it.
float16/bfloat16 compute in float32 (:func:`evjax.dtypes.compute_dtype`).  The
kernels of one (compute dtype, event kind) signature live in one Warp module.
"""
# No `from __future__ import annotations`: Warp reads the kernels' annotations as objects.

import functools
import threading
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np

from ...backends import warp as bridge
from ...dtypes import as_dtype, compute_dtype
from ...warp_kernel import jaxtype_to_warptype, warp_kernel
from . import ops

__all__ = ["dense_kernels", "KERNELS", "matmul_warp", "outer_warp"]

wp = bridge.import_warp()
_lock = threading.Lock()


def _types(compute_dt: str, weighted: bool) -> SimpleNamespace:
    F = jaxtype_to_warptype(compute_dt)  # noqa: N806
    E = F if weighted else wp.bool  # noqa: N806
    module = wp.get_module(f"evjax_dense_{compute_dt}_{'weighted' if weighted else 'binary'}")
    t = SimpleNamespace(F=F, E=E, module=module, opts=dict(enable_backward=False, module=module),
                        F1=wp.array(dtype=F, ndim=1), F2=wp.array(dtype=F, ndim=2),
                        E2=wp.array(dtype=E, ndim=2), I1=wp.array(dtype=wp.int32, ndim=1),
                        I2=wp.array(dtype=wp.int32, ndim=2))

    if weighted:
        @wp.func(module=module)
        def value(e: E):  # a graded event's value
            return e

        @wp.func(module=module)
        def active(e: E):
            return e != F(0)
    else:
        @wp.func(module=module)
        def value(e: E):  # a spike counts 1 (w * 1 is w exactly)
            return F(1)

        @wp.func(module=module)
        def active(e: E):
            return e
    t.value, t.active = value, active
    return t


def _compact(t):
    value, active = t.value, t.active

    @wp.kernel(**t.opts)
    def compact(x: t.E2, idx: t.I2, vals: t.F2, count: t.I1):
        c = wp.tid()
        n_active = int(0)
        for j in range(x.shape[0]):
            e = x[j, c]
            if active(e):
                idx[c, n_active] = j
                vals[c, n_active] = value(e)
                n_active += 1
        count[c] = n_active

    return compact


# The product and the gradient are each written once, a factory of ``transpose``: ``wp.static`` decides
# its branches when Warp generates the kernel's code, so each kernel holds its own orientation only.
def _product(t, transpose: bool):
    @wp.kernel(name="scatter" if transpose else "gather", **t.opts)
    def product(w: t.F2, idx: t.I2, vals: t.F2, count: t.I1, out: t.F2):
        i, c = wp.tid()  # out (m, n); w (k, m) (scatter) or (m, k) (gather)
        acc = t.F(0)
        for a in range(count[c]):
            if wp.static(transpose):
                acc += w[idx[c, a], i] * vals[c, a]
            else:
                acc += w[i, idx[c, a]] * vals[c, a]
        out[i, c] = acc

    return product


def _outer(t, transpose: bool):
    value, active = t.value, t.active

    @wp.kernel(name="outer" if transpose else "outer_t", **t.opts)
    def outer(x: t.E2, g: t.F2, out: t.F2):
        # out[r, s]: (j, i) of outer (k, m) = sum_c e(x[j, c]) g[i, c], or (i, j) of its transpose (outer_t,
        # written in place); selected, never multiplied by 0
        r, s = wp.tid()
        if wp.static(transpose):
            j, i = r, s
        else:
            j, i = s, r
        acc = t.F(0)
        for c in range(x.shape[1]):
            e = x[j, c]
            if active(e):
                acc += value(e) * g[i, c]
        out[r, s] = acc

    return outer


# kernel name -> factory of the signature's types; all five are built together in the signature's module
KERNELS = {"compact": _compact, "scatter": functools.partial(_product, transpose=True),
           "gather": functools.partial(_product, transpose=False), "outer": functools.partial(_outer, transpose=True),
           "outer_t": functools.partial(_outer, transpose=False)}


@functools.lru_cache(maxsize=None)
def dense_kernels(compute_dt: str, weighted: bool) -> dict:
    """The Warp kernels of one signature: ``compute_dt`` (``"float32"``/``"float64"``) and event kind."""
    t = _types(compute_dt, weighted)
    return {name: factory(t) for name, factory in KERNELS.items()}


def matmul_warp(outs, ins, transpose, weighted):
    """Warp generator for ``binary_densemv_p``/``binary_densemm_p``: ``run(weights, spikes) -> [out]``."""
    out = outs[0]
    w_in, s_in = ins
    dtype = compute_dtype(out.dtype)
    with _lock:
        kernels = dense_kernels(str(np.dtype(dtype)), bool(weighted))
    k = int(s_in.shape[0])
    n = int(s_in.shape[1]) if len(s_in.shape) == 2 else 1
    m = int(out.shape[0])
    compact = warp_kernel(kernels["compact"], [jax.ShapeDtypeStruct((n, k), jnp.int32),
                                               jax.ShapeDtypeStruct((n, k), dtype),
                                               jax.ShapeDtypeStruct((n,), jnp.int32)], launch_dims=(n,))
    product = warp_kernel(kernels["scatter" if transpose else "gather"], jax.ShapeDtypeStruct((m, n), dtype),
                          launch_dims=(m, n))

    def run(weights, spikes):
        idx, vals, count = compact(ops.kernel_events(spikes, weighted, dtype))
        y = product(as_dtype(weights, dtype), idx, vals, count)
        return [y.reshape(out.shape).astype(out.dtype)]

    return run


def outer_warp(outs, ins, transpose, weighted):
    """Warp generator for ``binary_dense_outer_p``: ``run(spikes, g) -> [outer(e(spikes), g)]``."""
    out = outs[0]
    dtype = compute_dtype(out.dtype)
    with _lock:
        kernel = dense_kernels(str(np.dtype(dtype)), bool(weighted))["outer" if transpose else "outer_t"]
    shape = tuple(int(d) for d in out.shape)  # (k, m), or (m, k) written by outer_t
    call = warp_kernel(kernel, jax.ShapeDtypeStruct(shape, dtype), launch_dims=shape)

    def run(spikes, g):
        return [call(*ops.outer_operands(spikes, g, weighted, dtype)).astype(out.dtype)]

    return run


for _op in (ops.binary_densemv_p, ops.binary_densemm_p):
    _op.def_warp_kernel(matmul_warp)
ops.binary_dense_outer_p.def_warp_kernel(outer_warp)

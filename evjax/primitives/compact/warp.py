"""Warp backend of ``active_list_p`` (CPU and GPU): one thread per row, a serial pass over it.

Imported (through the family's ``BACKEND_LOADERS``) the first time the op runs with ``backend="warp"``.
Not the GPU default (the reference is: XLA's ``nonzero`` scans in parallel there); chosen by name.
"""
# No `from __future__ import annotations`: Warp reads the kernels' annotations as objects.

import functools
import threading

import jax

from ...backends import warp as bridge
from ...warp_kernel import jaxtype_to_warptype, warp_kernel
from . import ops

__all__ = ["list_kernel", "active_list_warp"]

wp = bridge.import_warp()
_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def list_kernel(list_dt: str):
    """The row-listing kernel whose lists are of ``list_dt`` (int32 or int64), in its own Warp module."""
    L = jaxtype_to_warptype(list_dt)
    L2 = wp.array(dtype=L, ndim=2)
    module = wp.get_module(f"evjax_active_list_{list_dt}")

    @wp.kernel(enable_backward=False, module=module)
    def list_active(x: wp.array(dtype=wp.bool, ndim=2), ids: L2, count: L2):
        r = wp.tid()
        n = x.shape[1]
        m = int(0)
        for i in range(n):
            if x[r, i]:
                ids[r, m] = L(i)
                m += 1
        for i in range(m, n):
            ids[r, i] = L(0)
        count[r, 0] = L(m)

    return list_active


def active_list_warp(outs, ins):
    """Warp kernel generator for ``active_list_p``: ``run(x) -> [ids, count]``."""
    ids_out, count_out = outs
    n = ins[0].shape[-1]
    rows = int(ids_out.size // n) if n else 0
    if ids_out.size == 0:  # no entries: nothing to launch
        return lambda x: ops.empty_lists(outs)
    with _lock:
        kernel = list_kernel(str(ids_out.dtype))
    call = warp_kernel(kernel, [jax.ShapeDtypeStruct((rows, n), ids_out.dtype),
                                jax.ShapeDtypeStruct((rows, 1), count_out.dtype)], launch_dims=(rows,))

    def run(x):
        ids, count = call(x.reshape((rows, n)))
        return [ids.reshape(ids_out.shape), count.reshape(count_out.shape)]

    return run


ops.active_list_p.def_warp_kernel(active_list_warp)

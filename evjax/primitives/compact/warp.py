"""Warp backend of ``active_list_p`` (CPU and GPU): one thread per row, a serial pass over it.

Imported (through the family's ``BACKEND_LOADERS``) the first time the op runs with ``backend="warp"``.
Not the GPU default (the reference is: XLA's ``nonzero`` scans in parallel there); chosen by name.
"""
# No `from __future__ import annotations`: Warp reads the kernels' annotations as objects.

import functools
import threading

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
    def build(rows, results):
        with _lock:
            kernel = list_kernel(str(outs[0].dtype))
        return warp_kernel(kernel, results, launch_dims=(rows,))

    return ops.row_lists(outs, ins, build)


ops.active_list_p.def_warp_kernel(active_list_warp)

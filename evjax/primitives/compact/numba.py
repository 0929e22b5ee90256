"""Numba CPU backend of ``active_list_p``: one pass over each row, eight silent bytes skipped at once.

Imported (through the family's ``BACKEND_LOADERS``) the first time the op lowers with ``backend="numba"``.
"""
from __future__ import annotations

import numba
import numpy as np

from ..._kernel_compat import COMPILED_CODE_ONLY
from ...backends import numba_cpu
from ...backends.intrinsics import load_i64_unaligned
from . import ops

__all__ = ["list_active", "active_list_generator"]


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def _list_row(x, ids, count, r):
    """Row ``r``: the positions of its nonzero bytes into ``ids[r]`` (then zeros), their number into
    ``count[r, 0]``; eight bytes tested at once where all are zero."""
    row = x[r]
    out = ids[r]
    n = row.shape[0]
    base = np.int64(row.ctypes.data)
    m = 0
    i = 0
    while i < n:
        if i + 8 <= n and load_i64_unaligned(base + np.int64(i)) == 0:
            i += 8
            continue
        if row[i] != 0:
            out[m] = i
            m += 1
        i += 1
    for k in range(np.uint64(m), np.uint64(n)):  # unsigned: LLVM makes the padding a memset
        out[k] = 0
    count[r, 0] = m


@numba.njit(cache=True, nogil=True)
def list_active(x, ids, count):
    """``ids[r]`` = positions of the nonzero entries of ``x[r]`` (ascending, then 0), ``count[r, 0]`` = how
    many; ``x`` the ``(rows, n)`` bytes of bool spikes."""
    for r in range(x.shape[0]):
        _list_row(x, ids, count, r)


def active_list_generator(outs, ins):
    """Numba kernel for ``active_list_p`` (the spikes as a ``(rows, n)`` view of their bytes)."""
    def build(rows, results):
        shapes = [(r.shape, r.dtype) for r in results]
        return lambda x: numba_cpu.call_outputs(list_active, (x,), shapes, threads=False, bool_as_bytes=True)

    return ops.row_lists(outs, ins, build)


ops.active_list_p.def_numba_kernel(active_list_generator)

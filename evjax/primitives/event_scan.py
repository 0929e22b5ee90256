"""Numba helpers that scan a vector of events for its active entries, shared by the families' CPU kernels."""
from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import overload

from ..backends.intrinsics import load_i64_unaligned

__all__ = ["eight_zero"]


def eight_zero(x, i):
    """Whether ``x[i .. i + 8)`` are all zero: one 64-bit load for event bytes (uint8), eight
    compares otherwise (a NaN is nonzero)."""
    raise NotImplementedError("compiled by Numba only")


@overload(eight_zero)
def _eight_zero_overload(x, i):
    if x.dtype == types.uint8 and x.layout == "C":
        return lambda x, i: load_i64_unaligned(np.int64(x.ctypes.data) + np.int64(i)) == 0

    def compares(x, i):
        return x[i] == 0 and x[i + 1] == 0 and x[i + 2] == 0 and x[i + 3] == 0 and x[i + 4] == 0 \
            and x[i + 5] == 0 and x[i + 6] == 0 and x[i + 7] == 0
    return compares

"""Numba helpers that keep the families' CPU kernels in bounds for a malformed structure.

Under ``jit`` a structure cannot be validated (``docs/csr_backend_contract.md``,
"Malformed structures"): a kernel clamps each row's span to ``[0, nnz]`` and
skips an index outside the array it selects from.  The result of such a call is
unspecified; nothing outside the buffers is read or written.
"""
from __future__ import annotations

import numba
import numpy as np

from .._kernel_compat import COMPILED_CODE_ONLY

__all__ = ["row_span"]


@numba.njit(cache=True, nogil=True, **COMPILED_CODE_ONLY)
def row_span(indptr, i, nnz):
    """Entries ``[a, b)`` of row ``i`` of ``indptr``, unsigned, both ends clamped to ``[0, nnz]``."""
    a = min(max(np.int64(indptr[i]), np.int64(0)), np.int64(nnz))
    b = min(max(np.int64(indptr[i + 1]), np.int64(0)), np.int64(nnz))
    return np.uint64(a), np.uint64(b)

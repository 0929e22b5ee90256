"""Numba CPU backend of the fixed-width operators in :mod:`evjax.primitives.fixed.ops`.

Imported (through the family's ``BACKEND_LOADERS``) the first time its ops lower with ``backend="numba"``.  A
fixed-width table is a CSR structure with row pointers ``k * arange(n + 1)``,
so each op runs the CSR family's Numba kernel of the same op on the flattened
table (:func:`evjax.primitives.fixed.ops.as_csr_generator`): the same compiled
kernels and FFI handlers (no extra compile on a first call once CSR has run),
parallel above the CSR work thresholds, duplicates summed in per-thread
copies, events in the scatter visiting only active rows (``active x k``), the
weight gradient zero-filling silent rows, and indices outside ``[0, n_cols)``
skipped (see :mod:`evjax.primitives.csr.numba`).
"""
from __future__ import annotations

from ..csr import numba as csr_numba
from . import ops

__all__ = []

# (fixed op, the CSR generator of the same op, whether it is the SDDMM, the CSR op's own parameters)
for _op, _generator, _sddmm, _csr_params in (
        (ops.fcnmv_p, csr_numba.csrmv_generator, False, {}), (ops.fcnmm_p, csr_numba.csrmm_generator, False, {}),
        (ops.binary_fcnmv_p, csr_numba.binary_csrmv_generator, False, {"weighted": False}),
        (ops.binary_fcnmm_p, csr_numba.binary_csrmm_generator, False, {"weighted": False}),
        (ops.fcn_sddmm_p, csr_numba.sddmm_generator, True, {"weighted": None})):
    _op.def_numba_kernel(ops.as_csr_generator(_generator, sddmm=_sddmm, **_csr_params))

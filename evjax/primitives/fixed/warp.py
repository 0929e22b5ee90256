"""Warp backend of the fixed-width operators in :mod:`evjax.primitives.fixed.ops`.

Imported (through the family's ``BACKEND_LOADERS``) the first time its ops lower with ``backend="warp"``.  A
fixed-width table is a CSR structure with row pointers ``k * arange(n + 1)``,
so each op runs the CSR family's Warp kernel of the same op on the flattened
table (:func:`evjax.primitives.fixed.ops.as_csr_generator`): the same kernels,
on Warp's CPU and CUDA devices: one thread per row in the gather, per active row in
the scatter, duplicates summed by atomic adds; events in the scatter and the weight
gradient visit only active rows; indices outside ``[0, n_cols)`` skipped (see
:mod:`evjax.primitives.csr.warp` and ``docs/csr_backend_contract.md``).
"""
from __future__ import annotations

from ..csr import warp as csr_warp
from . import ops

__all__ = []

# (fixed op, the CSR generator of the same op, whether it is the SDDMM, the CSR op's own parameters)
for _op, _generator, _sddmm, _csr_params in (
        (ops.fcnmv_p, csr_warp.csrmv_warp, False, {}), (ops.fcnmm_p, csr_warp.csrmm_warp, False, {}),
        (ops.binary_fcnmv_p, csr_warp.binary_csrmv_warp, False, {"weighted": False}),
        (ops.binary_fcnmm_p, csr_warp.binary_csrmm_warp, False, {"weighted": False}),
        (ops.fcn_sddmm_p, csr_warp.csr_sddmm_warp, True, {"weighted": None})):
    _op.def_warp_kernel(ops.as_csr_generator(_generator, sddmm=_sddmm, **_csr_params))

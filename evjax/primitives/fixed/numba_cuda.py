"""Numba CUDA backend of the fixed-width operators in :mod:`evjax.primitives.fixed.ops`.

Imported (through the family's ``BACKEND_LOADERS``) the first time its ops lower with ``backend="numba_cuda"``.  A
fixed-width table is a CSR structure with row pointers ``k * arange(n + 1)``,
so each op runs the CSR family's Numba CUDA kernel of the same op on the flattened
table (:func:`evjax.primitives.fixed.ops.as_csr_generator`): the same kernels,
on the GPU: a warp per row in the gather, atomic adds in the scatter (duplicates
sum correctly), events in the scatter and the weight gradient visiting only active
rows, indices outside ``[0, n_cols)`` skipped (see :mod:`evjax.primitives.csr.numba_cuda`
and ``docs/csr_backend_contract.md``).
"""
from __future__ import annotations

from ..csr import numba_cuda as csr_cuda
from . import ops

__all__ = []

# (fixed op, the CSR generator of the same op, whether it is the SDDMM, the CSR op's own parameters)
for _op, _generator, _sddmm, _csr_params in (
        (ops.fcnmv_p, csr_cuda.csrmv_numba_cuda, False, {}), (ops.fcnmm_p, csr_cuda.csrmm_numba_cuda, False, {}),
        (ops.binary_fcnmv_p, csr_cuda.binary_csrmv_numba_cuda, False, {"weighted": False}),
        (ops.binary_fcnmm_p, csr_cuda.binary_csrmm_numba_cuda, False, {"weighted": False}),
        (ops.fcn_sddmm_p, csr_cuda.csr_sddmm_numba_cuda, True, {"weighted": None})):
    _op.def_numba_cuda_kernel(ops.as_csr_generator(_generator, sddmm=_sddmm, **_csr_params))

"""The CSR operator family: event-driven sparse propagation (``CSR``, ``CSC`` and their ops).

* :mod:`.ops`: the ops, their reference, rules and registration;
* :mod:`.matrix`: the data types ``CSR`` and ``CSC``;
* :mod:`.numba`, :mod:`.warp`, :mod:`.numba_cuda`: the backends, each imported
  by the ops the first time it is needed.
"""
from .matrix import CSC, CSR
from .ops import (
    OPS,
    binary_csrmm,
    binary_csrmm_p,
    binary_csrmv,
    binary_csrmv_p,
    csr_sddmm,
    csr_sddmm_p,
    csrmm,
    csrmm_p,
    csrmv,
    csrmv_p,
    row_ids,
    validate_csr,
)

__all__ = [
    "CSR", "CSC", "OPS", "csrmv", "csrmm", "binary_csrmv", "binary_csrmm", "csr_sddmm",
    "csrmv_p", "csrmm_p", "binary_csrmv_p", "binary_csrmm_p", "csr_sddmm_p", "validate_csr", "row_ids",
]

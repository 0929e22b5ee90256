"""The fixed fan-in / fan-out family: every row of the index table has ``k`` synapses.

* :mod:`.ops`: the ops (``fcnmv``, ``fcnmm``, ``binary_fcnmv``, ``binary_fcnmm``,
  ``fcn_sddmm``), their reference, rules and registration;
* :mod:`.matrix`: the data types ``FixedPostNumConn`` and ``FixedPreNumConn`` (also named
  ``FixedNumPerPre`` and ``FixedNumPerPost``, brainevent's newer names);
* :mod:`.numba`, :mod:`.warp`, :mod:`.numba_cuda`: the backends (the CSR kernels
  on the flattened table), each imported by the ops the first time it is needed.
"""
from .matrix import FixedNumPerPost, FixedNumPerPre, FixedPostNumConn, FixedPreNumConn
from .ops import (
    OPS,
    binary_fcnmm,
    binary_fcnmm_p,
    binary_fcnmv,
    binary_fcnmv_p,
    fcn_sddmm,
    fcn_sddmm_p,
    fcnmm,
    fcnmm_p,
    fcnmv,
    fcnmv_p,
    validate_table,
)

__all__ = [
    "FixedPostNumConn", "FixedPreNumConn", "FixedNumPerPre", "FixedNumPerPost", "OPS",
    "fcnmv", "fcnmm", "binary_fcnmv", "binary_fcnmm", "fcn_sddmm",
    "fcnmv_p", "fcnmm_p", "binary_fcnmv_p", "binary_fcnmm_p", "fcn_sddmm_p", "validate_table",
]

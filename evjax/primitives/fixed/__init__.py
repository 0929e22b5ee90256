"""The fixed fan-in / fan-out family: every row of the index table has ``k`` synapses.

A layer over the CSR family: a table of shape ``(n_rows, k)`` is the CSR matrix with
``indices = table.ravel()`` and ``indptr = k * arange(n_rows + 1)``, so the functions here
build that structure in the traced computation and bind CSR's ops on it.  The family has no
primitive, rule or backend module of its own.

* :mod:`.products`: the per-synapse products ``fcnmv_dt2t``, ``fcnmm_dt2t`` (pure JAX);
* :mod:`.ops`: the functions (``fcnmv``, ``fcnmm``, ``binary_fcnmv``, ``binary_fcnmm``,
  ``fcn_sddmm``); ``fcnmv_p``, ... ``fcn_sddmm_p`` and ``OPS`` name the CSR ops they bind;
* :mod:`.matrix`: the data types ``FixedPostNumConn`` and ``FixedPreNumConn`` (also named
  ``FixedNumPerPre`` and ``FixedNumPerPost``, brainevent's newer names);
* :mod:`.validation`: the table's checks and its row pointers.
"""
from .matrix import FixedNumConn, FixedNumPerPost, FixedNumPerPre, FixedPostNumConn, FixedPreNumConn
from .products import fcnmm_dt2t, fcnmv_dt2t
from .ops import (
    OPS,
    binary_fcnmm,
    binary_fcnmm_p,
    binary_fcnmv,
    binary_fcnmv_p,
    csr_structure,
    fcn_sddmm,
    fcn_sddmm_p,
    fcnmm,
    fcnmm_p,
    fcnmv,
    fcnmv_p,
    validate_table,
)

__all__ = [
    "fcnmv_dt2t", "fcnmm_dt2t",
    "FixedNumConn", "FixedPostNumConn", "FixedPreNumConn", "FixedNumPerPre", "FixedNumPerPost", "OPS",
    "fcnmv", "fcnmm", "binary_fcnmv", "binary_fcnmm", "fcn_sddmm",
    "fcnmv_p", "fcnmm_p", "binary_fcnmv_p", "binary_fcnmm_p", "fcn_sddmm_p", "validate_table",
    "csr_structure",
]

"""The CSR operator family: event-driven sparse propagation (``CSR``, ``CSC`` and their ops).

* :mod:`.products`: the per-synapse products ``csrmv_dt2t``, ``cscmv_dt2t``, ``csrmm_dt2t``, ``cscmm_dt2t`` (pure JAX);
* :mod:`.ops`: the ops, their reference, rules and registration;
* :mod:`.indexed`: ``binary_csrmv_indexed`` / ``binary_csrmm_indexed`` (weights in another order);
* :mod:`.matrix`: the data types ``CSR`` and ``CSC``;
* :mod:`.tcsr`: ``TCSR``, brainevent's row-sorted CSR whose transpose is a CSR view;
* :mod:`.sharded`: ``ShardedCSR``, a CSR split by column blocks across devices (model parallelism);
* :mod:`.numba`, :mod:`.warp`, :mod:`.numba_cuda`: the backends, each imported
  by ``BACKEND_LOADERS`` below the first time an op needs it.
"""
from .indexed import binary_csrmm_indexed, binary_csrmv_indexed
from .matrix import CSC, CSR
from .sharded import ShardedCSR
from .tcsr import TCSR
from .products import cscmm_dt2t, cscmv_dt2t, csrmm_dt2t, csrmv_dt2t
from .ops import (
    OPS,
    binary_csrmm,
    binary_csrmm_p,
    binary_csrmv,
    binary_csrmv_active,
    binary_csrmv_active_p,
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
    "csrmv_dt2t", "cscmv_dt2t", "csrmm_dt2t", "cscmm_dt2t",
    "CSR", "CSC", "TCSR", "ShardedCSR", "OPS", "csrmv", "csrmm", "binary_csrmv", "binary_csrmm", "binary_csrmv_active", "csr_sddmm",
    "binary_csrmv_indexed", "binary_csrmm_indexed",
    "csrmv_p", "csrmm_p", "binary_csrmv_p", "binary_csrmm_p", "binary_csrmv_active_p", "csr_sddmm_p",
    "validate_csr", "row_ids",
]

# ---------------------------------------------------------------------------
# backends: one module per kernel language, loaded (and returned) the first time an op needs
# it; it registers its generators on the ops. {backend: {platform: is_default_candidate}}
# ---------------------------------------------------------------------------
def _load_numba():
    from . import numba
    return numba


def _load_warp():
    from . import warp
    return warp


def _load_numba_cuda():
    from . import numba_cuda
    return numba_cuda


BACKEND_LOADERS = {"numba": _load_numba, "warp": _load_warp, "numba_cuda": _load_numba_cuda}
BACKENDS = {"numba": {"cpu": True}, "warp": {"cpu": False, "gpu": True}, "numba_cuda": {"gpu": True}}
for _op in OPS:
    _op.declare_backends(BACKEND_LOADERS, BACKENDS)


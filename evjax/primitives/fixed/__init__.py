"""The fixed fan-in / fan-out family: every row of the index table has ``k`` synapses.

* :mod:`.ops`: the ops (``fcnmv``, ``fcnmm``, ``binary_fcnmv``, ``binary_fcnmm``,
  ``fcn_sddmm``), their reference, rules and registration;
* :mod:`.matrix`: the data types ``FixedPostNumConn`` and ``FixedPreNumConn`` (also named
  ``FixedNumPerPre`` and ``FixedNumPerPost``, brainevent's newer names);
* :mod:`.numba`, :mod:`.warp`, :mod:`.numba_cuda`: the backends (the CSR kernels
  on the flattened table), each loaded by ``BACKEND_LOADERS`` below the first time an op needs it.
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


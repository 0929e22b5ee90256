"""The dense event family: a dense weight matrix fed with spikes or graded events.

* :mod:`.ops`: the ops ``binary_densemv_p``, ``binary_densemm_p`` and the weight
  gradient ``binary_dense_outer_p``, their reference, rules and registration;
* :mod:`.matrix`: the data type ``Dense``;
* :mod:`.numba`, :mod:`.warp`, :mod:`.numba_cuda`: the backends, each imported
  by ``BACKEND_LOADERS`` below the first time an op needs it.
"""
from .matrix import Dense
from .ops import (
    OPS,
    binary_dense_outer,
    binary_dense_outer_p,
    binary_densemm,
    binary_densemm_p,
    binary_densemv,
    binary_densemv_p,
    dense_event_matmul,
)

__all__ = [
    "Dense", "OPS", "binary_densemv", "binary_densemm", "binary_dense_outer", "dense_event_matmul",
    "binary_densemv_p", "binary_densemm_p", "binary_dense_outer_p",
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


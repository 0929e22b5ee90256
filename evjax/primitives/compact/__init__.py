"""The compact-events family: the list of the active entries of spikes (what :class:`evjax.CompactBinary` holds).

* :mod:`.ops`: the op ``active_list_p``, its reference, rules and registration, and the public ``active_list``;
* :mod:`.numba`, :mod:`.warp`, :mod:`.numba_cuda`: the backends, each imported
  by ``BACKEND_LOADERS`` below the first time an op needs it.  On GPU the
  default is the reference (XLA's ``nonzero``, a parallel scan there); the
  GPU kernels (one thread per row) are there to be chosen by name.
"""
from .ops import OPS, active_list, active_list_p

__all__ = ["OPS", "active_list", "active_list_p"]


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
BACKENDS = {"numba": {"cpu": True}, "warp": {"cpu": False, "gpu": False}, "numba_cuda": {"gpu": False}}
for _op in OPS:
    _op.declare_backends(BACKEND_LOADERS, BACKENDS)

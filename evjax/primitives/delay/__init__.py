"""The delay family: spikes delivered through a CSR connection with per-edge delays into an arrival ring.

* :mod:`.ops`: the ops ``csr_delay_deliver_p`` (also named
  ``csr_delay_deliver_layout_p``: the layout variant binds the same op on the
  layout's arrays) and ``csr_delay_gather_p`` (the cotangents), their
  reference, rules and registration, :class:`CSRDelayLayout`, and the public
  functions;
* :mod:`.numba`, :mod:`.warp`, :mod:`.numba_cuda`: the backends, each imported
  by ``BACKEND_LOADERS`` below the first time an op needs it.
"""
from .ops import (
    OPS,
    CSRDelayLayout,
    csr_delay_deliver,
    csr_delay_deliver_layout,
    csr_delay_deliver_layout_p,
    csr_delay_deliver_p,
    csr_delay_gather,
    csr_delay_gather_p,
)

__all__ = [
    "OPS", "CSRDelayLayout", "csr_delay_deliver", "csr_delay_deliver_p", "csr_delay_deliver_layout",
    "csr_delay_deliver_layout_p", "csr_delay_gather", "csr_delay_gather_p",
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

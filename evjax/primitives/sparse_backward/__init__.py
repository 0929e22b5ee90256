"""The sparse-backward family: products that visit only the nonzero entries of a vector.

* :mod:`.ops`: the ops ``csrmv_nonzero_p``, ``csr_sddmm_nonzero_p``,
  ``densemv_nonzero_p`` and ``dense_outer_nonzero_p``, their references,
  rules and registration, and their public wrappers;
* :mod:`.numba`, :mod:`.warp`, :mod:`.numba_cuda`: the backends, each imported
  by ``BACKEND_LOADERS`` below the first time an op needs it.  On GPU the
  default is Warp (then Numba CUDA): one thread per output entry, gathering
  its terms in the Numba CPU kernels' order, without atomics, so the results
  are deterministic and have the CPU's bits (the reference's scatter-adds
  would be neither on GPU).  On CPU Warp is chosen by name only.

:func:`evjax.sparse_backward_matmul` builds a layer ``spikes @ W`` whose
backward pass runs these ops.
"""
from .ops import (
    OPS, SPARSE_DENSITY, csr_sddmm_nonzero, csr_sddmm_nonzero_p, csrmv_nonzero, csrmv_nonzero_p, dense_outer_nonzero,
    dense_outer_nonzero_p, densemv_nonzero, densemv_nonzero_p, rows_sorted,
)

__all__ = ["OPS", "SPARSE_DENSITY", "csrmv_nonzero", "csrmv_nonzero_p", "csr_sddmm_nonzero", "csr_sddmm_nonzero_p",
           "densemv_nonzero", "densemv_nonzero_p", "dense_outer_nonzero", "dense_outer_nonzero_p", "rows_sorted"]


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

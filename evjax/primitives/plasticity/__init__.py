"""The plasticity family: event-driven weight updates of a connection on spikes (STDP).

* :mod:`.ops`: the ops ``update_csr_on_binary_pre_p``,
  ``update_csr_on_binary_post_p``, ``update_dense_on_binary_pre_p`` and
  ``update_dense_on_binary_post_p``, their reference, rules and registration, and
  the functions that bind them on other storage (CSC, fixed-width tables);
* :mod:`.apply`: ``csr_apply_on_pre`` / ``csr_apply_on_post``, a user's
  per-synapse rule applied on spikes (pure JAX);
* :mod:`.numba`, :mod:`.warp`, :mod:`.numba_cuda`: the backends, each imported
  by ``BACKEND_LOADERS`` below the first time an op needs it.
"""
from .apply import csr_apply_on_post, csr_apply_on_pre
from .ops import (
    OPS,
    update_csc_on_binary_post,
    update_csc_on_binary_pre,
    update_csr_on_binary_post,
    update_csr_on_binary_post_p,
    update_csr_on_binary_pre,
    update_csr_on_binary_pre_p,
    update_dense_on_binary_post,
    update_dense_on_binary_post_p,
    update_dense_on_binary_pre,
    update_dense_on_binary_pre_p,
    update_fixed_post_conn_on_binary_pre,
    update_fixed_pre_conn_on_binary_post,
)

__all__ = [
    "OPS", "update_csr_on_binary_pre", "update_csr_on_binary_post", "update_csr_on_binary_pre_p",
    "update_csr_on_binary_post_p", "update_csc_on_binary_pre", "update_csc_on_binary_post", "update_fixed_post_conn_on_binary_pre",
    "update_fixed_pre_conn_on_binary_post", "update_dense_on_binary_pre", "update_dense_on_binary_post",
    "update_dense_on_binary_pre_p", "update_dense_on_binary_post_p", "csr_apply_on_pre", "csr_apply_on_post",
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

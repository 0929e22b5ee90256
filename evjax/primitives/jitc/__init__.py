"""Just-in-time connectivity (JITC): random matrices regenerated in every kernel, never stored.

* :mod:`.products`: the per-synapse products ``jitsmv_dt2t``, ``jitnmv_dt2t``, ``jitumv_dt2t`` (pure JAX, concrete seed);
* :mod:`.generation`: the generation scheme (counter-based streams, geometric skipping), in JAX;
* :mod:`.ops`: the ops, their reference, rules and registration;
* :mod:`.functions`: the public functions (``jitsmv``, ``binary_jitsmv``, ``jits``, ...);
* :mod:`.matrix`: the data types ``JITCScalarR/C`` (also ``JITCHomoR/C``), ``JITCNormalR/C``, ``JITCUniformR/C``;
* :mod:`.numba`, :mod:`.warp`, :mod:`.numba_cuda`: the backends, each imported
  by ``BACKEND_LOADERS`` below the first time an op needs it.
"""
from .functions import (
    binary_jitnmm,
    binary_jitnmv,
    binary_jitsmm,
    binary_jitsmv,
    binary_jitumm,
    binary_jitumv,
    jitn,
    jitnmm,
    jitnmv,
    jits,
    jitsmm,
    jitsmv,
    jitu,
    jitumm,
    jitumv,
)
from .matrix import (
    JITCHomoC, JITCHomoR, JITCMatrix, JITCNormalC, JITCScalarMatrix, JITCNormalR, JITCScalarC, JITCScalarR, JITCUniformC, JITCUniformR,
)
from .products import jitnmv_dt2t, jitsmv_dt2t, jitumv_dt2t
from .ops import (
    DENSE_OPS, MATMUL_OPS, OPS, binary_jitnmm_p, binary_jitnmv_p, binary_jitsmm_p, binary_jitsmv_p, binary_jitumm_p,
    binary_jitumv_p, jitn_p, jitnmm_p, jitnmv_p, jits_p, jitsmm_p, jitsmv_p, jitu_p, jitumm_p, jitumv_p,
)

__all__ = [
    "jitsmv_dt2t", "jitnmv_dt2t", "jitumv_dt2t",
    "jitsmv", "jitsmm", "jitnmv", "jitnmm", "jitumv", "jitumm",
    "binary_jitsmv", "binary_jitsmm", "binary_jitnmv", "binary_jitnmm", "binary_jitumv", "binary_jitumm",
    "jits", "jitn", "jitu", "JITCMatrix", "JITCScalarMatrix", "JITCScalarR", "JITCScalarC", "JITCHomoR", "JITCHomoC", "JITCNormalR",
    "JITCNormalC", "JITCUniformR", "JITCUniformC", "OPS", "MATMUL_OPS", "DENSE_OPS",
    "jitsmv_p", "jitsmm_p", "binary_jitsmv_p", "binary_jitsmm_p", "jitnmv_p", "jitnmm_p", "binary_jitnmv_p",
    "binary_jitnmm_p", "jitumv_p", "jitumm_p", "binary_jitumv_p", "binary_jitumm_p", "jits_p", "jitn_p", "jitu_p",
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


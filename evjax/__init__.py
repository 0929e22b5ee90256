"""evjax: JAX primitives for event-driven (spiking) computation, complete under
``jit``, ``grad``, ``jvp`` and ``vmap``.

Importing evjax compiles nothing, clears no cache, imports neither Warp nor
``numba.cuda`` and changes no setting of Numba: backends are imported, and
kernels compiled, the first time an op needs them.  It does tell Numba's disk
cache that evjax's own kernels also depend on the files they inline code from
(:func:`evjax._kernel_compat.stamp_kernel_caches`); other code is unaffected.
"""
from . import _kernel_compat

_kernel_compat.stamp_kernel_caches()  # before any kernel is declared: see its docstring

from . import config, errors, rules, surrogate  # noqa: E402
from .config import set_backend, use_backend
from .errors import (
    BrainEventError, CompilationError, KernelCompilationError, KernelError, KernelExecutionError,
    KernelFallbackExhaustedError, KernelNotAvailableError, KernelRegistrationError, KernelToolchainError, MathError,
    UnsupportedOperationError, BenchmarkDataFnNotProvidedError,
)
from .events import (
    BinaryArray, BitPackedBinary, CompactBinary, EventArray, EventRepresentation, WeightedArray, bitpack,
)
from .numba_cuda_kernel import numba_cuda_callable, numba_cuda_kernel
from .numba_kernel import numba_kernel
from .primitives.csr import (
    CSC, CSR, ShardedCSR, TCSR, binary_csrmm, binary_csrmm_indexed, binary_csrmm_p, binary_csrmv, binary_csrmv_active,
    binary_csrmv_active_p, binary_csrmv_indexed, binary_csrmv_p, csr_sddmm, csrmm, csrmm_p, csrmv, csrmv_p, cscmm_dt2t, cscmv_dt2t, csrmm_dt2t, csrmv_dt2t,
)
from .primitives.csr.convert import (
    coo2csr,
    coo_to_csc_index,
    csc_to_csr_index,
    csr_slice_rows,
    csr_to_coo_index,
    csr_to_csc_index,
)
# dense event operators
from .primitives.dense import Dense, binary_densemm, binary_densemm_p, binary_densemv, binary_densemv_p
# fixed fan-in / fan-out connectivity
from .primitives.fixed import (
    FixedNumConn, FixedNumPerPost, FixedNumPerPre, FixedPostNumConn, FixedPreNumConn,
    binary_fcnmm, binary_fcnmm_p, binary_fcnmv, binary_fcnmv_p, fcn_sddmm, fcnmm, fcnmv, fcnmm_dt2t, fcnmv_dt2t,
)
# plasticity: weight updates on spikes
from .primitives.plasticity import (
    csr_apply_on_post, csr_apply_on_pre, update_csc_on_binary_pre,
    update_csc_on_binary_post, update_csr_on_binary_post, update_csr_on_binary_post_p, update_csr_on_binary_pre,
    update_csr_on_binary_pre_p, update_dense_on_binary_post, update_dense_on_binary_post_p, update_dense_on_binary_pre,
    update_dense_on_binary_pre_p, update_fixed_post_conn_on_binary_pre, update_fixed_pre_conn_on_binary_post,
)
# synaptic delays
from .primitives.delay import (
    CSRDelayLayout, csr_delay_deliver, csr_delay_deliver_layout, csr_delay_deliver_layout_p, csr_delay_deliver_p,
)
# just-in-time connectivity
from .primitives.jitc import (
    jitnmv_dt2t,
    jitsmv_dt2t,
    jitumv_dt2t,
    JITCHomoC,
    JITCHomoR,
    JITCMatrix,
    JITCScalarMatrix,
    JITCNormalC,
    JITCNormalR,
    JITCScalarC,
    JITCScalarR,
    JITCUniformC,
    JITCUniformR,
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
    binary_jitnmm_p, binary_jitnmv_p, binary_jitsmm_p, binary_jitsmv_p, binary_jitumm_p, binary_jitumv_p,
    jitn_p, jitnmm_p, jitnmv_p, jits_p, jitsmm_p, jitsmv_p, jitu_p, jitumm_p, jitumv_p,
)
from .primitives.neuron import detect_spikes, exp_trace, lif_step, spike
from .primitives.sparse_backward import csr_sddmm_nonzero, csrmv_nonzero, dense_outer_nonzero, densemv_nonzero
from .sparse_backward import sparse_backward_gate, sparse_backward_matmul
from .bptt import bptt_scan
from .rules.ad import defjvp
from .rules.batching import general_batching_rule
from .surrogate import SURROGATES, Surrogate, surrogate_grad
from .warp_kernel import jaxinfo_to_warpinfo, jaxtype_to_warptype, warp_kernel
from .xla_custom_kernel import KernelEntry, XLACustomKernel
from .benchmark import BenchmarkConfig, BenchmarkRecord, BenchmarkResult, benchmark_function
from .ffi_targets import list_registered_targets, register_ffi_target
from .data_representation import DataRepresentation
from .precompile import precompile
from .backends.threads import get_num_threads, set_num_threads
from .cache import clear_cache, get_cache_dir, set_cache_dir
from .diagnostics import print_diagnostics
from .catalog import get_all_primitive_names, get_primitives_by_tags, get_registry

__version__ = "0.1.0"

__all__ = [
    "XLACustomKernel",
    "KernelEntry",
    "benchmark_function",
    "BenchmarkConfig",
    "BenchmarkRecord",
    "BenchmarkResult",
    "register_ffi_target",
    "list_registered_targets",
    "DataRepresentation",
    "precompile",
    "set_num_threads",
    "get_num_threads",
    "config",
    "errors",
    "defjvp",
    "general_batching_rule",
    "numba_kernel",
    "numba_cuda_callable",
    "numba_cuda_kernel",
    "rules",
    "set_backend",
    "use_backend",
    "warp_kernel",
    "jaxinfo_to_warpinfo",
    "jaxtype_to_warptype",
    # neuron primitives
    "SURROGATES",
    "Surrogate",
    "detect_spikes",
    "exp_trace",
    "lif_step",
    "spike",
    "surrogate",
    "surrogate_grad",
    # sparse backward
    "sparse_backward_matmul",
    "sparse_backward_gate",
    "bptt_scan",
    "csrmv_nonzero",
    "csr_sddmm_nonzero",
    "densemv_nonzero",
    "dense_outer_nonzero",
    # CSR operators
    "CSR",
    "CSC",
    "ShardedCSR",
    "TCSR",
    "BinaryArray",
    "EventArray",
    "WeightedArray",
    "BitPackedBinary",
    "CompactBinary",
    "bitpack",
    "csrmv",
    "csrmm",
    "binary_csrmv",
    "binary_csrmm",
    "binary_csrmv_active",
    "binary_csrmv_indexed",
    "binary_csrmm_indexed",
    "csr_sddmm",
    # dense event operators
    "Dense",
    "binary_densemv",
    "binary_densemm",
    # fixed fan-in / fan-out connectivity
    "FixedPostNumConn",
    "FixedPreNumConn",
    "FixedNumPerPre",
    "FixedNumPerPost",
    "fcnmv",
    "fcnmm",
    "binary_fcnmv",
    "binary_fcnmm",
    "fcn_sddmm",
    # just-in-time connectivity
    "JITCScalarR",
    "JITCScalarC",
    "JITCHomoR",
    "JITCHomoC",
    "JITCNormalR",
    "JITCNormalC",
    "JITCUniformR",
    "JITCUniformC",
    "jitsmv",
    "jitsmm",
    "jitnmv",
    "jitnmm",
    "jitumv",
    "jitumm",
    "binary_jitsmv",
    "binary_jitsmm",
    "binary_jitnmv",
    "binary_jitnmm",
    "binary_jitumv",
    "binary_jitumm",
    "jits",
    "jitn",
    "jitu",
    # brainevent's base-class names
    "EventRepresentation",
    "FixedNumConn",
    "JITCMatrix",
    "JITCScalarMatrix",
    # the primitives (XLACustomKernel objects: op(*arrays, outs=[...], **params))
    "csrmv_p",
    "csrmm_p",
    "binary_csrmv_p",
    "binary_csrmm_p",
    "binary_csrmv_active_p",
    "binary_densemv_p",
    "binary_densemm_p",
    "binary_fcnmv_p",
    "binary_fcnmm_p",
    "jitsmv_p",
    "jitsmm_p",
    "binary_jitsmv_p",
    "binary_jitsmm_p",
    "jitnmv_p",
    "jitnmm_p",
    "binary_jitnmv_p",
    "binary_jitnmm_p",
    "jitumv_p",
    "jitumm_p",
    "binary_jitumv_p",
    "binary_jitumm_p",
    "jits_p",
    "jitn_p",
    "jitu_p",
    "update_csr_on_binary_pre_p",
    "update_csr_on_binary_post_p",
    "update_dense_on_binary_pre_p",
    "update_dense_on_binary_post_p",
    # plasticity
    "update_csr_on_binary_pre",
    "update_csr_on_binary_post",
    "update_csc_on_binary_post",
    "update_csc_on_binary_pre",
    # synaptic delays
    "csr_delay_deliver",
    "csr_delay_deliver_p",
    "CSRDelayLayout",
    "csr_delay_deliver_layout",
    "csr_delay_deliver_layout_p",
    # per-synapse products
    "csrmv_dt2t",
    "cscmv_dt2t",
    "csrmm_dt2t",
    "cscmm_dt2t",
    "fcnmv_dt2t",
    "fcnmm_dt2t",
    "jitsmv_dt2t",
    "jitnmv_dt2t",
    "jitumv_dt2t",
    "csr_apply_on_pre",
    "csr_apply_on_post",
    "update_fixed_post_conn_on_binary_pre",
    "update_fixed_pre_conn_on_binary_post",
    "update_dense_on_binary_pre",
    "update_dense_on_binary_post",
    # index utilities
    "csr_to_coo_index",
    "coo_to_csc_index",
    "csr_to_csc_index",
    "csc_to_csr_index",
    "coo2csr",
    "csr_slice_rows",
    # the catalogue of ops
    "get_registry",
    "get_all_primitive_names",
    "get_primitives_by_tags",
    # the cache folder
    "set_cache_dir",
    "get_cache_dir",
    "print_diagnostics",
    "clear_cache",
    # errors (also in evjax.errors)
    "BrainEventError",
    "KernelError",
    "KernelNotAvailableError",
    "KernelCompilationError",
    "KernelFallbackExhaustedError",
    "KernelExecutionError",
    "KernelToolchainError",
    "CompilationError",
    "KernelRegistrationError",
    "MathError",
    "UnsupportedOperationError",
    "BenchmarkDataFnNotProvidedError",
]

# brainevent's retired names, resolved as brainevent 0.3.0 resolves them: a renamed function warns and
# is the new one; a removed one raises an AttributeError that says what replaces it.
_RENAMED = {
    "csr_on_pre": "update_csr_on_binary_pre",
    "csr2csc_on_post": "update_csr_on_binary_post",
    "dense_on_pre": "update_dense_on_binary_pre",
    "dense_on_post": "update_dense_on_binary_post",
}
_COO = "COO matrices were removed (brainevent 0.1.0): use CSR or CSC (coo2csr converts COO coordinates)"
_FCN = ("the bit-packed and compact fixed-connection ops were removed (brainevent 0.1.0): use fcnmv / fcnmm, or "
        "binary_fcnmv with spikes, e.g. CompactBinary.from_array(s) @ FixedNumPerPre(...)")
_REMOVED = {
    **dict.fromkeys(("COO", "coomv", "coomv_p", "coomm", "coomm_p", "binary_coomv", "binary_coomv_p",
                     "binary_coomm", "binary_coomm_p", "update_coo_on_binary_pre", "update_coo_on_binary_post",
                     "update_coo_on_binary_pre_p", "update_coo_on_binary_post_p"), _COO),
    **dict.fromkeys(tuple(f"{kind}_binary_fcn{shape}{p}" for kind in ("bitpack", "compact")
                          for shape in ("mv", "mm") for p in ("", "_p")), _FCN),
    **dict.fromkeys(("EllLayout", "CscLayout"),
                    "the layout objects were removed (brainevent 0.1.0): use FixedNumPerPre / FixedNumPerPost"),
}


def __getattr__(name: str):
    """brainevent's renamed names (a ``DeprecationWarning``, then the new object) and removed ones (an
    ``AttributeError`` naming the replacement)."""
    if name in _RENAMED:
        import warnings

        warnings.warn(f"evjax.{name} is deprecated (as in brainevent); use evjax.{_RENAMED[name]} instead",
                      DeprecationWarning, stacklevel=2)
        return globals()[_RENAMED[name]]
    if name in _REMOVED:
        raise AttributeError(f"module 'evjax' has no attribute {name!r}: {_REMOVED[name]}")
    raise AttributeError(f"module 'evjax' has no attribute {name!r}")

"""evjax: JAX primitives for event-driven (spiking) computation, complete under
``jit``, ``grad``, ``jvp`` and ``vmap``.
"""
from . import config, rules
from .config import set_backend, use_backend
from .numba_kernel import numba_kernel
from .numba_cuda_kernel import numba_cuda_callable, numba_cuda_kernel  # numba.cuda imported lazily
from .xla_custom_kernel import XLACustomKernel
from .warp_kernel import jaxinfo_to_warpinfo, jaxtype_to_warptype, warp_kernel  # Warp imported lazily
from . import surrogate  # noqa: E402  (neuron primitives)
from .primitives.neuron import detect_spikes, exp_trace, lif_step, spike  # noqa: E402
from .surrogate import SURROGATES, Surrogate, surrogate_grad  # noqa: E402
from .primitives.csr import binary_csrmm, binary_csrmv, csr_sddmm, csrmm, csrmv  # noqa: E402
from .sparse import CSC, CSR, BinaryArray, EventArray  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "XLACustomKernel",
    "config",
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
    # CSR operators
    "CSR",
    "CSC",
    "BinaryArray",
    "EventArray",
    "csrmv",
    "csrmm",
    "binary_csrmv",
    "binary_csrmm",
    "csr_sddmm",
]

"""Warp bridge: ``@warp.kernel`` functions called from JAX through the XLA FFI.

How a call runs (no Python on the per-call path, on either platform):

* **CPU.** Warp compiles a module into a shared object whose entry point is
  ``void <kernel>_cpu_forward(launch_bounds_t<N>*, wp_args_<kernel>*)``.  The
  FFI handler is *one* generic handler (made by
  :func:`evjax.backends.ffi_core.compile_handler`, compiled once and cached on
  disk by Numba) running :func:`evjax.backends.warp_launch.cpu_launch`: it reads
  the launch description from an FFI attribute, builds the launch bounds and
  one ``array_t`` per kernel parameter on its stack from the FFI buffers (zero
  copy) and calls the forward function pointer.  Warp's CPU kernels are
  serial: one thread runs the whole launch grid.
* **CUDA.** A second generic handler (:func:`evjax.backends.warp_launch.cuda_launch`)
  gets XLA's stream and device ordinal from the call frame, picks the kernel's
  ``CUfunction`` loaded on that device, builds the parameter block on its stack
  and calls Warp's native ``wp_cuda_launch_kernel`` (a ``cuLaunchKernel`` on
  XLA's stream).  There is no host synchronisation and no allocation, so the
  handler declares itself command-buffer (CUDA graph) compatible.

The launch description is an int64 array attribute (see :func:`launch_attr`):
parameter count and routing, launch bounds, and per device the kernel's entry
point.  The addresses are process-local; they enter the HLO produced by the
same process, so a compilation-cache hit can only happen with identical (hence
valid) addresses.  Every loaded Warp module is kept alive for the life of the
process, so an address baked into a compiled executable never dangles.

Warp itself is imported lazily (:func:`import_warp`), which also points Warp's
kernel cache at ``$EVJAX_WARP_CACHE_DIR`` (default: ``<evjax cache>/warp``)
when Warp has not been initialised yet.  Warp's private API is reached through
:mod:`evjax._kernel_compat` only.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from typing import Any

import numpy as np

from .. import _disk_cache, _kernel_compat
from ..errors import KernelToolchainError
from . import ffi_abi, ffi_core, warp_launch
from .warp_launch import ATTR_VERSION, MAX_PARAMS

__all__ = [
    "WarpNotInstalledError",
    "import_warp",
    "warp_cache_dir",
    "cpu_target",
    "cuda_target",
    "load_cpu",
    "load_cuda",
    "launch_bounds",
    "launch_attr",
    "MAX_PARAMS",
]

CPU_TARGET = "evjax_warp_cpu"
CUDA_TARGET = "evjax_warp_cuda"
ATTR_NAME = "evjax_warp"


class WarpNotInstalledError(KernelToolchainError):
    """warp-lang is needed for this feature but is not installed (an ``ImportError`` and a
    :class:`evjax.errors.KernelToolchainError`)."""


# ---------------------------------------------------------------------------
# Lazy import and the kernel cache folder
# ---------------------------------------------------------------------------
_lock = threading.RLock()
_warp = None


def warp_cache_dir() -> str:
    """Warp's kernel cache folder used by evjax.

    ``$EVJAX_WARP_CACHE_DIR`` if set, else ``<evjax cache folder>/warp`` (see
    :func:`evjax.backends.ffi_core.cache_dir`).  Where that folder cannot be
    written, one line is logged and Warp builds in a temporary folder of this
    process instead (removed at exit): nothing is cached.
    """
    folder = owner = os.environ.get("EVJAX_WARP_CACHE_DIR")
    if not folder:
        owner = ffi_core.cache_dir()
        folder = os.path.join(owner, "warp")
    try:
        os.makedirs(folder, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()  # Warp writes its builds there
    except OSError as exc:
        _disk_cache.unwritable(owner, exc)
        folder = tempfile.mkdtemp(prefix="evjax-warp-")
        atexit.register(shutil.rmtree, folder, True)
    return folder


def import_warp():
    """Import and initialise Warp; point its kernel cache at :func:`warp_cache_dir`.

    The cache folder is set only if Warp was not initialised yet and the user
    did not choose one (``warp.config.kernel_cache_dir``).

    Raises:
        WarpNotInstalledError: warp-lang is not installed.
    """
    global _warp
    if _warp is not None:
        return _warp
    with _lock:
        if _warp is not None:
            return _warp
        try:
            import warp  # noqa: F401
        except ImportError as exc:
            raise WarpNotInstalledError(
                "evjax's Warp backend needs warp-lang, which is not installed. Install it with "
                "`pip install evjax[warp]` (or `pip install warp-lang`)."
            ) from exc
        _warp = _kernel_compat.warp_initialize(warp_cache_dir)
        return _warp


# ---------------------------------------------------------------------------
# Loading kernels (kept alive for the life of the process)
# ---------------------------------------------------------------------------
_keepalive: list[Any] = []
_loaded: set[tuple] = set()


def load_cpu(kernel) -> int:
    """Compile (or fetch from Warp's cache) ``kernel`` for Warp's CPU device.

    Returns:
        The address of its ``*_cpu_forward`` entry point.
    """
    wp = import_warp()
    device = wp.get_device("cpu")
    with _lock:
        address, keepalive = _kernel_compat.warp_cpu_entry(kernel, device)
        key = (id(keepalive[0]), address)  # one entry per loaded module executable
        if key not in _loaded:
            _keepalive.append(keepalive)
            _loaded.add(key)
        return address


def load_cuda(kernel) -> tuple[list[tuple[int, int]], dict]:
    """Compile and load ``kernel`` on every CUDA device Warp sees.

    Returns:
        ``([(CUfunction, CUcontext)] indexed by device ordinal, launch options)``
        where the options are ``block_dim``, ``grid_stride``, ``cluster_dim``
        and ``smem`` (dynamic shared memory bytes).
    """
    wp = import_warp()
    devices = [d for d in wp.get_cuda_devices()]
    if not devices:
        raise RuntimeError(
            "evjax: a Warp kernel was lowered for CUDA, but Warp sees no CUDA device "
            "(is the CUDA driver available to Warp?)"
        )
    table = [(0, 0)] * (max(d.ordinal for d in devices) + 1)
    options: dict = {}
    with _lock:
        for device in devices:
            function, context, options, keepalive = _kernel_compat.warp_cuda_entry(kernel, device)
            table[device.ordinal] = (function, context)
            _keepalive.append(keepalive)
    return table, options


def cuda_launch_address() -> int:
    """Address of Warp's native ``wp_cuda_launch_kernel``."""
    import_warp()
    return _kernel_compat.warp_cuda_launch_address()


# ---------------------------------------------------------------------------
# Launch description
# ---------------------------------------------------------------------------
def normalize_launch_dims(launch_dims) -> tuple[int, ...]:
    """``launch_dims`` as a tuple of 1 to 4 non-negative ints.

    Raises:
        TypeError / ValueError: it is not an int or a sequence of at most 4 ints.
    """
    if isinstance(launch_dims, (int, np.integer)) and not isinstance(launch_dims, bool):
        dims = (int(launch_dims),)
    elif isinstance(launch_dims, (tuple, list)) and all(
        isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in launch_dims
    ):
        dims = tuple(int(d) for d in launch_dims)
    else:
        raise TypeError(
            f"launch_dims must be an int or a tuple of up to 4 ints, got {launch_dims!r}"
        )
    if not 1 <= len(dims) <= 4:
        raise ValueError(f"launch_dims must have 1 to 4 dimensions, got {len(dims)}: {dims}")
    if any(d < 0 for d in dims):
        raise ValueError(f"launch_dims must be non-negative, got {dims}")
    if any(d >= 2**31 for d in dims):
        raise ValueError(f"each launch dimension must be below 2**31, got {dims}")
    return dims


def launch_bounds(dims: tuple[int, ...], kernel_dim: int) -> tuple[tuple[int, ...], int, int]:
    """Warp's launch bounds for ``dims``: ``(shape padded to kernel_dim, size, coord_mult)``.

    Same rule as ``wp.launch``: missing trailing dimensions are 1; extra ones are
    folded into ``coord_mult`` (threads that share a coordinate tuple).
    """
    padded = tuple(dims) + (1,) * max(0, kernel_dim - len(dims))
    kept, extras = padded[:kernel_dim], padded[kernel_dim:]
    mult = int(np.prod(extras, dtype=np.int64)) if extras else 1
    size = int(np.prod(kept, dtype=np.int64)) * mult
    return kept, size, mult


def launch_attr(
    n_params: int,
    from_results: int,
    kernel_dim: int,
    dims: tuple[int, ...],
    devices: list[tuple[int, int]],
    *,
    block_dim: int = 1,
    grid_stride: int = 1,
    cluster_dim: int = 1,
    smem: int = 0,
    launch_fn: int = 0,
) -> np.ndarray:
    """The int64 attribute both handlers read.

    Args:
        n_params: kernel parameters (each an array).
        from_results: bit ``k`` set when parameter ``k`` is the next *result*
            buffer of the FFI call; otherwise it is the next *argument* buffer.
        kernel_dim: the kernel's ``wp.tid()`` dimensionality.
        dims: the launch dimensions.
        devices: ``(entry point, context)`` per device ordinal (one entry on CPU).
    """
    if n_params > MAX_PARAMS:
        raise ValueError(f"a Warp kernel called through evjax takes at most {MAX_PARAMS} arrays, got {n_params}")
    shape, size, mult = launch_bounds(dims, kernel_dim)
    head = [ATTR_VERSION, n_params, from_results, kernel_dim, size, mult]
    head += list(shape) + [0] * (4 - len(shape))
    head += [block_dim, grid_stride, cluster_dim, smem, launch_fn, len(devices)]
    for function, context in devices:
        head += [function, context]
    return np.asarray(head, dtype=np.int64)


# ---------------------------------------------------------------------------
# The compiled handlers
# ---------------------------------------------------------------------------
_registered: set[str] = set()


def cpu_target() -> str:
    """Register (once) and return the FFI target of the CPU handler."""
    return _register(CPU_TARGET, "cpu")


def cuda_target() -> str:
    """Register (once) and return the FFI target of the CUDA handler (CUDA-graph safe: a launch on
    XLA's stream, no synchronisation, no allocation)."""
    return _register(CUDA_TARGET, "CUDA")


def _register(name: str, platform: str) -> str:
    if name in _registered:
        return name
    with _lock:
        if name in _registered:
            return name
        import jax

        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(handler_address(platform)), platform=platform)
        _registered.add(name)
    return name


def handler_address(platform: str) -> int:
    """The address of the CPU (``"cpu"``) or CUDA (``"CUDA"``) handler, compiled once per process
    (``ffi_core`` keeps the module alive); tests call it with fake frames."""
    body, traits = ((warp_launch.CPU_BODY, 0) if platform == "cpu"
                    else (warp_launch.CUDA_BODY, ffi_abi.TRAIT_COMMAND_BUFFER_COMPATIBLE))
    module, _ = ffi_core.compile_handler(body, traits=traits, imports=warp_launch.IMPORTS, depends=(warp_launch,))
    return int(module.handler.address)

"""Warp bridge: ``@warp.kernel`` functions called from JAX through the XLA FFI.

How a call runs (no Python on the per-call path, on either platform):

* **CPU.** Warp compiles a module into a shared object whose entry point is
  ``void <kernel>_cpu_forward(launch_bounds_t<N>*, wp_args_<kernel>*)``.  The
  FFI handler is *one* generic ``@numba.cfunc`` (compiled once, cached on disk
  by Numba).  It reads the launch description from an FFI attribute, builds
  the launch bounds and one ``array_t`` per kernel parameter on its stack from
  the FFI buffers (zero copy) and calls the forward function pointer.  Warp's
  CPU kernels are serial: one thread runs the whole launch grid.
* **CUDA.** A second generic ``@numba.cfunc`` gets XLA's stream from the call
  frame (``XLA_FFI_Stream_Get``) and the device ordinal
  (``XLA_FFI_DeviceOrdinal_Get``), picks the kernel's ``CUfunction`` loaded on
  that device, builds the parameter block on its stack and calls Warp's native
  ``wp_cuda_launch_kernel`` (a ``cuLaunchKernel`` on XLA's stream).  There is no
  host synchronisation and no allocation, so the handler declares itself
  command-buffer (CUDA graph) compatible.

The launch description is an int64 array attribute (see :func:`launch_attr`):
parameter count and routing, launch bounds, and per device the kernel's entry
point.  The addresses are process-local; they enter the HLO produced by the
same process, so a compilation-cache hit can only happen with identical (hence
valid) addresses.  Every loaded Warp module is kept alive for the life of the
process, so an address baked into a compiled executable never dangles.

Warp itself is imported lazily (:func:`import_warp`), which also points Warp's
kernel cache at ``$EVJAX_WARP_CACHE_DIR`` (default: ``<evjax cache>/warp``)
when Warp has not been initialised yet.
"""
from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

import numpy as np

from . import ffi_abi

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
MAX_PARAMS = 48  # kernel parameters per launch (routing mask is one int64)
ATTR_NAME = "evjax_warp"
ARRAY_T_SIZE = 56  # warp.types.array_t: data, grad, shape[4], strides[4], ndim, flags
# Layout of the int64 launch attribute.
L_VERSION, L_NPARAMS, L_MASK, L_KDIM, L_SIZE, L_MULT = 0, 1, 2, 3, 4, 5
L_SHAPE = 6  # 4 entries
L_BLOCK, L_GRID_STRIDE, L_CLUSTER, L_SMEM, L_LAUNCH_FN, L_NDEV = 10, 11, 12, 13, 14, 15
L_DEVICES = 16  # then (function, context) per device ordinal
ATTR_VERSION = 1
SCRATCH_BYTES = 32 + ARRAY_T_SIZE * MAX_PARAMS + 8 * (MAX_PARAMS + 1) + 64


class WarpNotInstalledError(ImportError):
    """warp-lang is needed for this feature but is not installed."""


# ---------------------------------------------------------------------------
# Lazy import and the kernel cache folder
# ---------------------------------------------------------------------------
_lock = threading.RLock()
_warp = None


def warp_cache_dir() -> str:
    """Warp's kernel cache folder used by evjax.

    ``$EVJAX_WARP_CACHE_DIR`` if set, else ``<evjax cache folder>/warp`` (see
    :func:`evjax.backends.numba_cpu.cache_dir`).
    """
    folder = os.environ.get("EVJAX_WARP_CACHE_DIR")
    if not folder:
        from .numba_cpu import cache_dir

        folder = os.path.join(cache_dir(), "warp")
    os.makedirs(folder, exist_ok=True)
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
            import warp as wp
        except ImportError as exc:
            raise WarpNotInstalledError(
                "evjax's Warp backend needs warp-lang, which is not installed. Install it with "
                "`pip install evjax[warp]` (or `pip install warp-lang`)."
            ) from exc
        from warp._src import context as wp_context  # noqa: PLC0415 - Warp's runtime lives here

        if getattr(wp_context, "runtime", None) is None:
            if not wp.config.kernel_cache_dir and not os.environ.get("WARP_CACHE_PATH"):
                wp.config.kernel_cache_dir = warp_cache_dir()
            wp.init()
        _warp = wp
        return wp


def _runtime():
    from warp._src import context as wp_context  # noqa: PLC0415

    return wp_context.runtime


# ---------------------------------------------------------------------------
# Loading kernels (kept alive for the life of the process)
# ---------------------------------------------------------------------------
_keepalive: list[Any] = []
_loaded: dict[tuple, tuple] = {}


def _module_exec(kernel, device, block_dim: int):
    exe = kernel.module.load(device, block_dim)
    if exe is None:  # pragma: no cover - Warp reports its own build errors
        raise RuntimeError(f"Warp could not load the module of kernel '{kernel.key}' on {device}")
    return exe


def load_cpu(kernel) -> int:
    """Compile (or fetch from Warp's cache) ``kernel`` for Warp's CPU device.

    Returns:
        The address of its ``*_cpu_forward`` entry point.
    """
    wp = import_warp()
    device = wp.get_device("cpu")
    with _lock:
        exe = _module_exec(kernel, device, 1)
        key = ("cpu", id(exe), kernel.key, id(kernel))
        hit = _loaded.get(key)
        if hit is not None:
            return hit[0]
        hooks = exe.get_kernel_hooks(kernel)
        if hooks.forward is None:  # pragma: no cover
            raise RuntimeError(f"Warp kernel '{kernel.key}' has no CPU forward entry point")
        address = ctypes.cast(hooks.forward, ctypes.c_void_p).value
        _keepalive.append((exe, hooks, kernel))
        _loaded[key] = (address,)
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
            block_dim = int(kernel.module.options["block_dim"])
            exe = _module_exec(kernel, device, block_dim)
            hooks = exe.get_kernel_hooks(kernel)
            if hooks.forward is None:  # pragma: no cover
                raise RuntimeError(f"Warp kernel '{kernel.key}' has no CUDA forward entry on {device}")
            meta = getattr(hooks, "det_launch_meta", None)
            if meta is not None and getattr(meta, "needs_deterministic", False):
                raise NotImplementedError(
                    f"Warp kernel '{kernel.key}' is compiled in Warp's deterministic mode, which needs hidden "
                    f"buffers that evjax does not provide; use wp.launch, or turn deterministic mode off."
                )
            if getattr(hooks, "forward_smem_shortfall", None):
                raise RuntimeError(
                    f"Warp kernel '{kernel.key}' needs more shared memory than {device} offers: "
                    f"{hooks.forward_smem_shortfall}"
                )
            function = ctypes.cast(hooks.forward, ctypes.c_void_p).value if not isinstance(
                hooks.forward, int
            ) else hooks.forward
            table[device.ordinal] = (int(function or 0), int(device.context or 0))
            options = {
                "block_dim": block_dim,
                "grid_stride": int(bool(kernel.grid_stride)),
                "cluster_dim": int(getattr(hooks, "cluster_dim", 1) or 1),
                "smem": int(hooks.forward_smem_bytes or 0),
            }
            _keepalive.append((exe, hooks, kernel))
    return table, options


def cuda_launch_address() -> int:
    """Address of Warp's native ``wp_cuda_launch_kernel``."""
    import_warp()
    return ctypes.cast(_runtime().core.wp_cuda_launch_kernel, ctypes.c_void_p).value


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
_handlers: dict[str, Any] = {}
_registered: set[str] = set()


def _compile_handlers():
    from . import warp_handlers  # noqa: PLC0415 - numba compile on first use

    return warp_handlers


def cpu_target() -> str:
    """Register (once) and return the FFI target of the CPU handler."""
    return _register(CPU_TARGET, "cpu")


def cuda_target() -> str:
    """Register (once) and return the FFI target of the CUDA handler."""
    return _register(CUDA_TARGET, "CUDA")


def _register(name: str, platform: str) -> str:
    if name in _registered:
        return name
    with _lock:
        if name in _registered:
            return name
        import jax

        handlers = _compile_handlers()
        cfunc = handlers.cpu_handler if platform == "cpu" else handlers.cuda_handler
        _handlers[name] = cfunc
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(cfunc.address), platform=platform)
        _registered.add(name)
    return name


def buffer_itemsize(code: int) -> int:
    """Bytes per element of an XLA FFI dtype code (0 if unknown)."""
    dtype = ffi_abi.CODE_TO_DTYPE.get(code)
    return 0 if dtype is None else dtype.itemsize

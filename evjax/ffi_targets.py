"""Registering your own compiled XLA FFI handlers: ``register_ffi_target`` and ``list_registered_targets``.

brainevent's names for registering a handler that a shared library exports
(brainevent builds that library from CUDA/C++ source; evjax does not compile
source, so you build it with your own toolchain).  The handler follows XLA's
FFI (``XLA_FFI_Error* handler(XLA_FFI_CallFrame*)``, see ``jax.ffi.include_dir()``);
call it with ``jax.ffi.ffi_call(target_name, ...)`` as usual.

evjax's own kernels (``numba_kernel``, ``warp_kernel``, the ops) register
their handlers themselves and are not listed here.
"""
from __future__ import annotations

import ctypes
import os
import threading

import jax

from .errors import KernelRegistrationError

__all__ = ["register_ffi_target", "list_registered_targets"]

_PLATFORMS = {"cuda": "CUDA", "gpu": "CUDA", "rocm": "ROCM", "cpu": "cpu", "host": "cpu"}
_lock = threading.Lock()
_registered: dict[str, tuple] = {}  # target -> (platform, address, content_id, library kept alive); filled by calls


def _library(module):
    """The loaded shared library of ``module``: a ``ctypes.CDLL``, a path, or an object with ``so_path``."""
    if isinstance(module, ctypes.CDLL):
        return module
    path = getattr(module, "so_path", module)
    if isinstance(path, (str, os.PathLike)):
        if not os.path.exists(path):
            raise FileNotFoundError(f"register_ffi_target: no shared library at {os.fspath(path)!r}")
        return ctypes.CDLL(os.fspath(path))
    raise TypeError(f"register_ffi_target: module must be a ctypes.CDLL, a path to a shared library or an object "
                    f"with a so_path attribute, got {type(module).__name__}")


def register_ffi_target(target_name: str, module, func_name: str, *, platform: str = "CUDA", replace: bool = False,
                        content_id: str | None = None) -> None:
    """Register the FFI handler ``func_name`` of a shared library as XLA custom-call target ``target_name``.

    Args:
        target_name: the name ``jax.ffi.ffi_call`` will use.
        module: the library: a ``ctypes.CDLL``, a path to a ``.so``, or an object
            with a ``so_path`` attribute (as brainevent's ``CompiledModule``).
        func_name: the exported handler symbol.
        platform: ``"CUDA"`` (default, as brainevent), ``"ROCM"`` or ``"cpu"``
            (also ``"gpu"`` for CUDA and ``"host"`` for cpu).
        replace: accepted for brainevent's signature.  XLA keeps one handler
            per name for the life of the process and refuses another one, so
            a name cannot be given a new handler either way: register the new
            handler under a new name (a version suffix, say).
        content_id: an identifier of the handler's code: registering the same
            name, library symbol and ``content_id`` again is a no-op.

    Raises:
        TypeError: a name that is not a string, or a ``module`` of another kind.
        FileNotFoundError: no library at the path.
        AttributeError: the library exports no ``func_name``.
        ValueError: an unknown platform.
        evjax.errors.KernelRegistrationError: ``target_name`` is registered
            already with another handler or platform.

    Example:
        >>> evjax.register_ffi_target("my_fill", "./libmykernels.so", "my_fill_handler", platform="cpu")
        >>> y = jax.ffi.ffi_call("my_fill", jax.ShapeDtypeStruct((4,), jnp.float32))()
    """
    for name, value in (("target_name", target_name), ("func_name", func_name)):
        if not isinstance(value, str) or not value:
            raise TypeError(f"register_ffi_target: {name} must be a non-empty string, got {value!r}")
    key = _PLATFORMS.get(str(platform).lower())
    if key is None:
        raise ValueError(f"register_ffi_target: platform must be 'CUDA', 'ROCM' or 'cpu', got {platform!r}")
    library = _library(module)
    try:
        symbol = getattr(library, func_name)
    except AttributeError:
        raise AttributeError(f"register_ffi_target: the library exports no symbol {func_name!r}") from None
    address = ctypes.cast(symbol, ctypes.c_void_p).value
    with _lock:
        known = _registered.get(target_name)
        if known is not None and known[:3] == (key, address, content_id):
            return
        if known is not None:
            raise KernelRegistrationError(
                f"register_ffi_target: target {target_name!r} is registered already (on {known[0]}) with another "
                f"handler; XLA keeps one handler per name for the life of the process (replace={replace} cannot "
                f"change that): register the new handler under a new name")
        jax.ffi.register_ffi_target(target_name, jax.ffi.pycapsule(address), platform=key)
        _registered[target_name] = (key, address, content_id, library)


def list_registered_targets() -> list[str]:
    """The target names registered through :func:`register_ffi_target` in this process, sorted.

    Example:
        >>> evjax.list_registered_targets()
        ['my_fill']
    """
    with _lock:
        return sorted(_registered)

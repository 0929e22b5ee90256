"""evjax's on-disk cache folder: where it is, moving it, emptying it (brainevent's names).

The folder (``$EVJAX_CACHE_DIR``, else ``$XDG_CACHE_HOME/evjax``, else
``~/.cache/evjax``) holds:

* ``handlers/``: the generated FFI handler modules (``_evjax_handler_<digest>.py``)
  and, unless ``NUMBA_CACHE_DIR`` is set, Numba's cache of their machine code
  (``handlers/__pycache__``);
* ``warp/``: Warp's kernel cache, unless ``EVJAX_WARP_CACHE_DIR`` or
  ``warp.config.kernel_cache_dir`` chose another folder.

Numba caches the kernels themselves (evjax's and yours) beside their source
files or in ``NUMBA_CACHE_DIR``: not here.

The folder is read each time evjax writes a handler module, so
:func:`set_cache_dir` applies to every handler compiled after it.  Handlers
this process already loaded stay in memory and keep working; Warp's folder is
fixed the first time evjax initialises Warp in the process, so set the cache
folder before the first Warp kernel runs (or set ``EVJAX_CACHE_DIR`` before
starting Python).
"""
from __future__ import annotations

import os
import pathlib

from .backends import ffi_core

__all__ = ["set_cache_dir", "get_cache_dir", "clear_cache"]

_PARTS = ("handlers", "warp")


def set_cache_dir(path: str | pathlib.Path) -> None:
    """Use the folder ``path`` as evjax's cache from now on (it is created if missing).

    Sets ``EVJAX_CACHE_DIR`` in this process's environment (child processes
    inherit it).  Handler modules compiled after the call are written there;
    those already loaded are not moved, and Warp's kernel cache moves only if
    Warp was not initialised yet (see :mod:`evjax.cache`).

    Args:
        path: the folder, absolute or relative to the current directory.

    Raises:
        TypeError: ``path`` is not a string or a path.
        ValueError: ``path`` is empty.

    Example:
        >>> evjax.set_cache_dir("/tmp/evjax-cache")
        >>> evjax.get_cache_dir()
        '/tmp/evjax-cache'
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"set_cache_dir: path must be a str or a path, got {type(path).__name__} {path!r}")
    path = os.fspath(path)
    if not path:
        raise ValueError("set_cache_dir: path must not be empty")
    os.environ["EVJAX_CACHE_DIR"] = os.path.abspath(os.path.expanduser(path))
    ffi_core.cache_dir()  # creates it where it can


def get_cache_dir() -> str:
    """The folder evjax caches generated code in (see :mod:`evjax.cache`).

    Example:
        >>> print(evjax.get_cache_dir())   # ~/.cache/evjax unless EVJAX_CACHE_DIR says otherwise
    """
    return ffi_core.cache_dir()


def _files_of(name: str | None, root: str) -> list[str]:
    """The files :func:`clear_cache` removes for ``name``."""
    if name is None or name in _PARTS:
        top = root if name is None else os.path.join(root, name)
        return [os.path.join(folder, f) for folder, _, files in os.walk(top) for f in files]
    handlers = os.path.join(root, "handlers")
    found = [os.path.join(handlers, f) for f in (f"{name}.py",) if os.path.isfile(os.path.join(handlers, f))]
    numba_cache = os.path.join(handlers, "__pycache__")
    if os.path.isdir(numba_cache):  # Numba names its files <module>.<function>-<line>.py<ver>.nbi/.nbc
        found += [os.path.join(numba_cache, f) for f in os.listdir(numba_cache) if f.startswith(f"{name}.")]
    return found


def _remove_empty_folders(top: str, root: str) -> None:
    for folder, _, _ in sorted(os.walk(top), key=lambda entry: -len(entry[0])):
        if folder != root:
            try:
                os.rmdir(folder)
            except OSError:  # not empty, or already gone
                pass


def clear_cache(name: str | None = None) -> int:
    """Delete cached files from evjax's cache folder; return how many were deleted.

    The next call of an op whose handler was deleted, in a new process,
    writes and compiles it again (seconds instead of milliseconds); handlers
    this process already loaded keep running from memory.

    Args:
        name: ``None`` empties the whole folder; ``"handlers"`` or ``"warp"``
            one part of it; any other string is a handler module name
            (``"_evjax_handler_<digest>"``): its file and Numba's cache of it.

    Returns:
        The number of files deleted (0 when there was nothing to delete).

    Raises:
        TypeError: ``name`` is not a string or ``None``.
        ValueError: ``name`` is empty or holds a path separator.

    Example:
        >>> n = evjax.clear_cache()          # everything
        >>> n = evjax.clear_cache("warp")    # Warp's kernel cache only
    """
    if name is not None and not isinstance(name, str):
        raise TypeError(f"clear_cache: name must be a string or None, got {type(name).__name__} {name!r}")
    if name is not None and (not name or os.sep in name or (os.altsep and os.altsep in name) or name in (".", "..")):
        raise ValueError(f"clear_cache: name must be 'handlers', 'warp' or a handler module name, got {name!r}")
    root = get_cache_dir()
    removed = 0
    for path in _files_of(name, root):
        try:
            os.remove(path)
            removed += 1
        except FileNotFoundError:  # removed meanwhile
            pass
    if name is None or name in _PARTS:
        _remove_empty_folders(root if name is None else os.path.join(root, name), root)
    return removed

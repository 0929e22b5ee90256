"""What evjax does when a disk cache is corrupted or cannot be written (imports neither Numba nor Warp).

evjax reads three disk caches: Numba's (``.nbi``/``.nbc`` files), its own
handler modules (``<evjax cache>/handlers``) and Warp's kernel cache.  An entry
that fails to load is deleted (that entry only) and rebuilt, with one line
through the ``"evjax"`` logger at WARNING (:func:`discarded`); a cache folder
that cannot be written gives one line per folder and process
(:func:`unwritable`), and evjax then compiles in memory.  The Numba and Warp
sides of this live in :mod:`evjax._kernel_compat`, the handler modules in
:mod:`evjax.backends.ffi_core`.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading

__all__ = ["logger", "compiling", "in_scope", "in_memory_filename", "is_in_memory", "remove", "discarded",
           "unwritable", "MemoryLocator", "guard_cache_methods"]

logger = logging.getLogger("evjax")
_IN_MEMORY = "<evjax in-memory module "
_scope = threading.local()
_unwritable: set[str] = set()
_lock = threading.Lock()


@contextlib.contextmanager
def compiling():
    """Within the block this thread compiles for evjax: every Numba cache entry it reads (a
    user's kernel called by a handler too) is guarded, and the functions it declares (a handler
    module's) are located by evjax (see :func:`evjax._kernel_compat.stamp_kernel_caches`)."""
    depth = getattr(_scope, "depth", 0)
    _scope.depth = depth + 1
    try:
        yield
    finally:
        _scope.depth = depth


def in_scope() -> bool:
    """Whether this thread is inside :func:`compiling`."""
    return getattr(_scope, "depth", 0) > 0


def in_memory_filename(name: str) -> str:
    """The file name to compile a module's source under when it cannot be written to disk:
    Numba then compiles its functions (``cache=True`` or not) in memory only."""
    return f"{_IN_MEMORY}{name}>"


def is_in_memory(filename) -> bool:
    """Whether ``filename`` was made by :func:`in_memory_filename`."""
    return str(filename).startswith(_IN_MEMORY)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def remove(path: str) -> str:
    """Delete the file ``path`` if it can be; return ``path``."""
    with contextlib.suppress(OSError):
        os.remove(path)
    return path


def discarded(what: str, exc: BaseException | None = None) -> None:
    """Log that the cache entry ``what`` (its files) failed to load, was deleted and is being rebuilt."""
    why = f" ({_one_line(exc)})" if exc is not None else ""
    logger.warning("evjax: discarded the corrupted cache entry %s%s; rebuilding it", what, why)


def unwritable(folder: str, exc: BaseException) -> None:
    """Log, once per process for ``folder`` and what is inside it, that the cache folder cannot
    be written and that evjax compiles in memory instead."""
    folder = os.path.abspath(folder)
    with _lock:
        if any(os.path.commonpath([folder, done]) == done for done in _unwritable):
            return
        _unwritable.add(folder)
    logger.warning("evjax: cannot write to the cache folder %s (%s); compiling in memory, nothing is cached",
                   folder, _one_line(exc))


class MemoryLocator:
    """A Numba cache locator (Numba's ``_CacheLocator`` interface) without a folder: the guarded
    cache methods (:func:`guard_cache_methods`) load and save nothing for it."""

    _evjax_memory = _evjax_guarded = True

    def __init__(self, py_func, py_file):
        self._py_file, self._lineno = str(py_file), py_func.__code__.co_firstlineno

    def ensure_cache_path(self):
        raise OSError(f"{self._py_file} is compiled in memory")

    def get_cache_path(self):
        return os.path.join(os.devnull, "evjax-in-memory")  # never a folder

    def get_source_stamp(self):
        return self._py_file

    def get_disambiguator(self):
        return str(self._lineno)


def guard_cache_methods(numba_load, numba_save, locator_of, discard):
    """Numba's ``Cache.load_overload`` and ``Cache.save_overload``, guarded for evjax.

    The guard applies to a cache whose locator (``locator_of(cache)``) is
    evjax's (``_evjax_guarded``) and to any cache used within
    :func:`compiling`.  A load that fails (a truncated or garbled ``.nbi`` or
    ``.nbc`` file: ``UnpicklingError``, ``EOFError``, a failed rebuild of the
    machine code...) deletes that entry (``discard(cache, sig, target_context)``
    returns the broken file, or None when the cache's files read fine and the
    error is re-raised), logs one line and reads as a miss, so Numba compiles
    and saves the entry afresh.  A save that cannot write logs one line per
    folder and keeps the compiled code in memory.  A :class:`MemoryLocator`'s
    cache loads and saves nothing.
    """

    def flag(cache, name: str) -> bool:
        return bool(getattr(locator_of(cache), name, False))

    def load_overload(self, sig, target_context):
        if flag(self, "_evjax_memory"):
            return None
        if not (flag(self, "_evjax_guarded") or in_scope()):
            return numba_load(self, sig, target_context)
        try:
            return numba_load(self, sig, target_context)
        except Exception as exc:  # noqa: BLE001 - an entry that does not load is corrupted
            broken = discard(self, sig, target_context)
            if broken is None:
                raise
            discarded(broken, exc)
            return None

    def save_overload(self, sig, data):
        if flag(self, "_evjax_memory"):
            return None
        if not (flag(self, "_evjax_guarded") or in_scope()):
            return numba_save(self, sig, data)
        try:
            return numba_save(self, sig, data)
        except OSError as exc:
            unwritable(str(self.cache_path), exc)
            return None

    load_overload._evjax_guard = save_overload._evjax_guard = True
    return load_overload, save_overload

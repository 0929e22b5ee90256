"""Which backend evjax ops run on: per call, per block of code, or globally.

The order in which an op's backend is decided, for the platform it is lowered
on (``"cpu"`` or ``"gpu"``):

1. ``backend=`` passed to the call;
2. the innermost :func:`use_backend` block around the code that traced the op;
3. :func:`set_backend`;
4. the op's default for the platform (:attr:`evjax.XLACustomKernel.defaults`);
5. the op's pure-JAX reference.

A per-call ``backend=`` must name a backend the op has on that platform.  A
block or global choice applies to the ops that have that backend on that
platform; the others keep their default.  An unknown name is an error at once.

Both choices live in JAX's own configuration state, which is part of
``jax.jit``'s cache key: a jitted function called under another choice is
retraced (and compiled once per choice), and a choice made inside a traced
function applies to the ops traced after it.  No cache is ever cleared.  The
state is registered with JAX when a choice is first made (which makes
functions jitted before that retrace once), not by ``import evjax``.
``EVJAX_BACKEND=<name>`` in the environment sets the global choice at start-up.
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator

from . import _compat, registry

__all__ = ["set_backend", "use_backend", "get_backend", "choices_snapshot", "defaults_changed"]

ALL_PLATFORMS = "*"

_lock = threading.Lock()
_MISSING = object()
_states: tuple | None = None  # (global state, block state), made on first use


def _get_states() -> tuple:
    """The two JAX config states, made on first use.

    Registering a state that is part of jit's cache key changes every key, so
    functions jitted before would be retraced: it is done when a choice is
    first made (or at import when ``EVJAX_BACKEND`` is set), never by
    ``import evjax`` alone.
    """
    global _states
    with _lock:
        if _states is None:
            # (generation, ((platform, backend), ...)): set_backend's choices; the generation counts
            # changes of op defaults (XLACustomKernel.set_default), so that they retrace too.
            global_state = _compat.trace_state(
                "evjax_backend", (0, ()),
                "evjax: the backend chosen with evjax.set_backend (or EVJAX_BACKEND=<name>), for every op that "
                "has it.",
            )
            # ((platform, backend), ...), innermost use_backend block first.
            block_state = _compat.trace_state(
                "evjax_backend_block", (), "evjax: the backends chosen with evjax.use_backend blocks, innermost first."
            )
            _states = (global_state, block_state)
        return _states


def _global_value() -> tuple[int, tuple]:
    if _states is None:
        return 0, ()
    value = _states[0].get_global()
    if isinstance(value, str):  # from the environment: EVJAX_BACKEND=<name>
        value = (0, () if value in ("", "none", "default")
                 else ((ALL_PLATFORMS, registry.canonical_backend_name(value)),))
    return value


def _block_value() -> tuple:
    return () if _states is None else tuple(_states[1].value)


def _platform(platform) -> str:
    if platform is None or platform == ALL_PLATFORMS:
        return ALL_PLATFORMS
    return registry.platform_of(platform, who="evjax.config")


def set_backend(platform_or_backend: str | None, backend=_MISSING) -> None:
    """Choose the backend of every op that has it, for code traced from now on.

    Two forms: ``set_backend(backend)`` for every platform (replacing any
    choice made per platform), and, as in brainevent,
    ``set_backend(platform, backend)`` for one platform (``"cpu"`` or
    ``"gpu"``), which comes before the choice for every platform.  ``None`` as
    the backend removes the choice, so ops go back to their defaults.

    Args:
        platform_or_backend: a backend name (``"numba"``, ``"warp"``,
            ``"numba_cuda"``, ``"reference"``, or one an op registered), or a
            platform when ``backend`` is given.
        backend: the backend for that platform.

    Raises:
        ValueError: an unknown backend or platform name.

    Example:
        >>> evjax.config.set_backend("gpu", "numba_cuda")
        >>> evjax.config.set_backend(None)            # back to each op's default
    """
    if backend is _MISSING:
        platform, backend = ALL_PLATFORMS, platform_or_backend
    else:
        platform = _platform(platform_or_backend)
    backend = registry.check_backend_name(backend, who="evjax.set_backend")
    global_state, _ = _get_states()
    with _lock:
        generation, entries = _global_value()
        if platform == ALL_PLATFORMS:
            kept = ()
        else:
            kept = tuple(e for e in entries if e[0] != platform)
        new = kept if backend is None else kept + ((platform, backend),)
        # a platform's own choice first, then the one for all platforms
        new = tuple(sorted(new, key=lambda e: e[0] == ALL_PLATFORMS))
        global_state._set((generation, new))


@contextlib.contextmanager
def use_backend(backend: str | None, platform: str | None = None) -> Iterator[None]:
    """Within the block, ops traced without ``backend=`` use ``backend`` where they have it.

    The choice is part of ``jax.jit``'s cache key: a function first jitted
    inside the block is retraced when called after it, and the other way round.

    Args:
        backend: a backend name, or ``None`` for each op's default (ignoring
            :func:`set_backend`) inside the block.
        platform: limit the choice to ``"cpu"`` or ``"gpu"`` (default: both).

    Raises:
        ValueError: an unknown backend or platform name.

    Example:
        >>> with evjax.use_backend("reference"):
        ...     y = jax.jit(f)(x)        # f's evjax ops run their pure-JAX reference
    """
    entry = (_platform(platform), registry.check_backend_name(backend, who="evjax.use_backend"))
    _, block_state = _get_states()
    with block_state((entry,) + _block_value()):
        yield


def _entries() -> tuple:
    """Every choice in force, the innermost first: blocks, then set_backend's."""
    return _block_value() + _global_value()[1]


def _first(entries: tuple, platform: str) -> str | None:
    for entry_platform, backend in entries:
        if entry_platform in (platform, ALL_PLATFORMS):
            return backend
    return None


def get_backend(platform: str = "cpu") -> str | None:
    """The backend chosen by :func:`use_backend` or :func:`set_backend` for ``platform``, if any."""
    return _first(_entries(), _platform(platform))


def choices_snapshot() -> tuple:
    """The choice in force per platform, as ops record it when they are traced.

    Returns:
        ``()`` when nothing is chosen, else ``(("cpu", name_or_None), ("gpu", name_or_None))``.
        Rules pass it on to the ops they bind, so a gradient uses the choice
        in force where the forward op was traced.
    """
    entries = _entries()
    if not entries:
        return ()
    return tuple((p, _first(entries, p)) for p in registry.PLATFORMS)


def defaults_changed() -> None:
    """Record that an op's default backend changed: jitted functions retrace on their next call."""
    global_state, _ = _get_states()
    with _lock:
        generation, entries = _global_value()
        global_state._set((generation + 1, entries))


if os.environ.get("EVJAX_BACKEND"):
    if os.environ["EVJAX_BACKEND"] not in ("none", "default"):
        registry.check_backend_name(os.environ["EVJAX_BACKEND"], who="EVJAX_BACKEND")
    _get_states()

"""Global and context-local choice of backend for :class:`XLACustomKernel` ops."""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator

_state = threading.local()
_global_backend: str | None = None


def set_backend(backend: str | None) -> None:
    """Set the backend every op uses unless a call passes ``backend=``.

    Args:
        backend: a backend name (``"numba"``, ``"warp"``, ``"numba_cuda"``,
            ``"reference"``) or ``None`` to go back to each op's defaults.
    """
    global _global_backend
    _global_backend = backend


def get_backend() -> str | None:
    """The backend chosen by :func:`use_backend` or :func:`set_backend`, if any."""
    stack = getattr(_state, "stack", None)
    if stack:
        return stack[-1]
    return _global_backend


@contextlib.contextmanager
def use_backend(backend: str | None) -> Iterator[None]:
    """Within the block, ops bound (traced) without ``backend=`` use ``backend``.

    The choice is made when an op is traced, so it is part of ``jax.jit``'s
    cache key: ``with use_backend("reference"): f(x)`` retraces ``f``.
    """
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = []
    stack.append(backend)
    try:
        yield
    finally:
        stack.pop()

"""Backend names, the libraries they need, and the lazy loading of backend modules.

A *backend* is a named way of running an op on a platform (``"cpu"`` or
``"gpu"``): ``"numba"``, ``"warp"``, ``"numba_cuda"``, a name an op author
registers with :meth:`evjax.XLACustomKernel.def_kernel`, or ``"reference"``
(the op's pure-JAX implementation, available everywhere).

The built-in backends need a library.  Whether it is installed is answered
without importing it (``importlib.util.find_spec``), so asking costs no import
and ``import evjax`` never loads Warp or ``numba.cuda``.

An operator family declares its backend modules (``<package>.<backend>``); the
op imports one the first time it needs that backend, and the module registers
its kernels on import.  Nothing here imports an op.
"""
from __future__ import annotations

import dataclasses

import importlib.util
import threading

from .errors import BackendNotAvailableError

__all__ = [
    "BackendChoice",
    "REFERENCE",
    "PLATFORMS",
    "platform_of",
    "note_backend_name",
    "known_backend_names",
    "check_backend_name",
    "canonical_backend_name",
    "BACKEND_ALIASES",
    "missing_library",
    "default_rank",
]

REFERENCE = "reference"
PLATFORMS = ("cpu", "gpu")
_PLATFORM_ALIASES = {"cpu": "cpu", "gpu": "gpu", "cuda": "gpu", "rocm": "gpu"}

# backend -> (module that must be importable, how to install it)
_LIBRARIES = {
    "numba": ("numba", "pip install numba"),
    "warp": ("warp", "pip install 'evjax[warp]' (warp-lang)"),
    "numba_cuda": ("numba.cuda", "pip install 'evjax[cuda]' (numba-cuda)"),
}

# brainevent's names of its pure-JAX implementation: accepted as names of the reference, so that a
# brainevent user's ``backend="jax_raw"`` runs (canonical_backend_name maps them where a name enters)
BACKEND_ALIASES = {"jax_raw": REFERENCE, "jax": REFERENCE}

_lock = threading.Lock()
_known: set[str] = {REFERENCE, *_LIBRARIES}
_missing: dict[str, str | None] = {}


@dataclasses.dataclass(frozen=True)
class BackendChoice:
    """What an op's lowering is told about the backend: the one value the resolver reads.

    Every bound op carries one as its ``backend`` parameter; rules pass it on
    to the ops they bind, so a gradient runs where its forward was chosen to.

    Attributes:
        per_call: the name passed as ``backend=`` to the call, or ``None``.
        in_force: the :func:`evjax.use_backend` / :func:`evjax.set_backend`
            choices when the op was bound, ``((platform, name or None), ...)``.
    """

    per_call: str | None = None
    in_force: tuple = ()

    def __repr__(self) -> str:  # short, for jaxprs
        if self.per_call is not None:
            return f"BackendChoice({self.per_call!r})"
        chosen = ", ".join(f"{p}={n!r}" for p, n in self.in_force if n is not None)
        return f"BackendChoice({chosen})"


def platform_of(name: str, *, who: str = "evjax") -> str:
    """The platform ``"cpu"`` or ``"gpu"`` for a platform name (``"cuda"`` and ``"rocm"`` are ``"gpu"``).

    Raises:
        TypeError: ``name`` is not a string.
        ValueError: an unknown platform name.
    """
    if not isinstance(name, str):
        raise TypeError(f"{who}: a platform is a string, one of {PLATFORMS}; got {type(name).__name__} {name!r}")
    platform = _PLATFORM_ALIASES.get(name)
    if platform is None:
        raise ValueError(f"{who}: unknown platform {name!r}; use one of {PLATFORMS}")
    return platform


def note_backend_name(name: str) -> None:
    """Remember a backend name registered by some op (so that choosing it is not an error)."""
    with _lock:
        _known.add(name)


def known_backend_names() -> list[str]:
    """Every backend name evjax knows: the built-in ones, ``"reference"`` and those ops registered."""
    with _lock:
        return sorted(_known)


def canonical_backend_name(name):
    """``name``, with brainevent's names of the reference (``"jax"``, ``"jax_raw"``) as ``"reference"``."""
    return BACKEND_ALIASES.get(name, name) if isinstance(name, str) else name


def check_backend_name(name, *, who: str) -> str | None:
    """Raise unless ``name`` is a backend some op has, one of :data:`BACKEND_ALIASES`, or ``None``.

    Returns:
        ``name`` as :func:`canonical_backend_name` gives it: the name to record.

    Raises:
        TypeError: ``name`` is not a string.
        BackendNotAvailableError: (a ``ValueError``) no op has a backend of
            that name; the message lists the known ones.
    """
    if name is None:
        return None
    if not isinstance(name, str):
        raise TypeError(f"{who}: a backend name is a string, got {type(name).__name__} {name!r}")
    canonical = canonical_backend_name(name)
    if canonical not in _known:
        raise BackendNotAvailableError(
            f"{who}: unknown backend {name!r}; known backends: {', '.join(known_backend_names())}"
            f" (and brainevent's {', '.join(map(repr, BACKEND_ALIASES))} for {REFERENCE!r})"
        )
    return canonical


def missing_library(backend: str) -> str | None:
    """Why ``backend`` cannot run here (its library is not installed), or ``None`` if it can.

    Backends without a library of their own (the reference, names registered by
    op authors) are always available.  The answer is cached.
    """
    if backend not in _LIBRARIES:
        return None
    if backend not in _missing:
        module, install = _LIBRARIES[backend]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        _missing[backend] = None if found else f"{module} is not installed ({install})"
    return _missing[backend]


def default_rank(platform: str, backend: str) -> int:
    """Where ``backend`` stands among an op's default candidates on ``platform`` (lower first).

    Warp's CPU kernels run on one thread, so on CPU Warp is the default only
    when the op has no other CPU candidate.  Otherwise registration order rules.
    """
    return 1 if (platform, backend) == ("cpu", "warp") else 0

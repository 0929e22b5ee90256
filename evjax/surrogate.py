"""Surrogate derivatives of the Heaviside step, for training spiking networks.

The forward of a spike is the step ``H(x) = 1 if x >= 0 else 0``, whose true
derivative is zero almost everywhere.  Gradient-based training replaces
``H'(x)`` by a smooth bump ``g(x)`` whose sharpness is set by ``alpha``:

==========================  ================================================  =======
name                        ``g(x)``                                          alpha
==========================  ================================================  =======
``"sigmoid"``               ``alpha * s * (1 - s)``, ``s = sigmoid(alpha x)``  4.0
``"fast_sigmoid"``          ``1 / (1 + alpha |x|)**2`` (SuperSpike)            10.0
``"arctan"``                ``(alpha / 2) / (1 + (pi/2 * alpha * x)**2)``       2.0
``"triangle"``              ``alpha * max(0, 1 - alpha |x|)``                   1.0
``"box"``                   ``alpha / 2`` where ``alpha |x| < 1``, else 0      1.0
``"clipped_fast_sigmoid"``  ``1 / (1 + alpha |x|)**2`` where ``|x| < width``   10.0
==========================  ================================================  =======

``sigmoid``, ``arctan``, ``triangle`` and ``box`` integrate to 1 (they are
derivatives of a smoothed step); ``fast_sigmoid`` peaks at 1, as in SuperSpike
(Zenke and Ganguli, 2018).  Larger ``alpha`` means a narrower, taller bump.

``triangle``, ``box`` and ``clipped_fast_sigmoid`` have compact support: their
derivative is exactly 0 for ``|x| >= width``, so a neuron far from threshold
passes no gradient at all (the sparsity a sparse backward pass can skip).
``width`` is the half-width of the band: ``1 / alpha`` for ``triangle`` and
``box`` (a ``width`` given sets ``alpha = 1 / width``), and its own parameter
for ``clipped_fast_sigmoid`` (default ``3 / alpha``, where the bump has fallen
to 1/16 of its peak).  The trade-off: a narrower band gives more exact zeros
(less backward work) but fewer neurons that learn at each step; the smooth
surrogates give every neuron some gradient.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["SURROGATES", "DEFAULT_ALPHA", "COMPACT", "Surrogate", "resolve_surrogate", "band_width",
           "surrogate_grad", "smooth_step"]

SURROGATES = ("sigmoid", "fast_sigmoid", "arctan", "triangle", "box", "clipped_fast_sigmoid")
DEFAULT_ALPHA = {"sigmoid": 4.0, "fast_sigmoid": 10.0, "arctan": 2.0, "triangle": 1.0, "box": 1.0,
                 "clipped_fast_sigmoid": 10.0}
COMPACT = ("triangle", "box", "clipped_fast_sigmoid")  # exact zeros outside |x| < width
_ALIASES = {"superspike": "fast_sigmoid", "fastsigmoid": "fast_sigmoid", "atan": "arctan", "rectangle": "box"}


class Surrogate(NamedTuple):
    """A surrogate choice: a name from :data:`SURROGATES` and its ``alpha``.

    It is hashable, so it can travel as a static parameter of a primitive.

    Attributes:
        name: one of :data:`SURROGATES`.
        alpha: the sharpness (``None``: the surrogate's default).
        width: the half-width of a compact surrogate's band (``None``: its
            default; see the module docstring); only for :data:`COMPACT` ones.

    Example:
        >>> s = evjax.Surrogate("arctan", alpha=2.0)
        >>> spikes = evjax.spike(v - 1.0, surrogate=s)
        >>> band = evjax.Surrogate("clipped_fast_sigmoid", alpha=10.0, width=0.3)
    """

    name: str = "fast_sigmoid"
    alpha: float | None = None
    width: float | None = None


def resolve_surrogate(surrogate: str | Surrogate = "fast_sigmoid", alpha: float | None = None) -> Surrogate:
    """Validate and normalise a surrogate choice.

    Args:
        surrogate: a name from :data:`SURROGATES` (aliases ``"superspike"``,
            ``"atan"``) or a :class:`Surrogate`.
        alpha: the sharpness; ``None`` takes the surrogate's default (or the
            ``alpha`` of a :class:`Surrogate` argument).

    Returns:
        A :class:`Surrogate` with a canonical name and a positive float alpha.

    Raises:
        ValueError: unknown name, or ``alpha`` not a finite positive number.
        TypeError: ``surrogate`` is neither a string nor a :class:`Surrogate`.
    """
    width = None
    if isinstance(surrogate, Surrogate):
        name, alpha, width = surrogate.name, surrogate.alpha if alpha is None else alpha, surrogate.width
    elif isinstance(surrogate, str):
        name = surrogate
    else:
        raise TypeError(
            f"surrogate must be a name from {SURROGATES} or an evjax.Surrogate, got "
            f"{type(surrogate).__name__} {surrogate!r}"
        )
    key = name.lower().replace("-", "_")
    key = _ALIASES.get(key, key)
    if key not in SURROGATES:
        raise ValueError(f"unknown surrogate {name!r}; choose one of {SURROGATES} (or 'superspike', 'atan')")
    if width is not None:
        if key not in COMPACT:
            raise ValueError(f"surrogate {key!r} has no band: width is for the compact surrogates {COMPACT}")
        width = _positive(width, "width")
        if key in ("triangle", "box"):
            alpha, width = 1.0 / width, None  # their band is |x| < 1 / alpha
    alpha = _positive(DEFAULT_ALPHA[key] if alpha is None else alpha, "alpha")
    if key == "clipped_fast_sigmoid":
        width = 3.0 / alpha if width is None else width
    return Surrogate(key, alpha, width)


def band_width(surrogate: str | Surrogate, alpha: float | None = None) -> float | None:
    """The half-width of a surrogate's band: ``g(x) = 0`` for ``|x| >= band_width`` (None: no band).

    Example:
        >>> evjax.surrogate.band_width("triangle", alpha=4.0)
        0.25
    """
    name, a, width = resolve_surrogate(surrogate, alpha)
    if name in ("triangle", "box"):
        return 1.0 / a
    return width


def _positive(value, name: str) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"surrogate {name} must be a Python number, got {type(value).__name__}") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"surrogate {name} must be a finite positive number, got {value}")
    return value


def surrogate_grad(x: jax.Array, surrogate: str | Surrogate = "fast_sigmoid", alpha: float | None = None) -> jax.Array:
    """The surrogate derivative ``g(x)`` that replaces ``H'(x)`` (see the module table).

    Args:
        x: distance to threshold (``v - v_th``), any shape, floating dtype.
        surrogate: the surrogate's name or a :class:`Surrogate`.
        alpha: its sharpness (``None``: default).

    Returns:
        ``g(x)``, same shape and dtype as ``x``.

    Example:
        >>> evjax.surrogate_grad(jnp.array([0.0, 1.0]), "fast_sigmoid")   # its peak is at x = 0
    """
    name, a, width = resolve_surrogate(surrogate, alpha)
    x = jnp.asarray(x)
    if name == "sigmoid":
        s = jax.nn.sigmoid(a * x)
        g = a * s * (1.0 - s)
    elif name == "fast_sigmoid":
        g = 1.0 / jnp.square(1.0 + a * jnp.abs(x))
    elif name == "arctan":
        g = (a / 2.0) / (1.0 + jnp.square((math.pi / 2.0) * a * x))
    elif name == "triangle":
        g = a * jnp.maximum(0.0, 1.0 - a * jnp.abs(x))
    elif name == "box":
        g = jnp.where(a * jnp.abs(x) < 1.0, a / 2.0, 0.0)
    else:  # clipped_fast_sigmoid
        g = jnp.where(jnp.abs(x) < width, 1.0 / jnp.square(1.0 + a * jnp.abs(x)), 0.0)
    return g.astype(x.dtype)


def smooth_step(x: jax.Array, surrogate: str | Surrogate = "fast_sigmoid", alpha: float | None = None) -> jax.Array:
    """The Heaviside forward with the surrogate derivative, in plain ``jax.numpy``.

    A ``jax.custom_jvp`` version of :func:`evjax.spike`, used as its dense
    reference in the tests and handy in models that avoid custom kernels.
    """
    choice = resolve_surrogate(surrogate, alpha)

    @jax.custom_jvp
    def step(x):
        return (x >= 0).astype(x.dtype)

    @step.defjvp
    def _(primals, tangents):
        (x,), (t,) = primals, tangents
        return step(x), surrogate_grad(x, choice) * t

    return step(jnp.asarray(x))

"""Neuron ops: spike, LIF step, exponential trace, spike detection.

Every op is a few ``jax.numpy`` expressions, so XLA fuses it with the
membrane update around it: a jitted step is one loop over the neurons, with
no custom call and no kernel to compile.  The Heaviside step of ``spike``,
``lif_step`` and ``detect_spikes`` has a :func:`jax.custom_jvp` whose
derivative is a surrogate ``g`` (see :mod:`evjax.surrogate`); its tangent
maths is written next to each rule.  ``exp_trace`` is linear and
differentiable as it is, so JAX's own derivative is the exact one.
``jax.vmap`` batches the expressions: one fused loop on the batched array.

``backend=``: the ops once ran as Numba (CPU) and Warp/Numba CUDA kernels;
``benchmarks/neuron_ops.py`` measured the fused pure-JAX step faster, so the
kernels are gone.  ``backend`` stays in the signatures for compatibility
and takes ``None`` or ``"reference"``, both this pure-JAX implementation;
any other name raises :class:`evjax.errors.BackendNotAvailableError` saying
to drop the argument.  :func:`evjax.set_backend` and :func:`evjax.use_backend`
do not apply to these ops (they have no backends).

Operands that may be a scalar or an array (``decay``, ``v_th``, ``v_rest``)
are kept as shape ``()`` when scalar, and broadcast by XLA inside the fused
loop.  Spikes are floats (0.0 / 1.0) of the membrane's dtype, so they carry
surrogate gradients and serve directly as events for the CSR ops.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ... import _compat
from ...errors import BackendNotAvailableError
from ...registry import canonical_backend_name
from ...surrogate import Surrogate, resolve_surrogate, surrogate_grad

__all__ = ["spike", "lif_step", "exp_trace", "detect_spikes"]

# The kernels these ops had before they became pure JAX (benchmarks/neuron_ops.py compares them).
_REMOVED_BACKENDS = ("numba", "warp", "numba_cuda")


# ---------------------------------------------------------------------------
# shared helpers
# ---------------------------------------------------------------------------
def _check_backend(who: str, backend) -> None:
    """Accept ``None`` and ``"reference"`` (the pure-JAX ops); raise, naming the fix, for anything else."""
    if backend is None:
        return
    if not isinstance(backend, str):
        raise TypeError(f"{who}: backend is None or 'reference', got {type(backend).__name__} {backend!r}")
    if canonical_backend_name(backend) == "reference":  # brainevent's "jax"/"jax_raw" included
        return
    if backend in _REMOVED_BACKENDS:
        raise BackendNotAvailableError(
            f"{who}: backend={backend!r} no longer exists: the neuron ops are pure JAX, which XLA fuses with "
            f"the code around them (see benchmarks/results/neuron_ops.md). Drop the backend= argument (or pass "
            f"backend='reference'); the results agree up to rounding."
        )
    raise BackendNotAvailableError(
        f"{who}: unknown backend {backend!r}; the neuron ops are pure JAX and take backend=None or 'reference'"
    )


def _reject_complex(who: str, **operands) -> None:
    """Raise TypeError for a complex operand (casting it to float would silently drop its imaginary part)."""
    for name, x in operands.items():
        if np.iscomplexobj(x):
            raise TypeError(
                f"{who}: {name} is complex ({getattr(x, 'dtype', type(x).__name__)}), which neuron ops do not "
                f"take; pass a real array, e.g. jnp.real({name}) if the imaginary part is zero"
            )


def _float_dtype(*xs) -> np.dtype:
    dtype = jnp.result_type(*xs)
    return np.dtype(dtype) if jnp.issubdtype(dtype, jnp.floating) else np.dtype(jnp.float32)


def _static_float(name: str, value, *, positive: bool = False) -> float:
    """A static parameter as a Python float, with a clear error otherwise."""
    if isinstance(value, _compat.Tracer):
        raise TypeError(
            f"{name} must be a static Python number, not a traced array. Close over it (or mark it "
            f"static in jax.jit); for thresholds that vary or are learned use detect_spikes, whose "
            f"v_th / v_rest are array operands."
        )
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def _scalar_or_full(x, shape, dtype):
    """Keep a scalar operand as shape (), else broadcast it to ``shape``."""
    x = jnp.asarray(x, dtype)
    return x if x.ndim == 0 else jnp.broadcast_to(x, shape)


# ===========================================================================
# spike
# ===========================================================================
def spike(x: jax.Array, surrogate: str | Surrogate = "fast_sigmoid", alpha: float | None = None, *,
          backend: str | None = None) -> jax.Array:
    """Heaviside spike with a surrogate derivative.

    Forward: ``1.0 where x >= 0 else 0.0`` (NaN gives 0.0).  Derivative:
    ``g(x)`` of the chosen surrogate (see :mod:`evjax.surrogate`) instead of
    the Dirac delta.

    Args:
        x: distance to threshold, any shape (integer inputs become float32).
        surrogate: ``"sigmoid"``, ``"fast_sigmoid"`` (SuperSpike), ``"arctan"``,
            ``"triangle"``, ``"box"``, ``"clipped_fast_sigmoid"`` (the last three:
            exact zeros outside a band) or an :class:`evjax.Surrogate`.
        alpha: the surrogate's sharpness (``None``: its default).
        backend: ``None`` or ``"reference"`` (the same: the op is pure JAX);
            kept for compatibility.

    Returns:
        Float spikes (0/1) of ``x``'s float dtype and shape.

    Raises:
        ValueError: unknown surrogate name or non-positive ``alpha``.
        TypeError: complex ``x``.
        evjax.errors.BackendNotAvailableError: ``backend`` other than ``None``
            or ``"reference"`` (the Numba and Warp kernels were removed).

    Example:
        >>> v = jnp.array([0.5, 1.2, 0.9])
        >>> evjax.spike(v - 1.0)                                   # [0., 1., 0.]
        >>> jax.grad(lambda v: evjax.spike(v - 1.0).sum())(v)      # the surrogate derivative
    """
    _check_backend("spike", backend)
    choice = resolve_surrogate(surrogate, alpha)
    _reject_complex("spike", x=x)
    x = jnp.asarray(x)
    x = x.astype(_float_dtype(x))
    return _spike(x, choice)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _spike(x, surrogate: Surrogate):
    return (x >= 0).astype(x.dtype)


# y = H(x), so dy = g(x) dx, with g the surrogate in place of H' (a Dirac delta).
# Linear in dx (a jnp product), so reverse mode is JAX's transpose of it: x_bar = g(x) y_bar.
@_spike.defjvp
def _spike_jvp(surrogate, primals, tangents):
    (x,), (dx,) = primals, tangents
    return _spike(x, surrogate), surrogate_grad(x, surrogate) * dx


# ===========================================================================
# lif_step
# ===========================================================================
class _LifParams(NamedTuple):
    """The static parameters of a LIF step (hashable: a nondiff argument of the custom JVP)."""

    tau: float
    dt: float
    v_th: float
    v_reset: float
    v_rest: float
    surrogate: Surrogate
    detach_reset: bool


def lif_step(v: jax.Array, i_ext: jax.Array, *, tau: float = 10.0, v_th: float = 1.0, v_reset: float = 0.0,
             dt: float = 1.0, v_rest: float | None = None, surrogate: str | Surrogate = "fast_sigmoid",
             alpha: float | None = None, detach_reset: bool = False,
             backend: str | None = None) -> tuple[jax.Array, jax.Array]:
    """One Euler step of leaky integrate-and-fire neurons, with threshold and reset.

    ``u = v + dt * (-(v - v_rest) / tau + i_ext)``; ``spikes = H(u - v_th)``;
    ``v_new = v_reset where spiking else u``.  Gradients flow through the
    surrogate: ``dv_new = (1 - s) du - (u - v_reset) g(u - v_th) du``.

    Args:
        v: membrane potentials, any shape.
        i_ext: input current, broadcastable to ``v``.
        tau: membrane time constant (> 0), same unit as ``dt``.
        v_th: firing threshold.
        v_reset: potential after a spike.
        dt: time step (> 0).
        v_rest: resting potential the leak pulls towards (default: ``v_reset``).
        surrogate: surrogate derivative of the step (see :func:`spike`).
        alpha: its sharpness (``None``: default).
        detach_reset: treat the reset as a constant in the gradient (the
            ``-(u - v_reset) g du`` term is dropped), as commonly done to
            stabilise training.
        backend: ``None`` or ``"reference"`` (the same: the op is pure JAX);
            kept for compatibility.

    Returns:
        ``(v_new, spikes)``, both of the float dtype of ``v`` and ``i_ext``.

    Raises:
        ValueError: non-positive ``tau`` or ``dt``, non-finite parameters or an
            unknown surrogate.
        TypeError: a parameter is a traced array (they are static numbers), or
            ``v`` or ``i_ext`` is complex.
        evjax.errors.BackendNotAvailableError: ``backend`` other than ``None``
            or ``"reference"``.

    Example:
        >>> v = jnp.zeros(100); i_ext = jnp.full(100, 0.3)
        >>> v, spikes = evjax.lif_step(v, i_ext, tau=10.0, v_th=1.0, dt=1.0)
    """
    _check_backend("lif_step", backend)
    _reject_complex("lif_step", v=v, i_ext=i_ext)
    tau = _static_float("lif_step: tau", tau, positive=True)
    dt = _static_float("lif_step: dt", dt, positive=True)
    v_th = _static_float("lif_step: v_th", v_th)
    v_reset = _static_float("lif_step: v_reset", v_reset)
    v_rest = v_reset if v_rest is None else _static_float("lif_step: v_rest", v_rest)
    choice = resolve_surrogate(surrogate, alpha)
    dtype = _float_dtype(v, i_ext)
    shape = jnp.broadcast_shapes(jnp.shape(v), jnp.shape(i_ext))
    v = jnp.broadcast_to(jnp.asarray(v, dtype), shape)
    i_ext = jnp.broadcast_to(jnp.asarray(i_ext, dtype), shape)
    params = _LifParams(tau=tau, dt=dt, v_th=v_th, v_reset=v_reset, v_rest=v_rest, surrogate=choice,
                        detach_reset=bool(detach_reset))
    return _lif(v, i_ext, params)


def _lif_potential(v, i_ext, p: _LifParams):
    """The pre-reset potential u = v - (dt/tau) (v - v_rest) + dt i_ext."""
    return v - (p.dt / p.tau) * (v - p.v_rest) + p.dt * i_ext


def _lif_forward(u, p: _LifParams):
    """(v_new, spikes) from u: spike where u >= v_th (NaN never spikes), reset to v_reset there."""
    fired = u >= p.v_th
    return jnp.where(fired, jnp.asarray(p.v_reset, u.dtype), u), fired.astype(u.dtype)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _lif(v, i_ext, p: _LifParams):
    return _lif_forward(_lif_potential(v, i_ext, p), p)


# u = (1 - dt/tau) v + dt i + (dt/tau) v_rest, so du = (1 - dt/tau) dv + dt di;
# s = H(u - v_th): ds = g(u - v_th) du, with g the surrogate;
# v_new = u - s (u - v_reset): dv_new = (1 - s) du - (u - v_reset) ds
#   (the last term is dropped when detach_reset: the reset is a constant then).
# Both tangents are primal-only coefficients times du: linear, so JAX transposes them (reverse mode).
@_lif.defjvp
def _lif_jvp(p: _LifParams, primals, tangents):
    v, i_ext = primals
    dv, di = tangents
    u = _lif_potential(v, i_ext, p)
    v_new, s = _lif_forward(u, p)
    du = (1.0 - p.dt / p.tau) * dv + p.dt * di
    g = surrogate_grad(u - p.v_th, p.surrogate)
    coef = 1.0 - s
    if not p.detach_reset:
        coef = coef - (u - p.v_reset) * g
    return (v_new, s), (coef * du, g * du)


# ===========================================================================
# exp_trace
# ===========================================================================
def exp_trace(trace: jax.Array, spikes: jax.Array, decay: jax.Array | float, *,
              backend: str | None = None) -> jax.Array:
    """Exponential (STDP) trace update: ``trace * decay + spikes``.

    With ``decay = exp(-dt / tau)`` the trace is a low-pass filter of the spike
    train.  The op is linear in ``(trace, spikes)`` and differentiable in all
    three arguments.

    Args:
        trace: the current trace, any shape, floating.
        spikes: spikes (bool, int or float), broadcastable to ``trace``.
        decay: a scalar or an array broadcastable to ``trace``; a Python number
            must lie in ``[0, 1]``.
        backend: ``None`` or ``"reference"`` (the same: the op is pure JAX);
            kept for compatibility.

    Returns:
        The new trace, with ``trace``'s shape and float dtype.

    Raises:
        ValueError: a Python-number ``decay`` outside ``[0, 1]``, or ``spikes``
            not broadcastable to ``trace``.
        TypeError: a complex argument.
        evjax.errors.BackendNotAvailableError: ``backend`` other than ``None``
            or ``"reference"``.

    Example:
        >>> trace = evjax.exp_trace(trace, spikes, 0.9)         # trace * 0.9 + spikes
    """
    _check_backend("exp_trace", backend)
    _reject_complex("exp_trace", trace=trace, spikes=spikes, decay=decay)
    if isinstance(decay, (int, float)) and not isinstance(decay, bool):
        if not (0.0 <= decay <= 1.0):
            raise ValueError(f"exp_trace: decay must lie in [0, 1] (decay = exp(-dt/tau)), got {decay}")
    trace = jnp.asarray(trace)
    dtype = _float_dtype(trace)
    trace = trace.astype(dtype)
    try:
        spikes = jnp.broadcast_to(jnp.asarray(spikes).astype(dtype), trace.shape)
    except ValueError:
        raise ValueError(
            f"exp_trace: spikes of shape {jnp.shape(spikes)} do not broadcast to the trace's {trace.shape}"
        ) from None
    decay = _scalar_or_full(decay, trace.shape, dtype)
    return _trace(trace, spikes, decay)


# out = decay * trace + spikes is smooth (no step): JAX's own derivative is exact, no custom rule.
# d out = decay d trace + d spikes + trace d decay; reverse mode:
# trace_bar = decay out_bar, spikes_bar = out_bar, decay_bar = trace out_bar (summed where decay is broadcast).
def _trace(trace, spikes, decay):
    return trace * decay + spikes


# ===========================================================================
# detect_spikes
# ===========================================================================
def detect_spikes(v: jax.Array, v_th: jax.Array | float = 1.0, v_rest: jax.Array | float = 0.0, *,
                  surrogate: str | Surrogate = "fast_sigmoid", alpha: float | None = None,
                  detach_reset: bool = False, backend: str | None = None) -> tuple[jax.Array, jax.Array]:
    """Threshold crossing and reset: ``spikes = H(v - v_th)``, ``v_out = v_rest where spiking else v``.

    Args:
        v: membrane potentials, any shape.
        v_th: threshold, a scalar or an array broadcastable to ``v`` (may be traced
            and differentiated).
        v_rest: the potential after a spike, scalar or broadcastable array.
        surrogate: surrogate derivative of the step (see :func:`spike`).
        alpha: its sharpness (``None``: default).
        detach_reset: drop the reset's dependence on the spike from the gradient.
        backend: ``None`` or ``"reference"`` (the same: the op is pure JAX);
            kept for compatibility.

    Returns:
        ``(spikes, v_out)``: float spikes (0/1) and the reset potentials.

    Raises:
        ValueError: unknown surrogate, or thresholds that do not broadcast to ``v``.
        TypeError: a complex argument.
        evjax.errors.BackendNotAvailableError: ``backend`` other than ``None``
            or ``"reference"``.

    Example:
        >>> spikes, v = evjax.detect_spikes(v, v_th=1.0, v_rest=0.0)   # spiking neurons reset to v_rest
    """
    _check_backend("detect_spikes", backend)
    _reject_complex("detect_spikes", v=v, v_th=v_th, v_rest=v_rest)
    choice = resolve_surrogate(surrogate, alpha)
    v = jnp.asarray(v)
    dtype = _float_dtype(v)
    v = v.astype(dtype)
    try:
        v_th = _scalar_or_full(v_th, v.shape, dtype)
        v_rest = _scalar_or_full(v_rest, v.shape, dtype)
    except ValueError:
        raise ValueError(
            f"detect_spikes: v_th {jnp.shape(v_th)} and v_rest {jnp.shape(v_rest)} must be scalars or "
            f"broadcastable to v {v.shape}"
        ) from None
    return _detect(v, v_th, v_rest, choice, bool(detach_reset))


def _detect_forward(v, v_th, v_rest):
    """(spikes, v_out): spike where v >= v_th (NaN never spikes), v_rest there, else v."""
    fired = v >= v_th
    return fired.astype(v.dtype), jnp.where(fired, v_rest, v)


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def _detect(v, v_th, v_rest, surrogate: Surrogate, detach_reset: bool):
    return _detect_forward(v, v_th, v_rest)


# s = H(v - v_th): ds = g(v - v_th) (dv - dv_th), with g the surrogate;
# v_out = v + s (v_rest - v): dv_out = (1 - s) dv + s dv_rest + (v_rest - v) ds
#   (the last term is dropped when detach_reset).
# Linear in the tangents (primal-only coefficients), so JAX transposes it; a scalar v_th or v_rest
# is broadcast in these products, and its cotangent is their sum.
@_detect.defjvp
def _detect_jvp(surrogate, detach_reset, primals, tangents):
    v, v_th, v_rest = primals
    dv, d_th, d_rest = tangents
    s, v_out = _detect_forward(v, v_th, v_rest)
    ds = surrogate_grad(v - v_th, surrogate) * (dv - d_th)
    d_out = (1.0 - s) * dv + s * d_rest
    if not detach_reset:
        d_out = d_out + (v_rest - v) * ds
    return (s, v_out), (ds, d_out)

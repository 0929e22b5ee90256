"""Neuron primitives: spike, LIF step, exponential trace, spike detection.

Every op is an :class:`evjax.XLACustomKernel` with the pure-JAX reference (the
GPU default, where XLA fuses it with its neighbours, and the tests' oracle),
explicit JVP and batching rules, and backends declared in this package:
``numba`` (the CPU default), ``warp`` (CPU and GPU) and ``numba_cuda`` (GPU),
each imported the first time it is needed.  All of them are elementwise: the kernels see
flattened arrays, so any shape works, and vmap is one call on the batched array.

Operands that may be a scalar or an array (``decay``, ``v_th``, ``v_rest``) are
kept as shape ``()`` when scalar and broadcast to the full shape otherwise; a
kernel reads a size-1 operand with stride 0.

Spikes are floats (0.0 / 1.0) of the membrane's dtype, so they carry surrogate
gradients and serve directly as events for the CSR ops.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from ... import _compat
from ...rules import ad as ad_rules
from ...rules import batching as batching_rules
from ...surrogate import Surrogate, resolve_surrogate, surrogate_grad
from ...xla_custom_kernel import XLACustomKernel

__all__ = ["spike", "lif_step", "exp_trace", "detect_spikes", "spike_p", "lif_step_p", "exp_trace_p",
           "detect_spikes_p", "OPS", "make_generator"]

# backend -> {platform: default candidate?}: Numba is the CPU default; on GPU the
# pure-JAX reference stays the default (XLA fuses these elementwise ops).
BACKENDS = {"numba": {"cpu": True}, "warp": {"cpu": False, "gpu": False}, "numba_cuda": {"gpu": False}}
_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


# ---------------------------------------------------------------------------
# shared helpers
# ---------------------------------------------------------------------------
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


def make_generator(make_call, reference, kernel_params=None):
    """A kernel generator for an elementwise op, for any backend.

    The kernels take the flattened inputs, an int32 ``strides`` array (0 for a
    size-1 input, read with stride 0; else 1), then, if ``kernel_params`` is
    given, the static floats ``kernel_params(**params)`` as a small array of the
    op's dtype, then the flattened outputs.  ``make_call(size, flat_outs, dtype)``
    returns the backend's callable for them.  Dtypes other than float32/float64
    (float16, bfloat16) and empty arrays use the pure-JAX ``reference``.
    """

    def generator(outs, ins, **params):
        dtype = np.dtype(outs[0].dtype)
        size = int(np.prod(outs[0].shape, dtype=np.int64))
        if dtype not in _KERNEL_DTYPES or any(np.dtype(i.dtype) != dtype for i in ins) or size == 0:
            return lambda *a: reference(*a, outs=outs, **params)
        call = make_call(size, [jax.ShapeDtypeStruct((size,), o.dtype) for o in outs], dtype)
        strides = np.array([0 if int(np.prod(i.shape)) == 1 else 1 for i in ins], np.int32)
        values = None if kernel_params is None else np.array(kernel_params(**params), dtype)

        def run(*arrays):
            flat = [a.reshape(-1) for a in arrays] + [jnp.asarray(strides)]
            if values is not None:
                flat.append(jnp.asarray(values))
            results = call(*flat)
            results = results if isinstance(results, (list, tuple)) else [results]
            return [r.reshape(o.shape) for r, o in zip(results, outs)]

        return run

    return generator


def _elementwise_batching(op: XLACustomKernel, scalar_operands: tuple[int, ...] = ()):
    """Batching rule: one call of the same op on the batched arrays (batch at axis 0).

    An unbatched scalar stays a scalar only at the positions ``scalar_operands``,
    which the kernels read with stride 0; every other operand (unbatched, or a
    batched scalar) is broadcast to the batched full shape.
    """

    def rule(args, axes, *, outs, **params):
        size = batching_rules.batch_size(args, axes)
        full = (size,) + tuple(outs[0].shape)
        new_args = []
        for position, (a, ax) in enumerate(zip(args, axes)):
            if ax is None:
                keep = a.ndim == 0 and position in scalar_operands
                new_args.append(a if keep else jnp.broadcast_to(a, full))
                continue
            a = batching_rules.move_batch_axis(a, ax, 0)
            if a.shape != full:  # a per-example scalar
                a = jnp.broadcast_to(a.reshape((size,) + (1,) * (len(full) - 1)), full)
            new_args.append(a)
        new_outs = tuple(jax.ShapeDtypeStruct(full, o.dtype) for o in outs)
        return op.primitive.bind(*new_args, outs=new_outs, **params), [0] * len(outs)

    return rule


def _tangent(t):
    """A tangent, or None where it is a symbolic zero."""
    return None if ad_rules.is_zero(t) else t


# ===========================================================================
# spike
# ===========================================================================
def spike(x: jax.Array, surrogate: str | Surrogate = "fast_sigmoid", alpha: float | None = None, *,
          backend: str | None = None) -> jax.Array:
    """Heaviside spike with a surrogate derivative.

    Forward: ``1.0 where x >= 0 else 0.0``.  Derivative: ``g(x)`` of the chosen
    surrogate (see :mod:`evjax.surrogate`) instead of the Dirac delta.

    Args:
        x: distance to threshold, any shape (integer inputs become float32).
        surrogate: ``"sigmoid"``, ``"fast_sigmoid"`` (SuperSpike), ``"arctan"``,
            ``"triangle"`` or an :class:`evjax.Surrogate`.
        alpha: the surrogate's sharpness (``None``: its default).
        backend: force a backend (``"numba"``, ``"warp"``, ``"numba_cuda"``, ``"reference"``).

    Returns:
        Float spikes (0/1) of ``x``'s float dtype and shape.

    Raises:
        ValueError: unknown surrogate name or non-positive ``alpha``.
        TypeError: complex ``x``.

    Example:
        >>> v = jnp.array([0.5, 1.2, 0.9])
        >>> evjax.spike(v - 1.0)                                   # [0., 1., 0.]
        >>> jax.grad(lambda v: evjax.spike(v - 1.0).sum())(v)      # the surrogate derivative
    """
    choice = resolve_surrogate(surrogate, alpha)
    _reject_complex("spike", x=x)
    x = jnp.asarray(x)
    x = x.astype(_float_dtype(x))
    (out,) = spike_p(x, outs=[jax.ShapeDtypeStruct(x.shape, x.dtype)], backend=backend,
                     surrogate=choice.name, alpha=choice.alpha)
    return out






def _spike_reference(x, *, outs, **params):
    return [(x >= 0).astype(outs[0].dtype)]


# JVP. y = H(x), dy = g(x) dx with g the surrogate; linear in dx (jnp multiply),
# so JAX transposes it without a rule of ours.
def _spike_jvp(t, x, *, outs, surrogate, alpha, **params):
    return [surrogate_grad(x, surrogate, alpha) * t]


spike_p = XLACustomKernel("evjax_spike")
spike_p.def_reference(_spike_reference)
spike_p.def_jvp_rule2(_spike_jvp)
spike_p.def_batching_rule(_elementwise_batching(spike_p))


# ===========================================================================
# lif_step
# ===========================================================================
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
        backend: force a backend (``"numba"``, ``"warp"``, ``"numba_cuda"``, ``"reference"``).

    Returns:
        ``(v_new, spikes)``, both of the float dtype of ``v`` and ``i_ext``.

    Raises:
        ValueError: non-positive ``tau`` or ``dt``, non-finite parameters or an
            unknown surrogate.
        TypeError: a parameter is a traced array (they are static numbers), or
            ``v`` or ``i_ext`` is complex.

    Example:
        >>> v = jnp.zeros(100); i_ext = jnp.full(100, 0.3)
        >>> v, spikes = evjax.lif_step(v, i_ext, tau=10.0, v_th=1.0, dt=1.0)
    """
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
    struct = jax.ShapeDtypeStruct(shape, dtype)
    v_new, spikes = lif_step_p(v, i_ext, outs=[struct, struct], backend=backend, tau=tau, dt=dt, v_th=v_th,
                               v_reset=v_reset, v_rest=v_rest, surrogate=choice.name, alpha=choice.alpha,
                               detach_reset=bool(detach_reset))
    return v_new, spikes






def _lif_potential(v, i_ext, *, tau, dt, v_rest, **params):
    """The pre-reset potential u (same expression, same order as the kernels)."""
    return v - (dt / tau) * (v - v_rest) + dt * i_ext


def _lif_reference(v, i_ext, *, outs, tau, dt, v_th, v_reset, v_rest, **params):
    u = _lif_potential(v, i_ext, tau=tau, dt=dt, v_rest=v_rest)
    s = u >= v_th
    return [jnp.where(s, jnp.asarray(v_reset, u.dtype), u), s.astype(u.dtype)]


# JVP. u = (1 - dt/tau) v + dt i + (dt/tau) v_rest, so du = (1 - dt/tau) dv + dt di;
# s = H(u - v_th): ds = g(u - v_th) du;  v_new = u - s (u - v_reset):
# dv_new = (1 - s) du - (u - v_reset) ds   (the last term is dropped when detach_reset).
# Every tangent is a jnp product of a primal-only coefficient and du: linear, so
# JAX transposes it (reverse mode) without a rule of ours.
def _lif_jvp(primals, tangents, *, outs, tau, dt, v_th, v_reset, v_rest, surrogate, alpha, detach_reset,
             **params):
    v, i_ext = primals
    dv, di = (_tangent(t) for t in tangents)
    v_new, s = lif_step_p.primitive.bind(v, i_ext, outs=outs, tau=tau, dt=dt, v_th=v_th, v_reset=v_reset,
                                         v_rest=v_rest, surrogate=surrogate, alpha=alpha,
                                         detach_reset=detach_reset, **params)
    if dv is None and di is None:
        return [v_new, s], ad_rules.zero_tangents(outs)
    du = 0.0
    if dv is not None:
        du = du + (1.0 - dt / tau) * dv
    if di is not None:
        du = du + dt * di
    u = _lif_potential(v, i_ext, tau=tau, dt=dt, v_rest=v_rest)
    g = surrogate_grad(u - v_th, surrogate, alpha)
    ds = g * du
    coef = 1.0 - s
    if not detach_reset:
        coef = coef - (u - v_reset) * g
    return [v_new, s], [coef * du, ds]


lif_step_p = XLACustomKernel("evjax_lif_step")
def _lif_kernel_params(tau, dt, v_rest, v_th, v_reset, **_):
    """The kernels' float parameters: (dt / tau, dt, v_rest, v_th, v_reset)."""
    return (dt / tau, dt, v_rest, v_th, v_reset)


lif_step_p.def_reference(_lif_reference)
lif_step_p.def_jvp_rule(_lif_jvp)
lif_step_p.def_batching_rule(_elementwise_batching(lif_step_p))


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
        backend: force a backend (``"numba"``, ``"warp"``, ``"numba_cuda"``, ``"reference"``).

    Returns:
        The new trace, with ``trace``'s shape and float dtype.

    Raises:
        ValueError: a Python-number ``decay`` outside ``[0, 1]``, or ``spikes``
            not broadcastable to ``trace``.
        TypeError: a complex argument.

    Example:
        >>> trace = evjax.exp_trace(trace, spikes, 0.9)         # trace * 0.9 + spikes
    """
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
    (out,) = exp_trace_p(trace, spikes, decay, outs=[jax.ShapeDtypeStruct(trace.shape, dtype)], backend=backend)
    return out






def _trace_reference(trace, spikes, decay, *, outs, **params):
    return [trace * decay + spikes]


# JVP. out = decay * trace + spikes:
# d out = (decay * d trace + d spikes)   [the op itself on the tangents: linear]
#       + trace * d decay                [a jnp product, transposed by JAX].
def _trace_jvp(primals, tangents, *, outs, **params):
    trace, spikes, decay = primals
    d_trace, d_spikes, d_decay = (_tangent(t) for t in tangents)
    out = exp_trace_p.primitive.bind(trace, spikes, decay, outs=outs, **params)
    if d_trace is None and d_spikes is None and d_decay is None:
        return out, ad_rules.zero_tangents(outs)
    tangent = None
    if d_trace is not None or d_spikes is not None:
        d_trace = jnp.zeros_like(trace) if d_trace is None else d_trace
        d_spikes = jnp.zeros_like(spikes) if d_spikes is None else d_spikes
        (tangent,) = exp_trace_p.primitive.bind(d_trace, d_spikes, decay, outs=outs, **params)
    if d_decay is not None:
        term = trace * d_decay
        tangent = term if tangent is None else tangent + term
    return out, [tangent]


# Transpose of (trace, spikes) -> decay * trace + spikes (decay a constant):
# ct_trace = decay * ct, ct_spikes = ct.  decay is never linear here.
def _trace_transpose(cotangents, trace, spikes, decay, *, outs, **params):
    (ct,) = cotangents
    if ad_rules.is_undefined(decay):
        raise NotImplementedError("exp_trace is not linear in decay; it cannot be transposed w.r.t. it")
    ct_trace = ct * decay if ad_rules.is_undefined(trace) else None
    ct_spikes = ct if ad_rules.is_undefined(spikes) else None
    return [ct_trace, ct_spikes, None]


exp_trace_p = XLACustomKernel("evjax_exp_trace")
exp_trace_p.def_reference(_trace_reference)
exp_trace_p.def_jvp_rule(_trace_jvp)
exp_trace_p.def_transpose_rule(_trace_transpose)
exp_trace_p.def_batching_rule(_elementwise_batching(exp_trace_p, scalar_operands=(2,)))  # decay


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
        backend: force a backend (``"numba"``, ``"warp"``, ``"numba_cuda"``, ``"reference"``).

    Returns:
        ``(spikes, v_out)``: float spikes (0/1) and the reset potentials.

    Raises:
        ValueError: unknown surrogate, or thresholds that do not broadcast to ``v``.
        TypeError: a complex argument.

    Example:
        >>> spikes, v = evjax.detect_spikes(v, v_th=1.0, v_rest=0.0)   # spiking neurons reset to v_rest
    """
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
    struct = jax.ShapeDtypeStruct(v.shape, dtype)
    spikes, v_out = detect_spikes_p(v, v_th, v_rest, outs=[struct, struct], backend=backend,
                                    surrogate=choice.name, alpha=choice.alpha, detach_reset=bool(detach_reset))
    return spikes, v_out






def _detect_reference(v, v_th, v_rest, *, outs, **params):
    s = v >= v_th
    return [s.astype(v.dtype), jnp.where(s, v_rest, v)]


# JVP. s = H(v - v_th): ds = g(v - v_th) (dv - dv_th);
# v_out = v + s (v_rest - v): dv_out = (1 - s) dv + s dv_rest + (v_rest - v) ds
# (the last term is dropped when detach_reset).
def _detect_jvp(primals, tangents, *, outs, surrogate, alpha, detach_reset, **params):
    v, v_th, v_rest = primals
    dv, d_th, d_rest = (_tangent(t) for t in tangents)
    s, v_out = detect_spikes_p.primitive.bind(v, v_th, v_rest, outs=outs, surrogate=surrogate, alpha=alpha,
                                              detach_reset=detach_reset, **params)
    if dv is None and d_th is None and d_rest is None:
        return [s, v_out], ad_rules.zero_tangents(outs)
    shape = outs[0].shape
    dx = jnp.zeros(shape, v.dtype)
    if dv is not None:
        dx = dx + dv
    if d_th is not None:
        dx = dx - d_th
    g = surrogate_grad(v - v_th, surrogate, alpha)
    ds = g * dx
    d_out = jnp.zeros(shape, v.dtype)
    if dv is not None:
        d_out = d_out + (1.0 - s) * dv
    if d_rest is not None:
        d_out = d_out + s * d_rest
    if not detach_reset:
        d_out = d_out + (v_rest - v) * ds
    return [s, v_out], [ds, d_out]


detect_spikes_p = XLACustomKernel("evjax_detect_spikes")
detect_spikes_p.def_reference(_detect_reference)
detect_spikes_p.def_jvp_rule(_detect_jvp)
detect_spikes_p.def_batching_rule(_elementwise_batching(detect_spikes_p, scalar_operands=(1, 2)))  # v_th, v_rest


# ===========================================================================
# Backends: declared here, imported on first use (numba.py, warp.py, numba_cuda.py)
# ===========================================================================
# name -> (op, reference, kernel_params); the kernels of every backend share the
# argument order of make_generator.
OPS = {
    "spike": (spike_p, _spike_reference, None),
    "lif_step": (lif_step_p, _lif_reference, _lif_kernel_params),
    "exp_trace": (exp_trace_p, _trace_reference, None),
    "detect_spikes": (detect_spikes_p, _detect_reference, None),
}

for _op, _, _ in OPS.values():
    _op.declare_backends(__package__, BACKENDS)

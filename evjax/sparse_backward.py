"""A sparse backward pass: gradients that flow only through neurons near threshold.

With a surrogate of compact support (``"triangle"``, ``"box"``,
``"clipped_fast_sigmoid"``: :data:`evjax.surrogate.COMPACT`) a neuron whose
membrane potential is outside the band ``|v - v_th| < width`` passes no
gradient through its spike.  Two pieces turn that into skipped work:

* :func:`sparse_backward_gate` also stops the gradient that the neuron's
  state (membrane potential, synaptic current) carries from one step to the
  next, for the neurons outside the band at that step (the approximation of
  Perez-Nieves and Goodman, 2021, "Sparse Spiking Gradient Descent").  Then
  the cotangent of each step's synaptic input is exactly zero outside the
  band.
* :func:`sparse_backward_matmul` is ``spikes @ W`` (the same forward, the same
  bits as ``evjax.BinaryArray(spikes) @ W``) whose backward pass visits only
  the nonzero entries of that cotangent: the spikes' cotangent ``W @ y_bar``
  and the weight gradient ``e[i] y_bar[j]`` (the synapses of active
  presynaptic and near-threshold postsynaptic neurons) run the kernels of
  :mod:`evjax.primitives.sparse_backward`, which choose at run time between a
  pass over the whole structure and a pass over the nonzero entries (the same
  bits either way).

Semantics of the backward: an entry of a cotangent that is zero contributes
nothing, whatever the weights hold (as an inactive event does); nonzero ones
follow IEEE.  The derivative in the spikes is straight-through, as for
``BinaryArray(spikes) @ W``.
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._event_values import event_operand
from .events import BinaryArray, WeightedArray
from .primitives.csr.matrix import CSC, CSR
from .primitives.dense.matrix import Dense
from .primitives.fixed.matrix import FixedNumConn
from .primitives.sparse_backward import csrmv_nonzero, densemv_nonzero, rows_sorted
from .surrogate import Surrogate, band_width
from .units import is_quantity

__all__ = ["sparse_backward_matmul", "sparse_backward_gate"]


def sparse_backward_matmul(spikes: Any, W: Any, *, backend: str | None = None) -> jax.Array:
    """``spikes @ W`` whose backward pass visits only the nonzero entries of the cotangent.

    The forward is ``BinaryArray(spikes) @ W`` (``WeightedArray`` when
    ``spikes`` is one): event-driven, the same bits.  The derivatives are the
    same products as that op's (straight-through in the spikes), computed by
    kernels that skip the zero entries of the tangent or cotangent: the
    spikes' cotangent ``W @ y_bar`` and the weight gradient visit only the
    synapses of nonzero ``y_bar`` entries (and, for the weights, of active
    spikes), chosen at run time from one count.

    Args:
        spikes: ``(n_pre,)`` or ``(batch, n_pre)`` spikes (bool or float; a
            :class:`evjax.BinaryArray` or :class:`evjax.WeightedArray`).
        W: an :class:`evjax.CSR` or :class:`evjax.CSC` (its column view is
            taken from :meth:`~evjax.CSR.build_weight_indices` when cached,
            else computed at trace time), a :class:`evjax.FixedPostNumConn` /
            :class:`evjax.FixedPreNumConn` (as its CSR), or a dense ``(n_pre,
            n_post)`` float matrix (a JAX array or :class:`evjax.Dense`).
        backend: a backend name for the backward kernels (``None``: default).

    Returns:
        ``(n_post,)`` or ``(batch, n_post)``.

    Raises:
        TypeError: ``W`` of another type, or with units (strip them first).
        ValueError: ``spikes`` not 1-d or 2-d, or of the wrong length.

    Example:
        >>> W = evjax.CSR.fromdense(w).build_weight_indices()
        >>> current = evjax.sparse_backward_matmul(spikes, W)
    """
    values, weighted = event_operand(spikes)
    values = jnp.asarray(values)
    if values.ndim not in (1, 2):
        raise ValueError(f"sparse_backward_matmul: spikes must be (n_pre,) or (batch, n_pre), got {values.shape}")
    if isinstance(W, FixedNumConn):
        W = W.tocsr()
    if isinstance(W, (CSR, CSC)):
        _check_plain("W.data", W.data)
        _check_length(values, W.shape[0])
        # (class, shape, stored shape, transpose of the stored structure, sorted rows, weighted, backend)
        static = (type(W), W.shape, W._stored_shape, isinstance(W, CSR), rows_sorted(W.indices, W.indptr),
                  weighted, backend)
        return _csr_layer(W.data, W.indices, W.indptr, *W._other_view(), values, static)
    w = W.data if isinstance(W, Dense) else W
    _check_plain("W", w)
    if not isinstance(w, (jax.Array, np.ndarray)) or np.ndim(w) != 2 or not jnp.issubdtype(w.dtype, jnp.floating):
        raise TypeError(f"sparse_backward_matmul: W must be an evjax.CSR, CSC, FixedPostNumConn, FixedPreNumConn, "
                        f"Dense or a 2-d float array, got {type(W).__name__}")
    _check_length(values, w.shape[0])
    return _dense_layer(jnp.asarray(w), values, (weighted, backend))


def _check_plain(name: str, x) -> None:
    if is_quantity(x):
        raise TypeError(f"sparse_backward_matmul: {name} carries units; pass the magnitudes "
                        f"(e.g. W.with_data(W.data.mantissa)) and attach the unit to the result")


def _check_length(values, n_pre: int) -> None:
    if values.shape[-1] != n_pre:
        raise ValueError(f"sparse_backward_matmul: spikes have {values.shape[-1]} entries on their last axis, "
                         f"W has {n_pre} rows")


def _event_class(weighted: bool) -> type:
    return WeightedArray if weighted else BinaryArray


def _event_values(s, weighted: bool, dtype):
    """What each event contributes to the product: its value (weighted) or 1, and 0 where silent."""
    if weighted:
        return jnp.where(s != 0, s, jnp.zeros((), s.dtype)).astype(dtype)
    return (s != 0).astype(dtype)


# ---------------------------------------------------------------------------
# CSR (and CSC, fixed): y = e(s) @ W, the stored structure A of shape (m, n):
#   CSR: A = W, y = A.T e;   CSC: A = W.T, y = A e
# ---------------------------------------------------------------------------
@functools.partial(jax.custom_jvp, nondiff_argnums=(7,))
def _csr_layer(data, indices, indptr, t_indices, t_indptr, perm, s, static):
    cls, shape, _, _, _, weighted, _ = static
    return _event_class(weighted)(s) @ cls._make(data, indices, indptr, shape)


# dy = A(dw) e + A ds (straight-through in s), each product over the nonzero entries of its vector only:
# reverse mode transposes them into  w_bar = sddmm over (e != 0) x (y_bar != 0),  s_bar = A y_bar (nonzero y_bar).
def _csr_layer_jvp(static, primals, tangents):
    data, indices, indptr, t_indices, t_indptr, perm, s = primals
    d_data, s_dot = tangents[0], tangents[6]
    _, _, stored, transpose, sorted_rows, weighted, backend = static
    y = _csr_layer(*primals, static)
    product = functools.partial(csrmv_nonzero, indices=indices, indptr=indptr, view=(t_indices, t_indptr, perm),
                                shape=stored, transpose=transpose, sorted_rows=sorted_rows, backend=backend)
    dy = jnp.zeros(y.shape, y.dtype)
    if not _is_symbolic_zero(d_data):
        dy = dy + product(d_data, v=_event_values(s, weighted, y.dtype))
    if not _is_symbolic_zero(s_dot):
        dy = dy + product(data, v=s_dot.astype(y.dtype))
    return y, dy


_csr_layer.defjvp(_csr_layer_jvp, symbolic_zeros=True)


# ---------------------------------------------------------------------------
# dense: y = e(s) @ W = W.T e
# ---------------------------------------------------------------------------
@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _dense_layer(w, s, static):
    weighted, backend = static
    return _event_class(weighted)(s) @ Dense(w, backend=backend)


# dy = dW.T e + W.T ds, over the nonzero entries of e and ds; reverse mode: W_bar = outer over
# (e != 0) x (y_bar != 0), s_bar = W y_bar over the nonzero y_bar.
def _dense_layer_jvp(static, primals, tangents):
    w, s = primals
    dw, s_dot = tangents
    weighted, backend = static
    y = _dense_layer(w, s, static)
    dy = jnp.zeros(y.shape, y.dtype)
    if not _is_symbolic_zero(dw):
        dy = dy + densemv_nonzero(dw, _event_values(s, weighted, y.dtype), transpose=True, backend=backend)
    if not _is_symbolic_zero(s_dot):
        dy = dy + densemv_nonzero(w, s_dot.astype(y.dtype), transpose=True, backend=backend)
    return y, dy


_dense_layer.defjvp(_dense_layer_jvp, symbolic_zeros=True)


def _is_symbolic_zero(t) -> bool:
    return isinstance(t, jax.custom_derivatives.SymbolicZero)


# ---------------------------------------------------------------------------
# the gate on the neuron state
# ---------------------------------------------------------------------------
def sparse_backward_gate(state: Any, v: jax.Array, spikes: jax.Array, *, v_th: float = 1.0,
                         surrogate: str | Surrogate = "triangle", alpha: float | None = None) -> Any:
    """``state`` unchanged, its gradient stopped for the neurons outside the surrogate's band.

    A neuron is in the band at this step when it spiked or ``|v - v_th| <
    width`` (:func:`evjax.surrogate.band_width`).  Outside it, the surrogate
    passes no gradient through the spike, and the gate stops the gradient
    that the state carries to earlier steps too: the tangent of every leaf
    of ``state`` is zeroed there (``where``, so a NaN tangent is cut as
    well).  Apply it to the state a step passes on (after the neuron
    update), with the same surrogate as the neurons.

    Args:
        state: a pytree of arrays of ``v``'s shape (e.g. ``(v, i_syn)``).
        v: the membrane potential after the step (after reset).
        spikes: the step's spikes.
        v_th: the firing threshold.
        surrogate: a surrogate of compact support (name or
            :class:`evjax.Surrogate`).
        alpha: its sharpness (``None``: default).

    Returns:
        ``state``, with the same values.

    Raises:
        ValueError: a surrogate without a band (``"fast_sigmoid"``, ...).

    Example:
        >>> v, s = evjax.lif_step(v, i_syn, surrogate="triangle", alpha=2.0)
        >>> v, i_syn = evjax.sparse_backward_gate((v, i_syn), v, s, surrogate="triangle", alpha=2.0)
    """
    width = band_width(surrogate, alpha)
    if width is None:
        raise ValueError(f"sparse_backward_gate: surrogate {surrogate!r} has no band (its gradient is nowhere "
                         f"exactly zero); use one of evjax.surrogate.COMPACT: 'triangle', 'box', "
                         f"'clipped_fast_sigmoid'")
    v = jnp.asarray(v)
    live = jax.lax.stop_gradient((jnp.asarray(spikes) != 0) | (jnp.abs(v - v_th) < width))
    return jax.tree_util.tree_map(lambda x: _gate(x, jnp.broadcast_to(live, jnp.shape(x))), state)


@jax.custom_jvp
def _gate(x, live):
    return x


# d gate(x) = where(live, dx, 0)
@_gate.defjvp
def _gate_jvp(primals, tangents):
    x, live = primals
    dx = tangents[0]
    return x, jnp.where(live, dx, jnp.zeros((), dx.dtype))


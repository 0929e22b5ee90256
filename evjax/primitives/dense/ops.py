"""Event-driven dense operators: a dense weight matrix fed with spikes or graded events.

Ops (:class:`~evjax.XLACustomKernel` instances):

* ``binary_densemv_p`` (events vector) and ``binary_densemm_p`` (events matrix,
  one spike vector per column): operands ``(weights, spikes)``;
* ``binary_dense_outer_p``: the weight gradient, ``outer(events, g)``;
  operands ``(spikes, g)``.

Static params ``transpose`` and ``weighted``.  Shapes, with ``k`` the
contracted (event) dimension:

==============  =================  ==============  =====================
transpose       weights            spikes          result
==============  =================  ==============  =====================
``False``       ``(m, k)``         ``(k[, n])``    ``weights @ spikes``
``True``        ``(k, m)``         ``(k[, n])``    ``weights.T @ spikes``
==============  =================  ==============  =====================

``transpose=True`` is ``spikes @ W`` for ``W`` of shape ``(n_pre, n_post)``:
each active event adds a whole row of ``W`` (cost ``active x m``).
``transpose=False`` gathers: the active indices are compacted once and each
output row sums its weights at them (cost ``m x active``).

Event semantics (``docs/semantics.md``): an event is ``s != 0``; an inactive
event contributes nothing, whatever its weights hold (a select, never a
multiply).  With ``weighted=True`` an active event contributes
``value * weight`` (IEEE), and the gradient w.r.t. the values is the true
one; with ``weighted=False`` it contributes its weight and the gradient
w.r.t. float spikes is straight-through (``d out / d s = W``).

Backends are declared, not imported (``numba``, ``warp``, ``numba_cuda``, as
for the CSR family); :func:`dense_event_matmul` is what
:class:`evjax.BinaryArray` calls (:mod:`evjax.events` imports it) for
``events @ plain dense array``.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from ...units import carries_units
from ..._validation import canonical
from ...dtypes import as_dtype, compute_dtype
from ..._event_values import as_bool_events, event_operand
from ...rules import ad as ad_rules
from ...rules import batching as batching_rules
from ...rules.partitioning import PartitionRule
from ...xla_custom_kernel import XLACustomKernel

__all__ = [
    "binary_densemv", "binary_densemm", "binary_dense_outer", "dense_event_matmul",
    "binary_densemv_p", "binary_densemm_p", "binary_dense_outer_p", "OPS",
]


_FLOATS = (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64)


# ===========================================================================
# Validation and binding
# ===========================================================================
def _check(weights, spikes, transpose, weighted, rank: int, who: str):
    """``(weights, spikes, out_dtype)`` checked; errors name the argument and the fix."""
    weights = canonical(weights)  # float64 weights made in 64-bit mode: float32 once it is off
    spikes = canonical(spikes)
    if not isinstance(transpose, (bool, int)) or not isinstance(weighted, (bool, int)):
        raise TypeError(f"{who}: transpose and weighted must be True or False, got {transpose!r}, {weighted!r}")
    if weights.ndim != 2 or weights.dtype not in [jnp.dtype(d) for d in _FLOATS]:
        raise TypeError(f"{who}: weights must be a 2-d float16/bfloat16/float32/float64 matrix, got "
                        f"{weights.dtype}{list(weights.shape)}; convert it, e.g. weights.astype(jnp.float32)")
    if spikes.ndim != rank:
        other = "binary_densemm" if rank == 1 else "binary_densemv"
        raise ValueError(f"{who}: spikes must be {'a vector' if rank == 1 else 'a matrix (k, n)'}, got shape "
                         f"{spikes.shape}; use {other} for {'a matrix' if rank == 1 else 'a vector'}")
    if jnp.issubdtype(spikes.dtype, jnp.complexfloating):
        raise TypeError(f"{who}: spikes must be bool, integer or real float, got {spikes.dtype}")
    k = weights.shape[0] if transpose else weights.shape[1]
    if spikes.shape[0] != k:
        side = "weights.shape[0] (transpose=True)" if transpose else "weights.shape[1] (transpose=False)"
        raise ValueError(f"{who}: spikes have {spikes.shape[0]} entries along their first axis, but {side} is {k}; "
                         f"weights are (m, k) for weights @ spikes and (k, m) for spikes @ weights")
    dtype = weights.dtype
    if weighted and jnp.issubdtype(spikes.dtype, jnp.floating):
        dtype = jnp.result_type(weights.dtype, spikes.dtype)
    return weights.astype(dtype), spikes, jnp.dtype(dtype)


def _out_shape(weights_shape, spikes_shape, transpose: bool) -> tuple:
    m = weights_shape[1] if transpose else weights_shape[0]
    return (m,) + tuple(spikes_shape[1:])


def _bind_matmul(weights, spikes, *, transpose, weighted, dtype, backend):
    op = binary_densemv_p if spikes.ndim == 1 else binary_densemm_p
    outs = [jax.ShapeDtypeStruct(_out_shape(weights.shape, spikes.shape, transpose), dtype)]
    return op.bind(weights, spikes, outs=outs, transpose=bool(transpose), weighted=bool(weighted),
                   backend=backend)[0]


def _bind_outer(spikes, g, *, transpose, weighted, dtype, backend):
    k, m = spikes.shape[0], g.shape[0]
    outs = [jax.ShapeDtypeStruct((k, m) if transpose else (m, k), dtype)]
    return binary_dense_outer_p.bind(spikes, g, outs=outs, transpose=bool(transpose), weighted=bool(weighted),
                                     backend=backend)[0]


# ===========================================================================
# Pure-JAX reference (the fallback backend and the tests' oracle)
# ===========================================================================
def _event_rows(rows, s, weighted: bool):
    """``where(s_j != 0, v_j * rows_j, 0)`` for each event j (``v = s`` weighted, else 1): a select,
    so an inactive event gives 0 whatever its row holds."""
    active = (s != 0).reshape(s.shape + (1,) * (rows.ndim - 1))
    scaled = rows * s.astype(rows.dtype).reshape(active.shape) if weighted else rows
    return jnp.where(active, scaled, jnp.zeros((), rows.dtype))


def _reference_matmul(weights, spikes, *, outs, transpose, weighted):
    # y_i = sum_j e(s_j) W_ji  (transpose) or  sum_j W_ij e(s_j);  e(s) selects (weighted: scales)
    out = outs[0]
    dtype = compute_dtype(out.dtype)
    rows = weights.astype(dtype) if transpose else weights.astype(dtype).T  # (k, m): the row of event j
    one = lambda s: jnp.sum(_event_rows(rows, s, weighted), axis=0)  # noqa: E731
    y = one(spikes) if spikes.ndim == 1 else jax.lax.map(one, spikes.T).T  # a column at a time: O(k m) memory
    return [y.astype(out.dtype)]


def _reference_outer(spikes, g, *, outs, transpose, weighted):
    # transpose: W_bar[j, i] = sum_c e(s[j, c]) g[i, c]  (the rows of inactive events are 0);
    # else the transpose of it, W_bar[i, j].  Vectors: one column c.
    out = outs[0]
    dtype = compute_dtype(out.dtype)
    g = g.astype(dtype)
    if spikes.ndim == 1:
        wbar = _event_rows(jnp.broadcast_to(g, spikes.shape + g.shape), spikes, weighted)
    else:  # one event row j at a time: sum over the columns c of e(s[j, c]) g[:, c]
        wbar = jax.lax.map(lambda s_j: jnp.sum(_event_rows(g.T, s_j, weighted), axis=0), spikes)
    return [(wbar if transpose else wbar.T).astype(out.dtype)]


# ===========================================================================
# Rule helpers (maths as comments)
# ===========================================================================
def _dense_product(weights, t, transpose: bool, dtype):
    """``W @ t`` (transpose=False) or ``W.T @ t``: the float op, IEEE, for derivatives in the events."""
    acc = compute_dtype(dtype)
    w = weights.astype(acc)
    return ((w.T if transpose else w) @ t.astype(acc)).astype(dtype)


# ===========================================================================
# The kernels' operands (backend-neutral: every backend's generator prepares them so)
# ===========================================================================
def as_columns(x):
    """``x`` as a matrix: a vector ``(k,)`` is the one column ``(k, 1)`` (a free reshape)."""
    return x if x.ndim == 2 else x.reshape(x.shape[0], 1)


def kernel_events(x, weighted: bool, dtype):
    """Events as the kernels read them, a ``(k, n)`` matrix: bool (binary: a spike counts 1) or their
    values in ``dtype``, the compute dtype (weighted)."""
    return as_columns(as_dtype(x, dtype) if weighted else as_bool_events(x))


def outer_operands(spikes, g, weighted: bool, dtype):
    """``binary_dense_outer_p``'s operands as the kernels read them: the events ``(k, n)``
    (:func:`kernel_events`) and ``g`` as ``(m, n)`` in ``dtype``."""
    return kernel_events(spikes, weighted, dtype), as_columns(as_dtype(g, dtype))


# ===========================================================================
# binary_densemv, binary_densemm: dense matrix times events (a vector; a matrix, one event vector
# per column).  Two primitives (brainevent's names) that differ only in the events' rank: the rules
# below serve both, binding the op of the rank they are given (_bind_matmul).
# ===========================================================================
@carries_units("weights", events=("spikes",), weighted="weighted")
def binary_densemv(weights, spikes, *, transpose: bool, backend: str | None = None,
                   weighted: bool = False) -> jax.Array:
    """Dense matrix times event vector: only the active (nonzero) events are visited.

    Args:
        weights: ``(m, k)`` (transpose=False) or ``(k, m)`` (transpose=True);
            float16, bfloat16, float32 or float64.
        spikes: ``(k,)``; bool, or numbers where nonzero is an event (a
            :class:`evjax.BinaryArray`/:class:`evjax.WeightedArray` is unwrapped).
        transpose: ``False``: ``weights @ spikes``; ``True``: ``spikes @ weights``
            (each active event adds a row of ``weights``).
        backend: ``"numba"``, ``"warp"``, ``"numba_cuda"``, ``"reference"``
            (default: see :mod:`evjax.config`).
        weighted: each active event contributes ``value * weight`` (graded
            events; the gradient w.r.t. the values is the true one) instead of
            its weight (binary; straight-through gradient for float spikes).

    Returns:
        ``(m,)`` in the weights' dtype (weighted: promoted with float values).

    Raises:
        TypeError: non-float weights, complex spikes, non-bool flags.
        ValueError: shapes that are not aligned.

    Example:
        >>> y = evjax.binary_densemv(W, spikes, transpose=True)   # spikes @ W
    """
    spikes, weighted = _unwrap(spikes, weighted)
    weights, spikes, dtype = _check(weights, spikes, transpose, weighted, 1, "binary_densemv")
    return _bind_matmul(weights, spikes, transpose=transpose, weighted=weighted, dtype=dtype, backend=backend)


@carries_units("weights", events=("spikes",), weighted="weighted")
def binary_densemm(weights, spikes, *, transpose: bool, backend: str | None = None,
                   weighted: bool = False) -> jax.Array:
    """Dense matrix times event matrix (one event vector per column), natively batched.

    Args:
        weights: as in :func:`binary_densemv`.
        spikes: ``(k, n)``: column ``c`` is one event vector.
        transpose: as in :func:`binary_densemv`.
        backend: as in :func:`binary_densemv`.
        weighted: as in :func:`binary_densemv`.

    Returns:
        ``(m, n)``: ``weights @ spikes`` or ``weights.T @ spikes``.

    Raises:
        TypeError, ValueError: as in :func:`binary_densemv`.

    Example:
        >>> W = jnp.ones((100, 50))                        # (k, m)
        >>> S = jax.random.bernoulli(key, 0.05, (100, 32)) # 32 event vectors as columns
        >>> out = evjax.binary_densemm(W, S, transpose=True)   # W.T @ S: (50, 32)
    """
    spikes, weighted = _unwrap(spikes, weighted)
    weights, spikes, dtype = _check(weights, spikes, transpose, weighted, 2, "binary_densemm")
    return _bind_matmul(weights, spikes, transpose=transpose, weighted=weighted, dtype=dtype, backend=backend)


binary_densemv_p = XLACustomKernel("evjax_binary_densemv")
binary_densemm_p = XLACustomKernel("evjax_binary_densemm")


def _binary_dense_matmul_jvp_weights(tangent, weights, spikes, *, outs, transpose, weighted, backend):
    # y = A(W) e(s) is linear in W:  dy = A(dW) e(s), the op itself on the tangent
    return [_bind_matmul(tangent, spikes, transpose=transpose, weighted=weighted, dtype=outs[0].dtype,
                         backend=backend)]


def _binary_dense_matmul_jvp_events(tangent, weights, spikes, *, outs, transpose, weighted, backend):
    # binary: the forward uses 1[s != 0]; straight-through, as if y = W s:  dy = W ds.
    # weighted: y = sum_j [s_j != 0] s_j W_j is linear in s:  dy = W ds (the true derivative).
    return [_dense_product(weights, tangent, transpose, outs[0].dtype)]


def _binary_dense_matmul_transpose(cts, weights, spikes, *, outs, transpose, weighted, backend):
    # y = W.T e(s)  =>  W_bar = outer(e(s), y_bar)      (transpose; rows of inactive events 0)
    # y = W e(s)    =>  W_bar = outer(y_bar, e(s))      (columns of inactive events 0)
    # matrices: W_bar = e(S) @ Y_bar.T (resp. Y_bar @ e(S).T); only active events are computed.
    # Only W: the events' derivative is the float product above, which JAX transposes itself.
    def weights_cotangent():
        dtype = ad_rules.aval_of(weights).dtype
        return _bind_outer(spikes, cts[0], transpose=transpose, weighted=weighted, dtype=dtype, backend=backend)

    name = (binary_densemv_p if ad_rules.aval_of(spikes).ndim == 1 else binary_densemm_p).name
    return ad_rules.linear_cotangents([weights, spikes], {0: weights_cotangent}, name=name)


def _binary_dense_matmul_batching(args, axes, *, outs, transpose, weighted, backend):
    # events batched, weights not: one call of the matrix op, the batch folded into its columns
    # (vmap of mv is mm): native, no loop.  Weights batched (with or without the events): one call
    # per batch element (rules.batching.sequential_batch); each call is event-driven.
    weights, spikes = args
    w_ax, s_ax = axes
    if w_ax is not None:
        unbatched_rank = spikes.ndim - (s_ax is not None)
        op_self = binary_densemv_p if unbatched_rank == 1 else binary_densemm_p
        return batching_rules.sequential_batch(op_self.primitive, args, axes, outs=outs, transpose=transpose,
                                               weighted=weighted, backend=backend)
    sb = jnp.moveaxis(spikes, s_ax, 1)  # (k, batch) or (k, batch, n)
    flat = sb.reshape(sb.shape[0], math.prod(sb.shape[1:]))  # (no -1: sizes may be 0)
    y = _bind_matmul(weights, flat, transpose=transpose, weighted=weighted, dtype=outs[0].dtype, backend=backend)
    return [y.reshape((y.shape[0],) + sb.shape[1:])], [1]


def _binary_dense_matmul_partition(weights, spikes, *, outs, transpose, **params):
    # y[o, c] = sum_i W(o, i) e(s)[i, c]: each output o and each event column c is an independent
    # product, so a device computes its block (o, c) from its slice of W's outputs and of the columns;
    # the contracted i is kept whole
    w = "i o" if transpose else "o i"
    if spikes.ndim == 1:
        return PartitionRule((w, "i"), ("o",), batch=("o",))
    return PartitionRule((w, "i c"), ("o c",), batch=("o", "c"))


for _op in (binary_densemv_p, binary_densemm_p):
    _op.def_reference(_reference_matmul)
    _op.def_jvp_rule2(_binary_dense_matmul_jvp_weights, _binary_dense_matmul_jvp_events)
    _op.def_transpose_rule(_binary_dense_matmul_transpose)
    _op.def_batching_rule(_binary_dense_matmul_batching)
    _op.def_partition_rule(_binary_dense_matmul_partition)


# ===========================================================================
# binary_dense_outer: the weight gradient of the two ops above, event-driven
# ===========================================================================
def binary_dense_outer(spikes, g, *, transpose: bool, backend: str | None = None, weighted: bool = False,
                       dtype=None) -> jax.Array:
    """The weight gradient of the dense event ops: ``outer(e(spikes), g)``, event-driven.

    Args:
        spikes: ``(k,)`` or ``(k, n)`` events.
        g: ``(m,)`` or ``(m, n)``: the cotangent of the op's result.
        transpose: ``True``: the ``(k, m)`` gradient of ``spikes @ W`` (rows of
            inactive events are 0); ``False``: the ``(m, k)`` one of ``W @ spikes``.
        backend, weighted: as in :func:`binary_densemv`.
        dtype: the result dtype (default: ``g``'s).

    Returns:
        ``(k, m)`` or ``(m, k)``; matrices sum over the columns ``n``.
    """
    spikes, weighted = _unwrap(spikes, weighted)
    spikes, g = jnp.asarray(spikes), jnp.asarray(g)
    if spikes.ndim not in (1, 2) or g.ndim != spikes.ndim or spikes.shape[1:] != g.shape[1:]:
        raise ValueError(f"binary_dense_outer: spikes {spikes.shape} and g {g.shape} must be (k[, n]) and (m[, n])")
    if not jnp.issubdtype(g.dtype, jnp.floating):
        raise TypeError(f"binary_dense_outer: g must be float, got {g.dtype}; convert it, e.g. g.astype(jnp.float32)")
    return _bind_outer(spikes, g, transpose=transpose, weighted=weighted, dtype=dtype or g.dtype, backend=backend)


binary_dense_outer_p = XLACustomKernel("evjax_binary_dense_outer")


def _binary_dense_outer_jvp_events(tangent, spikes, g, *, outs, transpose, weighted, backend):
    # d outer(s, g) = outer(ds, g) (weighted: the true derivative; binary: straight-through), IEEE
    acc = compute_dtype(outs[0].dtype)
    t, g = tangent.astype(acc), g.astype(acc)
    wbar = t[:, None] * g[None, :] if t.ndim == 1 else t @ g.T  # (k, m)
    return [(wbar if transpose else wbar.T).astype(outs[0].dtype)]


def _binary_dense_outer_jvp_g(tangent, spikes, g, *, outs, **params):
    # linear in g: d outer(e(s), g) = outer(e(s), dg), the op itself on the tangent
    return binary_dense_outer_p.primitive.bind(spikes, tangent, outs=outs, **params)


def _binary_dense_outer_transpose(cts, spikes, g, *, outs, transpose, weighted, backend):
    # W_bar = outer(e(s), g) (transpose) is linear in g:  g_bar_i = sum_j e(s_j) W_bar_bar[j, i], the
    # matmul op with the same orientation; likewise W_bar = outer(g, e(s)):  g_bar = W_bar_bar e(s).
    def g_cotangent():
        dtype = ad_rules.aval_of(g).dtype
        return _bind_matmul(cts[0], spikes, transpose=transpose, weighted=weighted, dtype=dtype, backend=backend)

    return ad_rules.linear_cotangents([spikes, g], {1: g_cotangent}, name="evjax_binary_dense_outer")


def _binary_dense_outer_partition(spikes, g, *, outs, transpose, **params):
    # W_bar[i, o] = sum_c e(s)[i, c] g[o, c]: the blocks (i, o) are independent; a device sums its own
    # columns c, and the partial sums are added over the devices (psum)
    out = "i o" if transpose else "o i"
    if spikes.ndim == 1:
        return PartitionRule(("i", "o"), (out,), batch=("i", "o"))
    return PartitionRule(("i c", "o c"), (out,), batch=("i", "o"), reduced=("c",))


binary_dense_outer_p.def_reference(_reference_outer)
binary_dense_outer_p.def_jvp_rule2(_binary_dense_outer_jvp_events, _binary_dense_outer_jvp_g)
binary_dense_outer_p.def_transpose_rule(_binary_dense_outer_transpose)
binary_dense_outer_p.def_partition_rule(_binary_dense_outer_partition)

OPS = (binary_densemv_p, binary_densemm_p, binary_dense_outer_p)


# ===========================================================================
# Events @ a plain dense matrix
# ===========================================================================
def _unwrap(spikes, weighted: bool):
    """An event wrapper's array; a ``WeightedArray`` turns ``weighted`` on."""
    value, is_weighted = event_operand(spikes)
    return value, bool(weighted) or is_weighted


def dense_event_matmul(events, weighted: bool, other, events_on_left: bool):
    """``events @ other`` (or ``other @ events``) for a plain dense ``other``, by the event ops.

    What :class:`evjax.BinaryArray`'s ``@`` calls (:mod:`evjax.events`); returns
    ``NotImplemented`` where the event ops do not apply (``other`` not a float
    matrix, events not a vector or matrix), and BinaryArray then multiplies
    the 0/1 (or graded) events densely.
    """
    if other.ndim != 2 or events.ndim not in (1, 2) or other.dtype not in [jnp.dtype(d) for d in _FLOATS]:
        return NotImplemented
    if events_on_left:  # s (k,) @ W (k, m);  S (n, k) @ W = (W.T @ S.T).T
        if events.ndim == 1:
            return binary_densemv(other, events, transpose=True, weighted=weighted)
        return binary_densemm(other, events.T, transpose=True, weighted=weighted).T
    if events.ndim == 1:  # W (m, k) @ s (k,)
        return binary_densemv(other, events, transpose=False, weighted=weighted)
    return binary_densemm(other, events, transpose=False, weighted=weighted)


"""Synaptic delays: event-driven delivery of spikes through a CSR connection into an arrival ring.

Ops (:class:`~evjax.XLACustomKernel` instances):

* ``csr_delay_deliver_p`` (brainevent's name): operands ``(ring, events,
  data, indices, indptr, delays, t)``, static params ``shape`` and
  ``weighted``.  For every edge ``e`` of every active row ``i``::

      ring_new[(t + d_e) mod L, indices[e]] += w_e * f(x)[i]

  with ``f(x) = 1`` (binary) or ``x[i]`` (weighted), ``L = ring.shape[0]``.
  ``csr_delay_deliver_layout_p`` is the same op object: the layout variant
  binds it on the layout's arrays (its ``delay_ptr`` is not an operand).
* ``csr_delay_gather_p``: the cotangents, event-driven where they can be:
  ``out = sum / per edge of w_e * g[(t + d_e) mod L, indices[e]]`` (times
  ``f(x)[i]`` on active rows only when ``by_event``).  The weight gradient
  visits the synapses of active rows only (plus a zero fill); the event
  gradient visits every row (it is the derivative at inactive events too).

Slots: ``s_e = (t mod L + clamp(d_e, 0, L - 1)) mod L`` with floor modulo; ``t``
and ``d`` are reduced separately, so nothing overflows.  Concrete delays
outside ``[0, L)`` are refused (ValueError); traced ones are clamped to ``[0,
L - 1]`` identically by every backend.  A delay of 0 lands in slot ``t``
itself (brainevent 0.3.0 refuses 0).

Operand forms the kernels take: ``data`` ``(1,)`` (homogeneous) or
``(nnz,)``; ``delays`` ``(1,)`` (one delay for every edge) or ``(nnz,)``,
int32 or int64; ``indices``/``indptr`` in one int dtype; ``t`` an integer
scalar.  Events reach the kernels as values in the compute dtype: ``1.0``/``0.0``
(binary) or ``x`` (weighted), so one kernel serves both modes (``w * 1.0`` is
``w`` exactly).  float16/bfloat16 compute in float32.  A column outside
``[0, n_post)`` is skipped by every backend.

Derivatives (maths at each rule): linear in ``ring``, ``data`` and (weighted)
``events``; straight-through in binary events; ``indices``, ``indptr``,
``delays``, ``t`` have none.  ``vmap`` over any operand runs one call per batch
element (``rules.batching.sequential_batch``).

Backends are declared, not imported (``numba``, ``warp``, ``numba_cuda``).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ...units import carries_units
from ..._event_values import event_operand
from ..._validation import canonical, check_compressed, check_shape, is_concrete
from ...dtypes import as_dtype, compute_dtype
from ...rules import ad as ad_rules
from ...rules import batching as batching_rules
from ...xla_custom_kernel import XLACustomKernel

__all__ = [
    "csr_delay_deliver", "csr_delay_deliver_p", "csr_delay_deliver_layout", "csr_delay_deliver_layout_p",
    "CSRDelayLayout", "csr_delay_gather", "csr_delay_gather_p", "OPS",
]

_FLOATS = tuple(jnp.dtype(d) for d in (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64))
_INT32_MAX = 2**31 - 1


# ===========================================================================
# Validation
# ===========================================================================
def _resolve_events(events, weighted, who: str):
    """``(array, weighted)``: a WeightedArray/BinaryArray unwrapped; ``weighted=None`` takes its kind."""
    value, wrapper_weighted = event_operand(events)
    if value is not events:  # an event wrapper
        if weighted is not None and bool(weighted) != wrapper_weighted:
            kind = "a WeightedArray" if wrapper_weighted else "a BinaryArray"
            raise ValueError(f"{who}: weighted={weighted!r} contradicts the events, which are {kind}; omit "
                             f"weighted, or pass the raw array (events.value)")
        return value, wrapper_weighted
    if weighted is not None and not isinstance(weighted, (bool, np.bool_)):
        raise TypeError(f"{who}: weighted must be True, False or None, got {weighted!r}")
    return events, bool(weighted)


def _check_ring(ring, n_post: int, who: str):
    ring = canonical(ring)
    if ring.ndim != 2 or ring.dtype not in _FLOATS:
        raise TypeError(f"{who}: ring must be the 2-d float (L, n_post) arrival buffer (float16, bfloat16, "
                        f"float32 or float64), got {ring.dtype}{list(ring.shape)}")
    if ring.shape[1] != n_post:
        raise ValueError(f"{who}: ring has {ring.shape[1]} columns, but shape says n_post = {n_post}; pass a ring "
                         f"of shape (L, {n_post})")
    if ring.shape[0] < 1:
        raise ValueError(f"{who}: ring has no slot (L = 0); give it at least one row, e.g. "
                         f"jnp.zeros((max_delay + 1, {n_post}))")
    return ring


_ROWS = "the CSR (row) structure of the connection"  # what to pass, for check_compressed's message


def _check_events(events, n_pre: int, who: str):
    events = canonical(events)
    if events.ndim != 1 or events.shape[0] != n_pre:
        raise ValueError(f"{who}: events must be a vector of n_pre = {n_pre} entries (from shape), got shape "
                         f"{tuple(events.shape)}")
    if not (events.dtype == jnp.bool_ or jnp.issubdtype(events.dtype, jnp.integer)
            or jnp.issubdtype(events.dtype, jnp.floating)):
        raise TypeError(f"{who}: events must be bool, integer or float, got {events.dtype}")
    return events


def _check_data(data, nnz: int, dtype, who: str):
    data = canonical(data)
    if data.ndim == 0:
        data = data.reshape(1)
    if data.ndim != 1 or data.shape[0] not in (1, nnz):
        raise ValueError(f"{who}: data must be a scalar, shape (1,) (homogeneous) or (nnz,) = ({nnz},), got shape "
                         f"{tuple(data.shape)}")
    if not (jnp.issubdtype(data.dtype, jnp.floating) or jnp.issubdtype(data.dtype, jnp.integer)):
        raise TypeError(f"{who}: data must be real (it is cast to the ring's dtype), got {data.dtype}")
    return data.astype(dtype)


def check_delays(delays, nnz: int, n_slots: int, who: str):
    """``delays`` as ``(1,)`` (one for every edge) or ``(nnz,)``, int32 or int64.

    Raises:
        TypeError: not integer.
        ValueError: a wrong shape, or a concrete delay outside ``[0, n_slots)``.
    """
    delays = jnp.asarray(delays)  # integers are never narrowed by canonical
    if not jnp.issubdtype(delays.dtype, jnp.integer):
        raise TypeError(f"{who}: delays must be integer steps, got {delays.dtype}; convert them, e.g. "
                        f"jnp.round(delay_ms / dt).astype(jnp.int32)")
    if delays.ndim == 0 or delays.shape == (1,):
        delays = delays.reshape(1)
    elif delays.shape != (nnz,):
        raise ValueError(f"{who}: delays must be a scalar, shape (1,) or (nnz,) = ({nnz},), got shape "
                         f"{tuple(delays.shape)}")
    if is_concrete(delays) and delays.size:
        host = np.asarray(delays)
        lo, hi = int(host.min()), int(host.max())
        if lo < 0 or hi >= n_slots:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{who}: delays must lie in [0, L) = [0, {n_slots}) (L: the ring's rows), got "
                             f"{bad} (delays span [{lo}, {hi}]); give the ring at least {hi + 1} rows, or fix "
                             f"the delays (delay 0 arrives in slot t itself)")
    if delays.dtype in (jnp.dtype(jnp.int32), jnp.dtype(jnp.int64)):
        return delays
    if jnp.issubdtype(delays.dtype, jnp.signedinteger) or delays.dtype.itemsize < 4:
        return delays.astype(jnp.int32)  # int8/int16/uint8/uint16: exact
    # uint32/uint64: clamp from above (they are >= 0) before narrowing, as the kernels would
    return jnp.minimum(delays, jnp.asarray(min(n_slots - 1, _INT32_MAX), delays.dtype)).astype(jnp.int32)


def _check_t(t, who: str):
    t = jnp.asarray(t)
    if not jnp.issubdtype(t.dtype, jnp.integer) or t.dtype == jnp.bool_:
        raise TypeError(f"{who}: t must be an integer time step, got {t.dtype}; pass e.g. jnp.int32(step)")
    if t.ndim != 0:
        raise ValueError(f"{who}: t must be a scalar (the current step), got shape {tuple(t.shape)}")
    return t


def _deliver_operands(ring, events, data, indices, indptr, delays, t, shape, weighted, who: str):
    n_pre, n_post = check_shape(shape, who, dims=("n_pre", "n_post"))
    events, weighted = _resolve_events(events, weighted, who)
    ring = _check_ring(ring, n_post, who)
    events = _check_events(events, n_pre, who)
    indices, indptr = check_compressed(indices, indptr, n_pre, None, who, _ROWS)
    nnz = indices.shape[0]
    data = _check_data(data, nnz, ring.dtype, who)
    delays = check_delays(delays, nnz, ring.shape[0], who)
    t = _check_t(t, who)
    return (ring, events, data, indices, indptr, delays, t), (n_pre, n_post), weighted


def _bind_deliver(ring, events, data, indices, indptr, delays, t, *, shape, weighted, backend):
    return csr_delay_deliver_p.bind(ring, events, data, indices, indptr, delays, t,
                                    outs=[jax.ShapeDtypeStruct(ring.shape, ring.dtype)], shape=tuple(shape),
                                    weighted=bool(weighted), backend=backend)[0]


# ===========================================================================
# Shared maths (the references' and the kernel generators')
# ===========================================================================
def slots(t, delays, n_slots: int):
    """Arrival slot of each edge: ``(t mod L + clamp(d, 0, L - 1)) mod L``, floor modulo, no overflow
    (both terms are below ``L`` before the one addition)."""
    dtype = jnp.promote_types(t.dtype, delays.dtype)
    s = jnp.remainder(t, n_slots).astype(dtype) + jnp.clip(delays, 0, n_slots - 1).astype(dtype)
    return jnp.where(s >= n_slots, s - n_slots, s)


def t_mod(t, n_slots: int, dtype):
    """``t mod L`` (floor) as the ``(1,)`` array of ``dtype`` the kernels take."""
    return jnp.remainder(t, n_slots).astype(dtype).reshape(1)


def row_of_edges(indptr, nnz: int):
    """The row of each of the ``nnz`` edges."""
    rows = jnp.arange(indptr.shape[0] - 1, dtype=indptr.dtype)
    return jnp.repeat(rows, jnp.diff(indptr), total_repeat_length=nnz)


def event_values(events, weighted: bool, dtype):
    """What each row contributes per unit weight, in ``dtype``: ``1``/``0`` (binary: ``x != 0``) or ``x``."""
    return events.astype(dtype) if weighted else (events != 0).astype(dtype)


def deliver_runner(outs, weighted: bool, build):
    """Every backend's deliver generator: ``run(ring, events, data, indices, indptr, delays, t) -> [ring]``.

    Args:
        outs: the op's result, the ring's shape and dtype.
        weighted: the events' kind (:func:`event_values`).
        build: ``build(dtype) -> launch``, the backend's kernel in the compute ``dtype`` as
            ``launch(ring, values, weights, indices, indptr, delays, t) -> ring`` (the ring, the events'
            values and the weights in ``dtype``); called only where the ring has cells.

    Returns:
        ``run``; a ring without cells comes back as it is, nothing launched.
    """
    out = outs[0]
    dtype = compute_dtype(out.dtype)
    if 0 in out.shape:
        return lambda ring, *operands: [ring]
    launch = build(dtype)

    def run(ring, events, data, indices, indptr, delays, t):
        y = launch(as_dtype(ring, dtype), event_values(events, weighted, dtype), data.astype(dtype), indices, indptr,
                   delays, t)
        return [y.astype(out.dtype)]

    return run


def gather_runner(outs, ins, weighted: bool, per_edge: bool, by_event: bool, build):
    """Every backend's gather generator: ``run(g, events, data, indices, indptr, delays, t) -> [cotangent]``.

    Args:
        outs: the op's result.
        ins: the op's operands (``ins[0]``: ``g``).
        weighted, per_edge, by_event: the op's params.
        build: ``build(dtype) -> launch``, the backend's kernel in the compute ``dtype`` as
            ``launch(g, values, weights, indices, indptr, delays, t, flags) -> cotangent`` (``g``, the
            events' values and the weights in ``dtype``; ``flags = [per_edge, by_event]``, int32);
            called only where there is something to gather.

    Returns:
        ``run``; zeros where the result or ``g`` is empty, nothing launched.
    """
    out = outs[0]
    dtype = compute_dtype(out.dtype)
    if 0 in out.shape or 0 in ins[0].shape:
        return lambda *operands: [jnp.zeros(out.shape, out.dtype)]
    launch = build(dtype)

    def run(g, events, data, indices, indptr, delays, t):
        flags = jnp.array([per_edge, by_event], jnp.int32)
        y = launch(g.astype(dtype), event_values(events, weighted, dtype), data.astype(dtype), indices, indptr,
                   delays, t, flags)
        return [y.astype(out.dtype)]

    return run


def _edges(events, data, indices, indptr, delays, t, n_slots: int, n_post: int, weighted: bool, acc):
    """Per edge, in ``acc``: ``(slot, column, valid column, f(x) of its row, weight)``."""
    nnz = indices.shape[0]
    rows = row_of_edges(indptr, nnz)
    f = event_values(events, weighted, acc)[rows]
    w = jnp.broadcast_to(data.astype(acc), (nnz,))
    s = jnp.broadcast_to(slots(t, delays, n_slots), (nnz,))
    valid = (indices >= 0) & (indices < n_post)
    return s, jnp.where(valid, indices, 0), valid, f, w, rows


# ===========================================================================
# csr_delay_deliver
# ===========================================================================
@carries_units("ring", events=("events",), shared={"data": "ring"})
def csr_delay_deliver(ring, events, data, indices, indptr, delays, t, *, shape, weighted=None,
                      backend: str | None = None) -> jax.Array:
    """Deliver spikes through a CSR connection with per-edge delays into an arrival ring.

    For every edge ``e`` of every active presynaptic row ``i`` (``events[i]
    != 0``)::

        ring_new[(t + d_e) mod L, indices[e]] += w_e * f(x)[i]

    with ``f(x) = 1`` (binary) or ``x[i]`` (weighted), ``L = ring.shape[0]``
    and floor modulo (``t`` and ``d_e`` reduced separately: no overflow).
    Only the synapses of active rows are visited; an inactive row
    contributes nothing, whatever its weights hold (NaN, inf).  A delay of
    ``0`` arrives in slot ``t`` itself (brainevent 0.3.0 refuses 0; evjax
    accepts it).

    Args:
        ring: ``(L, n_post)`` float arrival buffer (float16, bfloat16,
            float32, float64); its dtype is the result's.
        events: ``(n_pre,)`` bool, integer or float (nonzero = active), or an
            :class:`evjax.BinaryArray` / :class:`evjax.WeightedArray`.
        data: the weights: a scalar or ``(1,)`` (homogeneous) or ``(nnz,)``;
            cast to ``ring``'s dtype.
        indices: ``(nnz,)`` postsynaptic (column) index of each edge, int32 or
            int64.
        indptr: ``(n_pre + 1,)`` row pointers.
        delays: integer steps, a scalar or ``(nnz,)``; data (new delays do
            not retrace).  Concrete ones must lie in ``[0, L)``; traced ones
            are clamped to ``[0, L - 1]`` by every backend.
        t: the current integer step, a scalar; may be traced.
        shape: ``(n_pre, n_post)``.
        weighted: ``True``: each active row adds ``x[i] * w_e``; ``False``:
            ``w_e``; ``None`` (default): ``True`` for a WeightedArray, else
            ``False``.
        backend: ``"numba"``, ``"warp"``, ``"numba_cuda"``, ``"reference"``
            (default: the platform's).

    Returns:
        ``(L, n_post)`` the new ring, in ``ring``'s dtype.

    Raises:
        TypeError: an argument of the wrong kind (float delays or ``t``, a
            non-float ring), named.
        ValueError: a wrong shape, a concrete delay outside ``[0, L)``, or
            ``weighted`` contradicting an event wrapper.

    Example:
        >>> ring = jnp.zeros((3, 3), jnp.float32)
        >>> indices, indptr = jnp.array([0, 2, 1]), jnp.array([0, 2, 3])
        >>> ring = csr_delay_deliver(ring, jnp.array([True, False]), 0.5, indices, indptr,
        ...                          jnp.array([1, 2, 1]), 0, shape=(2, 3))
        >>> ring[1, 0], ring[2, 2]
        (Array(0.5, dtype=float32), Array(0.5, dtype=float32))
    """
    who = "csr_delay_deliver"
    args, shape, weighted = _deliver_operands(ring, events, data, indices, indptr, delays, t, shape, weighted, who)
    return _bind_deliver(*args, shape=shape, weighted=weighted, backend=backend)


csr_delay_deliver_p = XLACustomKernel("evjax_csr_delay_deliver")
csr_delay_deliver_layout_p = csr_delay_deliver_p  # the layout variant binds the same op on the layout's arrays


def _reference_deliver(ring, events, data, indices, indptr, delays, t, *, outs, shape, weighted):
    # ring'[s_e, j_e] += w_e f(x)[row e] for the edges of active rows; inactive edges are dropped
    # (sent to slot L, out of range), so they add nothing, not even a signed zero
    acc = compute_dtype(ring.dtype)
    n_slots, n_post = ring.shape
    if indices.shape[0] == 0 or n_post == 0:
        return [ring]
    s, j, valid, f, w, _ = _edges(events, data, indices, indptr, delays, t, n_slots, n_post, weighted, acc)
    s = jnp.where(valid & (f != 0), s, n_slots)
    return [ring.astype(acc).at[s, j].add(w * f, mode="drop").astype(ring.dtype)]


def _deliver_jvp_ring(tangent, ring, events, data, indices, indptr, delays, t, *, outs, shape, weighted, backend):
    # linear in ring with slope 1: d ring' = d ring
    return [tangent]


def _deliver_jvp_events(tangent, ring, events, data, indices, indptr, delays, t, *, outs, shape, weighted,
                        backend):
    # weighted: ring' = ring + sum_e where(x_i != 0, w_e x_i, 0) [...] equals ring + sum_e w_e x_i [...] for
    # finite weights, so d ring'[s_e, j_e] += w_e dx[row e] over every row (the true derivative, IEEE: a NaN
    # weight gives a NaN tangent even where x = 0); binary: the forward uses 1[x != 0], straight-through,
    # the same.  Linear in dx: a delivery of the weights w_e dx[row e] by every row (O(nnz), as any
    # derivative in the events: it is taken at inactive events too).
    if tangent.dtype == jax.dtypes.float0:
        return [jnp.zeros(outs[0].shape, outs[0].dtype)]
    acc = compute_dtype(outs[0].dtype)
    nnz = indices.shape[0]
    w = jnp.broadcast_to(data.astype(acc), (nnz,)) * tangent.astype(acc)[row_of_edges(indptr, nnz)]
    return csr_delay_deliver_p.primitive.bind(jnp.zeros_like(ring), jnp.ones((shape[0],), jnp.bool_),
                                              w.astype(data.dtype), indices, indptr, delays, t, outs=outs,
                                              shape=shape, weighted=False, backend=backend)


def _deliver_jvp_data(tangent, ring, events, data, indices, indptr, delays, t, *, outs, shape, weighted, backend):
    # linear in w: d ring'[s_e, j_e] += dw_e f(x)[row e] = deliver(0, x, dw)
    return csr_delay_deliver_p.primitive.bind(jnp.zeros_like(ring), events, tangent, indices, indptr, delays, t,
                                              outs=outs, shape=shape, weighted=weighted, backend=backend)


def _deliver_transpose(cts, ring, events, data, indices, indptr, delays, t, *, outs, shape, weighted, backend):
    # with g = ring'_bar and s_e = (t + d_e) mod L:
    #   ring_bar = g
    #   w_bar_e  = f(x)[row e] g[s_e, j_e]            (active rows only: csr_delay_gather, by_event, per edge)
    #   w_bar    = sum_i f(x)[i] sum_{e in i} g[...]   (homogeneous: per row, then summed)
    #   x_bar_i  = sum_{e in row i} w_e g[s_e, j_e]    (every row; only when weighted: linear in x)
    g = cts[0]

    def ring_bar():
        return g.astype(ad_rules.aval_of(ring).dtype)

    def data_bar():
        aval = ad_rules.aval_of(data)
        nnz = indices.shape[0]
        one = jnp.ones((1,), aval.dtype)
        per_edge = aval.shape[0] == nnz
        out = _bind_gather(g, events, one, indices, indptr, delays, t, shape=shape, weighted=weighted,
                           per_edge=per_edge, by_event=True, dtype=aval.dtype, backend=backend)
        if per_edge:
            return out
        acc = compute_dtype(aval.dtype)
        return jnp.sum(out.astype(acc)).astype(aval.dtype).reshape(1)

    def events_bar():
        aval = ad_rules.aval_of(events)
        return _bind_gather(g, jnp.zeros((shape[0],), jnp.bool_), data, indices, indptr, delays, t, shape=shape,
                            weighted=False, per_edge=False, by_event=False, dtype=aval.dtype, backend=backend)

    per_argument = {0: ring_bar, 2: data_bar}
    if weighted:
        per_argument[1] = events_bar
    return ad_rules.linear_cotangents((ring, events, data, indices, indptr, delays, t), per_argument,
                                      name=csr_delay_deliver_p.name)


def _deliver_batching(args, axes, *, outs, shape, weighted, backend):
    # any operand batched (ring, events, weights, delays, t, the structure): one call per element, each
    # event-driven (rules.batching.sequential_batch)
    return batching_rules.sequential_batch(csr_delay_deliver_p.primitive, args, axes, outs=outs, shape=shape,
                                           weighted=weighted, backend=backend)


csr_delay_deliver_p.def_reference(_reference_deliver)
csr_delay_deliver_p.def_jvp_rule2(_deliver_jvp_ring, _deliver_jvp_events, _deliver_jvp_data, None, None, None, None)
csr_delay_deliver_p.def_transpose_rule(_deliver_transpose)
csr_delay_deliver_p.def_batching_rule(_deliver_batching)


# ===========================================================================
# csr_delay_gather: out = per edge / per row of [f(x)[i]] w_e g[s_e, j_e]  (the cotangents)
# ===========================================================================
def csr_delay_gather(g, events, data, indices, indptr, delays, t, *, shape, weighted=False, per_edge=True,
                     by_event=True, dtype=None, backend: str | None = None) -> jax.Array:
    """Read a ring through the delayed connection: the cotangents of :func:`csr_delay_deliver`.

    With ``s_e = (t + d_e) mod L`` (as in :func:`csr_delay_deliver`) and the
    term ``c_e = w_e * g[s_e, indices[e]]``:

    * ``by_event=True``: only active rows (``events[i] != 0``) are visited;
      their terms are scaled by ``f(x)[i]`` (1, or ``x[i]`` when weighted);
      inactive rows give exactly 0 whatever ``g`` or the weights hold;
    * ``by_event=False``: every row, unscaled (``events`` is not read);
    * ``per_edge=True``: the result is ``(nnz,)``, one term per edge (0 off
      the visited rows); ``False``: ``(n_pre,)``, the sum of each row's terms.

    ``csr_delay_gather(g, x, 1.0, ..., per_edge=True)`` is the weight
    gradient of the delivery; ``by_event=False, per_edge=False`` with the
    weights, the event gradient.

    Args:
        g: ``(L, n_post)`` float array (a ring cotangent).
        events: ``(n_pre,)`` events (or an event wrapper), as in
            :func:`csr_delay_deliver`.
        data, indices, indptr, delays, t, shape: as in :func:`csr_delay_deliver`.
        weighted: as in :func:`csr_delay_deliver` (default False).
        per_edge: one term per edge (True) or one sum per row (False).
        by_event: visit (and scale by) active rows only.
        dtype: the result dtype (default: ``g``'s).
        backend: as in :func:`csr_delay_deliver`.

    Returns:
        ``(nnz,)`` or ``(n_pre,)`` in ``dtype``.

    Raises:
        TypeError, ValueError: as :func:`csr_delay_deliver`.

    Example:
        >>> dw = csr_delay_gather(g, spikes, 1.0, indices, indptr, delays, t, shape=(n_pre, n_post))
    """
    who = "csr_delay_gather"
    (g, events, data, indices, indptr, delays, t), shape, weighted = _deliver_operands(
        g, events, data, indices, indptr, delays, t, shape, weighted, who)
    return _bind_gather(g, events, data, indices, indptr, delays, t, shape=shape, weighted=weighted,
                        per_edge=bool(per_edge), by_event=bool(by_event), dtype=g.dtype if dtype is None else dtype,
                        backend=backend)


def _bind_gather(g, events, data, indices, indptr, delays, t, *, shape, weighted, per_edge, by_event, dtype, backend):
    n = indices.shape[0] if per_edge else shape[0]
    return csr_delay_gather_p.bind(g, events, data, indices, indptr, delays, t,
                                   outs=[jax.ShapeDtypeStruct((n,), dtype)], shape=tuple(shape),
                                   weighted=bool(weighted), per_edge=bool(per_edge), by_event=bool(by_event),
                                   backend=backend)[0]


csr_delay_gather_p = XLACustomKernel("evjax_csr_delay_gather")


def _reference_gather(g, events, data, indices, indptr, delays, t, *, outs, shape, weighted, per_edge, by_event):
    # term_e = w_e g[s_e, j_e], times f(x)[row e] on active rows only when by_event (0 elsewhere, a select)
    out = outs[0]
    acc = compute_dtype(out.dtype)
    n_slots, n_post = g.shape
    nnz = indices.shape[0]
    if nnz == 0 or n_post == 0:
        return [jnp.zeros(out.shape, out.dtype)]
    s, j, valid, f, w, rows = _edges(events, data, indices, indptr, delays, t, n_slots, n_post, weighted, acc)
    term = w * g.astype(acc)[s, j]
    keep = valid & (f != 0) if by_event else valid
    term = jnp.where(keep, f * term if by_event else term, jnp.zeros((), acc))
    if not per_edge:
        term = jax.ops.segment_sum(term, rows, num_segments=shape[0])
    return [term.astype(out.dtype)]


def _gather_jvp_g(tangent, g, events, data, indices, indptr, delays, t, *, outs, **params):
    # linear in g: d out = gather(dg)
    return csr_delay_gather_p.primitive.bind(tangent, events, data, indices, indptr, delays, t, outs=outs, **params)


def _gather_jvp_data(tangent, g, events, data, indices, indptr, delays, t, *, outs, **params):
    # linear in w: d out = gather(g, dw)
    return csr_delay_gather_p.primitive.bind(g, events, tangent, indices, indptr, delays, t, outs=outs, **params)


def _gather_jvp_events(tangent, g, events, data, indices, indptr, delays, t, *, outs, shape, weighted, per_edge,
                       by_event, backend):
    # by_event: linear in f(x) (weighted; straight-through when binary): d out = gather(g, dx) weighted;
    # not by_event: no dependence on the events
    if not by_event or tangent.dtype == jax.dtypes.float0:
        return [jnp.zeros(outs[0].shape, outs[0].dtype)]
    return csr_delay_gather_p.primitive.bind(g, tangent, data, indices, indptr, delays, t, outs=outs, shape=shape,
                                             weighted=True, per_edge=per_edge, by_event=True, backend=backend)


def _gather_transpose(cts, g, events, data, indices, indptr, delays, t, *, outs, shape, weighted, per_edge, by_event,
                      backend):
    # transposed in g only: out = G(g) with G a sum of terms c f w g[s_e, j_e]; its transpose scatters
    # ct back through the same slots: g_bar[s_e, j_e] += f(x)[i] w_e ct[e or i] on the visited rows,
    # i.e. a delivery into a zero ring with the ct folded into the weights (per edge) or the events (per row)
    ct = cts[0]
    aval = ad_rules.aval_of(g)
    acc = compute_dtype(aval.dtype)
    zeros = jnp.zeros(aval.shape, aval.dtype)

    def g_bar():
        nnz = indices.shape[0]
        if per_edge:
            w = jnp.broadcast_to(data.astype(acc), (nnz,)) * ct.astype(acc)
            x = events if by_event else jnp.ones((shape[0],), jnp.bool_)
            return _bind_deliver(zeros, x, w.astype(aval.dtype), indices, indptr, delays, t, shape=shape,
                                 weighted=weighted and by_event, backend=backend)
        v = ct.astype(acc) * (event_values(events, weighted, acc) if by_event else 1)
        return _bind_deliver(zeros, v, data, indices, indptr, delays, t, shape=shape, weighted=True,
                             backend=backend)

    return ad_rules.linear_cotangents((g, events, data, indices, indptr, delays, t), {0: g_bar},
                                      name=csr_delay_gather_p.name)


def _gather_batching(args, axes, *, outs, **params):
    # any operand batched: one call per element (rules.batching.sequential_batch)
    return batching_rules.sequential_batch(csr_delay_gather_p.primitive, args, axes, outs=outs, **params)


csr_delay_gather_p.def_reference(_reference_gather)
csr_delay_gather_p.def_jvp_rule2(_gather_jvp_g, _gather_jvp_events, _gather_jvp_data, None, None, None, None)
csr_delay_gather_p.def_transpose_rule(_gather_transpose)
csr_delay_gather_p.def_batching_rule(_gather_batching)

OPS = (csr_delay_deliver_p, csr_delay_gather_p)


# ===========================================================================
# CSRDelayLayout, csr_delay_deliver_layout: the edges of each row sorted by delay (host precomputation)
# ===========================================================================
@jax.tree_util.register_pytree_node_class
class CSRDelayLayout:
    """A CSR connection with per-edge delays, its edges sorted by delay within each row.

    The edges of every row are ordered by delay (ties keep their original
    order); ``delay_ptr[i, d]`` is the position where row ``i``'s edges of
    delay ``d`` start.  The weights live in layout order: use
    :meth:`with_data` to load weights given in the original edge order and
    :meth:`original_data` to read them back.  A JAX pytree: the arrays are
    leaves (a layout passes through ``jax.jit``, ``grad`` gives a layout of
    cotangents), ``shape`` is static.

    evjax's kernels deliver a layout as they deliver any CSR (the same op,
    bound on the layout's arrays), so its result is that of
    :func:`csr_delay_deliver` on the original CSR, bit for bit on the serial
    CPU backend; ``delay_ptr`` is kept for brainevent compatibility (its
    delay-major GPU kernel), and costs ``n_pre * L`` index entries.

    Args:
        data: weights in layout order, ``(1,)`` or ``(nnz,)``.
        indices: ``(nnz,)`` columns in layout order.
        indptr: ``(n_pre + 1,)`` row pointers.
        delays: ``(nnz,)`` delays in layout order.
        delay_ptr: ``(n_pre, L)``, ``indptr``'s dtype.
        perm: ``(nnz,)``: ``perm[k]`` is the original index of the edge at
            layout position ``k``.
        shape: ``(n_pre, n_post)``.

    Attributes:
        n_slots: the ring length ``L`` the layout was built for.
        nse: the number of stored edges.

    Example:
        >>> layout = CSRDelayLayout.build(jnp.array([1., 2., 3.]), jnp.array([0, 2, 1]),
        ...                               jnp.array([0, 2, 3]), jnp.array([2, 1, 1]), n_slots=3, shape=(2, 3))
        >>> layout.indices, layout.original_data()
        (Array([2, 0, 1], dtype=int32), Array([1., 2., 3.], dtype=float32))
    """

    def __init__(self, data, indices, indptr, delays, delay_ptr, perm, *, shape):
        self.data = data
        self.indices = indices
        self.indptr = indptr
        self.delays = delays
        self.delay_ptr = delay_ptr
        self.perm = perm
        self.shape = (int(shape[0]), int(shape[1]))

    @property
    def n_slots(self) -> int:
        """The ring length ``L`` the layout was built for."""
        return int(np.shape(self.delay_ptr)[1])

    @property
    def nse(self) -> int:
        """The number of stored edges."""
        return int(np.shape(self.indices)[0])

    def tree_flatten(self):
        return (self.data, self.indices, self.indptr, self.delays, self.delay_ptr, self.perm), self.shape

    @classmethod
    def tree_unflatten(cls, shape, children):
        return cls(*children, shape=shape)

    def __repr__(self) -> str:
        return f"CSRDelayLayout(shape={self.shape}, nse={self.nse}, n_slots={self.n_slots})"

    @classmethod
    def build(cls, data, indices, indptr, delays, *, n_slots: int, shape) -> "CSRDelayLayout":
        """Build a layout from a CSR connection and its per-edge delays (NumPy, on the host, once).

        Args:
            data: weights in the original edge order: a scalar, ``(1,)`` or
                ``(nnz,)``; may be traced.
            indices: ``(nnz,)`` columns; concrete.
            indptr: ``(n_pre + 1,)`` row pointers; concrete.
            delays: integer delays, a scalar or ``(nnz,)``, each in ``[0,
                n_slots)``; concrete.
            n_slots: the ring length ``L`` (at least 1).
            shape: ``(n_pre, n_post)``.

        Returns:
            The layout.

        Raises:
            TypeError: a traced structure or delays, or non-integer delays.
            ValueError: ``n_slots < 1``, a delay outside ``[0, n_slots)``, or
                inconsistent shapes.

        Example:
            >>> layout = CSRDelayLayout.build(0.5, indices, indptr, delays, n_slots=8, shape=(n_pre, n_post))
        """
        who = "CSRDelayLayout.build"
        for name, x in (("indices", indices), ("indptr", indptr), ("delays", delays)):
            if not is_concrete(x):
                raise TypeError(f"{who}: {name} must be concrete (it is precomputed on the host); build the "
                                f"layout once, outside jit/vmap/grad")
        if isinstance(n_slots, bool) or not isinstance(n_slots, (int, np.integer)) or n_slots < 1:
            raise ValueError(f"{who}: n_slots must be an integer >= 1 (the ring's rows), got {n_slots!r}")
        n_slots = int(n_slots)
        n_pre, n_post = check_shape(shape, who, dims=("n_pre", "n_post"))
        indices_j, indptr_j = check_compressed(indices, indptr, n_pre, None, who, _ROWS)
        nnz = indices_j.shape[0]
        delays_j = check_delays(delays, nnz, n_slots, who)
        data = canonical(data)
        data = _check_data(data, nnz, data.dtype if jnp.issubdtype(data.dtype, jnp.floating) else jnp.float32, who)
        ptr = np.asarray(indptr_j)
        d = np.broadcast_to(np.asarray(delays_j), (nnz,))
        rows = np.repeat(np.arange(n_pre, dtype=np.int64), np.diff(ptr).astype(np.int64))
        perm = np.lexsort((d, rows))  # by row, then delay; stable: ties keep their order
        counts = np.bincount(rows * n_slots + d[perm].astype(np.int64), minlength=n_pre * n_slots)
        starts = np.zeros(n_pre * n_slots, np.int64)
        if n_pre * n_slots > 1:
            np.cumsum(counts[:-1], out=starts[1:])
        perm_j = jnp.asarray(perm.astype(np.int32 if nnz <= _INT32_MAX else np.int64))
        if data.shape[0] == nnz and nnz != 1:
            data = data[perm_j]
        return cls(data, jnp.asarray(np.asarray(indices_j)[perm]), indptr_j,
                   jnp.asarray(d[perm].astype(np.asarray(delays_j).dtype)),
                   jnp.asarray(starts.reshape(n_pre, n_slots).astype(ptr.dtype)), perm_j, shape=(n_pre, n_post))

    def with_data(self, data) -> "CSRDelayLayout":
        """A copy holding ``data`` given in the original edge order (stored as ``data[perm]``).

        Args:
            data: a scalar, ``(1,)`` or ``(nnz,)`` in the order of the CSR the
                layout was built from.

        Returns:
            The layout with those weights.

        Raises:
            ValueError: a wrong shape.

        Example:
            >>> layout = layout.with_data(new_weights)   # original order in, layout order stored
        """
        data = canonical(data)
        if data.ndim == 0:
            data = data.reshape(1)
        if data.ndim != 1 or data.shape[0] not in (1, self.nse):
            raise ValueError(f"CSRDelayLayout.with_data: data must be a scalar, (1,) or (nse,) = ({self.nse},), "
                             f"got shape {tuple(data.shape)}")
        if data.shape[0] == self.nse and self.nse != 1:
            data = data[self.perm]
        return CSRDelayLayout(data, self.indices, self.indptr, self.delays, self.delay_ptr, self.perm,
                              shape=self.shape)

    def original_data(self):
        """The weights in the original edge order (unchanged when homogeneous).

        Returns:
            ``data`` scattered back through ``perm``.

        Example:
            >>> w = layout.original_data()   # the order of the CSR it was built from
        """
        data = jnp.asarray(self.data)
        if data.shape[0] != self.nse or self.nse == 1:
            return data
        return jnp.zeros_like(data).at[self.perm].set(data, unique_indices=True)

    def deliver(self, ring, events, t, *, weighted=None, backend: str | None = None):
        """Deliver events into ``ring``: :func:`csr_delay_deliver_layout` on this layout.

        Args:
            ring, events, t, weighted, backend: as in :func:`csr_delay_deliver_layout`.

        Returns:
            The new ring.

        Example:
            >>> ring = layout.deliver(ring, spikes, t)
        """
        return csr_delay_deliver_layout(ring, events, self, t, weighted=weighted, backend=backend)


def csr_delay_deliver_layout(ring, events, layout: CSRDelayLayout, t, *, weighted=None,
                             backend: str | None = None) -> jax.Array:
    """Deliver spikes with per-edge delays through a :class:`CSRDelayLayout`.

    The same result as :func:`csr_delay_deliver` on the CSR the layout was
    built from (bit for bit on the serial ``numba`` backend: within a row,
    edges of one delay keep their order, and edges of different delays go
    to different slots).  It binds ``csr_delay_deliver_p`` (which
    ``csr_delay_deliver_layout_p`` names) on the layout's arrays; the
    gradient w.r.t. ``layout.data`` is in layout order.

    Args:
        ring: ``(layout.n_slots, n_post)`` float arrival buffer.
        events: ``(n_pre,)`` events, or an event wrapper.
        layout: built by :meth:`CSRDelayLayout.build`.
        t: the current integer step; may be traced.
        weighted: as in :func:`csr_delay_deliver`.
        backend: as in :func:`csr_delay_deliver`.

    Returns:
        The new ring, in ``ring``'s dtype.

    Raises:
        TypeError: ``layout`` is not a CSRDelayLayout, or as
            :func:`csr_delay_deliver`.
        ValueError: ``ring`` does not have ``layout.n_slots`` rows, or as
            :func:`csr_delay_deliver`.

    Example:
        >>> layout = CSRDelayLayout.build(0.5, indices, indptr, delays, n_slots=8, shape=(n_pre, n_post))
        >>> ring = csr_delay_deliver_layout(ring, spikes, layout, t)
    """
    who = "csr_delay_deliver_layout"
    if not isinstance(layout, CSRDelayLayout):
        raise TypeError(f"{who}: layout must be a CSRDelayLayout (build one with CSRDelayLayout.build), got "
                        f"{type(layout).__name__}")
    if np.ndim(ring) != 2 or np.shape(ring)[0] != layout.n_slots:
        raise ValueError(f"{who}: ring must have layout.n_slots = {layout.n_slots} rows (the layout was built for "
                         f"that ring length), got shape {tuple(np.shape(ring))}; rebuild the layout with "
                         f"n_slots={np.shape(ring)[0] if np.ndim(ring) else '...'} or pass a matching ring")
    args, shape, weighted = _deliver_operands(ring, events, layout.data, layout.indices, layout.indptr,
                                              layout.delays, t, layout.shape, weighted, who)
    return _bind_deliver(*args, shape=shape, weighted=weighted, backend=backend)

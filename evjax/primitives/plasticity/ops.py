"""Event-driven weight updates of a CSR connection: plasticity (STDP) on pre- and postsynaptic spikes.

Ops (:class:`~evjax.XLACustomKernel` instances, brainevent's names):

* ``update_csr_on_binary_pre_p``: operands ``(weight, indices, indptr,
  pre_spike, post_trace, bounds)``; for each active presynaptic neuron ``i``
  and each synapse ``k`` of its row, ``weight[k] += post_trace[indices[k]]``;
* ``update_csr_on_binary_post_p``: operands ``(weight, indices, indptr,
  weight_indices, pre_trace, post_spike, bounds)``, with ``indices, indptr``
  the *column* (CSC) view of the same connection and ``weight_indices`` the
  CSR position of each CSC entry (a permutation of ``range(nnz)``); for each
  active postsynaptic neuron ``j`` and each synapse of its column,
  ``weight[weight_indices[e]] += pre_trace[indices[e]]``.

The two are one computation over "lines" (rows, or columns): for each active
line, each of its entries ``e`` moves the weight at position ``p(e)``
(``e`` itself, or ``weight_indices[e]``) by the trace of its other end, then
clips it.  Their rules below are shared; ``_lines`` names the operands.

``bounds`` is ``[w_min, w_max]`` in the weights' dtype, data (new bounds do
not retrace); whether each is given is static (params ``clip_min``,
``clip_max``), and a bound not given is ``-inf``/``+inf`` to the kernels.  Clipping is
``min(max(w, w_min), w_max)`` with NaN propagated as ``jnp.clip`` does, and
it applies to the updated synapses only.

Semantics (``docs/semantics.md``): a spike is ``s != 0``; a synapse whose
line is inactive keeps its weight bit for bit, NaN included, whatever the
trace holds; updated ones follow IEEE.  Cost: the synapses of active lines
(the backends visit nothing else) plus the copy of ``weight``.

Derivatives (``jvp``, ``grad``): those of the dense formula ``where(active,
jnp.clip(w + trace[idx], w_min, w_max), w)``, as ``jax.numpy`` takes them: in
the weights, 1 where the synapse is not updated or its update is not
clipped, 0 where it is clipped; in the trace, the same slope at each updated
synapse's trace entry; in a bound, 1 where the update clipped to it; a tie
between the sum and a bound splits the slope in halves, as ``jnp.maximum``
does.  Spikes and the structure have none.  ``vmap`` over any operand, structures included, runs one call per
batch element.

Backends are declared, not imported (``numba``, ``warp``, ``numba_cuda``).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ...units import carries_units
from ..._validation import canonical, check_compressed, check_index_vector, check_shape
from ...dtypes import as_dtype, compute_dtype
from ...rules import batching as batching_rules
from ...xla_custom_kernel import XLACustomKernel
from ..grouping import transposed_view

__all__ = [
    "update_csr_on_binary_pre", "update_csr_on_binary_post", "update_csr_on_binary_pre_p",
    "update_csr_on_binary_post_p", "update_csc_on_binary_pre", "update_csc_on_binary_post",
    "update_fixed_post_conn_on_binary_pre",
    "update_fixed_pre_conn_on_binary_post", "update_dense_on_binary_pre", "update_dense_on_binary_post",
    "update_dense_on_binary_pre_p", "update_dense_on_binary_post_p", "OPS",
]

_FLOATS = (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64)


# ===========================================================================
# Validation and binding
# ===========================================================================
def _check_weight(weight, indices, who: str):
    weight = canonical(weight)
    if weight.ndim != 1 or weight.dtype not in [jnp.dtype(d) for d in _FLOATS]:
        raise TypeError(f"{who}: weight must be the 1-d float array of the synapses' weights (nnz,), got "
                        f"{weight.dtype}{list(weight.shape)}; a homogeneous weight has no per-synapse "
                        f"values to update: broadcast it first, e.g. jnp.full(nnz, w)")
    nnz = np.shape(indices)[0] if np.ndim(indices) == 1 else None
    if weight.shape[0] == 1 and nnz not in (None, 1):
        raise ValueError(f"{who}: weight has one value shared by all {nnz} synapses (a homogeneous matrix), and an "
                         f"update needs per-synapse weights to move: broadcast it first, e.g. jnp.full({nnz}, w)")
    return weight


def _check_line_vector(x, name: str, length: int, who: str, *, events: bool):
    x = canonical(x)
    if x.ndim != 1 or x.shape[0] != length:
        raise ValueError(f"{who}: {name} must be a vector of {length} entries (from shape), got shape {x.shape}")
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        raise TypeError(f"{who}: {name} must be real, got {x.dtype}")
    if not events and not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{who}: {name} must be float, got {x.dtype}; convert it, e.g. {name}.astype(jnp.float32)")
    return x


def _bounds(w_min, w_max, dtype, who: str):
    """``[w_min, w_max]`` in ``dtype``; a bound not given is -inf / +inf."""
    values = []
    for name, bound, missing in (("w_min", w_min, -np.inf), ("w_max", w_max, np.inf)):
        if bound is None:
            values.append(jnp.asarray(missing, dtype))
            continue
        bound = jnp.asarray(bound)
        if bound.ndim != 0 or not (jnp.issubdtype(bound.dtype, jnp.floating)
                                   or jnp.issubdtype(bound.dtype, jnp.integer)):
            raise TypeError(f"{who}: {name} must be a real scalar or None, got {bound.dtype}{list(bound.shape)}")
        values.append(bound.astype(dtype))
    return jnp.stack(values)


# what to pass, for check_compressed's message
_ROWS, _COLUMNS = "the CSR (row) structure of the weights", "the CSC (column) structure of the weights"


def _shape(shape, who: str) -> tuple[int, int]:
    return check_shape(shape, who, dims=("n_pre", "n_post"))


def _spikes_and_trace(spike, trace, shape, on_pre: bool, who: str):
    """The checked spikes of the lines that fire (``pre_spike``: ``n_pre`` rows; ``post_spike``: ``n_post``
    columns) and the trace of the other end (``post_trace``, ``pre_trace``)."""
    n_pre, n_post = shape
    if on_pre:
        return (_check_line_vector(spike, "pre_spike", n_pre, who, events=True),
                _check_line_vector(trace, "post_trace", n_post, who, events=False))
    return (_check_line_vector(spike, "post_spike", n_post, who, events=True),
            _check_line_vector(trace, "pre_trace", n_pre, who, events=False))


def _bind_lines(weight, indices, indptr, spikes, trace, w_min, w_max, backend, who: str, positions=None):
    """The one binding of every update: ``update_csr_on_binary_pre_p`` on lines kept contiguous (CSR rows,
    CSC columns, table rows: each entry is its own weight position), ``update_csr_on_binary_post_p`` where
    ``positions`` gives each entry's weight position."""
    op, lines = (update_csr_on_binary_pre_p, (weight, indices, indptr)) if positions is None else (
        update_csr_on_binary_post_p, (weight, indices, indptr, positions))
    return op.bind(*lines, trace, spikes, _bounds(w_min, w_max, weight.dtype, who),
                   outs=[jax.ShapeDtypeStruct(weight.shape, weight.dtype)], indirect=positions is not None,
                   clip_min=w_min is not None, clip_max=w_max is not None, backend=backend)[0]


def _update_contiguous(weight, indices, indptr, spike, trace, w_min, w_max, shape, backend, on_pre: bool, who: str):
    """The update of weights stored with the firing lines contiguous: CSR rows (``on_pre``), CSC columns."""
    n_pre, n_post = _shape(shape, who)
    weight = _check_weight(weight, indices, who)
    indices, indptr = check_compressed(indices, indptr, n_pre if on_pre else n_post, weight.shape[0], who,
                                       _ROWS if on_pre else _COLUMNS)
    spikes, trace = _spikes_and_trace(spike, trace, (n_pre, n_post), on_pre, who)
    return _bind_lines(weight, indices, indptr, spikes, trace, w_min, w_max, backend, who)


# ===========================================================================
# Pure-JAX reference (the fallback backend and the tests' oracle)
# ===========================================================================
def _line_of_entries(indptr, nnz: int):
    """The line (row or column) of each of the ``nnz`` entries."""
    lines = jnp.arange(indptr.shape[0] - 1, dtype=indptr.dtype)
    return jnp.repeat(lines, jnp.diff(indptr), total_repeat_length=nnz)


def _clip(v, bounds, clip_min: bool, clip_max: bool):
    # min(max(v, lo), hi), NaN propagated (jnp.clip's order and NaN rule); a bound not given is skipped
    v = jnp.maximum(v, bounds[0]) if clip_min else v
    return jnp.minimum(v, bounds[1]) if clip_max else v


def _lines(args, indirect: bool):
    """``(weight, indices, indptr, positions, trace, spikes, bounds)``; ``positions`` None when direct."""
    if indirect:
        return args
    weight, indices, indptr, trace, spikes, bounds = args
    return weight, indices, indptr, None, trace, spikes, bounds


def kernel_lines(args, indirect: bool, dtype):
    """The CSR ops' operands as every backend's kernel takes them: ``(weight, indices, indptr, positions,
    trace, active, bounds)``, with the weights, trace and bounds in ``dtype`` (the compute dtype),
    ``active = spikes != 0``, and ``positions`` empty (of the indices' dtype) for the row view."""
    weight, indices, indptr, positions, trace, spikes, bounds = _lines(args, indirect)
    if positions is None:
        positions = jnp.zeros((0,), indices.dtype)
    return (as_dtype(weight, dtype), indices, indptr, positions, as_dtype(trace, dtype), spikes != 0,
            as_dtype(bounds, dtype))


def _raw_update(args, indirect: bool):
    """``(positions, active, current, raw)`` per entry: where it writes, whether its line fired,
    the weight there, and that weight plus the trace (before clipping), in the compute dtype."""
    weight, indices, indptr, positions, trace, spikes, bounds = _lines(args, indirect)
    acc = compute_dtype(weight.dtype)
    nnz = weight.shape[0]
    active = (spikes != 0)[_line_of_entries(indptr, nnz)]
    pos = jnp.arange(nnz, dtype=indptr.dtype) if positions is None else positions
    current = weight.astype(acc)[pos]
    raw = current + trace.astype(acc)[indices]
    return pos, active, current, raw


def _reference_update(*args, outs, indirect: bool, clip_min: bool, clip_max: bool):
    # w'[p(e)] = clip(w[p(e)] + trace[idx(e)]) for each entry e of an active line; w' = w elsewhere
    weight, bounds = args[0], args[-1]
    pos, active, current, raw = _raw_update(args, indirect)
    acc = raw.dtype
    new = jnp.where(active, _clip(raw, bounds.astype(acc), clip_min, clip_max), current)
    return [weight.at[pos].set(new.astype(weight.dtype), unique_indices=True)]


# ===========================================================================
# Rule helpers (maths as comments)
# ===========================================================================
def _balanced(x, result, other):
    # d result / d x of result = max(x, other) or min(x, other), as jax.numpy differentiates them:
    # 1 where x is the result alone, 1/2 at a tie, 0 where the other operand is (NaN: 0)
    return jnp.where(x == result, jnp.where(other == result, 0.5, 1.0), 0.0).astype(result.dtype)


def _coefficients(args, indirect: bool, clip_min: bool, clip_max: bool):
    """Per entry: ``pos``, ``active``, and the derivatives of ``clip(raw) = min(max(raw, lo), hi)`` in
    ``raw``, ``lo`` and ``hi`` (the chain rule through jnp's max and min, ties and NaN included; a
    bound not given is no step)."""
    pos, active, _, raw = _raw_update(args, indirect)
    return (pos, active, *_clip_slopes(raw, args[-1], clip_min, clip_max))


def _clip_slopes(raw, bounds, clip_min: bool, clip_max: bool):
    """``(d/d raw, d/d lo, d/d hi)`` of ``min(max(raw, lo), hi)`` (a bound not given: no step)."""
    lo, hi = bounds.astype(raw.dtype)[0], bounds.astype(raw.dtype)[1]
    one, zero = jnp.ones_like(raw), jnp.zeros_like(raw)
    above = jnp.maximum(raw, lo) if clip_min else raw
    d_raw, d_lo = (_balanced(raw, above, lo), _balanced(lo, above, raw)) if clip_min else (one, zero)
    if clip_max:
        clipped = jnp.minimum(above, hi)
        through, d_hi = _balanced(above, clipped, hi), _balanced(hi, clipped, above)
    else:
        through, d_hi = one, zero
    return through * d_raw, through * d_lo, d_hi


def _at_positions(values, pos, nnz: int, fill):
    """Entry-ordered ``values`` placed at the weight positions ``pos``."""
    return jnp.full((nnz,), fill, values.dtype).at[pos].set(values, unique_indices=True)


# ===========================================================================
# update_csr_on_binary_pre, update_csr_on_binary_post
# ===========================================================================
@carries_units("weight", events=("pre_spike",), shared={"post_trace": "weight", "w_min": "weight", "w_max": "weight"})
def update_csr_on_binary_pre(weight, indices, indptr, pre_spike, post_trace, w_min=None, w_max=None, *,
                             shape, backend: str | None = None) -> jax.Array:
    """Weights of a CSR connection after presynaptic spikes: ``w += post_trace`` on the rows that fired.

    For each presynaptic neuron ``i`` with ``pre_spike[i] != 0`` and each
    synapse ``k`` of row ``i``: ``weight[k] = clip(weight[k] +
    post_trace[indices[k]], w_min, w_max)``. Other synapses keep their weights
    bit for bit. Only the synapses of active rows are visited.

    Args:
        weight: ``(nnz,)`` float weights of the CSR structure.
        indices: ``(nnz,)`` postsynaptic index of each synapse.
        indptr: ``(n_pre + 1,)`` row pointers.
        pre_spike: ``(n_pre,)`` bool, or numbers where nonzero is a spike.
        post_trace: ``(n_post,)`` float trace of the postsynaptic neurons.
        w_min: lower bound for updated weights (a scalar), or None.
        w_max: upper bound for updated weights (a scalar), or None.
        shape: ``(n_pre, n_post)``.
        backend: ``"numba"``, ``"warp"``, ``"numba_cuda"``, ``"reference"``
            (default: the platform's).

    Returns:
        ``(nnz,)`` the new weights, in ``weight``'s dtype.

    Raises:
        TypeError, ValueError: an argument of the wrong kind or shape, named.

    Example:
        >>> w = evjax.update_csr_on_binary_pre(w, W.indices, W.indptr, spikes, post_trace,
        ...                                    w_min=0.0, w_max=1.0, shape=W.shape)
    """
    return _update_contiguous(weight, indices, indptr, pre_spike, post_trace, w_min, w_max, shape, backend, True,
                              "update_csr_on_binary_pre")


@carries_units("weight", events=("post_spike",), shared={"pre_trace": "weight", "w_min": "weight", "w_max": "weight"})
def update_csr_on_binary_post(weight, indices, indptr, weight_indices, pre_trace, post_spike, w_min=None,
                              w_max=None, *, shape, backend: str | None = None) -> jax.Array:
    """Weights of a CSR connection after postsynaptic spikes: ``w += pre_trace`` on the columns that fired.

    ``indices, indptr`` are the column (CSC) view of the connection and
    ``weight_indices`` the CSR position of each of its entries (``evjax.CSR``'s
    ``transpose`` structure and permutation give them, computed once). For
    each postsynaptic neuron ``j`` with ``post_spike[j] != 0`` and each entry
    ``e`` of column ``j``: ``weight[p] = clip(weight[p] + pre_trace[indices[e]],
    w_min, w_max)`` with ``p = weight_indices[e]``. Other synapses keep their
    weights bit for bit. Only the synapses of active columns are visited.

    Args:
        weight: ``(nnz,)`` float weights, in CSR order.
        indices: ``(nnz,)`` presynaptic index of each CSC entry.
        indptr: ``(n_post + 1,)`` column pointers.
        weight_indices: ``(nnz,)`` CSR position of each CSC entry (a permutation).
        pre_trace: ``(n_pre,)`` float trace of the presynaptic neurons.
        post_spike: ``(n_post,)`` bool, or numbers where nonzero is a spike.
        w_min, w_max: bounds for updated weights (scalars), or None.
        shape: ``(n_pre, n_post)``.
        backend: as in :func:`update_csr_on_binary_pre`.

    Returns:
        ``(nnz,)`` the new weights, in ``weight``'s dtype.

    Raises:
        TypeError, ValueError: an argument of the wrong kind or shape, named.

    Example:
        >>> csc_indptr, csc_indices, weight_indices = evjax.csr_to_csc_index(W.indptr, W.indices, shape=W.shape)
        >>> w = evjax.update_csr_on_binary_post(w, csc_indices, csc_indptr, weight_indices, pre_trace,
        ...                                     post_spikes, w_min=0.0, w_max=1.0, shape=W.shape)
    """
    who = "update_csr_on_binary_post"
    n_pre, n_post = _shape(shape, who)
    weight = _check_weight(weight, indices, who)
    indices, indptr = check_compressed(indices, indptr, n_post, weight.shape[0], who, _COLUMNS)
    positions = check_index_vector(weight_indices, "weight_indices", weight.shape[0], who).astype(indices.dtype)
    spikes, trace = _spikes_and_trace(post_spike, pre_trace, (n_pre, n_post), False, who)
    return _bind_lines(weight, indices, indptr, spikes, trace, w_min, w_max, backend, who, positions)


update_csr_on_binary_pre_p = XLACustomKernel("evjax_update_csr_on_binary_pre")
update_csr_on_binary_post_p = XLACustomKernel("evjax_update_csr_on_binary_post")


def _update_jvp_weight(tangent, *args, outs, indirect, clip_min, clip_max, backend):
    # w' = w off the updated synapses, clip(w + trace) on them:  dw' = dw there,
    # d clip / d raw * dw on them (1 inside the bounds, 0 where clipped, 1/2 at a tie)
    pos, active, d_raw, _, _ = _coefficients(args, indirect, clip_min, clip_max)
    slope = _at_positions(jnp.where(active, d_raw, 1), pos, tangent.shape[0], 1)
    return [(tangent.astype(slope.dtype) * slope).astype(outs[0].dtype)]


def _update_jvp_trace(tangent, *args, outs, indirect, clip_min, clip_max, backend):
    # dw'[p(e)] = d clip / d raw * dtrace[idx(e)] at each updated entry e; 0 elsewhere
    pos, active, d_raw, _, _ = _coefficients(args, indirect, clip_min, clip_max)
    moved = jnp.where(active, d_raw * tangent[args[1]].astype(d_raw.dtype), 0)
    return [_at_positions(moved, pos, args[0].shape[0], 0).astype(outs[0].dtype)]


def _update_jvp_bounds(tangent, *args, outs, indirect, clip_min, clip_max, backend):
    # dw'[p(e)] = d clip / d lo * dw_min + d clip / d hi * dw_max at each updated entry e
    pos, active, _, d_lo, d_hi = _coefficients(args, indirect, clip_min, clip_max)
    t = tangent.astype(d_lo.dtype)
    moved = jnp.where(active, d_lo * t[0] + d_hi * t[1], 0)
    return [_at_positions(moved, pos, args[0].shape[0], 0).astype(outs[0].dtype)]


def _update_batching(args, axes, *, outs, indirect, clip_min, clip_max, backend):
    # any operand batched (weights, spikes, traces, bounds, the structure): one call per element,
    # each event-driven (rules.batching.sequential_batch)
    op = update_csr_on_binary_post_p if indirect else update_csr_on_binary_pre_p
    return batching_rules.sequential_batch(op.primitive, args, axes, outs=outs, indirect=indirect,
                                           clip_min=clip_min, clip_max=clip_max, backend=backend)


update_csr_on_binary_pre_p.def_reference(_reference_update)
update_csr_on_binary_pre_p.def_jvp_rule2(_update_jvp_weight, None, None, _update_jvp_trace, None,
                                         _update_jvp_bounds)
update_csr_on_binary_pre_p.def_batching_rule(_update_batching)
update_csr_on_binary_post_p.def_reference(_reference_update)
update_csr_on_binary_post_p.def_jvp_rule2(_update_jvp_weight, None, None, None, _update_jvp_trace, None,
                                          _update_jvp_bounds)
update_csr_on_binary_post_p.def_batching_rule(_update_batching)

# ===========================================================================
# update_dense_on_binary_pre, update_dense_on_binary_post: a dense (n_pre, n_post) weight matrix; the
# lines are its rows (pre) or its columns (post).  Two primitives, one set of rules (param ``axis``).
# ===========================================================================
def _update_dense(weight, spike, trace, w_min, w_max, backend, axis: int, who: str):
    """Either dense update, checked and bound: the lines are the rows (``axis == 0``, the pre op) or the
    columns (the post op, whose operands are ``(W, trace, spikes, bounds)``)."""
    weight = canonical(weight)
    if weight.ndim != 2 or weight.dtype not in [jnp.dtype(d) for d in _FLOATS]:
        raise TypeError(f"{who}: weight must be a 2-d float (n_pre, n_post) matrix, got "
                        f"{weight.dtype}{list(weight.shape)}")
    spikes, trace = _spikes_and_trace(spike, trace, weight.shape, axis == 0, who)
    op, lines = (update_dense_on_binary_pre_p, (spikes, trace)) if axis == 0 else (
        update_dense_on_binary_post_p, (trace, spikes))
    return op.bind(weight, *lines, _bounds(w_min, w_max, weight.dtype, who),
                   outs=[jax.ShapeDtypeStruct(weight.shape, weight.dtype)], axis=axis, clip_min=w_min is not None,
                   clip_max=w_max is not None, backend=backend)[0]


@carries_units("weight", events=("pre_spike",), shared={"post_trace": "weight", "w_min": "weight", "w_max": "weight"})
def update_dense_on_binary_pre(weight, pre_spike, post_trace, w_min=None, w_max=None, *,
                               backend: str | None = None) -> jax.Array:
    """A dense weight matrix after presynaptic spikes: ``W[i, :] += post_trace`` on the rows that fired.

    For each ``i`` with ``pre_spike[i] != 0``: ``W[i, j] = clip(W[i, j] +
    post_trace[j], w_min, w_max)``; the other rows bit for bit. Only active
    rows are visited.

    Args:
        weight: ``(n_pre, n_post)`` float matrix.
        pre_spike: ``(n_pre,)`` bool, or numbers where nonzero is a spike.
        post_trace: ``(n_post,)`` float trace.
        w_min, w_max: bounds for updated weights (scalars), or None.
        backend: as in :func:`update_csr_on_binary_pre`.

    Returns:
        ``(n_pre, n_post)`` the new weights, in ``weight``'s dtype.

    Raises:
        TypeError, ValueError: an argument of the wrong kind or shape, named.

    Example:
        >>> W = evjax.update_dense_on_binary_pre(W, pre_spikes, post_trace, w_min=0.0, w_max=1.0)
    """
    return _update_dense(weight, pre_spike, post_trace, w_min, w_max, backend, 0, "update_dense_on_binary_pre")


@carries_units("weight", events=("post_spike",), shared={"pre_trace": "weight", "w_min": "weight", "w_max": "weight"})
def update_dense_on_binary_post(weight, pre_trace, post_spike, w_min=None, w_max=None, *,
                                backend: str | None = None) -> jax.Array:
    """A dense weight matrix after postsynaptic spikes: ``W[:, j] += pre_trace`` on the columns that fired.

    For each ``j`` with ``post_spike[j] != 0``: ``W[i, j] = clip(W[i, j] +
    pre_trace[i], w_min, w_max)``; the other columns bit for bit.

    Args:
        weight: ``(n_pre, n_post)`` float matrix.
        pre_trace: ``(n_pre,)`` float trace.
        post_spike: ``(n_post,)`` bool, or numbers where nonzero is a spike.
        w_min, w_max: bounds for updated weights (scalars), or None.
        backend: as in :func:`update_csr_on_binary_pre`.

    Returns:
        ``(n_pre, n_post)`` the new weights, in ``weight``'s dtype.

    Raises:
        TypeError, ValueError: an argument of the wrong kind or shape, named.

    Example:
        >>> W = evjax.update_dense_on_binary_post(W, pre_trace, post_spikes, w_min=0.0, w_max=1.0)
    """
    return _update_dense(weight, post_spike, pre_trace, w_min, w_max, backend, 1, "update_dense_on_binary_post")


update_dense_on_binary_pre_p = XLACustomKernel("evjax_update_dense_on_binary_pre")
update_dense_on_binary_post_p = XLACustomKernel("evjax_update_dense_on_binary_post")


def dense_lines(args, axis: int):
    """``(weight, spikes, trace, bounds)`` of either dense op (pre: ``(W, spikes, trace, bounds)``,
    post: ``(W, trace, spikes, bounds)``)."""
    weight, a, b, bounds = args
    return (weight, a, b, bounds) if axis == 0 else (weight, b, a, bounds)


def kernel_dense(args, axis: int, dtype):
    """Either dense op's operands as every backend's kernel takes them: ``(weight, active, trace, bounds)``,
    with ``active = spikes != 0`` and the rest in ``dtype`` (the compute dtype)."""
    weight, spikes, trace, bounds = dense_lines(args, axis)
    return as_dtype(weight, dtype), spikes != 0, as_dtype(trace, dtype), as_dtype(bounds, dtype)


def _dense_raw(args, axis: int):
    """``(active, raw)``: where the line fired (broadcast over the matrix) and ``W + trace`` there."""
    weight, spikes, trace, _ = dense_lines(args, axis)
    acc = compute_dtype(weight.dtype)
    active = (spikes != 0)[:, None] if axis == 0 else (spikes != 0)[None, :]
    other = trace.astype(acc)[None, :] if axis == 0 else trace.astype(acc)[:, None]
    return active, weight.astype(acc) + other


def _reference_dense_update(*args, outs, axis: int, clip_min: bool, clip_max: bool):
    # W'[i, j] = clip(W[i, j] + trace[other]) where line i (pre) or j (post) fired; W elsewhere
    weight, bounds = args[0], args[-1]
    active, raw = _dense_raw(args, axis)
    new = _clip(raw, bounds.astype(raw.dtype), clip_min, clip_max)
    return [jnp.where(active, new.astype(weight.dtype), weight)]


def _dense_jvp_weight(tangent, *args, outs, axis, clip_min, clip_max, backend):
    # dW' = dW off the active lines, d clip / d raw * dW on them
    active, raw = _dense_raw(args, axis)
    d_raw, _, _ = _clip_slopes(raw, args[-1], clip_min, clip_max)
    return [(tangent.astype(raw.dtype) * jnp.where(active, d_raw, 1)).astype(outs[0].dtype)]


def _dense_jvp_trace(tangent, *args, outs, axis, clip_min, clip_max, backend):
    # dW'[i, j] = d clip / d raw * dtrace[other end] on the active lines; 0 elsewhere
    active, raw = _dense_raw(args, axis)
    d_raw, _, _ = _clip_slopes(raw, args[-1], clip_min, clip_max)
    t = tangent.astype(raw.dtype)
    moved = d_raw * (t[None, :] if axis == 0 else t[:, None])
    return [jnp.where(active, moved, 0).astype(outs[0].dtype)]


def _dense_jvp_bounds(tangent, *args, outs, axis, clip_min, clip_max, backend):
    # dW' = d clip / d lo * dw_min + d clip / d hi * dw_max on the active lines
    active, raw = _dense_raw(args, axis)
    _, d_lo, d_hi = _clip_slopes(raw, args[-1], clip_min, clip_max)
    t = tangent.astype(raw.dtype)
    return [jnp.where(active, d_lo * t[0] + d_hi * t[1], 0).astype(outs[0].dtype)]


def _dense_update_batching(args, axes, *, outs, axis, clip_min, clip_max, backend):
    # any operand batched: one call per batch element (rules.batching.sequential_batch)
    op = update_dense_on_binary_pre_p if axis == 0 else update_dense_on_binary_post_p
    return batching_rules.sequential_batch(op.primitive, args, axes, outs=outs, axis=axis, clip_min=clip_min,
                                           clip_max=clip_max, backend=backend)


update_dense_on_binary_pre_p.def_jvp_rule2(_dense_jvp_weight, None, _dense_jvp_trace, _dense_jvp_bounds)
update_dense_on_binary_post_p.def_jvp_rule2(_dense_jvp_weight, _dense_jvp_trace, None, _dense_jvp_bounds)
for _op in (update_dense_on_binary_pre_p, update_dense_on_binary_post_p):
    _op.def_reference(_reference_dense_update)
    _op.def_batching_rule(_dense_update_batching)

CSR_OPS = (update_csr_on_binary_pre_p, update_csr_on_binary_post_p)
DENSE_OPS = (update_dense_on_binary_pre_p, update_dense_on_binary_post_p)
OPS = CSR_OPS + DENSE_OPS


# ===========================================================================
# The same update on other storage: each binds update_csr_on_binary_pre_p on lines that the
# storage keeps contiguous (CSC columns; the rows of a fixed-width table), so it is event-driven.
# ===========================================================================
@carries_units("weight", events=("post_spike",), shared={"pre_trace": "weight", "w_min": "weight", "w_max": "weight"})
def update_csc_on_binary_post(weight, indices, indptr, pre_trace, post_spike, w_min=None, w_max=None, *, shape,
                              backend: str | None = None) -> jax.Array:
    """Weights stored in CSC order after postsynaptic spikes: ``w += pre_trace`` on the columns that fired.

    For each postsynaptic neuron ``j`` with ``post_spike[j] != 0`` and each
    entry ``e`` of column ``j``: ``weight[e] = clip(weight[e] +
    pre_trace[indices[e]], w_min, w_max)``; the rest bit for bit. Only the
    synapses of active columns are visited.

    Args:
        weight: ``(nnz,)`` float weights in CSC order.
        indices: ``(nnz,)`` presynaptic (row) index of each entry.
        indptr: ``(n_post + 1,)`` column pointers.
        pre_trace: ``(n_pre,)`` float trace of the presynaptic neurons.
        post_spike: ``(n_post,)`` bool, or numbers where nonzero is a spike.
        w_min, w_max: bounds for updated weights (scalars), or None.
        shape: ``(n_pre, n_post)``.
        backend: as in :func:`update_csr_on_binary_pre`.

    Returns:
        ``(nnz,)`` the new weights, in ``weight``'s dtype.

    Raises:
        TypeError, ValueError: an argument of the wrong kind or shape, named.

    Example:
        >>> w = evjax.update_csc_on_binary_post(w, C.indices, C.indptr, pre_trace, post_spikes, shape=C.shape)
    """
    return _update_contiguous(weight, indices, indptr, post_spike, pre_trace, w_min, w_max, shape, backend, False,
                              "update_csc_on_binary_post")


@carries_units("weight", events=("pre_spike",), shared={"post_trace": "weight", "w_min": "weight", "w_max": "weight"})
def update_csc_on_binary_pre(weight, indices, indptr, pre_spike, post_trace, w_min=None, w_max=None, *, shape,
                             backend: str | None = None) -> jax.Array:
    """Weights stored in CSC order after presynaptic spikes: ``w += post_trace`` on the rows that fired.

    For each presynaptic neuron ``i`` with ``pre_spike[i] != 0`` and each
    stored synapse ``(i, j)``: ``W[i, j] = clip(W[i, j] + post_trace[j],
    w_min, w_max)``; the rest bit for bit.  A CSC structure keeps columns
    contiguous, not rows, so this first takes its row view
    (the CSR structure and the CSC position of each CSR entry, as
    :func:`evjax.csc_to_csr_index` gives them), then binds ``update_csr_on_binary_post_p`` on it,
    which visits only the synapses of active rows.  The row view costs one
    stable sort of the ``nnz`` entries: NumPy, once, when the structure is
    concrete at trace time (a jitted step that closes over it); ``jax.numpy``
    on every call when the structure is traced.  A step that runs many times
    with a traced structure should compute the view once and call
    :func:`update_csr_on_binary_post` with it.

    Args:
        weight: ``(nnz,)`` float weights in CSC order.
        indices: ``(nnz,)`` presynaptic (row) index of each entry.
        indptr: ``(n_post + 1,)`` column pointers.
        pre_spike: ``(n_pre,)`` bool, or numbers where nonzero is a spike.
        post_trace: ``(n_post,)`` float trace of the postsynaptic neurons.
        w_min, w_max: bounds for updated weights (scalars), or None.
        shape: ``(n_pre, n_post)``.
        backend: as in :func:`update_csr_on_binary_pre`.

    Returns:
        ``(nnz,)`` the new weights, in CSC order and ``weight``'s dtype.

    Raises:
        TypeError, ValueError: an argument of the wrong kind or shape, named.

    Example:
        >>> w = evjax.update_csc_on_binary_pre(w, C.indices, C.indptr, pre_spikes, post_trace, shape=C.shape)
    """
    who = "update_csc_on_binary_pre"
    n_pre, n_post = _shape(shape, who)
    weight = _check_weight(weight, indices, who)
    indices, indptr = check_compressed(indices, indptr, n_post, weight.shape[0], who, _COLUMNS)
    # the row view: the CSR structure of the stored CSC one, and the CSC position of each CSR entry
    row_indices, row_indptr, positions = transposed_view(indices, indptr, n_pre, indices.dtype)
    return update_on_row_view(weight, row_indices, row_indptr.astype(indices.dtype), positions, pre_spike, post_trace,
                              w_min, w_max, shape=(n_pre, n_post), backend=backend, who=who)


def update_on_row_view(weight, row_indices, row_indptr, positions, pre_spike, post_trace, w_min, w_max, *, shape,
                       backend, who: str) -> jax.Array:
    """Weights stored in another order (CSC) after presynaptic spikes, given the row view of their structure
    (``row_indices, row_indptr``: CSR; ``positions``: the weight position of each CSR entry): binds
    ``update_csr_on_binary_post_p`` on it (the synapses of active rows only).  ``CSC.update_on_pre`` calls
    it with the view it caches."""
    spikes, trace = _spikes_and_trace(pre_spike, post_trace, shape, True, who)
    return _bind_lines(weight, row_indices, row_indptr, spikes, trace, w_min, w_max, backend, who, positions)


def _update_table(data, indices, spike, trace, w_min, w_max, shape, backend, on_pre: bool, who: str):
    """The update of a fixed-width table whose rows are the firing lines: presynaptic (``on_pre``: a fan-out
    table ``(n_pre, k)``) or postsynaptic (a fan-in table ``(n_post, k)``)."""
    n_pre, n_post = _shape(shape, who)
    weight, flat, indptr = _table(data, indices, n_pre if on_pre else n_post, who)
    spikes, trace = _spikes_and_trace(spike, trace, (n_pre, n_post), on_pre, who)
    return _bind_lines(weight, flat, indptr, spikes, trace, w_min, w_max, backend, who).reshape(data.shape)


def _table(data, indices, n_rows: int, who: str):
    """A fixed-width table ``(n_rows, k)`` as lines: ``(weight, indices, indptr)`` flat, in one index dtype."""
    data, indices = canonical(data), canonical(indices)
    if data.ndim != 2 or data.dtype not in [jnp.dtype(d) for d in _FLOATS]:
        raise TypeError(f"{who}: data must be the (n, k) float table of per-synapse weights, got "
                        f"{data.dtype}{list(data.shape)}; a homogeneous weight has no per-synapse values to update")
    if indices.shape != data.shape or not jnp.issubdtype(indices.dtype, jnp.integer):
        raise ValueError(f"{who}: indices must be an integer table of data's shape {data.shape}, got "
                         f"{indices.dtype}{list(indices.shape)}")
    if data.shape[0] != n_rows:
        raise ValueError(f"{who}: the table has {data.shape[0]} rows, but shape says {n_rows}")
    k = data.shape[1]
    indptr = jnp.arange(n_rows + 1, dtype=indices.dtype) * k
    return data.reshape(-1), indices.reshape(-1), indptr


@carries_units("data", events=("pre_spike",), shared={"post_trace": "data", "w_min": "data", "w_max": "data"})
def update_fixed_post_conn_on_binary_pre(data, indices, pre_spike, post_trace, w_min=None, w_max=None, *, shape,
                                         backend: str | None = None) -> jax.Array:
    """A fixed fan-out table's weights after presynaptic spikes: ``data[i] += post_trace[indices[i]]``.

    ``data`` and ``indices`` are the ``(n_pre, k)`` table of
    :class:`evjax.FixedPostNumConn` (row ``i``: the ``k`` targets of
    presynaptic neuron ``i``). For each ``i`` with ``pre_spike[i] != 0``:
    ``data[i, c] = clip(data[i, c] + post_trace[indices[i, c]], w_min,
    w_max)``; the rest bit for bit. Only the rows of active neurons are
    visited.

    Args:
        data: ``(n_pre, k)`` float weights.
        indices: ``(n_pre, k)`` postsynaptic indices.
        pre_spike: ``(n_pre,)`` bool, or numbers where nonzero is a spike.
        post_trace: ``(n_post,)`` float trace.
        w_min, w_max: bounds for updated weights (scalars), or None.
        shape: ``(n_pre, n_post)``.
        backend: as in :func:`update_csr_on_binary_pre`.

    Returns:
        ``(n_pre, k)`` the new weights, in ``data``'s dtype.

    Raises:
        TypeError, ValueError: an argument of the wrong kind or shape, named.

    Example:
        >>> data = evjax.update_fixed_post_conn_on_binary_pre(C.data, C.indices, spikes, post_trace,
        ...                                                   shape=C.shape)
    """
    return _update_table(data, indices, pre_spike, post_trace, w_min, w_max, shape, backend, True,
                         "update_fixed_post_conn_on_binary_pre")


@carries_units("data", events=("post_spike",), shared={"pre_trace": "data", "w_min": "data", "w_max": "data"})
def update_fixed_pre_conn_on_binary_post(data, indices, pre_trace, post_spike, w_min=None, w_max=None, *, shape,
                                         backend: str | None = None) -> jax.Array:
    """A fixed fan-in table's weights after postsynaptic spikes: ``data[j] += pre_trace[indices[j]]``.

    ``data`` and ``indices`` are the ``(n_post, k)`` table of
    :class:`evjax.FixedPreNumConn` (row ``j``: the ``k`` sources of
    postsynaptic neuron ``j``). For each ``j`` with ``post_spike[j] != 0``:
    ``data[j, c] = clip(data[j, c] + pre_trace[indices[j, c]], w_min,
    w_max)``; the rest bit for bit. Only the rows of active neurons are
    visited.

    Args:
        data: ``(n_post, k)`` float weights.
        indices: ``(n_post, k)`` presynaptic indices.
        pre_trace: ``(n_pre,)`` float trace.
        post_spike: ``(n_post,)`` bool, or numbers where nonzero is a spike.
        w_min, w_max: bounds for updated weights (scalars), or None.
        shape: ``(n_pre, n_post)``.
        backend: as in :func:`update_csr_on_binary_pre`.

    Returns:
        ``(n_post, k)`` the new weights, in ``data``'s dtype.

    Raises:
        TypeError, ValueError: an argument of the wrong kind or shape, named.

    Example:
        >>> data = evjax.update_fixed_pre_conn_on_binary_post(C.data, C.indices, pre_trace, post_spikes,
        ...                                                   shape=C.shape)
    """
    return _update_table(data, indices, post_spike, pre_trace, w_min, w_max, shape, backend, False,
                         "update_fixed_pre_conn_on_binary_post")

"""Event-driven CSR operators: sparse synaptic propagation under jit, grad, jvp and vmap.

A CSR matrix ``A`` of shape ``(n_rows, n_cols)`` is three arrays: ``data``
(weights: shape ``(1,)`` homogeneous, or ``(nnz,)`` per synapse), ``indices``
(column of each synapse, ``(nnz,)``) and ``indptr`` (``(n_rows + 1,)``, row
``i`` owns ``indices[indptr[i]:indptr[i + 1]]``).  Duplicate column indices in
a row are summed.

Ops (:class:`~evjax.XLACustomKernel` instances): ``csrmv_p``, ``csrmm_p``
(float operand), ``binary_csrmv_p``, ``binary_csrmm_p`` (event operand) and
``csr_sddmm_p`` (the weight gradient).  Operands, in order: ``data``,
``indices``, ``indptr``, then the dense operand (contracted dimension first,
row-major); static params ``shape=(n_rows, n_cols)`` and ``transpose``.
``docs/csr_backend_contract.md`` is the contract every backend follows.

Backends are declared, not imported: ``numba`` (CPU), ``warp`` (CPU and GPU)
and ``numba_cuda`` (GPU) live in this package's modules of those names, which
the op imports the first time it lowers with them.  On CPU the default is
Numba; on GPU the first installed of Warp and Numba CUDA, else the reference.

Orientation: ``transpose=True`` scatters the operand's rows (``spikes @ W``
with ``W`` of shape ``(n_pre, n_post)``) and is event-driven: its cost follows
the synapses of active rows.  ``transpose=False`` gathers (``W @ x``).
Gradients w.r.t. an event operand given as float are straight-through
(``d out / d s = A``).

Weighted events (static ``weighted=True`` on the two binary ops, what
:class:`evjax.WeightedArray` dispatches to): the operand holds values; only
its nonzero entries are visited, each contributing ``value * weight`` (IEEE),
and a zero entry contributes nothing whatever its weights hold.  The gradient
w.r.t. the values is the true one (the op is linear in them); the weight
gradient is ``csr_sddmm_p`` in a weighted mode, event-driven and scaled by the
values.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ...units import carries_units
from ..._validation import INT32_MAX
from ...dtypes import compute_dtype
from ..._event_values import as_bool_events
from ...rules import ad as ad_rules
from ...rules import batching as batching_rules
from ...rules.partitioning import PartitionRule
from ...benchmark import BenchmarkConfig
from ...xla_custom_kernel import XLACustomKernel
from .validation import check_active_list, check_operand, validate_csr

__all__ = [
    "csrmv", "csrmm", "binary_csrmv", "binary_csrmm", "binary_csrmv_active", "csr_sddmm",
    "csrmv_p", "csrmm_p", "binary_csrmv_p", "binary_csrmm_p", "binary_csrmv_active_p", "csr_sddmm_p",
    "validate_csr", "row_ids", "OPS",
]



# ===========================================================================
# Validation (in validation.py: shapes and dtypes always; values when concrete, once per structure)
# ===========================================================================
def _out_shape(shape, transpose: bool, x_shape) -> tuple:
    n = shape[0] if not transpose else shape[1]
    return (n,) + tuple(x_shape[1:])


def _bind(op: XLACustomKernel, data, indices, indptr, x, *, shape, transpose, dtype, backend, **params):
    """Bind a matmul op; ``params``: the binary ops' ``weighted``."""
    outs = [jax.ShapeDtypeStruct(_out_shape(shape, transpose, x.shape), dtype)]
    return op.bind(data, indices, indptr, x, outs=outs, shape=tuple(shape), transpose=bool(transpose),
                   backend=backend, **params)[0]


def checked_matmul(op, data, indices, indptr, x, *, shape, transpose, backend, rank, event, who, weighted=False):
    """Validate, promote and bind one of the four matmul ops (the public wrappers and ``@``).

    Weighted events are values: promoted with the weights like a float operand.
    It binds the op itself (not through ``_bind``): ``A @ x`` reaches ``bind``
    in as few frames as the anchors' (issue "Structure v3").
    """
    data, indices, indptr, shape = validate_csr(data, indices, indptr, shape, who=who)
    weighted = bool(weighted)
    x, dtype = check_operand(x, data, shape, transpose, rank, event and not weighted, who)
    if not event or weighted:
        data, x = data.astype(dtype), x.astype(dtype)
    params = {"weighted": weighted} if event else {}
    outs = [jax.ShapeDtypeStruct(_out_shape(shape, transpose, x.shape), dtype)]
    return op.bind(data, indices, indptr, x, outs=outs, shape=tuple(shape), transpose=bool(transpose),
                   backend=backend, **params)[0]


# ===========================================================================
# Shared maths: pure-JAX reference, weight cotangent, batching
# ===========================================================================
def row_ids(indptr, nnz: int):
    """Row of each stored entry: ``row_ids[k] = i`` for ``indptr[i] <= k < indptr[i + 1]``."""
    return jnp.searchsorted(indptr[1:], jnp.arange(nnz, dtype=indptr.dtype), side="right")


@jax.custom_jvp
def _weighted_term(a, v):
    """where(v != 0, a * v, 0): a weighted event v selects, then scales (docs/semantics.md)."""
    return jnp.where(v != 0, a * v, jnp.zeros((), jnp.result_type(a, v)))


@_weighted_term.defjvp
def _weighted_term_jvp(primals, tangents):
    # d/da: the same select, scaled by v; d/dv: a (equal to a * v for finite a: the true derivative,
    # as the kernels' rules take it), so the vmapped pure-JAX SDDMM differentiates like the op
    a, v = primals
    da, dv = tangents
    return _weighted_term(a, v), _weighted_term(da, v) + a * dv


def _term(a, b, weighted: bool = False):
    """One term of a sum over synapses (docs/semantics.md): ``a * b`` for two values (IEEE);
    a bool (event) operand selects the other, never multiplies it (a silent event gives 0);
    ``weighted``: ``b`` holds weighted events, where(b != 0, a * b, 0) (select, then IEEE)."""
    if weighted:
        return _weighted_term(a, b)
    if a.dtype == jnp.bool_:
        return a & b if b.dtype == jnp.bool_ else jnp.where(a, b, jnp.zeros((), b.dtype))
    return jnp.where(b, a, jnp.zeros((), a.dtype)) if b.dtype == jnp.bool_ else a * b


def _reference_matmul(data, indices, indptr, x, *, outs, shape, transpose, event, weighted=False):
    """Pure-JAX ``A @ x`` / ``A.T @ x`` (the fallback backend and the tests' oracle), term by
    term and structural like scipy: y_i = sum_{k in row i} _term(w_k, x_{j_k})."""
    out = outs[0]
    dtype = compute_dtype(out.dtype)
    nnz = indices.shape[0]
    w = jnp.broadcast_to(data.astype(dtype), (nnz,)) if data.shape[0] != nnz else data.astype(dtype)
    x = as_bool_events(x) if event and not weighted else x.astype(dtype)
    term = functools.partial(_term, weighted=weighted)
    rows = row_ids(indptr, nnz)
    n_in = shape[1] if not transpose else shape[0]
    if n_in == 0 or nnz == 0:
        return [jnp.zeros(out.shape, out.dtype)]
    # malformed structures: a synapse outside the matrix contributes nothing
    valid = (indices >= 0) & (indices < shape[1]) & (rows < shape[0])
    cols = jnp.where(valid, indices, 0)
    lift = (lambda a: a[:, None]) if x.ndim == 2 else (lambda a: a)
    if not transpose:  # y_i = sum_{k in row i} w_k x_{j_k}
        contrib = jnp.where(lift(valid), term(lift(w), x[cols]), 0)
        y = jax.ops.segment_sum(contrib, rows, num_segments=shape[0])
    else:  # y_j = sum_{k: j_k = j} w_k x_{i_k}
        contrib = jnp.where(lift(valid), term(lift(w), x[jnp.clip(rows, 0, n_in - 1)]), 0)
        y = jnp.zeros((shape[1],) + x.shape[1:], dtype).at[cols].add(contrib)
    return [y.astype(out.dtype)]


def _weight_cotangent(op, data, indices, indptr, x, ct, *, shape, transpose, backend, event=False, **params):
    """Cotangent of the weights of ``y = op(data, ..., x)`` given ``ct = y_bar``.

    Per synapse k in row i with column j (x binarised for event ops):
        transpose=False:  y_i += w_k x_j   =>  w_bar_k = <y_bar_i, x_j>
        transpose=True:   y_j += w_k x_i   =>  w_bar_k = <x_i, y_bar_j>
    i.e. w_bar = sddmm(r, q) with (r, q) = (y_bar, x) or (x, y_bar).  Bool events
    select (w_bar_k = y_bar if the event is active, else 0, whatever y_bar holds),
    and silent rows of the scatter orientation are skipped: event-driven; float
    x gives the IEEE product.  Weighted events v (``params["weighted"]``) scale
    the selected terms: w_bar_k = where(v != 0, v * y_bar, 0), the rows of v == 0
    skipped in the scatter orientation (sddmm mode ``r_weighted``/``q_weighted``).

    Homogeneous w (shape (1,)): the sum of those per-synapse terms, grouped by output o
    (one output column c of y at a time for a matrix operand):
        w_bar = sum_k g_k = sum_o [o reached] y_bar_o * op(1, ..., x)_o
    where op(1, ..., x)_o = sum of the terms of the synapses into o (events: their count;
    weighted: the selected values; float: the x values), and "o reached" means that some
    synapse contributes a term to o: an active event's (event and weighted ops) or any
    stored entry's (float ops: structural).  The selection is needed because an output no
    term reaches has op(1, ...)_o = 0 (an empty sum), and 0 * y_bar_o is nan for a nan or
    inf y_bar_o, whereas the per-synapse sum has no term there (docs/semantics.md: an
    inactive event, or a structural zero, contributes nothing, in every gradient).  A
    reached output keeps the IEEE product (a float x = 0 beside y_bar = nan gives nan).
    Cost: op(1, ...) in the op's own (event-driven) orientation, plus, where it is not
    already the count (weighted events, float values), one pass of the bool op counting
    the synapses reached (event-driven for weighted events; every synapse for float
    values, which the float op visits anyway).  It never reads w.
    """
    aval = ad_rules.aval_of(data)
    nnz = indices.shape[0]
    if aval.shape[0] != nnz or nnz == 1:
        one = jnp.ones((1,), aval.dtype)
        y1 = _bind(op, one, indices, indptr, x, shape=shape, transpose=transpose, dtype=ct.dtype,
                   backend=backend, **params)
        if event and not params.get("weighted"):
            reached = y1 != 0  # y1 counts the active synapses into each output
        else:  # count them: the active entries of weighted events, or every stored entry (float values)
            live = as_bool_events(x) if event else jnp.ones(x.shape[:1], jnp.bool_)
            count_op = binary_csrmv_p if live.ndim == 1 else binary_csrmm_p
            counts = _bind(count_op, one, indices, indptr, live, shape=shape, transpose=transpose,
                           dtype=ct.dtype, backend=backend, weighted=False)
            reached = (counts != 0) if counts.ndim == ct.ndim else (counts != 0)[:, None]
        acc = compute_dtype(aval.dtype)
        terms = jnp.where(reached, ct.astype(acc) * y1.astype(acc), jnp.zeros((), acc))
        return jnp.sum(terms).astype(aval.dtype).reshape(1)
    r, q = (ct, x) if not transpose else (x, ct)
    weighted = ("r" if transpose else "q") if params.get("weighted") else None
    return _bind_sddmm(indices, indptr, r, q, shape=shape, dtype=aval.dtype, backend=backend, weighted=weighted)


def _stack(a, axis, size: int):
    """``a`` with its batch axis first; an unbatched ``a`` broadcast to ``(size,) + a.shape``."""
    return jnp.moveaxis(a, axis, 0) if axis is not None else jnp.broadcast_to(a, (size,) + a.shape)


def _stack_rows(a, axis, size: int):
    """The batch of ``a`` (each ``(rows, ...)``) as one ``(size rows, ...)`` array, element after element."""
    a = _stack(a, axis, size)
    return a.reshape((size * a.shape[1],) + a.shape[2:])


def _batch_size(args, axes) -> int:
    return next(a.shape[ax] for a, ax in zip(args, axes) if ax is not None)


def _block_fits(indices, indptr, size: int, nnz: int, shape) -> bool:
    """Whether a block-diagonal structure of ``size`` elements can be had: a nonempty one whose
    columns (``size n_cols``) fit the dtype of ``indices`` and whose entries (``size nnz``) that of
    ``indptr`` (int64 holds both); else the batching rules keep their loop (or the pure-JAX SDDMM)."""
    def holds(dtype, n):
        return np.dtype(dtype).itemsize >= 8 or n <= INT32_MAX
    return (nnz > 0 and min(shape) > 0 and holds(indices.dtype, size * shape[1])
            and holds(indptr.dtype, size * nnz))


def _block_structure(indices, i_ax, indptr, p_ax, size: int, shape):
    """One CSR structure for a batch of ``size`` structures (each ``(nnz,)``, ``(n_rows + 1,)``):
    element b is the block of rows ``[b n_rows, (b + 1) n_rows)``, columns ``[b n_cols, (b + 1) n_cols)``
    and entries ``[b nnz, (b + 1) nnz)`` of a matrix of shape ``(size n_rows, size n_cols)``, so one
    kernel call does the work of the ``size`` calls of a loop (the same synapses, no more).

    An entry that element b would skip stays skipped and inside block b: a column outside
    ``[0, n_cols)``, and an entry outside b's own span ``[indptr_b[0], indptr_b[-1])`` (row pointers
    clamped to ``[0, nnz]``), become column -1 (ignored by every backend, docs/csr_backend_contract.md),
    never a column of another block."""
    idx = _stack(indices, i_ax, size)  # (size, nnz)
    ptr = jnp.clip(_stack(indptr, p_ax, size), 0, idx.shape[1])  # (size, n_rows + 1)
    nnz = idx.shape[1]
    k = jnp.arange(nnz, dtype=ptr.dtype)[None, :]
    valid = (idx >= 0) & (idx < shape[1]) & (k >= ptr[:, :1]) & (k < ptr[:, -1:])
    cols = jnp.where(valid, idx + (jnp.arange(size, dtype=idx.dtype) * shape[1])[:, None],
                     jnp.asarray(-1, idx.dtype)).reshape(size * nnz)
    starts = (ptr[:, :-1] + (jnp.arange(size, dtype=ptr.dtype) * nnz)[:, None]).reshape(size * shape[0])
    rows = jnp.concatenate([starts, jnp.full((1,), size * nnz, ptr.dtype)])
    return cols, rows, (size * shape[0], size * shape[1])


def _block_matmul(op_self, args, axes, *, outs, shape, transpose, backend, **params):
    """y_b = A_b x_b for a batched structure, as block b of diag(A_1..A_B) [x_1; ...; x_B]: one call.
    None where the block structure does not fit its index dtypes (the caller loops)."""
    data, indices, indptr, x = args
    d_ax, i_ax, p_ax, x_ax = axes
    size = _batch_size(args, axes)
    nnz = indices.shape[0] if i_ax is None else indices.shape[1 - i_ax]
    if not _block_fits(indices, indptr, size, nnz, shape):
        return None
    cols, rows, big = _block_structure(indices, i_ax, indptr, p_ax, size, shape)
    if d_ax is None:  # (1,) stays homogeneous (every block has the weight); (nnz,) repeats per block
        w = data if data.shape[0] != nnz or nnz == 1 else jnp.tile(data, size)
    elif data.shape[1 - d_ax] != nnz:  # homogeneous, one weight per element: w_b on block b's entries
        w = jnp.broadcast_to(jnp.moveaxis(data, d_ax, 0)[:, :1], (size, nnz)).reshape(size * nnz)
    else:
        w = _stack_rows(data, d_ax, size)
    y = _bind(op_self, w, cols, rows, _stack_rows(x, x_ax, size), shape=big, transpose=transpose,
              dtype=outs[0].dtype, backend=backend, **params)
    return y.reshape((size, y.shape[0] // size) + y.shape[1:])


def _batch_matmul(vector_op, matrix_op, rank: int, event: bool, args, axes, *, outs, shape, transpose, backend,
                  **params):
    """The batching rule of the matmul ops (``rank`` of the dense operand), shared by all four.

    * dense operand batched: one call of the matrix op (``vmap`` of mv is mm;
      ``vmap`` of mm folds the batch into the columns): native, no loop.
    * homogeneous weights batched: y_b = w_b * op(1, ..., x_b), one call.  For events
      op(1, ...) counts active synapses, and a count of 0 gives 0 even for w_b = nan; for
      values (and weighted events: op(1, ...) sums the selected values) it is the sum of
      the terms w_b x_k only for finite w_b (inf * 0 is nan): a batch with a nan or inf
      weight takes the loop instead (lax.cond).
    * the structure batched (indices or indptr, with any weights and operand): one call on the
      block-diagonal structure (``_block_structure``): y_b = A_b x_b is block b of
      diag(A_1..A_B) [x_1; ...; x_B]; a loop where its indices would not fit their dtype.
    * per-synapse weights batched over a shared structure: a loop over the batch (measured
      faster than the block structure, which rebuilds the shared one B times).
    """
    op_self = vector_op if rank == 1 else matrix_op
    data, indices, indptr, x = args
    d_ax, i_ax, p_ax, x_ax = axes
    dtype = outs[0].dtype
    homogeneous = d_ax is not None and data.shape[1 - d_ax] == 1
    loop = functools.partial(batching_rules.sequential_batch, op_self.primitive, args, axes, outs=outs,
                             shape=shape, transpose=transpose, backend=backend, **params)
    if i_ax is not None or p_ax is not None:
        y = _block_matmul(op_self, args, axes, outs=outs, shape=shape, transpose=transpose, backend=backend,
                          **params)
        return loop() if y is None else ([y], [0])
    if d_ax is not None and not homogeneous:
        return loop()
    weights = jnp.ones((1,), data.dtype) if d_ax is not None else data  # scaled per example below
    if x_ax is None:
        y = _bind(op_self, weights, indices, indptr, x, shape=shape, transpose=transpose, dtype=dtype,
                  backend=backend, **params)
        y_ax = None
    else:
        xb = jnp.moveaxis(x, x_ax, 1)  # (n, batch) or (n, batch, k)
        size = xb.shape[1]
        flat = xb.reshape(xb.shape[0], int(np.prod(xb.shape[1:])))
        y = _bind(matrix_op, weights, indices, indptr, flat, shape=shape, transpose=transpose,
                  dtype=dtype, backend=backend, **params)
        y = y.reshape((y.shape[0], size) + xb.shape[2:])
        y_ax = 1
    if d_ax is None:
        return [y], [y_ax]
    w = jnp.moveaxis(data, d_ax, 0)[:, 0]  # (batch,)
    y = y[None] if y_ax is None else jnp.moveaxis(y, 1, 0)
    acc = compute_dtype(dtype)
    scale = w.astype(acc).reshape((-1,) + (1,) * (y.ndim - 1))
    scaled = scale * y.astype(acc)
    if event and not params.get("weighted"):  # y counts active synapses: none gives 0, whatever w_b holds
        return [jnp.where(y != 0, scaled, 0).astype(dtype)], [0]
    scaled = jnp.broadcast_to(scaled, (w.shape[0],) + scaled.shape[1:]).astype(dtype)
    return [jax.lax.cond(jnp.all(jnp.isfinite(w)), lambda: scaled, lambda: loop()[0][0])], [0]


def _transpose_matmul(op, float_op, event: bool, cts, data, indices, indptr, x, *, shape, transpose, backend,
                      **params):
    """The transpose rule of the matmul ops, shared by all four (maths in each op's section)."""
    ct = cts[0]

    def weights():
        events = as_bool_events(x) if event and not params.get("weighted") else x
        return _weight_cotangent(op, data, indices, indptr, events, ct, shape=shape, transpose=transpose,
                                 backend=backend, event=event, **params)

    def operand():
        return _bind(float_op, data, indices, indptr, ct, shape=shape, transpose=not transpose,
                     dtype=ad_rules.aval_of(x).dtype, backend=backend)

    return ad_rules.linear_cotangents((data, indices, indptr, x), {0: weights, 3: operand}, name=op.name)


def _jvp_matmul_weights(op, tangent, data, indices, indptr, x, *, outs, **params):
    # y = A(w) x is linear in w: dy = A(dw) x  (x binarised by an event op, selected when weighted)
    return op.primitive.bind(tangent, indices, indptr, x, outs=outs, **params)


def _jvp_straight_through(float_op, tangent, data, indices, indptr, *, outs, shape, transpose, backend):
    # an event op's derivative in its events, taken as if y = A x (straight-through): dy = A dx, the
    # float op on the tangent.  Weighted events: y = sum_k where(v != 0, w_k v, 0) equals A v wherever
    # the weights are finite, so dy = A dv is the true derivative (IEEE: a nan weight gives a nan
    # tangent, even at v == 0).
    return float_op.primitive.bind(data, indices, indptr, tangent.astype(outs[0].dtype), outs=outs, shape=shape,
                                   transpose=transpose, backend=backend)


def _partition_matmul(data, indices, indptr, x, *, outs, **params):
    # Y[:, c] = A X[:, c]: the columns c of a matrix operand are independent products, so each device
    # multiplies its own columns with the whole matrix (the structure and weights are kept whole)
    if x.ndim != 2:
        return None
    return PartitionRule(("w", "e", "r", "i c"), ("o c",), batch=("c",))


# ===========================================================================
# csrmv: y = A x (transpose=False) or y = A.T x, x a float vector
# ===========================================================================
@carries_units("data", "v")
def csrmv(data, indices, indptr, v, *, shape, transpose: bool = False, backend: str | None = None) -> jax.Array:
    """Sparse matrix times float vector.

    Args:
        data: weights, shape ``(1,)``/scalar (homogeneous) or ``(nnz,)``; float.
        indices: column indices, ``(nnz,)``, int32 or int64.
        indptr: row pointers, ``(n_rows + 1,)``.
        v: ``(n_cols,)`` (transpose=False) or ``(n_rows,)`` (transpose=True).
        shape: ``(n_rows, n_cols)``.
        transpose: compute ``A.T @ v`` (the scatter orientation).
        backend: ``"numba"``, ``"warp"``, ``"numba_cuda"``, ``"reference"``
            (default: see :mod:`evjax.config`).

    Returns:
        ``A @ v`` of shape ``(n_rows,)`` or ``A.T @ v`` of shape ``(n_cols,)``,
        in the promoted dtype of ``data`` and ``v``.

    Example:
        >>> y = evjax.csrmv(W.data, W.indices, W.indptr, v, shape=W.shape)
    """
    return checked_matmul(csrmv_p, data, indices, indptr, v, shape=shape, transpose=transpose, backend=backend,
                          rank=1, event=False, who="csrmv")


csrmv_p = XLACustomKernel("evjax_csrmv")


def _csrmv_reference(data, indices, indptr, v, *, outs, shape, transpose):
    return _reference_matmul(data, indices, indptr, v, outs=outs, shape=shape, transpose=transpose, event=False)


def _csrmv_jvp_data(tangent, data, indices, indptr, v, *, outs, **params):
    # linear in w: dy = A(dw) v
    return _jvp_matmul_weights(csrmv_p, tangent, data, indices, indptr, v, outs=outs, **params)


def _csrmv_jvp_vector(tangent, data, indices, indptr, v, *, outs, **params):
    # linear in v: dy = A dv
    return csrmv_p.primitive.bind(data, indices, indptr, tangent, outs=outs, **params)


def _csrmv_transpose(cts, data, indices, indptr, v, *, outs, shape, transpose, backend):
    # y = A v:    w_bar_k = y_bar[i_k] v[j_k]  (csr_sddmm(y_bar, v)),  v_bar = A.T y_bar
    # y = A.T v:  w_bar_k = v[i_k] y_bar[j_k]  (csr_sddmm(v, y_bar)),  v_bar = A y_bar
    return _transpose_matmul(csrmv_p, csrmv_p, False, cts, data, indices, indptr, v, shape=shape,
                             transpose=transpose, backend=backend)


def _csrmv_batching(args, axes, *, outs, shape, transpose, backend):
    # vmap over v: one csrmm; over a homogeneous w: w_b * A(1) v; else a loop (see _batch_matmul)
    return _batch_matmul(csrmv_p, csrmm_p, 1, False, args, axes, outs=outs, shape=shape, transpose=transpose,
                         backend=backend)


csrmv_p.def_reference(_csrmv_reference)
csrmv_p.def_jvp_rule2(_csrmv_jvp_data, None, None, _csrmv_jvp_vector)
csrmv_p.def_transpose_rule(_csrmv_transpose)
csrmv_p.def_batching_rule(_csrmv_batching)


# ===========================================================================
# csrmm: Y = A B (transpose=False) or Y = A.T B, B a float matrix (contracted dimension first)
# ===========================================================================
@carries_units("data", "B")
def csrmm(data, indices, indptr, B, *, shape, transpose: bool = False, backend: str | None = None) -> jax.Array:
    """Sparse matrix times float matrix.

    Args:
        data: as in :func:`csrmv`.
        indices: as in :func:`csrmv`.
        indptr: as in :func:`csrmv`.
        B: ``(n_cols, k)`` (transpose=False) or ``(n_rows, k)`` (transpose=True).
        shape: as in :func:`csrmv`.
        transpose: as in :func:`csrmv`.
        backend: as in :func:`csrmv`.

    Returns:
        ``A @ B`` of shape ``(n_rows, k)`` or ``A.T @ B`` of shape ``(n_cols, k)``.

    Example:
        >>> Y = evjax.csrmm(W.data, W.indices, W.indptr, X, shape=W.shape, transpose=True)   # W.T @ X
    """
    return checked_matmul(csrmm_p, data, indices, indptr, B, shape=shape, transpose=transpose, backend=backend,
                          rank=2, event=False, who="csrmm")


csrmm_p = XLACustomKernel("evjax_csrmm")


def _csrmm_reference(data, indices, indptr, B, *, outs, shape, transpose):
    return _reference_matmul(data, indices, indptr, B, outs=outs, shape=shape, transpose=transpose, event=False)


def _csrmm_jvp_data(tangent, data, indices, indptr, B, *, outs, **params):
    # linear in w: dY = A(dw) B
    return _jvp_matmul_weights(csrmm_p, tangent, data, indices, indptr, B, outs=outs, **params)


def _csrmm_jvp_matrix(tangent, data, indices, indptr, B, *, outs, **params):
    # linear in B: dY = A dB
    return csrmm_p.primitive.bind(data, indices, indptr, tangent, outs=outs, **params)


def _csrmm_transpose(cts, data, indices, indptr, B, *, outs, shape, transpose, backend):
    # Y = A B:    w_bar_k = <Y_bar[i_k], B[j_k]>  (csr_sddmm on rows),  B_bar = A.T Y_bar
    # Y = A.T B:  w_bar_k = <B[i_k], Y_bar[j_k]>,                        B_bar = A Y_bar
    return _transpose_matmul(csrmm_p, csrmm_p, False, cts, data, indices, indptr, B, shape=shape,
                             transpose=transpose, backend=backend)


def _csrmm_batching(args, axes, *, outs, shape, transpose, backend):
    # vmap over B: the batch folded into B's columns, one csrmm (see _batch_matmul)
    return _batch_matmul(csrmv_p, csrmm_p, 2, False, args, axes, outs=outs, shape=shape, transpose=transpose,
                         backend=backend)


csrmm_p.def_reference(_csrmm_reference)
csrmm_p.def_jvp_rule2(_csrmm_jvp_data, None, None, _csrmm_jvp_matrix)
csrmm_p.def_transpose_rule(_csrmm_transpose)
csrmm_p.def_batching_rule(_csrmm_batching)
csrmm_p.def_partition_rule(_partition_matmul)


# ===========================================================================
# binary_csrmv: y = A 1[s != 0] (or A.T ...), s an event vector; weighted: y = A where(v != 0, v, 0)
# ===========================================================================
@carries_units("data", events=("v",), weighted="weighted")
def binary_csrmv(data, indices, indptr, v, *, shape, workspace=None, transpose: bool = False,
                 backend: str | None = None, weighted: bool = False) -> jax.Array:
    """Sparse matrix times event vector: only active entries of ``v`` contribute.

    With ``transpose=True`` (``spikes @ W`` for ``W`` of shape ``(n_pre, n_post)``)
    the cost follows the synapses of the active rows.

    Args:
        data: as in :func:`csrmv`.
        indices: as in :func:`csrmv`.
        indptr: as in :func:`csrmv`.
        v: the spikes, ``(n_cols,)`` (transpose=False) or ``(n_rows,)``
            (transpose=True); bool, or float with nonzero = spike (the value
            is ignored in the forward pass; its gradient is straight-through,
            ``A``).
        shape: as in :func:`csrmv`.
        transpose: as in :func:`csrmv`.
        backend: as in :func:`csrmv`.
        workspace: accepted for brainevent's signature and ignored: evjax's
            kernels need no scratch buffer.
        weighted: ``v`` holds graded events (what :class:`evjax.WeightedArray`
            passes): each nonzero entry contributes ``v * weight`` (IEEE), a
            zero one nothing whatever its weights hold; the gradient w.r.t.
            ``v`` is the true one.

    Returns:
        The result in the weight dtype (weighted: the promoted dtype of the
        weights and ``v``, integer counts taking the weights' dtype).

    Example:
        >>> y = evjax.binary_csrmv(W.data, W.indices, W.indptr, counts, shape=W.shape,
        ...                        transpose=True, weighted=True)
    """
    return checked_matmul(binary_csrmv_p, data, indices, indptr, v, shape=shape, transpose=transpose,
                          backend=backend, rank=1, event=True, who="binary_csrmv", weighted=weighted)


binary_csrmv_p = XLACustomKernel("evjax_binary_csrmv")


def _binary_csrmv_reference(data, indices, indptr, s, *, outs, shape, transpose, weighted):
    return _reference_matmul(data, indices, indptr, s, outs=outs, shape=shape, transpose=transpose, event=True,
                             weighted=weighted)


def _binary_csrmv_jvp_data(tangent, data, indices, indptr, s, *, outs, **params):
    # linear in w: dy = A(dw) 1[s != 0]  (weighted: A(dw) v on the selected v)
    return _jvp_matmul_weights(binary_csrmv_p, tangent, data, indices, indptr, s, outs=outs, **params)


def _binary_csrmv_jvp_events(tangent, data, indices, indptr, s, *, outs, shape, transpose, backend, weighted):
    # the forward uses 1[s != 0]; straight-through: dy = A ds (the true derivative for weighted events)
    return _jvp_straight_through(csrmv_p, tangent, data, indices, indptr, outs=outs, shape=shape,
                                 transpose=transpose, backend=backend)


def _binary_csrmv_transpose(cts, data, indices, indptr, s, *, outs, shape, transpose, backend, weighted):
    # y = A e, e = 1[s != 0]:  w_bar_k = y_bar[i_k] e[j_k], only active events' synapses computed
    # (in the scatter orientation only the rows of active events are visited; csr_sddmm in an event mode).
    # Not linear in s, so s is transposed only when weighted (y = A v on the selected v): v_bar = A.T y_bar.
    return _transpose_matmul(binary_csrmv_p, csrmv_p, True, cts, data, indices, indptr, s, shape=shape,
                             transpose=transpose, backend=backend, weighted=weighted)


def _binary_csrmv_batching(args, axes, *, outs, shape, transpose, backend, weighted):
    # vmap over s: one binary_csrmm; over a homogeneous w: w_b * counts, 0 where none (see _batch_matmul)
    return _batch_matmul(binary_csrmv_p, binary_csrmm_p, 1, True, args, axes, outs=outs, shape=shape,
                         transpose=transpose, backend=backend, weighted=weighted)


def _binary_csrmv_benchmark_data(*, platform):
    # what XLACustomKernel.benchmark times: spikes @ W, n = 10000, 100 synapses per row, 1 % and 10 % active
    rng = np.random.default_rng(0)
    n, k = 10_000, 100
    indices = jnp.asarray(np.sort(rng.integers(0, n, (n, k)), axis=1).astype(np.int32).ravel())
    indptr = jnp.asarray((np.arange(n + 1) * k).astype(np.int32))
    data = jnp.asarray(rng.standard_normal(n * k).astype(np.float32))
    outs = (jax.ShapeDtypeStruct((n,), jnp.float32),)
    return [BenchmarkConfig(f"spikes @ W, {rate:.0%} active", (data, indices, indptr, jnp.asarray(rng.random(n) < rate)),
                            dict(outs=outs, shape=(n, n), transpose=True, weighted=False),
                            dict(n=n, synapses_per_row=k, rate=rate))
            for rate in (0.01, 0.1)]


binary_csrmv_p.def_reference(_binary_csrmv_reference)
binary_csrmv_p.def_benchmark_data(_binary_csrmv_benchmark_data)
binary_csrmv_p.def_jvp_rule2(_binary_csrmv_jvp_data, None, None, _binary_csrmv_jvp_events)
binary_csrmv_p.def_transpose_rule(_binary_csrmv_transpose)
binary_csrmv_p.def_batching_rule(_binary_csrmv_batching)


# ===========================================================================
# binary_csrmm: Y = A 1[S != 0] (or A.T ...), S an event matrix; weighted as binary_csrmv
# ===========================================================================
@carries_units("data", events=("B",), weighted="weighted")
def binary_csrmm(data, indices, indptr, B, *, shape, workspace=None, transpose: bool = False,
                 backend: str | None = None, weighted: bool = False) -> jax.Array:
    """Sparse matrix times event matrix (a batch of spike vectors as columns).

    Args:
        data: as in :func:`csrmv`.
        indices: as in :func:`csrmv`.
        indptr: as in :func:`csrmv`.
        B: the spikes, ``(n_cols, k)`` (transpose=False) or ``(n_rows, k)``
            (transpose=True); bool, or float with nonzero = spike.
        shape: as in :func:`csrmv`.
        transpose: as in :func:`csrmv`.
        backend: as in :func:`csrmv`.
        workspace: as in :func:`binary_csrmv` (accepted and ignored).
        weighted: as in :func:`binary_csrmv`: ``B`` holds graded events.

    Returns:
        ``(n_rows, k)`` or ``(n_cols, k)`` in the weight dtype (weighted: as in
        :func:`binary_csrmv`).

    Example:
        >>> spikes = jax.random.bernoulli(key, 0.05, (32, W.shape[0]))   # 32 trials
        >>> out = evjax.binary_csrmm(W.data, W.indices, W.indptr, spikes.T, shape=W.shape, transpose=True)
    """
    return checked_matmul(binary_csrmm_p, data, indices, indptr, B, shape=shape, transpose=transpose,
                          backend=backend, rank=2, event=True, who="binary_csrmm", weighted=weighted)


binary_csrmm_p = XLACustomKernel("evjax_binary_csrmm")


def _binary_csrmm_reference(data, indices, indptr, S, *, outs, shape, transpose, weighted):
    return _reference_matmul(data, indices, indptr, S, outs=outs, shape=shape, transpose=transpose, event=True,
                             weighted=weighted)


def _binary_csrmm_jvp_data(tangent, data, indices, indptr, S, *, outs, **params):
    # linear in w: dY = A(dw) 1[S != 0]
    return _jvp_matmul_weights(binary_csrmm_p, tangent, data, indices, indptr, S, outs=outs, **params)


def _binary_csrmm_jvp_events(tangent, data, indices, indptr, S, *, outs, shape, transpose, backend, weighted):
    # the forward uses 1[S != 0]; straight-through: dY = A dS (the true derivative for weighted events)
    return _jvp_straight_through(csrmm_p, tangent, data, indices, indptr, outs=outs, shape=shape,
                                 transpose=transpose, backend=backend)


def _binary_csrmm_transpose(cts, data, indices, indptr, S, *, outs, shape, transpose, backend, weighted):
    # Y = A E, E = 1[S != 0]:  w_bar_k = <Y_bar[i_k], E[j_k]> (or <E[i_k], Y_bar[j_k]>), active rows only;
    # weighted: S_bar = A.T Y_bar (linear in the selected values)
    return _transpose_matmul(binary_csrmm_p, csrmm_p, True, cts, data, indices, indptr, S, shape=shape,
                             transpose=transpose, backend=backend, weighted=weighted)


def _binary_csrmm_batching(args, axes, *, outs, shape, transpose, backend, weighted):
    # vmap over S: the batch folded into S's columns, one binary_csrmm (see _batch_matmul)
    return _batch_matmul(binary_csrmv_p, binary_csrmm_p, 2, True, args, axes, outs=outs, shape=shape,
                         transpose=transpose, backend=backend, weighted=weighted)


binary_csrmm_p.def_reference(_binary_csrmm_reference)
binary_csrmm_p.def_jvp_rule2(_binary_csrmm_jvp_data, None, None, _binary_csrmm_jvp_events)
binary_csrmm_p.def_transpose_rule(_binary_csrmm_transpose)
binary_csrmm_p.def_batching_rule(_binary_csrmm_batching)
binary_csrmm_p.def_partition_rule(_partition_matmul)


# ===========================================================================
# binary_csrmv_active: y = A.T e, e given by the ascending list of its active rows (CompactBinary)
# ===========================================================================
@carries_units("data", events=("v",))
def binary_csrmv_active(data, indices, indptr, active_ids, n_active, v, *, shape,
                        backend: str | None = None) -> jax.Array:
    """``spikes @ A`` with the spikes also given as the list of their active rows.

    The scatter (``transpose=True``) of :func:`binary_csrmv` that reads the
    active rows from ``active_ids[:n_active]`` instead of scanning the ``n_rows``
    entries of ``v``: what :class:`evjax.CompactBinary` ``@`` a CSR (or a CSC
    ``@`` it) runs.  The result has the same bits as ``binary_csrmv(..., v,
    transpose=True)`` on every backend: the same rows, added in the same order.

    Args:
        data: as in :func:`csrmv`.
        indices: as in :func:`csrmv`.
        indptr: as in :func:`csrmv`.
        active_ids: ``(n_rows,)`` integers: the active rows of ``v`` in ascending
            order, then any padding.
        n_active: ``(1,)`` integer: how many entries of ``active_ids`` are rows.
        v: the spikes themselves, ``(n_rows,)`` (bool, or float with nonzero =
            spike): the reference backend, the gradients (straight-through in
            ``v``, event-driven in ``data``) and ``vmap`` read them.  They must
            agree with the list, as :meth:`evjax.CompactBinary.from_array`
            makes them.
        shape: ``(n_rows, n_cols)`` of ``A``.
        backend: as in :func:`csrmv`.

    Returns:
        ``(n_cols,)`` in the weight dtype.

    Example:
        >>> cb = evjax.CompactBinary.from_array(spikes)
        >>> y = evjax.binary_csrmv_active(W.data, W.indices, W.indptr, cb.active_ids, cb.n_active,
        ...                               cb.value, shape=W.shape)
    """
    who = "binary_csrmv_active"
    data, indices, indptr, shape = validate_csr(data, indices, indptr, shape, who=who)
    v, dtype = check_operand(v, data, shape, True, 1, True, who)
    active_ids, n_active = check_active_list(active_ids, n_active, shape[0], who)
    outs = [jax.ShapeDtypeStruct((shape[1],), dtype)]
    return binary_csrmv_active_p.bind(data, indices, indptr, active_ids, n_active, v, outs=outs,
                                      shape=tuple(shape), backend=backend)[0]


binary_csrmv_active_p = XLACustomKernel("evjax_binary_csrmv_active")


def _binary_csrmv_active_reference(data, indices, indptr, active_ids, n_active, v, *, outs, shape):
    # the dense events are the reference: y_j = sum_{k: j_k = j, v[i_k] != 0} w_k
    return _reference_matmul(data, indices, indptr, v, outs=outs, shape=shape, transpose=True, event=True)


def _binary_csrmv_active_jvp_data(tangent, data, indices, indptr, active_ids, n_active, v, *, outs, **params):
    # linear in w: dy = A(dw).T e, over the same listed rows
    return binary_csrmv_active_p.primitive.bind(tangent, indices, indptr, active_ids, n_active, v, outs=outs,
                                                **params)


def _binary_csrmv_active_jvp_events(tangent, data, indices, indptr, active_ids, n_active, v, *, outs, shape,
                                    backend):
    # straight-through in the spikes, as binary_csrmv: dy = A.T dv
    return _jvp_straight_through(csrmv_p, tangent, data, indices, indptr, outs=outs, shape=shape, transpose=True,
                                 backend=backend)


def _binary_csrmv_active_transpose(cts, data, indices, indptr, active_ids, n_active, v, *, outs, shape, backend):
    # y = A.T e: w_bar_k = e[i_k] y_bar[j_k], the event-driven SDDMM of binary_csrmv on the spikes v
    # (only the rows of active events computed); the list and v have no cotangent
    def weights():
        return _weight_cotangent(binary_csrmv_p, data, indices, indptr, as_bool_events(v), cts[0], shape=shape,
                                 transpose=True, backend=backend, event=True, weighted=False)

    return ad_rules.linear_cotangents((data, indices, indptr, active_ids, n_active, v), {0: weights},
                                      name="evjax_binary_csrmv_active")


def _binary_csrmv_active_batching(args, axes, *, outs, shape, backend):
    # a batch of spike vectors is binary_csrmv's batch (one binary_csrmm over the spikes, or the block
    # structure for batched structures): the lists, one per element, are not needed there
    data, indices, indptr, _, _, v = args
    d_ax, i_ax, p_ax, _, _, v_ax = axes
    return _batch_matmul(binary_csrmv_p, binary_csrmm_p, 1, True, (data, indices, indptr, v),
                         (d_ax, i_ax, p_ax, v_ax), outs=outs, shape=shape, transpose=True, backend=backend,
                         weighted=False)


binary_csrmv_active_p.def_reference(_binary_csrmv_active_reference)
binary_csrmv_active_p.def_jvp_rule2(_binary_csrmv_active_jvp_data, None, None, None, None,
                                    _binary_csrmv_active_jvp_events)
binary_csrmv_active_p.def_transpose_rule(_binary_csrmv_active_transpose)
binary_csrmv_active_p.def_batching_rule(_binary_csrmv_active_batching)


# ===========================================================================
# csr_sddmm: g[k] = <r[i_k], q[j_k]>  (the weight gradient; r, q vectors or matrices)
# ===========================================================================
@carries_units("r", "q")
def csr_sddmm(indices, indptr, r, q, *, shape, dtype=None, backend: str | None = None,
              weighted: str | None = None) -> jax.Array:
    """Sampled dense-dense product on the CSR pattern: ``g[k] = <r[row k], q[indices[k]]>``.

    The gradient of the CSR matmuls w.r.t. per-synapse weights.  A bool
    (event) operand selects: a term with an inactive event is 0 whatever the
    other operand holds (nan and inf included), and where an operand is bool
    the rows whose ``r`` is zero are skipped (their entries are 0), which makes
    the gradient of the scatter orientation event-driven.  Two float operands
    give the IEEE product on every row (``0 * inf`` is nan), as dense JAX does.
    See ``docs/semantics.md``.

    Args:
        indices: column indices of the CSR structure.
        indptr: row pointers of the CSR structure.
        r: ``(n_rows,)`` or ``(n_rows, k)``; float or bool (events).
        q: ``(n_cols,)`` or ``(n_cols, k)``; float or bool (events).
        shape: ``(n_rows, n_cols)``.
        dtype: the result dtype (default: promotion of the float operands).
        backend: as in :func:`csrmv`.
        weighted: ``"r"`` or ``"q"``: that float operand holds weighted events,
            and each term is ``where(e != 0, r * q, 0)`` for its entry ``e``
            (a zero event hides a nan or inf of the other operand); with
            ``"r"`` the rows where ``r`` is zero are skipped.  The weight
            gradient of the ops with ``weighted=True``.

    Returns:
        ``(nnz,)`` array.

    Raises:
        TypeError: complex or integer ``r``/``q``, or a bad structure dtype.
        ValueError: a structure or operand shape that does not fit ``shape``, or
            ``weighted`` not ``None``, ``"r"`` or ``"q"``.

    Example:
        >>> # d sum(g * (spikes @ W)) / d W.data, event-driven: r = spikes, q = g
        >>> dW = evjax.csr_sddmm(W.indices, W.indptr, spikes, g, shape=W.shape)
    """
    if weighted not in (None, "r", "q"):
        raise ValueError(f"csr_sddmm: weighted must be None, 'r' or 'q' (the operand holding weighted events), "
                         f"got {weighted!r}")
    _, indices, indptr, shape = validate_csr(jnp.ones((1,), jnp.float32), indices, indptr, shape, who="csr_sddmm")
    r, q = jnp.asarray(r), jnp.asarray(q)
    for name, a in (("r", r), ("q", q)):
        if not (a.dtype == jnp.bool_ or jnp.issubdtype(a.dtype, jnp.floating)):
            raise TypeError(f"csr_sddmm: {name} must be float or bool (events), got {a.dtype}; convert it, "
                            f"e.g. {name}.astype(jnp.float32)")
    if r.ndim not in (1, 2) or r.ndim != q.ndim or r.shape[0] != shape[0] or q.shape[0] != shape[1] \
            or r.shape[1:] != q.shape[1:]:
        raise ValueError(
            f"csr_sddmm: r {r.shape} and q {q.shape} must be (n_rows[, k]) and (n_cols[, k]) for shape {shape}"
        )
    if dtype is None:
        floats = [a.dtype for a in (r, q) if a.dtype != jnp.bool_]
        dtype = jnp.result_type(*floats) if floats else jnp.float32
    if weighted is not None:  # the weighted operand holds values: bool ones become 0/1
        r, q = (r.astype(dtype) if weighted == "r" else r), (q.astype(dtype) if weighted == "q" else q)
    return _bind_sddmm(indices, indptr, r, q, shape=tuple(shape), dtype=dtype, backend=backend, weighted=weighted)


def _bind_sddmm(indices, indptr, r, q, *, shape, dtype, backend, weighted=None):
    outs = [jax.ShapeDtypeStruct((indices.shape[0],), dtype)]
    return csr_sddmm_p.bind(indices, indptr, r, q, outs=outs, shape=tuple(shape), backend=backend,
                            weighted=weighted)[0]


def _sddmm_dense(indices, indptr, r, q, *, dtype, shape, weighted=None):
    """g_k = <r[i_k], q[j_k]> term by term: ``_term`` selects by a bool operand, else IEEE product;
    ``weighted`` ("r" or "q"): that operand's zero entries select, where(e != 0, r * q, 0)."""
    acc = compute_dtype(dtype)
    nnz = indices.shape[0]
    if nnz == 0 or min(shape) == 0:
        return jnp.zeros((nnz,), dtype)
    rows = row_ids(indptr, nnz)
    valid = (rows < shape[0]) & (indices >= 0) & (indices < shape[1])
    as_acc = lambda a: a if a.dtype == jnp.bool_ else a.astype(acc)  # noqa: E731
    rv = as_acc(r)[jnp.clip(rows, 0, max(shape[0] - 1, 0))]
    qv = as_acc(q)[jnp.clip(indices, 0, max(shape[1] - 1, 0))]
    if weighted == "q":
        terms = _term(rv, qv, weighted=True).astype(acc)
    else:
        terms = (_term(qv, rv, weighted=True) if weighted == "r" else _term(rv, qv)).astype(acc)
    g = terms if r.ndim == 1 else jnp.sum(terms, axis=-1)
    return jnp.where(valid, g, 0).astype(dtype)


def sddmm_mode(r_dtype, q_dtype, weighted: str | None = None) -> str:
    """Which SDDMM kernel a backend runs: ``"r_events"`` (bool r: silent rows skipped, q selected),
    ``"q_events"`` (bool q, float r: r selected), ``"values"`` (IEEE product on every row),
    or, with ``weighted`` ("r" or "q", both operands float): ``"r_weighted"`` (rows with r == 0
    skipped, g = where(r != 0, r * q, 0)) or ``"q_weighted"`` (every row, g = where(q != 0, r * q, 0))."""
    if weighted is not None:
        return f"{weighted}_weighted"
    if np.dtype(r_dtype) == np.bool_:
        return "r_events"
    return "q_events" if np.dtype(q_dtype) == np.bool_ else "values"


def _csr_sddmm_reference(indices, indptr, r, q, *, outs, shape, weighted):
    return [_sddmm_dense(indices, indptr, r, q, dtype=outs[0].dtype, shape=shape, weighted=weighted)]


def _sddmm_operand_cotangent(cts, indices, indptr, other, *, dt, rank, shape, transpose, backend, weighted):
    # the matmul of A(g_bar) with the other operand: a bool one selects (the binary op), a float one
    # multiplies, a weighted one selects and multiplies (the binary op with weighted=True)
    event = weighted or other.dtype == jnp.bool_
    op = {(1, False): csrmv_p, (2, False): csrmm_p, (1, True): binary_csrmv_p, (2, True): binary_csrmm_p}
    params = {"weighted": weighted} if event else {}
    return _bind(op[(rank, event)], cts[0].astype(dt), indices, indptr,
                 other if event and not weighted else other.astype(dt),
                 shape=shape, transpose=transpose, dtype=dt, backend=backend, **params)


def _sddmm_r_cotangent(cts, indices, indptr, r, q, *, shape, backend, weighted):
    # r_bar_i = sum_{k in row i} g_bar_k q_{j_k} = (A(g_bar) q)_i
    # (q weighted: the terms where(q != 0, g_bar q, 0); r weighted: linear in r, the plain product)
    aval = ad_rules.aval_of(r)
    return _sddmm_operand_cotangent(cts, indices, indptr, q, dt=aval.dtype, rank=aval.ndim, shape=shape,
                                    transpose=False, backend=backend, weighted=weighted == "q")


def _sddmm_q_cotangent(cts, indices, indptr, r, q, *, shape, backend, weighted):
    # q_bar_j = sum_{k: j_k = j} g_bar_k r_{i_k} = (A(g_bar).T r)_j  (r weighted: r selects)
    aval = ad_rules.aval_of(q)
    return _sddmm_operand_cotangent(cts, indices, indptr, r, dt=aval.dtype, rank=aval.ndim, shape=shape,
                                    transpose=True, backend=backend, weighted=weighted == "r")


def _csr_sddmm_batching(args, axes, *, outs, shape, backend, weighted):
    # g_b = sddmm(structure_b, r_b, q_b) is block b of the sddmm on the block-diagonal structure
    # (_block_structure) with r and q stacked (an unbatched one repeated): one call, still event-driven
    # (the silent rows of an event r are skipped).  Where the block structure does not fit its index
    # dtypes: the vectorised pure-JAX formula g[b, k] = <r_b[i_k], q_b[j_k]>.
    indices, indptr, r, q = args
    i_ax, p_ax, r_ax, q_ax = axes
    size = _batch_size(args, axes)
    nnz = indices.shape[0] if i_ax is None else indices.shape[1 - i_ax]
    if _block_fits(indices, indptr, size, nnz, shape):
        cols, rows, big = _block_structure(indices, i_ax, indptr, p_ax, size, shape)
        g = _bind_sddmm(cols, rows, _stack_rows(r, r_ax, size), _stack_rows(q, q_ax, size), shape=big,
                        dtype=outs[0].dtype, backend=backend, weighted=weighted)
        return [g.reshape(size, nnz)], [0]
    fn = functools.partial(_sddmm_dense, dtype=outs[0].dtype, shape=shape, weighted=weighted)
    return [jax.vmap(fn, in_axes=tuple(axes))(*args)], [0]


def _csr_sddmm_jvp_r(tangent, indices, indptr, r, q, *, outs, shape, backend, weighted):
    # g = <r_i, q_j> is bilinear: dg = sddmm(dr, q) + sddmm(r, dq).  Weighted mode: g = where(e != 0, r q, 0)
    # equals r q for finite values, so the weighted operand's own tangent gives the plain product (no
    # select), the other's keeps the select by e.
    mode = None if weighted == "r" else weighted
    return csr_sddmm_p.primitive.bind(indices, indptr, tangent, q, outs=outs, shape=shape, backend=backend,
                                      weighted=mode)


def _csr_sddmm_jvp_q(tangent, indices, indptr, r, q, *, outs, shape, backend, weighted):
    # dg = sddmm(r, dq), as _csr_sddmm_jvp_r
    mode = None if weighted == "q" else weighted
    return csr_sddmm_p.primitive.bind(indices, indptr, r, tangent, outs=outs, shape=shape, backend=backend,
                                      weighted=mode)


def _csr_sddmm_transpose(cts, indices, indptr, r, q, *, outs, shape, backend, weighted):
    # r_bar_i = sum_{k in row i} g_bar_k q_{j_k} = (A(g_bar) q)_i;  q_bar_j = (A(g_bar).T r)_j
    return ad_rules.linear_cotangents((indices, indptr, r, q), {
        2: lambda: _sddmm_r_cotangent(cts, indices, indptr, r, q, shape=shape, backend=backend, weighted=weighted),
        3: lambda: _sddmm_q_cotangent(cts, indices, indptr, r, q, shape=shape, backend=backend, weighted=weighted),
    }, name="evjax_csr_sddmm")


def _csr_sddmm_partition(indices, indptr, r, q, *, outs, **params):
    # g_k = sum_c r[i_k, c] q[j_k, c]: each device sums its own columns c, and the partial sums are added
    # over the devices (a psum of g); the structure is kept whole
    if r.ndim != 2 or q.ndim != 2:
        return None
    return PartitionRule(("e", "r", "i c", "j c"), ("e",), reduced=("c",))


csr_sddmm_p = XLACustomKernel("evjax_csr_sddmm")
csr_sddmm_p.def_reference(_csr_sddmm_reference)
csr_sddmm_p.def_jvp_rule2(None, None, _csr_sddmm_jvp_r, _csr_sddmm_jvp_q)
csr_sddmm_p.def_transpose_rule(_csr_sddmm_transpose)
csr_sddmm_p.def_batching_rule(_csr_sddmm_batching)
csr_sddmm_p.def_partition_rule(_csr_sddmm_partition)

OPS = (csrmv_p, csrmm_p, binary_csrmv_p, binary_csrmm_p, binary_csrmv_active_p, csr_sddmm_p)

"""Products that visit only the nonzero entries of a vector: the kernels of a sparse backward pass.

In a spiking network trained with a surrogate of compact support, the
cotangent ``y_bar`` of a layer ``y = spikes @ W`` is exactly zero for every
neuron away from threshold.  The backward pass of the layer is then two
products in which most terms are zero:

* ``spikes_bar = W @ y_bar`` (the straight-through cotangent of the spikes);
* ``W_bar[i, j] = e[i] * y_bar[j]`` on the synapses (the weight gradient),
  ``e`` the events (1 for a binary spike, its value for a weighted one).

The ops here compute them visiting only the nonzero entries.  Each kernel
counts the nonzero entries of each row of its vector operand (one pass), and
picks at run time between a path that walks the whole structure and a path
that walks only the synapses of the nonzero entries (through the structure's
column view).  Both paths add the same terms in the same order, so they give
the same bits; tests call each path directly.

Semantics: an entry of the vector that is zero contributes nothing, whatever
the weights hold (as an inactive event does); nonzero entries follow IEEE.

Operands: the vector operand is always a batch of rows, ``(B, n)``; ``B = 1``
for a single vector.  A CSR structure comes with its column view
``(t_indices, t_indptr, perm)`` (:func:`evjax.primitives.grouping.transposed_view`).

* ``csrmv_nonzero_p``: ``out[b] = A v[b]`` (``transpose=False``) or
  ``A.T v[b]``, the zero entries of ``v[b]`` skipped;
* ``csr_sddmm_nonzero_p``: ``g[k] = sum_b r[b, i_k] q[b, j_k]`` over the
  pairs where both are nonzero (operands grouped ``(G, B, .)``, one sum per
  group: a ``vmap`` adds groups);
* ``densemv_nonzero_p`` and ``dense_outer_nonzero_p``: the same for a dense
  ``W``.

:func:`evjax.sparse_backward_matmul` builds a layer from them.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ...dtypes import as_dtype, compute_dtype
from ...rules import ad as ad_rules
from ...rules.batching import broadcast_batch, move_batch_axis, sequential_batch
from ...rules.partitioning import PartitionRule
from ...xla_custom_kernel import XLACustomKernel
from ..grouping import entry_rows

__all__ = ["empty_result", "in_compute_dtype", "csrmv_nonzero", "csr_sddmm_nonzero", "densemv_nonzero",
           "dense_outer_nonzero", "rows_sorted",
           "csrmv_nonzero_p", "csr_sddmm_nonzero_p", "densemv_nonzero_p", "dense_outer_nonzero_p",
           "SPARSE_DENSITY", "OPS", "FLOAT_OPERANDS"]

# the kernels take the path over the nonzero entries when at most this fraction of a row is nonzero
SPARSE_DENSITY = 0.1


def empty_result(out):
    """A generator's kernel where the output has no entries: zeros of ``out``'s shape, nothing launched."""
    return lambda *args: [jnp.zeros(out.shape, out.dtype)]


def in_compute_dtype(op, out, launch):
    """A GPU generator's kernel: one launch in ``out``'s compute dtype, its result rounded back.

    The float operands of ``op`` (:data:`FLOAT_OPERANDS`) are cast to
    ``compute_dtype(out.dtype)`` (float16 and bfloat16 are computed in
    float32), the others (the structure's integers) passed as they are.

    Args:
        op: the op whose kernel this is (one of :data:`OPS`).
        out: the ``ShapeDtypeStruct`` of its one output.
        launch: ``launch(dtype) -> call``, the backend's kernel computing in ``dtype``.

    Returns:
        ``run(*operands) -> [out]``; zeros, nothing launched, where ``out`` has no entries.
    """
    if out.size == 0:
        return empty_result(out)
    dtype = compute_dtype(out.dtype)
    call = launch(dtype)
    floats = FLOAT_OPERANDS[op]

    def run(*operands):
        cast = [as_dtype(x, dtype) if k in floats else x for k, x in enumerate(operands)]
        return [as_dtype(call(*cast), out.dtype)]

    return run


def rows_sorted(indices, indptr) -> bool:
    """Whether each row's column indices are nondecreasing (False when the structure is traced).

    The gather over rows of ``csrmv_nonzero(transpose=False)`` adds a row's
    terms in its stored order, the scatter over columns in column order: the
    two give the same bits only for sorted rows, so the gather is used only
    then.
    """
    try:
        idx, ptr = np.asarray(indices), np.asarray(indptr)
    except jax.errors.TracerArrayConversionError:
        return False
    if idx.size < 2:
        return True
    step_down = np.flatnonzero(np.diff(idx.astype(np.int64)) < 0) + 1  # entries below their predecessor
    return bool(np.all(np.isin(step_down, ptr)))  # ... only at the start of a row


def _homogeneous(data, nnz: int) -> bool:
    return data.shape[0] == 1 and nnz != 1


def _rows(x):
    """``x`` as ``(B, n)``: a vector gets ``B = 1``."""
    return x[None] if x.ndim == 1 else x


# ===========================================================================
# csrmv_nonzero: out[b] = A v[b] (transpose=False) or A.T v[b], zero entries of v[b] skipped
# ===========================================================================
def csrmv_nonzero(data, indices, indptr, view, v, *, shape, transpose: bool, sorted_rows: bool | None = None,
                  backend: str | None = None) -> jax.Array:
    """``A v`` (or ``A.T v``) for a CSR ``A``, visiting only the nonzero entries of ``v``.

    Args:
        data: ``(nnz,)`` weights, or ``(1,)`` shared by every synapse.
        indices, indptr: the CSR structure of ``A``, of shape ``shape``.
        view: ``(t_indices, t_indptr, perm)``, the column view of the structure.
        v: ``(n,)`` or ``(B, n)`` (each row a vector), ``n`` the contracted side.
        shape: ``(m, n)`` of ``A``.
        transpose: ``False``: ``A v`` (``v`` over columns); ``True``: ``A.T v``.
        sorted_rows: whether each row's indices are sorted (``None``: checked
            when concrete, else False); unsorted rows always take the scatter.
        backend: a backend name, or ``None`` for the default.

    Returns:
        ``(m,)`` / ``(n,)`` (or with the leading ``B``), of the result dtype of
        ``data`` and ``v``.

    Example:
        >>> W = evjax.CSR.fromdense(w)
        >>> spikes_bar = evjax.csrmv_nonzero(W.data, W.indices, W.indptr, W._other_view(), y_bar,
        ...                                  shape=W.shape, transpose=False)     # W @ y_bar
    """
    t_indices, t_indptr, perm = view
    sorted_rows = rows_sorted(indices, indptr) if sorted_rows is None else bool(sorted_rows)
    dtype = jnp.result_type(data.dtype, v.dtype)
    rows = _rows(v).astype(dtype)
    n_out = shape[1] if transpose else shape[0]
    (out,) = csrmv_nonzero_p.bind(data.astype(dtype), indices, indptr, t_indices, t_indptr, perm, rows,
                                  outs=[jax.ShapeDtypeStruct((rows.shape[0], n_out), dtype)], shape=tuple(shape),
                                  transpose=bool(transpose), sorted_rows=sorted_rows, backend=backend)
    return out if v.ndim == 2 else out[0]


csrmv_nonzero_p = XLACustomKernel("evjax_csrmv_nonzero")


def _csrmv_nonzero_reference(data, indices, indptr, t_indices, t_indptr, perm, v, *, outs, shape, transpose,
                             sorted_rows):
    # y[b, o] = sum over synapses k into o, with v[b, other end of k] != 0, of w_k v[b, other end]
    (out,) = outs
    nnz = indices.shape[0]
    w = jnp.broadcast_to(data, (nnz,)) if _homogeneous(data, nnz) else data
    rows = entry_rows(indptr, nnz, jnp)
    src, dst = (rows, indices) if transpose else (indices, rows)
    x = v[:, src]
    terms = jnp.where(x != 0, w[None, :] * x, jnp.zeros((), out.dtype))
    return [jnp.zeros(out.shape, out.dtype).at[:, dst].add(terms)]


# linear in data: dy = A(dw) v
def _csrmv_nonzero_jvp_data(tangent, data, indices, indptr, t_indices, t_indptr, perm, v, *, outs, **params):
    return csrmv_nonzero_p.primitive.bind(tangent, indices, indptr, t_indices, t_indptr, perm, v, outs=outs,
                                          **params)


# linear in v: dy = A dv
def _csrmv_nonzero_jvp_vector(tangent, data, indices, indptr, t_indices, t_indptr, perm, v, *, outs, **params):
    return csrmv_nonzero_p.primitive.bind(data, indices, indptr, t_indices, t_indptr, perm, tangent, outs=outs,
                                          **params)


# y[b] = A v[b]:    v_bar[b] = A.T y_bar[b],  w_bar_k = sum_b y_bar[b, i_k] v[b, j_k]
# y[b] = A.T v[b]:  v_bar[b] = A y_bar[b],    w_bar_k = sum_b v[b, i_k] y_bar[b, j_k]
# both over nonzero entries only (a zero cotangent, like a zero v, contributes nothing); a shared
# weight's cotangent is the sum of the per-synapse ones.
def _csrmv_nonzero_transpose(cts, data, indices, indptr, t_indices, t_indptr, perm, v, *, outs, shape,
                             transpose, sorted_rows, backend):
    (ct,) = cts
    structure = (indices, indptr, t_indices, t_indptr, perm)
    if ad_rules.is_zero(ct):
        return [None] * 7
    ct = ad_rules.instantiate(ct, outs[0])
    v_bar = data_bar = None
    if ad_rules.is_undefined(v):
        v_aval = ad_rules.aval_of(v)
        v_bar = csrmv_nonzero_p.bind(
            data, *structure, ct, outs=[jax.ShapeDtypeStruct(v_aval.shape, v_aval.dtype)], shape=shape,
            transpose=not transpose, sorted_rows=sorted_rows, backend=backend)[0]
    if ad_rules.is_undefined(data):
        d_aval = ad_rules.aval_of(data)
        r, q = (v, ct) if transpose else (ct, v)
        g = csr_sddmm_nonzero_p.bind(
            *structure, r[None], q[None], outs=[jax.ShapeDtypeStruct((1, indices.shape[0]), ct.dtype)],
            shape=shape, backend=backend)[0][0]
        data_bar = (jnp.sum(g).reshape(1) if _homogeneous(d_aval, indices.shape[0]) else g).astype(d_aval.dtype)
    return [data_bar, None, None, None, None, None, v_bar]


# vmap over v only: the batch joins the rows of v (one call); otherwise a loop
def _csrmv_nonzero_batching(args, axes, *, outs, **params):
    if any(ax is not None for ax in axes[:6]):
        return sequential_batch(csrmv_nonzero_p.primitive, args, axes, outs=outs, **params)
    *fixed, v = args
    v = move_batch_axis(v, axes[6])
    size, rows = v.shape[0], v.shape[1]
    (out,) = csrmv_nonzero_p.bind(
        *fixed, v.reshape((size * rows, v.shape[2])),
        outs=[jax.ShapeDtypeStruct((size * rows, outs[0].shape[1]), outs[0].dtype)], **params)
    return [out.reshape((size, rows, out.shape[1]))], [0]


def _csrmv_nonzero_partition(data, indices, indptr, t_indices, t_indptr, perm, v, *, outs, **params):
    # y[b] = A v[b]: the rows b of the batch are independent products, so each device computes its own
    # rows with the whole matrix and its column view
    return PartitionRule(("w", "e", "r", "te", "tr", "p", "b i"), ("b o",), batch=("b",))


csrmv_nonzero_p.def_reference(_csrmv_nonzero_reference)
csrmv_nonzero_p.def_jvp_rule2(_csrmv_nonzero_jvp_data, None, None, None, None, None, _csrmv_nonzero_jvp_vector)
csrmv_nonzero_p.def_transpose_rule(_csrmv_nonzero_transpose)
csrmv_nonzero_p.def_batching_rule(_csrmv_nonzero_batching)
csrmv_nonzero_p.def_partition_rule(_csrmv_nonzero_partition)


# ===========================================================================
# csr_sddmm_nonzero: g[G, k] = sum_b r[G, b, i_k] q[G, b, j_k] over the pairs where both are nonzero
# ===========================================================================
def csr_sddmm_nonzero(indices, indptr, view, r, q, *, shape, backend: str | None = None) -> jax.Array:
    """Per-synapse products ``r[i_k] q[j_k]`` where both factors are nonzero (else 0), summed over a batch.

    For each row ``b`` of a batch the kernel visits the synapses of the
    nonzero entries of ``r[b]`` or those of the nonzero entries of ``q[b]``
    (through the column view), whichever are fewer, counted at run time; each
    synapse's terms are added in the order of ``b``.

    Args:
        indices, indptr: the CSR structure, of shape ``shape``.
        view: ``(t_indices, t_indptr, perm)``, its column view.
        r: ``(m,)`` or ``(B, m)``, over rows.
        q: ``(n,)`` or ``(B, n)``, over columns (the same rank as ``r``).
        shape: ``(m, n)``.
        backend: a backend name, or ``None`` for the default.

    Returns:
        ``(nnz,)``: ``g[k] = sum_b [r[b, i_k] != 0][q[b, j_k] != 0] r[b, i_k] q[b, j_k]``
        (the weight gradient of a batch), of the result dtype of ``r`` and ``q``.

    Example:
        >>> W = evjax.CSR.fromdense(w)
        >>> w_bar = evjax.csr_sddmm_nonzero(W.indices, W.indptr, W._other_view(), spikes, y_bar, shape=W.shape)
    """
    if r.ndim != q.ndim or r.ndim not in (1, 2):
        raise ValueError(f"csr_sddmm_nonzero: r and q must both be 1-d or both 2-d, got {r.shape} and {q.shape}")
    dtype = jnp.result_type(r.dtype, q.dtype)
    rr, qq = _rows(r).astype(dtype)[None], _rows(q).astype(dtype)[None]
    (g,) = csr_sddmm_nonzero_p.bind(indices, indptr, *view, rr, qq,
                                    outs=[jax.ShapeDtypeStruct((1, indices.shape[0]), dtype)],
                                    shape=tuple(shape), backend=backend)
    return g[0]


csr_sddmm_nonzero_p = XLACustomKernel("evjax_csr_sddmm_nonzero")


def _csr_sddmm_nonzero_reference(indices, indptr, t_indices, t_indptr, perm, r, q, *, outs, shape):
    # r (G, B, m), q (G, B, n) -> g (G, nnz), the terms of each synapse added in the order of b
    (out,) = outs
    a, b = r[:, :, entry_rows(indptr, indices.shape[0], jnp)], q[:, :, indices]
    terms = jnp.where((a != 0) & (b != 0), a * b, jnp.zeros((), out.dtype))
    return [_ordered_sum(terms, out)]


# bilinear: dg = S(dr, q) + S(r, dq)
def _csr_sddmm_nonzero_jvp_r(tangent, indices, indptr, t_indices, t_indptr, perm, r, q, *, outs, **params):
    return csr_sddmm_nonzero_p.primitive.bind(indices, indptr, t_indices, t_indptr, perm, tangent, q, outs=outs,
                                              **params)


def _csr_sddmm_nonzero_jvp_q(tangent, indices, indptr, t_indices, t_indptr, perm, r, q, *, outs, **params):
    return csr_sddmm_nonzero_p.primitive.bind(indices, indptr, t_indices, t_indptr, perm, r, tangent, outs=outs,
                                              **params)


# g_k = sum_b [r_bi != 0][q_bj != 0] r_bi q_bj:  r_bar_bi = sum_{k in row i, q_bj != 0} g_bar_k q_bj,
#                                                q_bar_bj = sum_{k in col j, r_bi != 0} g_bar_k r_bi
# (second-order terms only: computed in XLA, not event-driven)
def _csr_sddmm_nonzero_transpose(cts, indices, indptr, t_indices, t_indptr, perm, r, q, *, outs, shape, backend):
    (ct,) = cts
    if ad_rules.is_zero(ct):
        return [None] * 7
    ct = ad_rules.instantiate(ct, outs[0])[:, None, :]  # (G, 1, nnz)
    rows = entry_rows(indptr, indices.shape[0], jnp)
    zero = jnp.zeros((), ct.dtype)
    r_bar = q_bar = None
    if ad_rules.is_undefined(r):
        qv = q[:, :, indices]
        r_bar = jnp.zeros(ad_rules.aval_of(r).shape, ct.dtype).at[:, :, rows].add(jnp.where(qv != 0, ct * qv, zero))
    if ad_rules.is_undefined(q):
        rv = r[:, :, rows]
        q_bar = jnp.zeros(ad_rules.aval_of(q).shape, ct.dtype).at[:, :, indices].add(
            jnp.where(rv != 0, ct * rv, zero))
    return [None, None, None, None, None, r_bar, q_bar]


# vmap over r and/or q only: the vmapped axis joins the groups G; otherwise a loop
def _csr_sddmm_nonzero_batching(args, axes, *, outs, **params):
    if any(ax is not None for ax in axes[:5]):
        return sequential_batch(csr_sddmm_nonzero_p.primitive, args, axes, outs=outs, **params)
    *fixed, r, q = args
    size = r.shape[axes[5]] if axes[5] is not None else q.shape[axes[6]]
    r, q = _joined(r, axes[5], size), _joined(q, axes[6], size)
    (g,) = csr_sddmm_nonzero_p.bind(
        *fixed, r, q, outs=[jax.ShapeDtypeStruct((r.shape[0], outs[0].shape[1]), outs[0].dtype)], **params)
    return [g.reshape((size, -1, g.shape[1]))], [0]


def _joined(x, axis, size: int):
    """A grouped operand ``(G, ...)`` with a vmapped axis: the batch moved first and joined with ``G``."""
    x = broadcast_batch(x, axis, size)
    return x.reshape((size * x.shape[1],) + x.shape[2:])


def _ordered_sum(terms, out):
    """``sum_b terms[:, b]`` added in the order of ``b`` (the kernels' order), starting from zeros."""
    if terms.shape[1] == 0:  # nothing to add (fori_loop would still trace terms[:, b] on the empty axis)
        return jnp.zeros(out.shape, out.dtype)
    return jax.lax.fori_loop(0, terms.shape[1], lambda b, acc: acc + terms[:, b],
                             jnp.zeros(out.shape, out.dtype))


def _csr_sddmm_nonzero_partition(indices, indptr, t_indices, t_indptr, perm, r, q, *, outs, **params):
    # g[grp, k] = sum_b r[grp, b, i_k] q[grp, b, j_k]: the groups are independent, the rows b of the batch
    # are summed (each device sums its own rows, then a psum)
    return PartitionRule(("e", "r", "te", "tr", "p", "g b i", "g b j"), ("g e",), batch=("g",), reduced=("b",))


csr_sddmm_nonzero_p.def_reference(_csr_sddmm_nonzero_reference)
csr_sddmm_nonzero_p.def_jvp_rule2(None, None, None, None, None, _csr_sddmm_nonzero_jvp_r, _csr_sddmm_nonzero_jvp_q)
csr_sddmm_nonzero_p.def_transpose_rule(_csr_sddmm_nonzero_transpose)
csr_sddmm_nonzero_p.def_batching_rule(_csr_sddmm_nonzero_batching)
csr_sddmm_nonzero_p.def_partition_rule(_csr_sddmm_nonzero_partition)


# ===========================================================================
# densemv_nonzero: out[b] = W v[b] (transpose=False) or W.T v[b], zero entries of v[b] skipped
# ===========================================================================
def densemv_nonzero(w, v, *, transpose: bool, backend: str | None = None) -> jax.Array:
    """``W v`` (or ``W.T v``) for a dense ``W``, visiting only the nonzero entries of ``v``.

    Args:
        w: ``(m, n)`` weights.
        v: ``(n,)`` (``(m,)`` when ``transpose``), or a batch ``(B, .)`` of them.
        transpose: ``False``: ``W v``; ``True``: ``W.T v``.
        backend: a backend name, or ``None`` for the default.

    Returns:
        ``(m,)`` / ``(n,)`` (or with the leading ``B``), of the result dtype.

    Example:
        >>> spikes_bar = evjax.densemv_nonzero(w, y_bar, transpose=False)      # w @ y_bar
    """
    dtype = jnp.result_type(w.dtype, v.dtype)
    rows = _rows(v).astype(dtype)
    n_out = w.shape[1] if transpose else w.shape[0]
    (out,) = densemv_nonzero_p.bind(w.astype(dtype), rows,
                                    outs=[jax.ShapeDtypeStruct((rows.shape[0], n_out), dtype)],
                                    transpose=bool(transpose), backend=backend)
    return out if v.ndim == 2 else out[0]


densemv_nonzero_p = XLACustomKernel("evjax_densemv_nonzero")


def _densemv_nonzero_reference(w, v, *, outs, transpose):
    (out,) = outs
    wt = w if transpose else w.T  # (contracted, out)
    terms = jnp.where(v[:, :, None] != 0, v[:, :, None] * wt[None], jnp.zeros((), out.dtype))
    return [_ordered_sum(terms, out)]



# bilinear in (w, v)
def _densemv_nonzero_jvp_w(tangent, w, v, *, outs, **params):
    return densemv_nonzero_p.primitive.bind(tangent, v, outs=outs, **params)


def _densemv_nonzero_jvp_v(tangent, w, v, *, outs, **params):
    return densemv_nonzero_p.primitive.bind(w, tangent, outs=outs, **params)


# y[b] = W v[b]:    v_bar[b] = W.T y_bar[b],  W_bar = sum_b outer(y_bar[b], v[b])
# y[b] = W.T v[b]:  v_bar[b] = W y_bar[b],    W_bar = sum_b outer(v[b], y_bar[b])   (nonzero entries only)
def _densemv_nonzero_transpose(cts, w, v, *, outs, transpose, backend):
    (ct,) = cts
    if ad_rules.is_zero(ct):
        return [None, None]
    ct = ad_rules.instantiate(ct, outs[0])
    w_bar = v_bar = None
    if ad_rules.is_undefined(v):
        v_aval = ad_rules.aval_of(v)
        v_bar = densemv_nonzero_p.bind(w, ct, outs=[jax.ShapeDtypeStruct(v_aval.shape, v_aval.dtype)],
                                                 transpose=not transpose, backend=backend)[0]
    if ad_rules.is_undefined(w):
        w_aval = ad_rules.aval_of(w)
        r, q = (v, ct) if transpose else (ct, v)
        g = dense_outer_nonzero_p.bind(
            r[None], q[None], outs=[jax.ShapeDtypeStruct((1,) + w_aval.shape, ct.dtype)], backend=backend)[0]
        w_bar = g[0].astype(w_aval.dtype)
    return [w_bar, v_bar]


def _densemv_nonzero_batching(args, axes, *, outs, **params):
    if axes[0] is not None:
        return sequential_batch(densemv_nonzero_p.primitive, args, axes, outs=outs, **params)
    w, v = args
    v = move_batch_axis(v, axes[1])
    size, rows = v.shape[0], v.shape[1]
    (out,) = densemv_nonzero_p.bind(
        w, v.reshape((size * rows, v.shape[2])),
        outs=[jax.ShapeDtypeStruct((size * rows, outs[0].shape[1]), outs[0].dtype)], **params)
    return [out.reshape((size, rows, out.shape[1]))], [0]


def _densemv_nonzero_partition(w, v, *, outs, transpose, **params):
    # y[b, o] = sum_i W(o, i) v[b, i]: each row b of the batch and each output o is independent
    return PartitionRule(("i o" if transpose else "o i", "b i"), ("b o",), batch=("b", "o"))


densemv_nonzero_p.def_reference(_densemv_nonzero_reference)
densemv_nonzero_p.def_jvp_rule2(_densemv_nonzero_jvp_w, _densemv_nonzero_jvp_v)
densemv_nonzero_p.def_transpose_rule(_densemv_nonzero_transpose)
densemv_nonzero_p.def_batching_rule(_densemv_nonzero_batching)
densemv_nonzero_p.def_partition_rule(_densemv_nonzero_partition)


# ===========================================================================
# dense_outer_nonzero: g[G, i, j] = sum_b r[G, b, i] q[G, b, j] over the pairs where both are nonzero
# ===========================================================================
def dense_outer_nonzero(r, q, *, backend: str | None = None) -> jax.Array:
    """The outer product ``r[i] q[j]`` where both factors are nonzero (else 0), summed over a batch.

    Args:
        r: ``(m,)`` or ``(B, m)``.
        q: ``(n,)`` or ``(B, n)``, the same rank as ``r``.
        backend: a backend name, or ``None`` for the default.

    Returns:
        ``(m, n)``: ``g[i, j] = sum_b [r[b, i] != 0][q[b, j] != 0] r[b, i] q[b, j]``, added in the order of ``b``.

    Example:
        >>> w_bar = evjax.dense_outer_nonzero(spikes, y_bar)
    """
    if r.ndim != q.ndim or r.ndim not in (1, 2):
        raise ValueError(f"dense_outer_nonzero: r and q must both be 1-d or both 2-d, got {r.shape} and {q.shape}")
    dtype = jnp.result_type(r.dtype, q.dtype)
    rr, qq = _rows(r).astype(dtype)[None], _rows(q).astype(dtype)[None]
    (g,) = dense_outer_nonzero_p.bind(rr, qq, outs=[jax.ShapeDtypeStruct((1, rr.shape[2], qq.shape[2]), dtype)],
                                      backend=backend)
    return g[0]


dense_outer_nonzero_p = XLACustomKernel("evjax_dense_outer_nonzero")


def _dense_outer_nonzero_reference(r, q, *, outs):
    # r (G, B, m), q (G, B, n) -> (G, m, n)
    (out,) = outs
    a, b = r[:, :, :, None], q[:, :, None, :]
    return [_ordered_sum(jnp.where((a != 0) & (b != 0), a * b, jnp.zeros((), out.dtype)), out)]


def _dense_outer_nonzero_jvp_r(tangent, r, q, *, outs, **params):
    return dense_outer_nonzero_p.primitive.bind(tangent, q, outs=outs, **params)


def _dense_outer_nonzero_jvp_q(tangent, r, q, *, outs, **params):
    return dense_outer_nonzero_p.primitive.bind(r, tangent, outs=outs, **params)


# g_ij = sum_b [r_bi != 0][q_bj != 0] r_bi q_bj:  r_bar_bi = sum_{q_bj != 0} g_bar_ij q_bj,
#                                                 q_bar_bj = sum_{r_bi != 0} g_bar_ij r_bi
def _dense_outer_nonzero_transpose(cts, r, q, *, outs, backend):
    (ct,) = cts
    if ad_rules.is_zero(ct):
        return [None, None]
    ct = ad_rules.instantiate(ct, outs[0])[:, None]  # (G, 1, m, n)
    zero = jnp.zeros((), ct.dtype)
    r_bar = q_bar = None
    if ad_rules.is_undefined(r):
        qv = q[:, :, None, :]
        r_bar = jnp.sum(jnp.where(qv != 0, ct * qv, zero), axis=3)
    if ad_rules.is_undefined(q):
        rv = r[:, :, :, None]
        q_bar = jnp.sum(jnp.where(rv != 0, ct * rv, zero), axis=2)
    return [r_bar, q_bar]


def _dense_outer_nonzero_batching(args, axes, *, outs, **params):
    r, q = args
    size = r.shape[axes[0]] if axes[0] is not None else q.shape[axes[1]]
    r, q = _joined(r, axes[0], size), _joined(q, axes[1], size)
    (g,) = dense_outer_nonzero_p.bind(
        r, q, outs=[jax.ShapeDtypeStruct((r.shape[0],) + outs[0].shape[1:], outs[0].dtype)], **params)
    return [g.reshape((size, -1) + g.shape[1:])], [0]


def _dense_outer_nonzero_partition(r, q, *, outs, **params):
    # g[grp, i, j] = sum_b r[grp, b, i] q[grp, b, j]: groups and blocks (i, j) are independent, the rows b
    # of the batch are summed (each device sums its own rows, then a psum)
    return PartitionRule(("g b i", "g b j"), ("g i j",), batch=("g", "i", "j"), reduced=("b",))


dense_outer_nonzero_p.def_reference(_dense_outer_nonzero_reference)
dense_outer_nonzero_p.def_jvp_rule2(_dense_outer_nonzero_jvp_r, _dense_outer_nonzero_jvp_q)
dense_outer_nonzero_p.def_transpose_rule(_dense_outer_nonzero_transpose)
dense_outer_nonzero_p.def_batching_rule(_dense_outer_nonzero_batching)
dense_outer_nonzero_p.def_partition_rule(_dense_outer_nonzero_partition)

OPS = (csrmv_nonzero_p, csr_sddmm_nonzero_p, densemv_nonzero_p, dense_outer_nonzero_p)

# the positions of each op's float operands (the others are the structure's integers)
FLOAT_OPERANDS = {csrmv_nonzero_p: (0, 6), csr_sddmm_nonzero_p: (5, 6), densemv_nonzero_p: (0, 1),
                  dense_outer_nonzero_p: (0, 1)}

"""Fixed fan-out / fan-in operators: a layer over the CSR family's ops.

The stored matrix ``A`` (shape ``(n_rows, n_cols)``) is an index table
``indices`` of shape ``(n_rows, k)`` (row ``i`` connects to the columns
``indices[i, :]``; duplicates add up) and weights, homogeneous (shape ``(1,)``)
or per synapse (shape ``(n_rows, k)``):

    A[i, j] = sum_{l : indices[i, l] = j} w[i, l]

That table IS a CSR matrix: its column indices are ``indices.ravel()`` and its
row pointers ``k * arange(n_rows + 1)`` (row ``i`` owns the synapses
``[k i, k (i + 1))``).  So the fixed family has no primitive of its own: each
public function checks the table (:mod:`.validation`), builds that structure
inside the traced computation (the row pointers are an iota, made by XLA in
the program: a new table of the same shape never retraces) and binds CSR's op
(:mod:`evjax.primitives.csr.ops`) on it, with the weights flattened to
``(n_rows k,)`` (``(1,)`` stays homogeneous):

    fcnmv / fcnmm                -> csrmv_p / csrmm_p
    binary_fcnmv / binary_fcnmm  -> binary_csrmv_p / binary_csrmm_p (weighted or not)
    fcn_sddmm                    -> csr_sddmm_p, reshaped to (n_rows, k)

Everything else is CSR's: its kernels on every backend (``numba``, ``warp``,
``numba_cuda``, ``reference``, chosen as for any op: ``backend=``,
:func:`evjax.use_backend`, ...), its JVP, transpose and batching rules, and
its contract for malformed structures (``docs/csr_backend_contract.md``: an
index outside ``[0, n_cols)`` is skipped under ``jit``).  A gradient w.r.t.
the weights is CSR's ``(n_rows k,)`` (or ``(1,)``) cotangent, brought back to
the table's shape by the transpose of the ``reshape`` above; the indices, being
integers, get a ``float0`` zero.  ``transpose`` means what it means for
brainevent: ``False`` is ``A @ x`` (the gather), ``True`` is ``A.T @ x`` (the
event-driven scatter of the rows' synapses: ``active rows x k``).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ...units import carries_units
from ..._validation import check_operand, is_concrete
from ..csr.ops import binary_csrmm_p, binary_csrmv_p, csr_sddmm_p, csrmm_p, csrmv_p
from .validation import pointer_dtype, row_pointers, validate_table  # noqa: F401 (re-exported)

__all__ = [
    "fcnmv", "fcnmm", "binary_fcnmv", "binary_fcnmm", "fcn_sddmm",
    "fcnmv_p", "fcnmm_p", "binary_fcnmv_p", "binary_fcnmm_p", "fcn_sddmm_p",
    "csr_structure", "validate_table", "row_pointers", "OPS",
]

# The ops the public functions bind, under the fixed family's names (brainevent exports
# binary_fcnmv_p and binary_fcnmm_p): the CSR ops themselves, whose operands are the flat
# weights, the flat indices, the row pointers and the dense operand (see csr_structure).
fcnmv_p = csrmv_p
fcnmm_p = csrmm_p
binary_fcnmv_p = binary_csrmv_p
binary_fcnmm_p = binary_csrmm_p
fcn_sddmm_p = csr_sddmm_p
OPS = (fcnmv_p, fcnmm_p, binary_fcnmv_p, binary_fcnmm_p, fcn_sddmm_p)


def csr_structure(indices):
    """``(indices.ravel(), indptr)``: the CSR structure of a checked ``(n_rows, k)`` table.

    ``indptr[i] = k i`` (:func:`.validation.row_pointers`, an iota with no flops), in
    :func:`.validation.pointer_dtype`: the indices' width, or int64 where int32 cannot
    count the ``n_rows k`` synapses.
    """
    n, k = indices.shape
    return indices.reshape(n * k), row_pointers(n, k, pointer_dtype(indices.dtype, n, k))


def _bind_on_table(op, *arrays, table_at: int, flat_out: bool, params: tuple):
    """Bind CSR's ``op`` with the table ``arrays[table_at]`` replaced by its CSR structure (and,
    for a matmul, the weights before it flattened); ``flat_out``: reshape the ``(n k,)`` result
    (the SDDMM's) to the table's shape."""
    arrays = list(arrays)
    indices = arrays[table_at]
    arrays[table_at:table_at + 1] = csr_structure(indices)
    if table_at == 1:
        arrays[0] = arrays[0].reshape(arrays[0].size)
    kw = dict(params)
    out = kw.pop("out")
    y = op.bind(*arrays, outs=[jax.ShapeDtypeStruct(out, kw.pop("dtype"))], **kw)[0]
    return y.reshape(indices.shape) if flat_out else y


# Concrete (eager) calls run the few array steps above and the op as one compiled program, one
# dispatch, as an eager CSR op; the backend choice in force is part of jit's cache key.
_bind_on_table_jit = jax.jit(_bind_on_table, static_argnums=(0,), static_argnames=("table_at", "flat_out", "params"))


def _bind(op, *arrays, table_at: int, flat_out: bool = False, **params):
    bind = _bind_on_table_jit if is_concrete(*arrays) else _bind_on_table
    return bind(op, *arrays, table_at=table_at, flat_out=flat_out, params=tuple(sorted(params.items())))


def _matmul(op, weights, indices, x, *, shape, transpose, backend, rank, event, who, weighted=False):
    """Validate and promote (as CSR's ``checked_matmul``), then bind CSR's ``op`` on the flat table.

    Weighted events are values: promoted with the weights like a float operand.
    """
    weights, indices, shape = validate_table(weights, indices, shape, who=who)
    weighted = bool(weighted)
    x, dtype = check_operand(x, weights, shape, transpose, rank, event and not weighted, who)
    if not event or weighted:
        weights, x = weights.astype(dtype), x.astype(dtype)
    params = {"weighted": weighted} if event else {}
    out = ((shape[1] if transpose else shape[0]),) + tuple(x.shape[1:])
    return _bind(op, weights, indices, x, table_at=1, out=out, dtype=np.dtype(dtype), shape=shape,
                 transpose=bool(transpose), backend=backend, **params)


# ===========================================================================
# Public functions (brainevent's names and signatures)
# ===========================================================================
@carries_units("weights", "vector")
def fcnmv(weights, indices, vector, *, shape, transpose: bool = False, backend: str | None = None) -> jax.Array:
    """Fixed-width connectivity times float vector.

    Args:
        weights: a scalar or ``(1,)`` (homogeneous), or ``(n_rows, k)`` (per synapse); float.
        indices: ``(n_rows, k)``, the columns of row ``i``'s ``k`` synapses; int32 or int64.
        vector: ``(n_cols,)`` (transpose=False) or ``(n_rows,)`` (transpose=True).
        shape: ``(n_rows, n_cols)`` of the stored matrix ``A``.
        transpose: compute ``A.T @ vector`` (the scatter orientation).
        backend: ``"numba"``, ``"warp"``, ``"numba_cuda"``, ``"reference"`` (default: see :mod:`evjax.config`).

    Returns:
        ``A @ vector`` of shape ``(n_rows,)`` or ``A.T @ vector`` of shape ``(n_cols,)``.

    Raises:
        ValueError: shapes that do not fit, or a concrete index outside ``[0, n_cols)``.

    Example:
        >>> C = evjax.FixedPostNumConn.random(jax.random.PRNGKey(0), 1000, 500, 20, weight=0.1)
        >>> y = evjax.fcnmv(C.data, C.indices, x, shape=C.shape, transpose=True)   # x @ C, x: (1000,)
    """
    return _matmul(csrmv_p, weights, indices, vector, shape=shape, transpose=transpose, backend=backend,
                   rank=1, event=False, who="fcnmv")


@carries_units("weights", "matrix")
def fcnmm(weights, indices, matrix, *, shape, transpose: bool = False, backend: str | None = None) -> jax.Array:
    """Fixed-width connectivity times float matrix.

    Args:
        weights: as in :func:`fcnmv`.
        indices: as in :func:`fcnmv`.
        shape: as in :func:`fcnmv`.
        transpose: as in :func:`fcnmv`.
        backend: as in :func:`fcnmv`.
        matrix: ``(n_cols, m)`` (transpose=False) or ``(n_rows, m)`` (transpose=True).

    Returns:
        ``A @ matrix`` of shape ``(n_rows, m)`` or ``A.T @ matrix`` of shape ``(n_cols, m)``.

    Example:
        >>> Y = evjax.fcnmm(C.data, C.indices, X, shape=C.shape, transpose=True)   # X: (1000, 32)
    """
    return _matmul(csrmm_p, weights, indices, matrix, shape=shape, transpose=transpose, backend=backend,
                   rank=2, event=False, who="fcnmm")


@carries_units("weights", events=("spikes",), weighted="weighted")
def binary_fcnmv(weights, indices, spikes, *, shape, transpose: bool = False, backend: str | None = None,
                 weighted: bool = False) -> jax.Array:
    """Fixed-width connectivity times event vector: only active entries contribute.

    With ``transpose=True`` (``spikes @ W`` for a fan-out table of shape ``(n_pre, n_post)``)
    the cost is ``active rows x k``.

    Args:
        weights: as in :func:`fcnmv`.
        indices: as in :func:`fcnmv`.
        shape: as in :func:`fcnmv`.
        transpose: as in :func:`fcnmv`.
        backend: as in :func:`fcnmv`.
        spikes: ``(n_cols,)`` (transpose=False) or ``(n_rows,)`` (transpose=True); bool, or a
            number where nonzero is a spike (its gradient is straight-through, ``A``).
        weighted: graded events: each nonzero entry contributes ``value * weight`` (a zero
            entry nothing, whatever its weights hold), with the true gradient w.r.t. the values.

    Returns:
        The result in the weight dtype (weighted: the promoted dtype).

    Example:
        >>> spikes = jax.random.bernoulli(key, 0.05, (1000,))
        >>> current = evjax.binary_fcnmv(C.data, C.indices, spikes, shape=C.shape, transpose=True)
    """
    return _matmul(binary_csrmv_p, weights, indices, spikes, shape=shape, transpose=transpose, backend=backend,
                   rank=1, event=True, who="binary_fcnmv", weighted=weighted)


@carries_units("weights", events=("matrix",), weighted="weighted")
def binary_fcnmm(weights, indices, matrix, *, shape, transpose: bool = False, backend: str | None = None,
                 weighted: bool = False) -> jax.Array:
    """Fixed-width connectivity times event matrix (a batch of spike vectors as columns).

    Args:
        weights: as in :func:`binary_fcnmv`.
        indices: as in :func:`binary_fcnmv`.
        shape: as in :func:`binary_fcnmv`.
        transpose: as in :func:`binary_fcnmv`.
        backend: as in :func:`binary_fcnmv`.
        weighted: as in :func:`binary_fcnmv`.
        matrix: ``(n_cols, m)`` (transpose=False) or ``(n_rows, m)`` (transpose=True); events.

    Returns:
        ``(n_rows, m)`` or ``(n_cols, m)`` in the weight dtype.

    Example:
        >>> S = jax.random.bernoulli(key, 0.05, (1000, 32))       # 32 event vectors as columns
        >>> out = evjax.binary_fcnmm(C.data, C.indices, S, shape=C.shape, transpose=True)
    """
    return _matmul(binary_csrmm_p, weights, indices, matrix, shape=shape, transpose=transpose, backend=backend,
                   rank=2, event=True, who="binary_fcnmm", weighted=weighted)


@carries_units("r", "q")
def fcn_sddmm(indices, r, q, *, shape, dtype=None, backend: str | None = None) -> jax.Array:
    """Sampled dense-dense product on the table: ``g[i, l] = <r[i], q[indices[i, l]]>``.

    The gradient of the fixed-width matmuls w.r.t. per-synapse weights: CSR's
    ``csr_sddmm`` on the flat table, reshaped to ``(n_rows, k)``.  A bool
    (event) operand selects (a term with an inactive event is 0, whatever the
    other holds); with a bool operand the rows where ``r`` is zero are skipped
    (zero-filled), which makes the scatter's weight gradient event-driven.

    Args:
        indices: the table and the stored matrix's shape.
        shape: the table and the stored matrix's shape.
        r: ``(n_rows,)`` or ``(n_rows, m)``; float or bool.
        q: ``(n_cols,)`` or ``(n_cols, m)``; float or bool.
        dtype: the result dtype (default: promotion of the float operands).
        backend: as in :func:`fcnmv`.

    Returns:
        ``(n_rows, k)`` array.

    Example:
        >>> # d sum(g * (spikes @ C)) / d C.data, event-driven: r = spikes, q = g
        >>> dW = evjax.fcn_sddmm(C.indices, spikes, g, shape=C.shape)
    """
    _, indices, shape = validate_table(jnp.ones((1,), jnp.float32), indices, shape, who="fcn_sddmm")
    r, q = jnp.asarray(r), jnp.asarray(q)
    if r.ndim not in (1, 2) or r.ndim != q.ndim or r.shape[0] != shape[0] or q.shape[0] != shape[1] \
            or r.shape[1:] != q.shape[1:]:
        raise ValueError(f"fcn_sddmm: r {r.shape} and q {q.shape} must be (n_rows[, m]) and (n_cols[, m]) "
                         f"for shape {shape}")
    floats = [a.dtype for a in (r, q) if a.dtype != jnp.bool_]
    dtype = dtype or (jnp.result_type(*floats) if floats else jnp.float32)
    return _bind(csr_sddmm_p, indices, r, q, table_at=0, flat_out=True, out=(indices.size,),
                 dtype=np.dtype(dtype), shape=shape, backend=backend, weighted=None)

"""The CSR family's data types: ``CSR`` and its transposed view ``CSC``.

``CSR`` and ``CSC`` are pytrees whose children are ``data``, ``indices`` and
``indptr``; only the shape is static.  A jitted function therefore accepts a
matrix of another structure with the same shape and nnz without retracing.

Matmul calls the public wrappers of :mod:`evjax.primitives.csr.ops`:

==================  ==========================================  ==============
expression          op                                          orientation
==================  ==========================================  ==============
``W @ x``           ``csrmv`` / ``csrmm``, transpose=False      gather
``x @ W``           ``csrmv`` / ``csrmm``, transpose=True       scatter
``W.T @ x``         transpose=True                              scatter
``x @ W.T``         transpose=False                             gather
==================  ==========================================  ==============

``x`` may be a vector or a matrix (a batch: rows for ``x @ W``, columns for
``W @ x``).  A :class:`evjax.BinaryArray`, or a plain bool array, selects the
event ops (``binary_csrmv`` / ``binary_csrmm``).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ...dtypes import LOW_PRECISION
from ...events import BinaryArray
from .ops import binary_csrmm, binary_csrmv, csrmm, csrmv, row_ids, validate_csr
from .validation import INT32_MAX, check_shape, checked_index_cast

__all__ = ["CSR", "CSC"]

_MATMUL = {(1, False): csrmv, (2, False): csrmm, (1, True): binary_csrmv, (2, True): binary_csrmm}


def _split_operand(x):
    """``(array, is_event)`` for a matmul operand."""
    if isinstance(x, BinaryArray):
        return x.value, True
    if isinstance(x, _Compressed):
        raise TypeError("sparse @ sparse is not supported; convert one side with .todense()")
    x = x if isinstance(x, jax.Array) else jnp.asarray(x)
    return x, x.dtype == jnp.bool_


def _product(data, indices, indptr, stored_shape, x, event: bool, transpose: bool):
    """``A @ x`` (transpose=False) or ``A.T @ x`` for the stored CSR ``A``; x has the contracted dim first.

    The public wrapper checks the structure's shapes at trace time (a matrix
    rebuilt by a transform, e.g. a vmap whose in_axes leave a batched
    ``indices`` unbatched, must not reach a kernel); its values were checked
    when the matrix was made and are not checked again.
    """
    op = _MATMUL[(x.ndim, event)]
    return op(data, indices, indptr, x, shape=stored_shape, transpose=transpose)


def _matmul(sparse, x, *, sparse_on_left: bool):
    """Shared ``@`` for CSR (``stored_transposed=False``) and CSC (its transposed view)."""
    x, event = _split_operand(x)
    m, n = sparse.shape
    contracted = n if sparse_on_left else m
    if x.ndim not in (1, 2):
        raise ValueError(f"matmul: the dense side must be a vector or a matrix, got shape {x.shape}")
    x_dim = x.shape[0] if (sparse_on_left or x.ndim == 1) else x.shape[1]
    if x_dim != contracted:
        left, right = (sparse.shape, x.shape) if sparse_on_left else (x.shape, sparse.shape)
        raise ValueError(f"matmul: shapes {left} and {right} are not aligned ({x_dim} != {contracted})")
    # transposition of the stored CSR needed for "sparse @ x"
    transpose = isinstance(sparse, CSC)
    stored = sparse._stored_shape
    if sparse_on_left:  # S @ x
        return _product(sparse.data, sparse.indices, sparse.indptr, stored, x, event, transpose)
    # x @ S = (S.T @ x.T).T
    if x.ndim == 1:
        return _product(sparse.data, sparse.indices, sparse.indptr, stored, x, event, not transpose)
    return _product(sparse.data, sparse.indices, sparse.indptr, stored, x.T, event, not transpose).T


# ---------------------------------------------------------------------------
# CSR and its transposed view
# ---------------------------------------------------------------------------
def _register_pytree(cls):
    """Register a sparse class as a pytree whose children are ``data``, ``indices``, ``indptr``.

    As a "dataclass" node JAX flattens it in C++, without calling Python: about
    1.5 microseconds less per jitted call that takes the matrix (measured on a
    2-core VM).  Unflattening calls ``cls(data=..., indices=..., indptr=...,
    shape=..., _from_tree=True)``, which skips validation (the children may be
    tracers or placeholders).
    """
    jax.tree_util.register_dataclass(
        cls, data_fields=["data", "indices", "indptr"], meta_fields=["shape", "_from_tree"]
    )
    return cls


class _Compressed:
    __array_ufunc__ = None  # numpy defers ``ndarray @ sparse`` to __rmatmul__
    takes_events = True  # ``BinaryArray @ sparse`` runs the event ops (see evjax.events)
    _from_tree = True  # the pytree's static flag: rebuilt instances skip validation

    data: jax.Array
    indices: jax.Array
    indptr: jax.Array
    shape: tuple

    def __init__(self, data, indices=None, indptr=None, *, shape, indptr_dtype="auto", _from_tree: bool = False):
        if _from_tree:  # rebuilt by JAX from its own leaves: no validation
            self._set(data, indices, indptr, shape)
            return
        if indices is None and indptr is None:
            data, indices, indptr = data
        self._set(*self._validated(data, indices, indptr, shape, indptr_dtype))

    def _validated(self, data, indices, indptr, shape, indptr_dtype) -> tuple:
        """``(data, indices, indptr, shape)`` checked and normalised (per subclass)."""
        raise NotImplementedError

    def _set(self, data, indices, indptr, shape) -> None:
        self.data, self.indices, self.indptr, self.shape = data, indices, indptr, tuple(shape)

    @classmethod
    def _from_scipy_parts(cls, data, m, index_dtype, indptr_dtype):
        """An instance from a scipy matrix's arrays, cast to ``index_dtype`` only where every value fits."""
        who = f"{cls.__name__}.from_scipy"
        index_dtype = m.indices.dtype if index_dtype is None else index_dtype
        indices, indptr = checked_index_cast(m.indices, index_dtype, "indices", who), m.indptr
        if (indptr_dtype is None or isinstance(indptr_dtype, str) and indptr_dtype == "auto") and m.nnz <= INT32_MAX:
            indptr = checked_index_cast(indptr, index_dtype, "indptr", who)  # "auto": indices' dtype where it fits
        return cls((data, indices, indptr), shape=m.shape, indptr_dtype=indptr_dtype)

    @classmethod
    def _make(cls, data, indices, indptr, shape):
        """An instance from trusted parts, without validation."""
        return cls(data, indices, indptr, shape=shape, _from_tree=True)

    @property
    def nnz(self) -> int:
        """Number of stored entries (synapses)."""
        return int(self.indices.shape[0])

    nse = nnz

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def ndim(self) -> int:
        return 2

    @property
    def homogeneous(self) -> bool:
        """Whether all synapses share one weight (``data`` of shape ``(1,)``)."""
        return self.data.shape[0] == 1 and self.nnz != 1

    def with_data(self, data):
        """The same structure with new weights (shape ``(1,)``/scalar or ``(nnz,)``, float)."""
        data = jnp.asarray(data)
        if not jnp.issubdtype(data.dtype, jnp.floating):
            raise TypeError(f"with_data: weights must be floating point, got {data.dtype}")
        data = data.reshape(1) if data.ndim == 0 else data
        if data.ndim != 1 or data.shape[0] not in (1, self.nnz):
            raise ValueError(f"with_data: data must have shape (1,) or (nnz,) = ({self.nnz},), got {data.shape}")
        return self._make(data, self.indices, self.indptr, self.shape)

    def _weights(self):
        return jnp.broadcast_to(self.data, (self.nnz,)) if self.data.shape[0] != self.nnz else self.data

    def _dense_stored(self):
        m, n = self._stored_shape
        rows = row_ids(self.indptr, self.nnz)
        return jnp.zeros((m, n), self.dtype).at[rows, self.indices].add(self._weights(), mode="drop")

    def _scipy_arrays(self):
        data = np.asarray(self._weights())
        if data.dtype in LOW_PRECISION:
            data = data.astype(np.float32)  # scipy has no arithmetic in these
        return data, np.asarray(self.indices), np.asarray(self.indptr)

    def __matmul__(self, other):
        return _matmul(self, other, sparse_on_left=True)

    def __rmatmul__(self, other):
        return _matmul(self, other, sparse_on_left=False)

    def __repr__(self) -> str:
        kind = "homogeneous" if self.homogeneous else "per-synapse"
        return f"{type(self).__name__}(shape={self.shape}, nnz={self.nnz}, {kind} {self.dtype})"


@_register_pytree
class CSR(_Compressed):
    """A compressed-sparse-row matrix (e.g. synapses, ``(n_pre, n_post)``).

    Args:
        args: ``(data, indices, indptr)``, or ``data`` followed by ``indices``
            and ``indptr`` as separate arguments.
        shape: ``(n_rows, n_cols)``.
        indptr_dtype: ``"auto"``, ``jnp.int32`` or ``jnp.int64``: the dtype of
            ``indptr``, which counts synapses; int64 (needed beyond ``2**31 - 1``
            synapses, and chosen by ``"auto"`` there) needs JAX's 64-bit mode.

    ``data`` is a scalar or ``(1,)`` (one weight for all synapses) or ``(nnz,)``;
    ``indices`` (int32/int64) are the columns of each row's synapses; duplicate
    columns in a row are summed.  Concrete arrays are validated before any
    conversion (see :mod:`evjax.primitives.csr.validation`).

    Example:
        >>> W = CSR((data, indices, indptr), shape=(n_pre, n_post))
        >>> I = BinaryArray(spikes) @ W      # event-driven, (n_post,)
    """

    def _validated(self, data, indices, indptr, shape, indptr_dtype) -> tuple:
        return validate_csr(data, indices, indptr, shape, who=type(self).__name__, indptr_dtype=indptr_dtype)

    @property
    def _stored_shape(self) -> tuple:
        return self.shape

    @property
    def T(self) -> "CSC":
        """The transpose, as a view (no copy): a :class:`CSC` sharing the arrays."""
        return CSC._make(self.data, self.indices, self.indptr, self.shape[::-1])

    def transpose(self) -> "CSC":
        return self.T

    def todense(self) -> jax.Array:
        """The dense matrix (duplicates summed)."""
        return self._dense_stored()

    def to_scipy(self):
        """A ``scipy.sparse.csr_matrix`` with the same entries (float32 for 16-bit weights)."""
        import scipy.sparse as sp

        return sp.csr_matrix(self._scipy_arrays(), shape=self.shape)

    @classmethod
    def from_scipy(cls, matrix, *, dtype=None, index_dtype=None, indptr_dtype="auto") -> "CSR":
        """From any ``scipy.sparse`` matrix or array (converted to CSR).

        ``index_dtype`` (default: scipy's) is that of ``indices`` and, with
        ``indptr_dtype="auto"``, of ``indptr`` unless nnz needs int64.
        """
        m = matrix.tocsr()
        data = m.data if dtype is None else m.data.astype(dtype)
        return cls._from_scipy_parts(data, m, index_dtype, indptr_dtype)

    @classmethod
    def fromdense(cls, dense, *, index_dtype=np.int32, indptr_dtype="auto") -> "CSR":
        """From a dense (concrete) matrix, keeping its nonzero entries.

        Args:
            dense: a 2-d array.
            index_dtype: the dtype of ``indices`` and, with
                ``indptr_dtype="auto"``, of ``indptr`` unless nnz needs int64.
            indptr_dtype: as in :class:`CSR`.
        """
        import scipy.sparse as sp

        dense = np.asarray(dense)
        if dense.ndim != 2:
            raise ValueError(f"fromdense: expected a matrix, got shape {dense.shape}")
        if dense.dtype in LOW_PRECISION:
            m = sp.csr_matrix(dense.astype(np.float32))
            data = m.data.astype(dense.dtype)
        else:
            m = sp.csr_matrix(dense)
            data = m.data
        return cls._from_scipy_parts(data, m, index_dtype, indptr_dtype)

    from_dense = fromdense


@_register_pytree
class CSC(_Compressed):
    """A compressed-sparse-column matrix; ``CSR.T`` returns one without copying.

    The arrays of a CSC matrix of shape ``(n_rows, n_cols)`` are those of the
    CSR matrix of its transpose: ``indptr`` has ``n_cols + 1`` entries and
    ``indices`` are row indices.

    Args:
        args: ``(data, indices, indptr)`` or three arguments.
        shape: ``(n_rows, n_cols)``.
    """

    def _validated(self, data, indices, indptr, shape, indptr_dtype) -> tuple:
        shape = check_shape(shape, who="CSC")
        data, indices, indptr, stored = validate_csr(
            data, indices, indptr, shape[::-1], who="CSC (as the CSR of its transpose)", indptr_dtype=indptr_dtype
        )
        return data, indices, indptr, stored[::-1]

    @property
    def _stored_shape(self) -> tuple:
        return self.shape[::-1]

    @property
    def T(self) -> CSR:
        """The transpose, a :class:`CSR` sharing the arrays."""
        return CSR._make(self.data, self.indices, self.indptr, self.shape[::-1])

    def transpose(self) -> CSR:
        return self.T

    def todense(self) -> jax.Array:
        return self._dense_stored().T

    def to_scipy(self):
        """A ``scipy.sparse.csc_matrix`` with the same entries."""
        import scipy.sparse as sp

        return sp.csc_matrix(self._scipy_arrays(), shape=self.shape)

    @classmethod
    def from_scipy(cls, matrix, *, dtype=None, index_dtype=None, indptr_dtype="auto") -> "CSC":
        """From any ``scipy.sparse`` matrix or array (converted to CSC); dtypes as in :meth:`CSR.from_scipy`."""
        m = matrix.tocsc()
        data = m.data if dtype is None else m.data.astype(dtype)
        return cls._from_scipy_parts(data, m, index_dtype, indptr_dtype)

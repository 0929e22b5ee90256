"""The dense event family's data type: ``Dense``, a weight matrix whose ``@`` with events is event-driven.

==========================  ===============================================  ===========
expression                  op                                               cost
==========================  ===============================================  ===========
``spikes @ W``              ``binary_densemv(W.data, s, transpose=True)``    active x m
``spikes (n, k) @ W``       ``binary_densemm(W.data, s.T, transpose=True)``  active x m
``W @ spikes``              ``binary_densemv(W.data, s, transpose=False)``   m x active
``W @ spikes (k, n)``       ``binary_densemm(W.data, s, transpose=False)``   m x active
==========================  ===============================================  ===========

Events are a :class:`evjax.BinaryArray`, a :class:`evjax.WeightedArray`
(``weighted=True``) or a plain bool array; a float operand goes to
``jnp.matmul``.  ``Dense`` is a pytree with ``data`` as its one child, so a
jitted function takes new weights of the same shape without retracing, and
``jax.grad`` w.r.t. a ``Dense`` returns a ``Dense`` of weight gradients.

Beyond ``@`` it has brainevent's everyday methods, each a plain JAX
expression on ``data`` (no kernel): ``fromdense``, ``+ - * /`` with a scalar,
an array that broadcasts to its shape or another ``Dense``, ``apply``,
``diag_add``, ``slice_rows`` and ``W[rows]``, ``transpose``, ``tocsr`` /
``tocsc`` / ``tocoo``, ``solve`` and the plasticity updates ``update_on_pre``
/ ``update_on_post``.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from ... import _compat, units
from ...data_representation import DataRepresentation, WeightArithmetic, broadcasts_to
from ...errors import UnsupportedOperationError
from ..._validation import check_shape
from ..._event_values import EventValues, event_operand
from ..csr.convert import normalize_row_index
from ..csr.matrix import CSC, CSR
from ..plasticity.ops import update_dense_on_binary_post, update_dense_on_binary_pre
from .ops import binary_densemm, binary_densemv

__all__ = ["Dense"]


@jax.tree_util.register_pytree_node_class
class Dense(WeightArithmetic, DataRepresentation):
    """A dense weight matrix ``(n_rows, n_cols)`` whose products with events visit only the active ones.

    Args:
        data: the weights, a 2-d float16/bfloat16/float32/float64 array.
        shape: optional, checked against ``data.shape`` (brainevent's signature).
        backend: the backend its event ops ask for (default: see :mod:`evjax.config`).

    Raises:
        TypeError: ``data`` is not a 2-d float array, or ``shape`` is not a pair of integers.
        ValueError: ``shape`` differs from ``data.shape``.

    Example:
        >>> W = evjax.Dense(jnp.ones((3, 4)))
        >>> current = evjax.BinaryArray(jnp.array([True, False, True])) @ W   # (4,): rows 0 and 2
    """

    __array_ufunc__ = None  # numpy defers ``ndarray @ Dense`` to __rmatmul__
    takes_events = True  # ``BinaryArray @ Dense`` comes to us (see evjax.events)

    def __init__(self, data: Any, *, shape=None, backend: str | None = None):
        data, unit = (data, None) if isinstance(data, jax.Array) else units.split(data)  # brainunit: unit kept
        data = data if isinstance(data, jax.Array) else jnp.asarray(data)
        if data.ndim != 2 or not jnp.issubdtype(data.dtype, jnp.floating):
            raise TypeError(f"Dense: data must be a 2-d float matrix, got {data.dtype}{list(data.shape)}; "
                            f"e.g. Dense(jnp.asarray(w, jnp.float32))")
        if shape is not None and check_shape(shape, "Dense") != tuple(data.shape):
            raise ValueError(f"Dense: shape {tuple(shape)} does not match data.shape {tuple(data.shape)}; "
                             f"leave shape out, it is read from data")
        self.data, self.backend = units.attach(data, unit), backend

    def tree_flatten(self):
        return (self.data,), self.backend

    @classmethod
    def tree_unflatten(cls, backend, children):
        obj = object.__new__(cls)  # the child may be a tracer or a placeholder: no checks
        obj.data, obj.backend = children[0], backend
        return obj

    @property
    def shape(self) -> tuple:
        return tuple(self.data.shape)

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def ndim(self) -> int:
        return 2

    @property
    def T(self) -> "Dense":  # noqa: N802 - NumPy's name
        """The transposed matrix (a new ``Dense``)."""
        return self.with_data(self.data.T)

    def with_data(self, data) -> "Dense":
        """A ``Dense`` with new weights and the same backend."""
        return Dense(data, backend=self.backend)

    @classmethod
    def fromdense(cls, mat, *, backend: str | None = None) -> "Dense":
        """A ``Dense`` holding ``mat`` (brainevent's constructor name), as ``Dense(mat, backend=backend)``."""
        return cls(mat, backend=backend)

    @property
    def nse(self) -> int:
        """The number of stored entries: every entry of the matrix."""
        return self.shape[0] * self.shape[1]

    # ---------------------------------------------------------- elementwise
    def apply(self, fn: Callable) -> "Dense":
        """A ``Dense`` with weights ``fn(data)``; ``fn`` must keep the shape (else ``ValueError``)."""
        data = fn(self.data)
        if tuple(np.shape(data)) != self.shape:
            raise ValueError(f"Dense.apply: fn must keep the shape {self.shape}, got {tuple(np.shape(data))}")
        return self.with_data(data)

    def _scaled(self, other, op: Callable, symbol: str, reverse: bool = False) -> "Dense":
        """``self (op) other`` (``other (op) self`` if ``reverse``): ``other`` a scalar, an array that
        broadcasts to this shape, or a ``Dense`` of this shape."""
        who = f"Dense {symbol}"
        if isinstance(other, Dense):
            theirs = other.data
        elif isinstance(other, (DataRepresentation, EventValues)):
            raise UnsupportedOperationError(f"{who} {type(other).__name__} is not supported; convert the other "
                                            f"operand with .todense() (or multiply with @)")
        else:
            theirs = other if isinstance(other, jax.Array) or units.is_quantity(other) else jnp.asarray(other)
        shape = tuple(np.shape(theirs))
        if not broadcasts_to(shape, self.shape):
            raise ValueError(f"{who}: the other operand must be a scalar, an array that broadcasts to "
                             f"{self.shape} or a Dense of that shape; got shape {shape}")
        return self.with_data(op(theirs, self.data) if reverse else op(self.data, theirs))

    _summed = _scaled  # + and - of a Dense are a Dense

    # ------------------------------------------------------------- structure
    def diag_add(self, other) -> "Dense":
        """``A + diag(other)``: ``other`` a scalar or ``min(shape)`` values (in the weights' unit, if any).

        Raises:
            ValueError: ``other`` has another length.
        """
        data, unit = units.split(self.data)
        k = min(self.shape)
        diag = jnp.asarray(units.in_unit_of(other, unit, "the diagonal values", "Dense.diag_add"))
        diag = jnp.broadcast_to(diag, (k,)) if diag.ndim == 0 else diag
        if diag.shape != (k,):
            raise ValueError(f"Dense.diag_add: expected a scalar or min(shape) = {k} values, got shape {diag.shape}")
        i = jnp.arange(k)
        return self.with_data(units.attach(data.at[i, i].add(diag.astype(data.dtype)), unit))

    def slice_rows(self, index) -> "Dense":
        """Rows ``W[index, :]`` as a new ``Dense`` of shape ``(n_selected, n_cols)``.

        Args:
            index: an int (one row: shape ``(1, n_cols)``), a slice, or a sequence, array or bool
                mask of rows; a traced index array is gathered as JAX gathers.

        Raises:
            IndexError: a concrete row out of range (as for :meth:`evjax.CSR.slice_rows`; JAX's own
                gather would clamp it to the last row).
        """
        if isinstance(index, _compat.Tracer):
            return self.with_data(self.data[index])
        return self.with_data(self.data[normalize_row_index(index, self.shape[0], "Dense.slice_rows")])

    def __getitem__(self, index):
        """``W[index]``: the weights' entries (``data[index]``, a list read as an array of rows), a plain array."""
        return self.data[jnp.asarray(index) if isinstance(index, list) else index]

    def __iter__(self):
        """The rows of the weights (without it, Python would iterate through ``W[i]``, which JAX clamps:
        no end)."""
        return iter(self.data)

    # ------------------------------------------------------------ conversions
    def tocsr(self, *, nse: int | None = None, index_dtype=jnp.int32, precompute_weight_indices: bool = False):
        """The nonzero entries as an :class:`evjax.CSR` (the matrix must be concrete).

        Args:
            nse: brainevent's count of stored entries; if given it must equal the number of
                nonzero entries (evjax stores exactly those).
            index_dtype: the dtype of ``indices``.
            precompute_weight_indices: also build the column view
                (:meth:`evjax.CSR.build_weight_indices`), for post-side plasticity.
        """
        return _to_compressed(CSR, self, nse, index_dtype, precompute_weight_indices)

    def tocsc(self, *, nse: int | None = None, index_dtype=jnp.int32, precompute_weight_indices: bool = False):
        """The nonzero entries as an :class:`evjax.CSC` (see :meth:`tocsr`)."""
        return _to_compressed(CSC, self, nse, index_dtype, precompute_weight_indices)

    def tocoo(self):
        """The nonzero entries as a ``jax.experimental.sparse.BCOO`` (the matrix must be concrete)."""
        return self.tocsr().tocoo()

    def solve(self, b, tol=1e-6, reorder=1):
        """``x`` with ``A @ x = b`` (``jnp.linalg.solve``; ``tol`` and ``reorder`` belong to the sparse
        solvers and are not used).  With units, ``x`` has ``b``'s unit over the weights'."""
        (a, unit_a), (rhs, unit_b) = units.split(self.data), units.split(b)
        x = jnp.linalg.solve(a, rhs)
        return units.attach(x, units.product(unit_b, None if unit_a is None else unit_a ** -1))

    # -------------------------------------------------------------- plasticity
    def update_on_pre(self, pre_spike, post_trace, w_min=None, w_max=None) -> "Dense":
        """:func:`evjax.update_dense_on_binary_pre` on these weights: a new ``Dense``."""
        return self.with_data(update_dense_on_binary_pre(self.data, pre_spike, post_trace, w_min, w_max,
                                                         backend=self.backend))

    def update_on_post(self, pre_trace, post_spike, w_min=None, w_max=None) -> "Dense":
        """:func:`evjax.update_dense_on_binary_post` on these weights: a new ``Dense``."""
        return self.with_data(update_dense_on_binary_post(self.data, pre_trace, post_spike, w_min, w_max,
                                                          backend=self.backend))

    def todense(self) -> jax.Array:
        """The weights as a plain array."""
        return self.data

    def __repr__(self) -> str:
        return f"Dense(shape={self.shape}, dtype={self.dtype})"

    def _operand(self, x):
        """``(array, is_event, weighted)`` for the other side of ``@``."""
        if isinstance(x, Dense):
            raise TypeError("Dense @ Dense: multiply the arrays, e.g. A.todense() @ B.todense()")
        if isinstance(x, EventValues):
            value, weighted = event_operand(x)
            return value, True, weighted
        if not isinstance(x, jax.Array):
            if units.is_quantity(x):
                return x, False, False
            x = jnp.asarray(x)
        return x, x.dtype == jnp.bool_, False

    def _dense_matmul(self, a, b):
        """``a @ b`` of two plain or brainunit operands (numbers multiplied, units too)."""
        (a, ua), (b, ub) = units.split(a), units.split(b)
        return units.attach(jnp.matmul(a, b), units.product(ua, ub))

    def __matmul__(self, other):  # W @ x
        x, event, weighted = self._operand(other)
        if not event:
            return self._dense_matmul(self.data, x)
        op = binary_densemv if x.ndim == 1 else binary_densemm
        return op(self.data, x, transpose=False, backend=self.backend, weighted=weighted)

    def __rmatmul__(self, other):  # x @ W
        x, event, weighted = self._operand(other)
        if not event:
            return self._dense_matmul(x, self.data)
        if x.ndim == 1:
            return binary_densemv(self.data, x, transpose=True, backend=self.backend, weighted=weighted)
        if x.ndim != 2:
            raise ValueError(f"matmul: events must be a vector or a matrix (n, k), got shape {x.shape}")
        return binary_densemm(self.data, x.T, transpose=True, backend=self.backend, weighted=weighted).T


def _to_compressed(cls, dense: Dense, nse, index_dtype, precompute_weight_indices: bool):
    """``cls.fromdense`` of a ``Dense`` with brainevent's ``tocsr``/``tocsc`` options."""
    matrix = cls.fromdense(dense.data, index_dtype=index_dtype)
    if nse is not None and int(nse) != matrix.nnz:
        raise ValueError(f"Dense.to{cls.__name__.lower()}: nse = {nse} but the matrix has {matrix.nnz} nonzero "
                         f"entries; leave nse out (evjax stores exactly the nonzero entries)")
    return matrix.build_weight_indices() if precompute_weight_indices else matrix

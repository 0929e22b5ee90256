"""Fixed fan-out / fan-in connectivity: ``FixedPostNumConn`` and ``FixedPreNumConn``.

Both hold an index table ``indices`` of shape ``(n, k)`` and weights (a scalar
or ``(1,)``, or ``(n, k)``), as pytree children: a new table of the same shape
does not retrace a jitted function.

* :class:`FixedPostNumConn` ``(n_pre, n_post)``: row ``i`` (a presynaptic neuron)
  has the ``k`` targets ``indices[i, :]`` (fan-out); the table has ``n_pre`` rows.
* :class:`FixedPreNumConn` ``(n_pre, n_post)``: column ``j`` (a postsynaptic
  neuron) has the ``k`` sources ``indices[j, :]`` (fan-in); the table has
  ``n_post`` rows and stores the transpose.

``@`` runs the functions of :mod:`evjax.primitives.fixed.ops` (CSR's ops on the
table's CSR structure) in the orientation the product needs (a bool operand, a
:class:`~evjax.BinaryArray` or a :class:`~evjax.WeightedArray` selects the event
ops): ``spikes @ FixedPostNumConn`` and ``FixedPreNumConn @ spikes`` are the
event-driven scatter, the other two products the gather.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ... import units
from ...data_representation import DataRepresentation, WeightArithmetic
from ...errors import UnsupportedOperationError
from ..._validation import check_shape, check_size, host_rng
from ..._event_values import EventValues, event_operand
from ..csr.convert import normalize_row_index
from ..csr.matrix import CSR
from ..csr.ops import binary_csrmv_active
from ..plasticity.ops import update_fixed_post_conn_on_binary_pre, update_fixed_pre_conn_on_binary_post
from .ops import binary_fcnmm, binary_fcnmv, csr_structure, fcnmm, fcnmv
from .validation import row_pointers, validate_table

__all__ = ["FixedNumConn", "FixedPostNumConn", "FixedPreNumConn", "FixedNumPerPre", "FixedNumPerPost"]

_FLOAT = {1: fcnmv, 2: fcnmm}
_EVENT = {1: binary_fcnmv, 2: binary_fcnmm}


def _register_pytree(cls):
    """Children ``data`` and ``indices``; ``shape`` and ``backend`` are static (a dataclass node,
    flattened in C++).  Unflattening passes ``_from_tree=True``, which skips validation (the
    children may be tracers or placeholders)."""
    jax.tree_util.register_dataclass(cls, data_fields=["data", "indices"],
                                     meta_fields=["shape", "backend", "_from_tree"])
    return cls


def _random_table(rng: np.random.Generator, n: int, n_targets: int, k: int, replace: bool,
                  who: str = "random") -> np.ndarray:
    """``(n, k)`` int32 targets in ``[0, n_targets)``; without replacement, distinct in each row."""
    if k == 0 or n == 0:
        return np.zeros((n, k), np.int32)
    if n_targets == 0:
        raise ValueError(f"{who}: k = {k} targets per row, but there is no neuron to draw them from; pass k=0")
    if replace:
        return rng.integers(0, n_targets, (n, k)).astype(np.int32)
    if k > n_targets:
        raise ValueError(f"{who}: k = {k} distinct targets per row need n >= k, but there are {n_targets}; "
                         f"pass replace=True or a smaller k")
    if 2 * k > n_targets:  # dense: a random permutation per row
        return np.argsort(rng.random((n, n_targets)), axis=1)[:, :k].astype(np.int32)
    table = rng.integers(0, n_targets, (n, k))
    while True:  # redraw duplicates in each row until none is left (k <= n_targets / 2: few rounds)
        order = np.argsort(table, axis=1)
        ranked = np.take_along_axis(table, order, axis=1)
        dup_sorted = np.zeros_like(ranked, bool)
        dup_sorted[:, 1:] = ranked[:, 1:] == ranked[:, :-1]
        if not dup_sorted.any():
            return table.astype(np.int32)
        dup = np.zeros_like(dup_sorted)
        np.put_along_axis(dup, order, dup_sorted, axis=1)
        table[dup] = rng.integers(0, n_targets, int(dup.sum()))


class FixedNumConn(WeightArithmetic, DataRepresentation):
    """The base of :class:`FixedPostNumConn` and :class:`FixedPreNumConn` (brainevent's ``FixedNumConn``).

    Both store a weight table and an index table of shape ``_table_shape``
    (``(n_rows, k)``); the matrix is the table's CSR matrix (fixed fan-out) or
    its transpose (fixed fan-in).  Use the base to ask whether an object is
    either: build one of the two subclasses.

    Args:
        data: the weights (a scalar or ``(1,)``, or the table's shape), or ``(data, indices)``.
        indices: the index table, int32/int64.
        shape: ``(n_pre, n_post)``.
        backend: the backend of every product (default: see :mod:`evjax.config`).

    Example:
        >>> W = evjax.FixedPostNumConn((0.5, indices), shape=(n_pre, n_post))
        >>> isinstance(W, evjax.FixedNumConn) and isinstance(W.T, evjax.FixedNumConn)
        True
    """

    __array_ufunc__ = None  # numpy defers ``ndarray @ conn`` to __rmatmul__
    takes_events = True  # ``BinaryArray @ conn`` runs the event ops (see evjax.events)
    _fan_out = True

    _from_tree = True  # the pytree's static flag: instances rebuilt by JAX skip validation

    def __init__(self, data, indices=None, *, shape, backend: str | None = None, _from_tree: bool = False):
        if _from_tree:
            self.data, self.indices, self.shape, self.backend = data, indices, shape, backend
            return
        if type(self) is FixedNumConn:
            raise TypeError("FixedNumConn is the base class: build a FixedPostNumConn (fixed fan-out) or a "
                            "FixedPreNumConn (fixed fan-in)")
        if indices is None:
            if not isinstance(data, (tuple, list)) or len(data) != 2:
                raise TypeError(f"{type(self).__name__}: pass (data, indices) or data and indices, got "
                                f"{type(data).__name__}")
            data, indices = data
        shape = check_shape(shape, type(self).__name__, dims=("n_pre", "n_post"))
        stored = shape if self._fan_out else shape[::-1]
        data, unit = units.split(data)  # brainunit weights: the numbers are checked, the unit kept
        data, indices, _ = validate_table(data, indices, stored, who=type(self).__name__)
        self.data, self.indices, self.shape, self.backend = units.attach(data, unit), indices, shape, backend

    # -- structure -----------------------------------------------------------
    @property
    def _table_shape(self) -> tuple:
        return self.shape if self._fan_out else self.shape[::-1]

    @property
    def num_conn(self) -> int:
        """``k``: synapses per row of the table."""
        return int(self.indices.shape[1])

    @property
    def nse(self) -> int:
        """Stored synapses, ``n * k``."""
        return int(self.indices.shape[0] * self.indices.shape[1])

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def ndim(self) -> int:
        return 2

    @property
    def homogeneous(self) -> bool:
        """One weight for every synapse."""
        return self.data.shape != self.indices.shape

    def with_data(self, data):
        """The same table with new weights (scalar/``(1,)`` or ``(n, k)``)."""
        data, _, _ = validate_table(data, self.indices, self._table_shape, who=f"{type(self).__name__}.with_data")
        return type(self)(data, self.indices, shape=self.shape, backend=self.backend, _from_tree=True)

    def _weights(self):
        return jnp.broadcast_to(self.data, self.indices.shape) if self.homogeneous else self.data

    def _plastic_table(self, who: str):
        """The per-synapse weights an update moves; a homogeneous table has none (a clear error)."""
        if self.homogeneous:
            raise ValueError(f"{type(self).__name__}.{who}: this table has one weight shared by all synapses, so "
                             f"there are no per-synapse weights to update; give it per-synapse weights first: "
                             f"W.with_data(jnp.full(W.indices.shape, w))")
        return self.data

    def _with_table(self, data):
        return type(self)(data, self.indices, shape=self.shape, backend=self.backend, _from_tree=True)

    def _stored_csr(self) -> CSR:
        n, k = self.indices.shape
        return CSR((self._weights().reshape(-1), self.indices.reshape(-1), row_pointers(n, k)),
                   shape=self._table_shape)

    def todense(self) -> jax.Array:
        """The dense ``(n_pre, n_post)`` matrix (duplicate targets summed)."""
        n, k = self.indices.shape
        rows = jnp.repeat(jnp.arange(n), k)
        data, unit = units.split(self.data)
        weights = jnp.broadcast_to(data, self.indices.shape) if self.homogeneous else data
        table = jnp.zeros(self._table_shape, weights.dtype).at[rows, self.indices.reshape(-1)].add(
            weights.reshape(-1), mode="drop")
        return units.attach(table if self._fan_out else table.T, unit)

    def tocsr(self) -> CSR:
        """The same matrix as an :class:`evjax.CSR` of shape ``(n_pre, n_post)``."""
        stored = self._stored_csr()
        return stored if self._fan_out else stored.T.tocsr()

    def tocsc(self):
        """The same matrix as an :class:`evjax.CSC` of shape ``(n_pre, n_post)``."""
        stored = self._stored_csr()
        return stored.tocsc() if self._fan_out else stored.T

    def tocoo(self):
        """The same matrix as a ``jax.experimental.sparse.BCOO`` (one entry per synapse)."""
        return self.tocsr().tocoo()

    def __getitem__(self, index) -> jax.Array:
        """Rows ``W[index]`` (or ``W[index, :]``) as a dense array, as :meth:`evjax.CSR.__getitem__`
        gives them (``W[i]`` is ``(n_post,)``, ``W[rows]`` and ``W[slice]`` are ``(k, n_post)``)."""
        return self.tocsr()[index]

    def sum(self, axis=None) -> jax.Array:
        """Sum of the synapses' weights: all (``None``), per column (``0``) or per row (``1``)."""
        return self.tocsr().sum(axis)

    @property
    def num_pre(self) -> int:
        """``n_pre``, the matrix's rows."""
        return self.shape[0]

    @property
    def num_post(self) -> int:
        """``n_post``, the matrix's columns."""
        return self.shape[1]

    # -- weights ---------------------------------------------------------------
    def apply(self, fn):
        """The same table with weights ``fn(data)`` (``fn`` elementwise)."""
        return self.with_data(fn(self.data))

    def _scaled(self, other, op, symbol: str, reverse: bool = False):
        """``self (op) other`` on the weights: ``other`` a scalar or a table of the same ``indices``."""
        if isinstance(other, FixedNumConn):
            if type(other) is not type(self) or other.indices is not self.indices or other.shape != self.shape:
                raise TypeError(f"{type(self).__name__} {symbol}: two tables must share one structure (the same "
                                f"indices array, e.g. C and C.with_data(...)); convert one with .todense()")
            theirs, mine = other._weights(), self._weights()
        elif np.ndim(other) == 0:
            theirs, mine = other, self.data
        else:
            raise ValueError(f"{type(self).__name__} {symbol}: the other operand must be a scalar or a table of "
                             f"the same structure, got shape {np.shape(other)}; convert with .todense()")
        return self.with_data(op(theirs, mine) if reverse else op(mine, theirs))

    # -- products ------------------------------------------------------------
    def _product(self, x, *, conn_on_left: bool):
        value, weighted = event_operand(x)
        event = isinstance(x, EventValues)
        value = value if isinstance(value, jax.Array) or units.is_quantity(value) else jnp.asarray(value)
        event = event or value.dtype == jnp.bool_
        if value.ndim not in (1, 2):
            raise ValueError(f"matmul: the dense side must be a vector or a matrix, got shape {value.shape}")
        m, n = self.shape
        contracted = n if conn_on_left else m
        x_dim = value.shape[0] if (conn_on_left or value.ndim == 1) else value.shape[1]
        if x_dim != contracted:
            left, right = (self.shape, value.shape) if conn_on_left else (value.shape, self.shape)
            raise ValueError(f"matmul: shapes {left} and {right} are not aligned ({x_dim} != {contracted})")
        # conn @ x is table @ x (fan-out) or table.T @ x (fan-in); x @ conn = (conn.T @ x.T).T
        transpose = (not self._fan_out) if conn_on_left else self._fan_out
        if transpose and value.ndim == 1 and not weighted and getattr(x, "lists_rows", False):
            listed = x.active_rows()  # a CompactBinary: the scatter reads its list of active rows
            if listed is not None:
                flat, indptr = csr_structure(self.indices)
                return binary_csrmv_active(self.data.reshape(-1), flat, indptr, *listed, value,
                                           shape=self._table_shape, backend=self.backend)
        operand = value if (conn_on_left or value.ndim == 1) else value.T
        fn = (_EVENT if event else _FLOAT)[value.ndim]
        kw = dict(shape=self._table_shape, transpose=transpose, backend=self.backend)
        if event:
            kw["weighted"] = weighted
        y = fn(self.data, self.indices, operand, **kw)
        return y if (conn_on_left or value.ndim == 1) else y.T

    def __matmul__(self, other):
        return self._product(other, conn_on_left=True)

    def __rmatmul__(self, other):
        return self._product(other, conn_on_left=False)

    def __repr__(self) -> str:
        kind = "homogeneous" if self.homogeneous else "per-synapse"
        return f"{type(self).__name__}(shape={self.shape}, k={self.num_conn}, {kind} {self.dtype})"

    # -- construction ----------------------------------------------------------
    @classmethod
    def _random(cls, key, n_pre, n_post, k, weight, replace: bool, backend):
        who = f"{cls.__name__}.random"
        n_pre, n_post, k = (check_size(n_pre, who, "n_pre"), check_size(n_post, who, "n_post"),
                            check_size(k, who, "k"))
        rng = host_rng(key, who, "key")
        n_rows, n_targets = (n_pre, n_post) if cls._fan_out else (n_post, n_pre)
        indices = _random_table(rng, n_rows, n_targets, k, bool(replace), who)
        weight = jnp.asarray(weight, jnp.float32) if isinstance(weight, (int, float)) else jnp.asarray(weight)
        return cls((weight, jnp.asarray(indices)), shape=(n_pre, n_post), backend=backend)


@_register_pytree
class FixedPostNumConn(FixedNumConn):
    """Fixed fan-out: each presynaptic neuron (row) has ``k`` postsynaptic targets.

    Args:
        data: the weights (a scalar or ``(1,)``, or ``(n_pre, k)``), or ``(data, indices)``.
        indices: ``(n_pre, k)``, the targets of each row (duplicates add up); int32/int64.
        shape: ``(n_pre, n_post)``.
        backend: the backend of every product (default: see :mod:`evjax.config`).

    Raises:
        TypeError: ``shape`` is not a pair of integers (``4.7`` is never truncated).
        ValueError: a negative size, shapes that do not fit, or (concrete) a target outside ``[0, n_post)``.

    Example:
        >>> W = FixedPostNumConn((0.5, indices), shape=(n_pre, n_post))
        >>> current = spikes @ W          # event-driven: active rows x k
    """

    _fan_out = True

    @property
    def T(self) -> "FixedPreNumConn":
        """The transpose, a :class:`FixedPreNumConn` sharing the arrays (no copy)."""
        return FixedPreNumConn((self.data, self.indices), shape=self.shape[::-1], backend=self.backend)

    def slice_rows(self, index) -> "FixedPostNumConn":
        """Rows ``W[index, :]`` as a new table of shape ``(n_selected, n_post)``: the selected rows of
        the table, each with its ``k`` targets (a gather; the table may be traced).

        Args:
            index: an int (one row), a slice, or a sequence, array or bool mask of rows (concrete).

        Raises:
            IndexError: a row out of range.
        """
        rows = normalize_row_index(index, self.shape[0], "FixedPostNumConn.slice_rows")
        data = self.data if self.homogeneous else self.data[rows]
        return FixedPostNumConn(data, self.indices[rows], shape=(rows.size, self.shape[1]), backend=self.backend,
                                _from_tree=True)

    def update_on_pre(self, pre_spike, post_trace, w_min=None, w_max=None) -> "FixedPostNumConn":
        """This table after presynaptic spikes: ``data[i, c] = clip(data[i, c] + post_trace[indices[i, c]])``.

        :func:`evjax.update_fixed_post_conn_on_binary_pre` on this table: only
        the rows of neurons that fired are visited.

        Args:
            pre_spike: ``(n_pre,)`` bool, or numbers where nonzero is a spike.
            post_trace: ``(n_post,)`` float trace.
            w_min, w_max: bounds for updated weights (scalars), or None.

        Returns:
            A :class:`FixedPostNumConn` with the same targets and the new weights.

        Raises:
            ValueError: the table is homogeneous, or an argument of the wrong shape (named).

        Example:
            >>> W = W.update_on_pre(pre_spikes, post_trace, w_min=0.0, w_max=1.0)
        """
        return self._with_table(update_fixed_post_conn_on_binary_pre(
            self._plastic_table("update_on_pre"), self.indices, pre_spike, post_trace, w_min, w_max,
            shape=self.shape, backend=self.backend))

    @classmethod
    def random(cls, key, n_pre: int, n_post: int, k: int, *, weight=1.0, replace: bool = False,
               backend: str | None = None) -> "FixedPostNumConn":
        """Each of ``n_pre`` rows connects to ``k`` targets drawn uniformly from ``[0, n_post)``.

        Args:
            key: a JAX random key (or a non-negative integer seed).
            n_pre: presynaptic neurons (rows).
            n_post: postsynaptic neurons (columns).
            k: targets per presynaptic neuron (the fan-out).
            weight: a scalar (homogeneous) or an ``(n_pre, k)`` array.
            replace: allow a row to hit a target more than once (the weights add up).
            backend: as in the constructor.

        Raises:
            TypeError: ``key`` is neither a key nor an integer, or a size is not an integer.
            ValueError: a negative seed or size, or ``k`` distinct targets that ``n_post`` cannot hold.
        """
        return cls._random(key, n_pre, n_post, k, weight, replace, backend)


@_register_pytree
class FixedPreNumConn(FixedNumConn):
    """Fixed fan-in: each postsynaptic neuron (column) has ``k`` presynaptic sources.

    Args:
        data: the weights (a scalar or ``(1,)``, or ``(n_post, k)``), or ``(data, indices)``.
        indices: ``(n_post, k)``, the sources of each column (duplicates add up); int32/int64.
        shape: ``(n_pre, n_post)``.
        backend: the backend of every product.

    Example:
        >>> W = FixedPreNumConn((weights, indices), shape=(n_pre, n_post))
        >>> current = spikes @ W          # the gather: one pass over each column's k sources
    """

    _fan_out = False

    def slice_rows(self, index):
        """Not for a fan-in table: its rows are the matrix's columns, so selecting matrix rows breaks
        the fixed count per column.  Select them on ``W.tocsr()`` (a CSR), or columns with
        ``W.T.slice_rows(columns)``."""
        raise UnsupportedOperationError("FixedPreNumConn.slice_rows: the table's rows are the matrix's columns, "
                                        "so selected matrix rows are no fixed fan-in table; use "
                                        "W.tocsr().slice_rows(rows), or W[rows] for the dense rows")

    @property
    def T(self) -> FixedPostNumConn:
        """The transpose, a :class:`FixedPostNumConn` sharing the arrays (no copy)."""
        return FixedPostNumConn((self.data, self.indices), shape=self.shape[::-1], backend=self.backend)

    def update_on_post(self, pre_trace, post_spike, w_min=None, w_max=None) -> "FixedPreNumConn":
        """This table after postsynaptic spikes: ``data[j, c] = clip(data[j, c] + pre_trace[indices[j, c]])``.

        :func:`evjax.update_fixed_pre_conn_on_binary_post` on this table: only
        the rows (postsynaptic neurons) that fired are visited.

        Args:
            pre_trace: ``(n_pre,)`` float trace.
            post_spike: ``(n_post,)`` bool, or numbers where nonzero is a spike.
            w_min, w_max: bounds for updated weights (scalars), or None.

        Returns:
            A :class:`FixedPreNumConn` with the same sources and the new weights.

        Raises:
            ValueError: the table is homogeneous, or an argument of the wrong shape (named).

        Example:
            >>> W = W.update_on_post(pre_trace, post_spikes, w_min=0.0, w_max=1.0)
        """
        return self._with_table(update_fixed_pre_conn_on_binary_post(
            self._plastic_table("update_on_post"), self.indices, pre_trace, post_spike, w_min, w_max,
            shape=self.shape, backend=self.backend))

    @classmethod
    def random(cls, key, n_pre: int, n_post: int, k: int, *, weight=1.0, replace: bool = False,
               backend: str | None = None) -> "FixedPreNumConn":
        """Each of ``n_post`` columns receives ``k`` sources drawn uniformly from ``[0, n_pre)``.

        Args: as :meth:`FixedPostNumConn.random` (weights ``(n_post, k)``).
        """
        return cls._random(key, n_pre, n_post, k, weight, replace, backend)


# brainevent 0.2's current names for the two classes (the ones above are its deprecated ones, kept there):
# a fixed number of targets per presynaptic neuron, and of sources per postsynaptic neuron.
FixedNumPerPre = FixedPostNumConn
FixedNumPerPost = FixedPreNumConn

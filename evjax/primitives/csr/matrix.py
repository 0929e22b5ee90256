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
event ops (``binary_csrmv`` / ``binary_csrmm``); a :class:`evjax.WeightedArray`
the same ops with ``weighted=True``.

Beyond ``@``, a matrix has brainevent's everyday methods: ``sum(axis)``,
``todense``/``toarray``, ``tocoo`` (a ``jax.experimental.sparse.BCOO``),
``tocsr``/``tocsc`` (re-sorted storage), ``T``/``transpose()`` (a view),
``apply(fn)``, ``*``, ``/`` and unary ``-`` on the weights, ``diag_add`` and
``slice_rows``; the structural maths is in :mod:`.convert`.  ``np.asarray(W)``
raises a ``TypeError`` pointing to ``todense()``.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ... import units
from ...data_representation import DataRepresentation, WeightArithmetic, sparse_apply2
from ..._validation import INT32_MAX, check_shape, checked_index_cast
from ...dtypes import LOW_PRECISION
from ...errors import UnsupportedOperationError
from ..._event_values import EventValues, event_operand
from .convert import (
    add_diagonal,
    axis_sums,
    dense_at_entries,
    dense_rows,
    is_concrete,
    normalize_row_index,
    select_rows,
    selected_rows,
    transpose_structure,
    weights_of,
)
from .ops import (binary_csrmm_p, binary_csrmv_active, binary_csrmv_p, checked_matmul, csrmm_p, csrmv_p, row_ids,
                  validate_csr)
from ..delay.ops import CSRDelayLayout, csr_delay_deliver
from ..grouping import transposed_view
from ..plasticity.apply import csr_apply_on_post, csr_apply_on_pre
from ..plasticity.ops import (
    update_csc_on_binary_post,
    update_csr_on_binary_post,
    update_csr_on_binary_pre,
    update_on_row_view,
)

__all__ = ["CSR", "CSC"]

# (rank of x, events) -> (op, the public wrapper named in errors)
_MATMUL = {(1, False): (csrmv_p, "csrmv"), (2, False): (csrmm_p, "csrmm"),
           (1, True): (binary_csrmv_p, "binary_csrmv"), (2, True): (binary_csrmm_p, "binary_csrmm")}


def _split_operand(x):
    """``(array, is_event, weighted)`` for a matmul operand."""
    if isinstance(x, EventValues):
        value, weighted = event_operand(x)
        return value, True, weighted
    if isinstance(x, _Compressed):
        raise UnsupportedOperationError("sparse @ sparse is not supported; convert one side with .todense()")
    if not isinstance(x, jax.Array):
        if units.is_quantity(x):  # values with a unit (_matmul takes the unit off)
            return x, False, False
        x = jnp.asarray(x)
    return x, x.dtype == jnp.bool_, False


def _matmul_quantities(sparse, operand, x, event: bool, weighted: bool, sparse_on_left: bool):
    """``_matmul`` where the weights or the operand are brainunit quantities: on the numbers, then the
    product's unit (spikes carry none)."""
    data, unit = units.split(sparse.data)
    if units.is_quantity(x):
        if event and not weighted:
            raise TypeError("matmul: spikes carry no unit; pass their numbers (x.mantissa), or a WeightedArray")
        x, x_unit = units.split(x)
        unit = units.product(unit, x_unit)
        operand = type(operand)(x) if isinstance(operand, EventValues) else x  # (a WeightedArray's values)
    plain = sparse._make(data, sparse.indices, sparse.indptr, sparse.shape, sparse.other_view, sparse.backend)
    return units.attach(_matmul(plain, operand, sparse_on_left=sparse_on_left), unit)


def _matmul(sparse, x, *, sparse_on_left: bool):
    """Shared ``@`` for CSR (``stored_transposed=False``) and CSC (its transposed view).

    ``S @ x`` is ``A @ x`` (or ``A.T @ x`` for a CSC) with ``A`` the stored CSR;
    ``x @ S`` is ``(S.T @ x.T).T``.  The structure's shapes are checked at trace
    time by :func:`.ops.checked_matmul` (a matrix rebuilt by a transform, e.g. a
    vmap whose in_axes leave a batched ``indices`` unbatched, must not reach a
    kernel); its values were checked when the matrix was made.
    """
    operand = x
    x, event, weighted = _split_operand(x)
    if not (isinstance(sparse.data, jax.Array) and isinstance(x, jax.Array)) and (
            units.is_quantity(sparse.data) or units.is_quantity(x)):  # (no call at all for JAX arrays)
        return _matmul_quantities(sparse, operand, x, event, weighted, sparse_on_left)
    m, n = sparse.shape
    contracted = n if sparse_on_left else m
    if x.ndim not in (1, 2):
        raise ValueError(f"matmul: the dense side must be a vector or a matrix, got shape {x.shape}")
    x_dim = x.shape[0] if (sparse_on_left or x.ndim == 1) else x.shape[1]
    if x_dim != contracted:
        left, right = (sparse.shape, x.shape) if sparse_on_left else (x.shape, sparse.shape)
        raise ValueError(f"matmul: shapes {left} and {right} are not aligned ({x_dim} != {contracted})")
    transpose = isinstance(sparse, CSC) != (not sparse_on_left)  # of the stored CSR
    listed = operand.active_rows() if transpose and getattr(operand, "lists_rows", False) and not weighted else None
    if listed is not None:  # events that carry the list of their active rows: the scatter reads the list
        return binary_csrmv_active(sparse.data, sparse.indices, sparse.indptr, *listed, x,
                                   shape=sparse._stored_shape, backend=sparse.backend)
    flip = not sparse_on_left and x.ndim == 2  # x @ S = (S.T @ x.T).T
    op, who = _MATMUL[(x.ndim, event)]
    y = checked_matmul(op, sparse.data, sparse.indices, sparse.indptr, x.T if flip else x,
                       shape=sparse._stored_shape, transpose=transpose, backend=sparse.backend, rank=x.ndim, event=event,
                       who=who, weighted=weighted)
    return y.T if flip else y


# ---------------------------------------------------------------------------
# CSR and its transposed view
# ---------------------------------------------------------------------------
def _register_pytree(cls):
    """Register a sparse class as a pytree whose children are ``data``, ``indices``, ``indptr``.

    As a "dataclass" node JAX flattens it in C++, without calling Python: about
    1.5 microseconds less per jitted call that takes the matrix (measured on a
    2-core VM).  Unflattening calls ``cls(data=..., indices=..., indptr=...,
    other_view=..., shape=..., _from_tree=True)``, which skips validation (the
    children may be tracers or placeholders).  ``other_view`` is None (no
    leaves) or the cached transposed structure of
    :meth:`_Compressed.build_weight_indices`, so a matrix carries it through
    ``jit`` as data.
    """
    jax.tree_util.register_dataclass(
        cls, data_fields=["data", "indices", "indptr", "other_view"], meta_fields=["shape", "_from_tree", "backend"]
    )
    return cls



def _normalize_axis(axis, who: str):
    """``None`` (all entries), ``0`` or ``1`` from a NumPy-style axis: an int or a tuple of ints."""
    if axis is None:
        return None
    axes = list(axis) if isinstance(axis, (tuple, list)) else [axis]
    valid = all(isinstance(a, (int, np.integer)) and not isinstance(a, bool) and -2 <= a <= 1 for a in axes)
    if not axes or not valid:
        raise ValueError(f"{who}: axis must be None, 0, 1 (or -1, -2) or a tuple of them, got {axis!r}")
    axes = {int(a) % 2 for a in axes}
    return None if len(axes) == 2 else axes.pop()


def checked_backend(value, who: str, name: str = "backend"):
    """``value`` if it is a backend's name or None, else a ``TypeError`` naming ``name``."""
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{who}: {name} must be a backend's name (e.g. 'numba') or None, got {value!r}")
    return value


def _constructor_parts(who: str, data, indices, indptr, args: tuple, shape, unknown: dict) -> tuple:
    """``(data, indices, indptr, shape)`` from the accepted call forms, errors naming the class.

    Forms: ``C((data, indices, indptr), shape=s)``, ``C((data, indices, indptr), s)``,
    ``C(data, indices, indptr, shape=s)`` and ``C(data, indices, indptr, s)``.
    """
    usage = f"e.g. {who}((data, indices, indptr), shape=(n_rows, n_cols))"
    if unknown:
        raise TypeError(f"{who}: unexpected keyword argument(s) {sorted(unknown)}; {usage}")
    if indptr is None and isinstance(data, (tuple, list)):  # the (data, indices, indptr) form
        if len(data) != 3:
            raise ValueError(f"{who}: expected (data, indices, indptr), got a sequence of {len(data)}; {usage}")
        positional = () if indices is None else (indices,)
        data, indices, indptr = data
        args = positional + args
    elif indices is None or indptr is None:
        raise TypeError(f"{who}: give data, indices and indptr (as one tuple or three arguments); {usage}")
    if len(args) > 1 or (args and shape is not None):
        raise TypeError(f"{who}: too many arguments (the shape was given twice, or extra arguments); {usage}")
    shape = args[0] if args else shape
    if shape is None:
        raise TypeError(f"{who}: shape=(n_rows, n_cols) is required; {usage}")
    return data, indices, indptr, shape


class _Compressed(WeightArithmetic, DataRepresentation):
    __array_ufunc__ = None  # numpy defers ``ndarray @ sparse`` to __rmatmul__
    takes_events = True  # ``BinaryArray @ sparse`` runs the event ops (see evjax.events)
    _from_tree = True  # the pytree's static flag: rebuilt instances skip validation

    data: jax.Array
    indices: jax.Array
    indptr: jax.Array
    shape: tuple
    other_view: tuple | None = None  # (t_indices, t_indptr, perm) of the stored arrays' transpose, if cached
    _owner: str | None = None  # the class the user holds, where it is not this one (a TCSR's views: "TCSR")

    @property
    def _name(self) -> str:
        """The class name the methods' errors give: the user's class (:attr:`_owner`), else this one's."""
        return self._owner or type(self).__name__

    def __init__(self, data, indices=None, indptr=None, *args, shape=None, indptr_dtype="auto",
                 backend: str | None = None, _from_tree: bool = False, other_view=None, **unknown):
        self.backend = backend
        if _from_tree:  # rebuilt by JAX from its own leaves: no validation
            self._set(data, indices, indptr, shape)
            self.other_view = other_view
            return
        checked_backend(backend, type(self).__name__)
        parts = _constructor_parts(type(self).__name__, data, indices, indptr, args, shape, unknown)
        data, unit = parts[0], None
        if not isinstance(data, (jax.Array, np.ndarray)):  # brainunit weights: the numbers checked, the unit kept
            data, unit = units.split(data)
        data, indices, indptr, shape = self._validated(data, *parts[1:], indptr_dtype)
        self._set(data if unit is None else units.attach(data, unit), indices, indptr, shape)

    def _validated(self, data, indices, indptr, shape, indptr_dtype) -> tuple:
        """``(data, indices, indptr, shape)`` checked and normalised (per subclass)."""
        raise NotImplementedError

    def _set(self, data, indices, indptr, shape) -> None:
        self.data, self.indices, self.indptr, self.shape = data, indices, indptr, tuple(shape)

    @classmethod
    def _from_scipy_parts(cls, data, m, index_dtype, indptr_dtype, backend=None):
        """An instance from a scipy matrix's arrays, cast to ``index_dtype`` only where every value fits."""
        who = f"{cls.__name__}.from_scipy"
        index_dtype = m.indices.dtype if index_dtype is None else index_dtype
        indices, indptr = checked_index_cast(m.indices, index_dtype, "indices", who), m.indptr
        if (indptr_dtype is None or isinstance(indptr_dtype, str) and indptr_dtype == "auto") and m.nnz <= INT32_MAX:
            indptr = checked_index_cast(indptr, index_dtype, "indptr", who)  # "auto": indices' dtype where it fits
        return cls((data, indices, indptr), shape=m.shape, indptr_dtype=indptr_dtype, backend=backend)

    @classmethod
    def _make(cls, data, indices, indptr, shape, other_view=None, backend=None):
        """An instance from trusted parts, without validation."""
        return cls(data, indices, indptr, shape=shape, _from_tree=True, other_view=other_view, backend=backend)

    def _reweighted(self, data):
        """This structure (and its cached view, if any) with the trusted weights ``data``."""
        return self._make(data, self.indices, self.indptr, self.shape, self.other_view, self.backend)

    def build_weight_indices(self):
        """A copy that carries the other view of its structure, computed once (brainevent's name).

        The view is the transposed structure of the stored arrays and the
        position of each of its entries in ``data`` (as
        :func:`evjax.csr_to_csc_index` gives them): a :class:`CSR`'s columns,
        a :class:`CSC`'s rows.  The plasticity updates that need it
        (``CSR.update_on_post``, ``CSC.update_on_pre``) then skip its stable
        sort, also when the matrix is a traced argument of a jitted step: the
        view is a pytree child, carried as data, and kept by ``with_data`` and
        the updates.  It is computed with NumPy when the structure is
        concrete, with ``jax.numpy`` when it is traced.

        Returns:
            A matrix of the same class sharing ``data``, ``indices`` and
            ``indptr``, with the view cached.

        Example:
            >>> W = evjax.CSR.fromdense(dense).build_weight_indices()
            >>> W = jax.jit(lambda W, s, x: W.update_on_post(x, s, 0.0, 1.0))(W, post_spikes, pre_trace)
        """
        return self._make(self.data, self.indices, self.indptr, self.shape, self._other_view(), self.backend)

    def _other_view(self) -> tuple:
        """``(t_indices, t_indptr, perm)``: the cached view, or computed now (NumPy on a concrete structure)."""
        if self.other_view is not None:
            return self.other_view
        return transposed_view(self.indices, self.indptr, self._stored_shape[1])

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
        return self._with_weights(data, "with_data")

    def _with_weights(self, data, who: str):
        data, unit = (data, None) if isinstance(data, jax.Array) else units.split(data)  # brainunit: unit kept
        data = jnp.asarray(data)
        if not jnp.issubdtype(data.dtype, jnp.floating):
            raise TypeError(f"{who}: weights must be floating point, got {data.dtype}")
        data = data.reshape(1) if data.ndim == 0 else data
        if data.ndim != 1 or data.shape[0] not in (1, self.nnz):
            raise ValueError(f"{who}: data must have shape (1,) or (nnz,) = ({self.nnz},), got {data.shape}")
        return self._reweighted(data if unit is None else units.attach(data, unit))

    def _weights(self):
        return weights_of(self.data, self.nnz)

    def _plastic_weights(self, who: str):
        """The per-synapse weights an update moves; a homogeneous matrix has none (a clear error)."""
        if self.homogeneous:
            raise ValueError(f"{self._name}.{who}: this matrix has one weight shared by all synapses, so "
                             f"there are no per-synapse weights to update; give it per-synapse weights first: "
                             f"M.with_data(jnp.full(M.nnz, w))")
        return self.data

    # ------------------------------------------------------------ weights only
    def apply(self, fn: Callable):
        """A matrix of the same structure with weights ``fn(data)`` (``fn`` elementwise, float result).

        A homogeneous matrix stays homogeneous: ``fn`` sees its one weight.
        """
        return self._with_weights(fn(self.data), f"{self._name}.apply")

    def _scaled(self, other, op: Callable, symbol: str, reverse: bool = False):
        """``self (op) other`` (``other (op) self`` if ``reverse``) on the stored entries.

        ``other`` is a scalar, a dense matrix of the same shape (read at the
        stored positions) or a matrix of the same structure (the same
        ``indices`` and ``indptr`` arrays, as ``W.with_data(...)`` keeps).
        """
        who = f"{self._name} {symbol}"
        if isinstance(other, _Compressed):
            if type(other) is not type(self) or other.indices is not self.indices or \
                    other.indptr is not self.indptr or other.shape != self.shape:
                raise TypeError(f"{who}: two sparse matrices must share one structure (the same indices and "
                                f"indptr arrays, e.g. W and W.with_data(...)); convert one with .todense()")
            mine, theirs = self.data, other.data
            if mine.shape != theirs.shape:
                mine, theirs = self._weights(), other._weights()
        else:
            theirs = other if isinstance(other, jax.Array) else jnp.asarray(other)
            if theirs.size == 1:
                mine, theirs = self.data, theirs.reshape(())
            elif theirs.shape == self.shape:
                dense = theirs if self._row_major else theirs.T
                mine, theirs = self._weights(), dense_at_entries(dense, self.indices, self.indptr)
            else:
                raise ValueError(f"{who}: the other operand must be a scalar or a dense matrix of shape "
                                 f"{self.shape}, got shape {theirs.shape}")
        return self._with_weights(op(theirs, mine) if reverse else op(mine, theirs), who)

    def apply2(self, other, fn: Callable, *, reverse: bool = False):
        """``fn(self, other)`` (``fn(other, self)`` if ``reverse``), brainevent's binary form: ``+``
        and ``-`` (``operator.add``/``sub``) give the dense array, any other ``fn`` new weights of the
        same structure, as ``*`` does (``other`` a scalar, a dense matrix read at the stored entries, or
        a matrix of the same structure)."""
        return sparse_apply2(self, other, fn, reverse)

    # ------------------------------------------------------------- reductions
    def sum(self, axis=None) -> jax.Array:
        """Sum of the stored entries (duplicates included), in the weight dtype.

        Args:
            axis: ``None`` or ``(0, 1)`` (all entries, a scalar), ``0`` (sum
                over rows: ``(n_cols,)``) or ``1`` (``(n_rows,)``); negative
                axes count from the end.
        """
        axis = _normalize_axis(axis, f"{self._name}.sum")
        if axis is not None and not self._row_major:
            axis = 1 - axis  # the stored matrix is the transpose
        return axis_sums(self.data, self.indices, self.indptr, self._stored_shape, axis)

    # ------------------------------------------------------------ conversions
    def toarray(self) -> jax.Array:
        """The dense matrix (duplicates summed), as :meth:`todense`."""
        return self.todense()

    def tocoo(self):
        """The same matrix as a ``jax.experimental.sparse.BCOO`` (JAX's coordinate format).

        ``coo.data`` holds one weight per stored entry (a homogeneous weight
        is broadcast), ``coo.indices[:, 0]`` the rows and ``coo.indices[:, 1]``
        the columns, in storage order; duplicates are kept (``todense`` sums
        them).  It works under ``jit``, ``grad`` and ``vmap``.
        """
        from jax.experimental import sparse as jax_sparse

        rows = row_ids(self.indptr, self.nnz).astype(self.indices.dtype)
        coords = (rows, self.indices) if self._row_major else (self.indices, rows)
        return jax_sparse.BCOO((self._weights(), jnp.stack(coords, axis=1)), shape=self.shape)

    def solve(self, b, tol=1e-6, reorder=1):
        """``x`` with ``A @ x = b`` for this square matrix: ``jax.experimental.sparse.linalg.spsolve``
        (SciPy's sparse LU on CPU through a callback, cuSOLVER on GPU), differentiable in the weights
        and ``b``.  With units, ``x`` has ``b``'s unit over the weights'.

        Args:
            b: ``(n,)`` right-hand side.
            tol: the GPU solver's singularity tolerance (spsolve's).
            reorder: the GPU solver's fill-reducing ordering, 0-3 (spsolve's).

        Raises:
            ValueError: the matrix is not square, or ``b`` is not ``(n,)``.
        """
        from jax.experimental.sparse.linalg import spsolve

        who = f"{self._name}.solve"
        n = self.shape[0]
        if self.shape[1] != n:
            raise ValueError(f"{who}: the matrix must be square, got shape {self.shape}")
        rhs, unit_b = units.split(b)
        rhs = jnp.asarray(rhs)
        if rhs.shape != (n,):
            raise ValueError(f"{who}: b must have shape ({n},), got {rhs.shape}")
        rows = self.tocsr()  # (a CSC's arrays are its transpose's)
        weights, unit_a = units.split(rows._weights())
        x = spsolve(weights, rows.indices, rows.indptr, rhs.astype(weights.dtype), tol=tol, reorder=reorder)
        return units.attach(x, units.product(unit_b, None if unit_a is None else unit_a ** -1))

    # ------------------------------------------------------------- structure
    def diag_add(self, other):
        """``A + diag(other)``: a new matrix of the same class and shape.

        Args:
            other: a scalar or ``(min(n_rows, n_cols),)`` values (cast to the
                weight dtype).

        Diagonal entries missing from the pattern are inserted (so ``nnz``
        may grow) when the structure is concrete.  Under ``jax.jit`` with the
        matrix as an argument the structure is traced and cannot grow by a
        data-dependent amount: each row ``i < min(shape)`` then gets one entry
        ``(i, i)`` appended (``nnz + min(shape)`` entries; duplicates add up,
        so the matrix is the same).
        """
        who = f"{self._name}.diag_add"
        if isinstance(other, _Compressed):
            raise TypeError(f"{who}: expects diagonal values, not a sparse matrix")
        k = min(self.shape)
        diag = jnp.asarray(other)
        if not (jnp.issubdtype(diag.dtype, jnp.floating) or jnp.issubdtype(diag.dtype, jnp.integer)):
            raise TypeError(f"{who}: diagonal values must be real numbers, got {diag.dtype}")
        diag = jnp.broadcast_to(diag, (k,)) if diag.ndim == 0 else diag
        if diag.shape != (k,):
            raise ValueError(f"{who}: expected a scalar or min(shape) = {k} values, got shape {diag.shape}")
        parts = add_diagonal(self.data, self.indices, self.indptr, self._stored_shape, diag)
        return self._make(*parts, self.shape, backend=self.backend)

    def slice_rows(self, index):
        """Rows ``W[index, :]`` as a new matrix of the same class, shape ``(n_selected, n_cols)``.

        Args:
            index: an int (one row), a slice, a sequence or array of ints
                (repeats allowed) or a bool mask of length ``n_rows``; concrete.

        The size of the result depends on the structure's values, so the
        structure must be concrete: call it outside ``jax.jit``, or close over
        the matrix instead of passing it in.  The weights may be traced.
        """
        who = f"{self._name}.slice_rows"
        if not is_concrete(self.indices, self.indptr):
            raise TypeError(f"{who}: the structure (indices, indptr) is traced, as when the matrix is an "
                            f"argument of jax.jit, and the result's size depends on its values; call "
                            f"slice_rows outside jit, or close over the matrix instead of passing it in")
        rows = normalize_row_index(index, self.shape[0], who)
        columns_of = None if self._row_major else self._stored_shape
        parts = select_rows(self.data, self.indices, self.indptr, rows, rows_are_columns_of=columns_of)
        return self._make(*parts, (rows.size, self.shape[1]), backend=self.backend)

    def __getitem__(self, index) -> jax.Array:
        """Rows ``W[index]`` (or ``W[index, :]``) as a dense array, like brainevent's.

        Args:
            index: an int (one row: shape ``(n_cols,)``), a slice, a sequence
                or array of ints (repeats allowed; shape ``(k, n_cols)``) or a
                concrete bool mask of length ``n_rows``.  Ints may be traced.

        Returns:
            A dense ``jax.Array``; for the rows as a sparse matrix use
            :meth:`slice_rows`.  Works under ``jax.jit`` with a traced
            structure (see :func:`evjax.csr_slice_rows`).

        Raises:
            IndexError: a concrete row out of range, or a column index other than ``:``.

        Example:
            >>> W = evjax.CSR.fromdense(np.array([[1.0, 0.0], [2.0, 3.0]], np.float32))
            >>> W[1]
            Array([2., 3.], dtype=float32)
        """
        who = f"{self._name}.__getitem__"
        if isinstance(index, tuple):
            if len(index) != 2 or not (isinstance(index[1], slice) and index[1] == slice(None)):
                raise IndexError(f"{who}: only rows can be selected (W[rows] or W[rows, :]), got {index!r}")
            index = index[0]
        rows, single = selected_rows(index, self.shape[0], who)
        ids = row_ids(self.indptr, self.nnz)
        # a CSC stores A.T as CSR: stored entry k sits at row indices[k] and column r_k of A
        entry_rows, entry_cols = (ids, self.indices) if self._row_major else (self.indices, ids)
        out = dense_rows(self._weights(), entry_rows, entry_cols, rows, self.shape)
        return out[0] if single else out

    def __array__(self, dtype=None, copy=None):
        # np.asarray(W) and jnp.asarray(W) (which falls back to NumPy's protocol) land here.
        # No __jax_array__: JAX's operators call it on the other operand, and `x @ W` with
        # a jax.Array x must defer to __rmatmul__ instead.
        raise TypeError(
            f"{type(self).__name__} is a sparse matrix and does not convert implicitly to a dense array; "
            f"call .todense() for a dense jax.Array (or .to_scipy() for a SciPy matrix)"
        )

    def _dense_stored(self):
        m, n = self._stored_shape
        rows = row_ids(self.indptr, self.nnz)
        data, unit = units.split(self.data)
        weights = weights_of(data, self.nnz)
        return units.attach(jnp.zeros((m, n), weights.dtype).at[rows, self.indices].add(weights, mode="drop"), unit)

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
        data: ``(data, indices, indptr)``, or ``data`` followed by ``indices``
            and ``indptr`` as separate arguments.
        shape: ``(n_rows, n_cols)``, as a keyword or after the arrays.
        indptr_dtype: ``"auto"``, ``jnp.int32`` or ``jnp.int64``: the dtype of
            ``indptr``, which counts synapses; int64 (needed beyond ``2**31 - 1``
            synapses, and chosen by ``"auto"`` there) needs JAX's 64-bit mode.
        backend: the backend its ops ask for (``"numba"``, ``"warp"``,
            ``"numba_cuda"``, ``"reference"``; default: see :mod:`evjax.config`),
            kept by ``with_data``, ``T`` and the other methods; a ``backend=``
            of a call (``delay_deliver``) wins.

    ``data`` is a scalar or ``(1,)`` (one weight for all synapses) or ``(nnz,)``;
    ``indices`` (int32/int64) are the columns of each row's synapses; duplicate
    columns in a row are summed.  Concrete arrays are validated before any
    conversion (see :mod:`evjax.primitives.csr.validation`).

    Example:
        >>> W = CSR((data, indices, indptr), shape=(n_pre, n_post))
        >>> I = BinaryArray(spikes) @ W      # event-driven, (n_post,)
    """

    _row_major = True  # the stored CSR is this matrix

    def _validated(self, data, indices, indptr, shape, indptr_dtype) -> tuple:
        return validate_csr(data, indices, indptr, shape, who=type(self).__name__, indptr_dtype=indptr_dtype)

    @property
    def _stored_shape(self) -> tuple:
        return self.shape

    @property
    def T(self) -> "CSC":
        """The transpose, as a view (no copy): a :class:`CSC` sharing the arrays."""
        return CSC._make(self.data, self.indices, self.indptr, self.shape[::-1], self.other_view, self.backend)

    def todense(self) -> jax.Array:
        """The dense matrix (duplicates summed)."""
        return self._dense_stored()

    def tocsr(self) -> "CSR":
        """This matrix (already row-compressed)."""
        return self

    def tocsc(self) -> "CSC":
        """The same matrix stored column-major: a :class:`CSC` of the same shape (entries re-sorted)."""
        return CSC._make(*transpose_structure(self.data, self.indices, self.indptr, self.shape), self.shape,
                         backend=self.backend)

    # ------------------------------------------------------------ plasticity
    def update_on_pre(self, pre_spike, post_trace, w_min=None, w_max=None) -> "CSR":
        """This matrix after presynaptic spikes: ``W[i, j] = clip(W[i, j] + post_trace[j])`` on the rows that fired.

        :func:`evjax.update_csr_on_binary_pre` on this matrix's arrays: only the
        synapses of active rows are visited; the structure is kept.

        Args:
            pre_spike: ``(n_pre,)`` bool, or numbers where nonzero is a spike.
            post_trace: ``(n_post,)`` float trace.
            w_min, w_max: bounds for updated weights (scalars), or None.

        Returns:
            A :class:`CSR` of the same structure with the new weights.

        Raises:
            ValueError: the matrix is homogeneous (no per-synapse weights), or
                an argument of the wrong shape (named).

        Example:
            >>> W = W.update_on_pre(pre_spikes, post_trace, w_min=0.0, w_max=1.0)
        """
        data = update_csr_on_binary_pre(self._plastic_weights("update_on_pre"), self.indices, self.indptr,
                                        pre_spike, post_trace, w_min, w_max, shape=self.shape, backend=self.backend)
        return self._reweighted(data)

    def update_on_post(self, pre_trace, post_spike, w_min=None, w_max=None) -> "CSR":
        """This matrix after postsynaptic spikes: ``W[i, j] = clip(W[i, j] + pre_trace[i])`` on the columns that fired.

        :func:`evjax.update_csr_on_binary_post` on the column view of this
        matrix (its CSC structure and the CSR position of each entry): only
        the synapses of active columns are visited.  The view is cached by
        :meth:`build_weight_indices` (computed once, carried as data);
        without it, one stable sort of the structure per call: NumPy at trace
        time when the structure is concrete (a jitted step that closes over
        the matrix), ``jax.numpy`` when it is traced.

        Args:
            pre_trace: ``(n_pre,)`` float trace.
            post_spike: ``(n_post,)`` bool, or numbers where nonzero is a spike.
            w_min, w_max: bounds for updated weights (scalars), or None.

        Returns:
            A :class:`CSR` of the same structure with the new weights.

        Raises:
            ValueError: as :meth:`update_on_pre`.

        Example:
            >>> W = W.update_on_post(pre_trace, post_spikes, w_min=0.0, w_max=1.0)
        """
        weight = self._plastic_weights("update_on_post")
        csc_indices, csc_indptr, positions = self._other_view()
        data = update_csr_on_binary_post(weight, csc_indices, csc_indptr, positions, pre_trace, post_spike, w_min,
                                         w_max, shape=self.shape, backend=self.backend)
        return self._reweighted(data)

    def apply_on_pre(self, rule, pre_spike, *, edge_state=None, pre_vals=None, post_vals=None, params=None):
        """:func:`evjax.csr_apply_on_pre` on this matrix's structure.

        Args:
            rule: ``rule(edge, pre, post, params) -> new_edge``, on one synapse.
            pre_spike: ``(n_pre,)`` bool, or numbers where nonzero is a spike.
            edge_state: per-synapse pytree in CSR order; None: this matrix's
                weights (per-synapse).
            pre_vals, post_vals: per-neuron pytrees, or None.
            params: passed to the rule as is.

        Returns:
            The new edge state (a pytree like ``edge_state``; the new weights
            array when ``edge_state`` is None).

        Raises:
            TypeError, ValueError: as :func:`evjax.csr_apply_on_pre`.

        Example:
            >>> new_w = W.apply_on_pre(lambda w, pre, post, lr: w + lr * post, spikes, post_vals=trace, params=0.01)
        """
        state = self._plastic_weights("apply_on_pre") if edge_state is None else edge_state
        return csr_apply_on_pre(rule, state, self.indices, self.indptr, pre_spike, pre_vals=pre_vals,
                                post_vals=post_vals, params=params, shape=self.shape)

    def apply_on_post(self, rule, post_spike, *, edge_state=None, pre_vals=None, post_vals=None, params=None):
        """:func:`evjax.csr_apply_on_post` on this matrix's structure.

        Args:
            rule: ``rule(edge, pre, post, params) -> new_edge``, on one synapse.
            post_spike: ``(n_post,)`` bool, or numbers where nonzero is a spike.
            edge_state: per-synapse pytree in CSR order; None: this matrix's weights.
            pre_vals, post_vals: per-neuron pytrees, or None.
            params: passed to the rule as is.

        Returns:
            The new edge state (the new weights array when ``edge_state`` is None).

        Raises:
            TypeError, ValueError: as :func:`evjax.csr_apply_on_post`.

        Example:
            >>> new_w = W.apply_on_post(lambda w, pre, post, lr: w + lr * pre, spikes, pre_vals=trace, params=0.01)
        """
        state = self._plastic_weights("apply_on_post") if edge_state is None else edge_state
        return csr_apply_on_post(rule, state, self.indices, self.indptr, post_spike, pre_vals=pre_vals,
                                 post_vals=post_vals, params=params, shape=self.shape)

    # ------------------------------------------------------------ delays
    def delay_deliver(self, ring, events, delays, t, *, weighted=None, backend: str | None = None):
        """Deliver events through this matrix with per-synapse delays: :func:`evjax.csr_delay_deliver`.

        ``ring_new[(t + delays[e]) % L, indices[e]] += data[e] * f(events)[row(e)]`` for the
        synapses of the rows whose event is set (``f``: 1, or the event's value when weighted).

        Args:
            ring: ``(L, n_post)`` float arrival ring.
            events: ``(n_pre,)`` events (bool, numbers, ``BinaryArray`` or ``WeightedArray``).
            delays: integer delays in steps, ``(nnz,)`` in this matrix's order, or a scalar.
            t: the current integer step (may be traced).
            weighted: as in :func:`evjax.csr_delay_deliver`.
            backend: as in :func:`evjax.csr_delay_deliver`.

        Returns:
            The new ring, ``ring``'s shape and dtype.

        Raises:
            TypeError, ValueError: as :func:`evjax.csr_delay_deliver`.

        Example:
            >>> ring = W.delay_deliver(ring, spikes, delays, t)
        """
        return csr_delay_deliver(ring, events, self.data, self.indices, self.indptr, delays, t, shape=self.shape,
                                 weighted=weighted, backend=self.backend if backend is None else backend)

    def delay_layout(self, delays, n_slots: int) -> CSRDelayLayout:
        """This matrix's synapses grouped by delay: :meth:`evjax.CSRDelayLayout.build`.

        Args:
            delays: concrete integer delays, ``(nnz,)`` in this matrix's order, or a scalar.
            n_slots: the ring length ``L``.

        Returns:
            A :class:`evjax.CSRDelayLayout` holding this matrix's weights in layout order.

        Raises:
            ValueError: as :meth:`evjax.CSRDelayLayout.build`.

        Example:
            >>> layout = W.delay_layout(delays, n_slots=32)
            >>> ring = evjax.csr_delay_deliver_layout(ring, spikes, layout, t)
        """
        return CSRDelayLayout.build(self.data, self.indices, self.indptr, delays, n_slots=n_slots, shape=self.shape)

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
    def fromdense(cls, dense, *, nse: int | None = None, index_dtype=np.int32, indptr_dtype="auto",
                  backend: str | None = None, precompute_weight_indices: bool = False) -> "CSR":
        """From a dense (concrete) matrix, keeping its nonzero entries.

        Args:
            dense: a 2-d array (a brainunit quantity: the weights keep its unit).
            nse: brainevent's count of stored entries; if given it must equal
                the number of nonzero entries (evjax stores exactly those).
            index_dtype: the dtype of ``indices`` and, with
                ``indptr_dtype="auto"``, of ``indptr`` unless nnz needs int64.
            indptr_dtype: as in :class:`CSR`.
            backend: as in :class:`CSR`.
            precompute_weight_indices: also cache the other view of the
                structure (:meth:`build_weight_indices`), for the plasticity
                updates that need it.

        Raises:
            ValueError: ``dense`` is not 2-d, or ``nse`` is not its number of
                nonzero entries.
        """
        import scipy.sparse as sp

        dense, unit = units.split(dense)
        dense = np.asarray(dense)
        if dense.ndim != 2:
            raise ValueError(f"fromdense: expected a matrix, got shape {dense.shape}")
        if dense.dtype in LOW_PRECISION:
            m = sp.csr_matrix(dense.astype(np.float32))
            data = m.data.astype(dense.dtype)
        else:
            m = sp.csr_matrix(dense)
            data = m.data
        if nse is not None and int(nse) != m.nnz:
            raise ValueError(f"{cls.__name__}.fromdense: nse = {nse} but the matrix has {m.nnz} nonzero entries; "
                             f"leave nse out (evjax stores exactly the nonzero entries)")
        matrix = cls._from_scipy_parts(data, m, index_dtype, indptr_dtype, backend)
        matrix = matrix if unit is None else matrix._reweighted(units.attach(matrix.data, unit))
        return matrix.build_weight_indices() if precompute_weight_indices else matrix

    from_dense = fromdense


@_register_pytree
class CSC(_Compressed):
    """A compressed-sparse-column matrix; ``CSR.T`` returns one without copying.

    The arrays of a CSC matrix of shape ``(n_rows, n_cols)`` are those of the
    CSR matrix of its transpose: ``indptr`` has ``n_cols + 1`` entries and
    ``indices`` are row indices.

    Args:
        data: ``(data, indices, indptr)`` or three arguments.
        shape: ``(n_rows, n_cols)``, as a keyword or after the arrays.

    Example:
        >>> Wc = evjax.CSC.fromdense(dense)      # or W.T for a CSR W
        >>> current = spikes @ Wc                # event-driven in either layout
    """

    _row_major = False  # the stored CSR is the transpose

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
        return CSR._make(self.data, self.indices, self.indptr, self.shape[::-1], self.other_view, self.backend)

    def todense(self) -> jax.Array:
        """The dense matrix (duplicates summed)."""
        return self._dense_stored().T

    def tocsc(self) -> "CSC":
        """This matrix (already column-compressed)."""
        return self

    def tocsr(self) -> CSR:
        """The same matrix stored row-major: a :class:`CSR` of the same shape (entries re-sorted)."""
        stored = (self.data, self.indices, self.indptr, self._stored_shape)
        return CSR._make(*transpose_structure(*stored), self.shape, backend=self.backend)

    # ------------------------------------------------------------ plasticity
    def update_on_pre(self, pre_spike, post_trace, w_min=None, w_max=None) -> "CSC":
        """This matrix after presynaptic spikes: ``W[i, j] = clip(W[i, j] + post_trace[j])`` on the rows that fired.

        :func:`evjax.update_csc_on_binary_pre` on this matrix's arrays: the
        synapses of active rows only, through the row view of the structure,
        cached by :meth:`build_weight_indices` or computed per call (see
        :meth:`CSR.update_on_post`).

        Args:
            pre_spike: ``(n_pre,)`` bool, or numbers where nonzero is a spike.
            post_trace: ``(n_post,)`` float trace.
            w_min, w_max: bounds for updated weights (scalars), or None.

        Returns:
            A :class:`CSC` of the same structure with the new weights.

        Raises:
            ValueError: the matrix is homogeneous, or an argument of the wrong shape (named).

        Example:
            >>> Wc = Wc.update_on_pre(pre_spikes, post_trace, w_min=0.0, w_max=1.0)
        """
        row_indices, row_indptr, positions = self._other_view()
        data = update_on_row_view(self._plastic_weights("update_on_pre"), row_indices, row_indptr, positions,
                                  pre_spike, post_trace, w_min, w_max, shape=self.shape, backend=self.backend,
                                  who="CSC.update_on_pre")
        return self._reweighted(data)

    def update_on_post(self, pre_trace, post_spike, w_min=None, w_max=None) -> "CSC":
        """This matrix after postsynaptic spikes: ``W[i, j] = clip(W[i, j] + pre_trace[i])`` on the columns that fired.

        :func:`evjax.update_csc_on_binary_post` on this matrix's arrays: only
        the synapses of active columns are visited.

        Args:
            pre_trace: ``(n_pre,)`` float trace.
            post_spike: ``(n_post,)`` bool, or numbers where nonzero is a spike.
            w_min, w_max: bounds for updated weights (scalars), or None.

        Returns:
            A :class:`CSC` of the same structure with the new weights.

        Raises:
            ValueError: as :meth:`update_on_pre`.

        Example:
            >>> Wc = Wc.update_on_post(pre_trace, post_spikes, w_min=0.0, w_max=1.0)
        """
        data = update_csc_on_binary_post(self._plastic_weights("update_on_post"), self.indices, self.indptr,
                                         pre_trace, post_spike, w_min, w_max, shape=self.shape,
                                         backend=self.backend)
        return self._reweighted(data)

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

    @classmethod
    def fromdense(cls, dense, *, nse: int | None = None, index_dtype=np.int32, indptr_dtype="auto",
                  backend: str | None = None, precompute_weight_indices: bool = False) -> "CSC":
        """From a dense (concrete) matrix, keeping its nonzero entries (arguments as in :meth:`CSR.fromdense`)."""
        if np.ndim(dense) != 2:
            raise ValueError(f"fromdense: expected a matrix, got shape {np.shape(dense)}")
        return CSR.fromdense(dense.T, nse=nse, index_dtype=index_dtype, indptr_dtype=indptr_dtype, backend=backend,
                             precompute_weight_indices=precompute_weight_indices).T

    from_dense = fromdense

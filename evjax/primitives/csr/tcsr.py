"""``TCSR``: brainevent's row-sorted CSR matrix whose transpose is a CSR view of its own.

brainevent 0.3.0's ``TCSR`` stores a row-sorted CSR in tiles for its GPU
kernels.  evjax's kernels need no tiles (they split their work at run time),
so evjax's ``TCSR`` holds a plain :class:`evjax.CSR` (the canonical storage)
and keeps what a brainevent user's code relies on:

* ``W.T`` is a ``TCSR`` too, an O(1) view whose ``data``, ``indices`` and
  ``indptr`` are the CSR of the transposed matrix ("the mirror": computed
  once, on the first call that needs it, and carried by the pytree);
  ``with_data`` takes values in the current view's order;
* products run the CSR ops: float operands on ``backend``, events on
  ``binary_backend``;
* ``backward_algorithm="pp_prop"``: with a float ``BinaryArray``, the
  weight gradient is the event values times the cotangent (brainevent's
  eligibility rule), while the forward still counts each nonzero event once;
  ``"bptt"`` (the default) is the true gradient of the forward.

==================  =========================================
expression          runs
==================  =========================================
``W @ x``           ``CSR @ x`` on the canonical storage
``x @ W``           ``x @ CSR``
``W.T @ x``         ``CSC @ x`` (the same arrays, transposed)
``x @ W.T``         ``x @ CSC``
==================  =========================================

So ``s @ W`` is event-driven (only the rows of active events are visited);
``s @ W.T`` gathers over every stored row, as for a :class:`evjax.CSC`.
"""
from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from ... import units
from ..._event_values import EventValues
from ..._validation import is_concrete
from ...data_representation import DataRepresentation, WeightArithmetic, sparse_apply2
from ...errors import UnsupportedOperationError
from .convert import _gather_data
from .matrix import CSC, CSR, _matmul, checked_backend
from .products import csrmv_dt2t

__all__ = ["TCSR"]

BACKWARD_ALGORITHMS = ("bptt", "pp_prop")


def _check_backward_algorithm(value) -> str:
    if not (isinstance(value, str) and value in BACKWARD_ALGORITHMS):
        raise ValueError(f"TCSR: backward_algorithm must be 'bptt' (the true gradient) or 'pp_prop' (the weight "
                         f"gradient weighted by float event values), got {value!r}")
    return value


def _owned(matrix):
    """``matrix``, a CSR or CSC made for one call of a ``TCSR`` method, its errors naming ``TCSR``."""
    matrix._owner = "TCSR"
    return matrix


def _owned_copy(matrix):
    """:func:`_owned` on a copy of ``matrix``, which may be a ``TCSR``'s storage (as ``tocsr`` may return)."""
    return _owned(matrix._reweighted(matrix.data))


# ---------------------------------------------------------------------------
# pp_prop: the forward of the binary op, the weights' linearisation of the graded one
# ---------------------------------------------------------------------------
class _Spikes(EventValues):
    weighted = False


class _Graded(EventValues):
    weighted = True


def _stored_view(data, indices, indptr, how):
    view_class, view_shape, _, backend = how
    return view_class._make(data, indices, indptr, view_shape, backend=backend)


@functools.partial(jax.custom_jvp, nondiff_argnums=(4,))
def _eligibility_product(data, indices, indptr, events, how):
    # how = (CSR or CSC, the view's shape, sparse_on_left, backend): y = A 1[e != 0] (the binary op)
    return _matmul(_stored_view(data, indices, indptr, how), _Spikes(events), sparse_on_left=how[2])


def _eligibility_product_jvp(how, primals, tangents):
    # y = A 1[e != 0].  pp_prop linearises the weights with the event values (not the derivative of y):
    #   dy = A(dw) e        (graded: a zero event selects, so inactive events contribute nothing)
    # and the events straight-through, as the binary op does:  dy = A de.
    data, indices, indptr, events = primals
    d_data, _, _, d_events = tangents
    sparse_on_left = how[2]
    y = _eligibility_product(data, indices, indptr, events, how)
    dy = jnp.zeros_like(y)
    if not isinstance(d_data, SymbolicZero):
        dy = dy + _matmul(_stored_view(d_data, indices, indptr, how), _Graded(events),
                          sparse_on_left=sparse_on_left).astype(y.dtype)
    if not isinstance(d_events, SymbolicZero):
        dy = dy + _matmul(_stored_view(data, indices, indptr, how), d_events.astype(y.dtype),
                          sparse_on_left=sparse_on_left)
    return y, dy


_eligibility_product.defjvp(_eligibility_product_jvp, symbolic_zeros=True)


# ---------------------------------------------------------------------------
# TCSR
# ---------------------------------------------------------------------------
@jax.tree_util.register_pytree_node_class
class TCSR(WeightArithmetic, DataRepresentation):
    """A row-sorted CSR matrix with a CSR transposed view (brainevent's ``TCSR``).

    Args:
        source: an :class:`evjax.CSR` whose columns are nondecreasing within
            each row (trusted, as brainevent's constructor does; use
            :meth:`fromcsr` to sort one).  Its arrays are the canonical storage.
        backend: the backend of the float products (``W @ x`` with a float
            ``x``), ``solve`` and ``dt2t``; ``None``: the platform's default.
        binary_backend: the backend of the event products (``BinaryArray``,
            ``WeightedArray``, bool arrays); ``None``: the platform's default.
        backward_algorithm: ``"bptt"`` (default): the true gradient.
            ``"pp_prop"``: with a float ``BinaryArray``, the weight gradient is
            ``e_i * y_bar_j`` on the synapses of the nonzero events ``e_i``
            (the forward still counts each nonzero event as 1).

    Raises:
        TypeError: ``source`` is not an ``evjax.CSR``, or a backend is not a name.
        ValueError: an unknown ``backward_algorithm``.

    Example:
        >>> W = evjax.TCSR.fromdense(np.array([[1.0, 0.0], [2.0, 3.0]], np.float32))
        >>> W.T.data                      # the transposed view's CSR order
        Array([1., 2., 3.], dtype=float32)
        >>> evjax.BinaryArray(jnp.array([True, False])) @ W
        Array([1., 0.], dtype=float32)
    """

    __array_ufunc__ = None  # numpy defers ``ndarray @ W`` to __rmatmul__
    takes_events = True  # ``BinaryArray @ W`` runs the event ops (see evjax.events)

    def __init__(self, source, *, backend: str | None = None, binary_backend: str | None = None,
                 backward_algorithm: str = "bptt"):
        if type(source) is not CSR:
            raise TypeError(f"TCSR: source must be an evjax.CSR (sorted within rows), got {type(source).__name__}; "
                            f"build it with TCSR.fromcsr(evjax.CSR(...)), TCSR.fromcsc(...) or TCSR.fromdense(...)")
        self.binary_backend = checked_backend(binary_backend, "TCSR", "binary_backend")
        self.backward_algorithm = _check_backward_algorithm(backward_algorithm)
        self._base = CSR._make(source.data, source.indices, source.indptr, source.shape, source.other_view,
                               checked_backend(backend, "TCSR"))
        self._transposed = False

    # ------------------------------------------------------------------ pytree
    def tree_flatten(self):
        return (self._base,), (self._transposed, self.binary_backend, self.backward_algorithm)

    @classmethod
    def tree_unflatten(cls, aux, children):
        obj = object.__new__(cls)
        obj._base, = children
        obj._transposed, obj.binary_backend, obj.backward_algorithm = aux
        return obj

    def _with_base(self, base: CSR, transposed: bool | None = None) -> "TCSR":
        """This view (``transposed`` given: that one) over the canonical storage ``base``."""
        aux = (self._transposed if transposed is None else transposed, self.binary_backend, self.backward_algorithm)
        return self.tree_unflatten(aux, (base,))

    # -------------------------------------------------------------- factories
    @classmethod
    def from_sorted_csr(cls, source, **kwargs) -> "TCSR":
        """``TCSR(source, **kwargs)``: ``source`` is trusted to be sorted within rows."""
        return cls(source, **kwargs)

    @classmethod
    def fromcsr(cls, source, **kwargs) -> "TCSR":
        """A ``TCSR`` of ``source`` with each row's entries stably sorted by column (the weights follow).

        Args:
            source: an :class:`evjax.CSR` (concrete or traced structure).
            **kwargs: ``backend``, ``binary_backend``, ``backward_algorithm``.
        """
        if type(source) is not CSR:
            raise TypeError(f"TCSR.fromcsr: source must be an evjax.CSR, got {type(source).__name__} "
                            f"(a CSC: TCSR.fromcsc)")
        return cls(source.tocsc().tocsr(), **kwargs)  # (two stable transposes: rows by column, ties in order)

    @classmethod
    def fromcsc(cls, source, **kwargs) -> "TCSR":
        """A ``TCSR`` of the matrix of an :class:`evjax.CSC` (converted to row-major, rows sorted)."""
        if type(source) is not CSC:
            raise TypeError(f"TCSR.fromcsc: source must be an evjax.CSC, got {type(source).__name__}")
        return cls.fromcsr(source.tocsr(), **kwargs)

    @classmethod
    def fromdense(cls, source, *, nse: int | None = None, index_dtype=jnp.int32, **kwargs) -> "TCSR":
        """A ``TCSR`` of the nonzero entries of a dense matrix (as :meth:`evjax.CSR.fromdense`).

        Args:
            source: a dense 2-D array (a ``brainunit`` quantity keeps its unit).
            nse: the number of nonzero entries, checked if given.
            index_dtype: the dtype of ``indices``.
            **kwargs: ``backend``, ``binary_backend``, ``backward_algorithm``.
        """
        return cls(CSR.fromdense(source, nse=nse, index_dtype=index_dtype), **kwargs)

    # ------------------------------------------------------------ the storage
    @property
    def backend(self) -> str | None:
        """The backend of the float products (``None``: the platform's default)."""
        return self._base.backend

    @property
    def shape(self) -> tuple:
        return self._base.shape[::-1] if self._transposed else self._base.shape

    @property
    def nse(self) -> int:
        """Number of stored entries (synapses)."""
        return self._base.nnz

    nnz = nse

    @property
    def dtype(self):
        return self._base.dtype

    @property
    def ndim(self) -> int:
        return 2

    @property
    def homogeneous(self) -> bool:
        """Whether all synapses share one weight."""
        return self._base.homogeneous

    @property
    def has_tcsc_mirror(self) -> bool:
        """Whether the transposed structure (the mirror) is computed and carried."""
        return self._base.other_view is not None

    def _mirror(self) -> tuple:
        """``(t_indices, t_indptr, perm)``: the CSR of the canonical matrix's transpose, and where each of
        its entries sits in the canonical storage (:meth:`evjax.CSR.build_weight_indices`'s view); kept on
        this object when the structure is concrete."""
        base = self._base if self.has_tcsc_mirror else self._base.build_weight_indices()
        if is_concrete(base.indices, base.indptr):
            self._base = base
        return base.other_view

    def materialize_tcsc_mirror(self) -> "TCSR":
        """This matrix with its mirror computed now (it is then a pytree child, carried through ``jit``)."""
        if self.has_tcsc_mirror or is_concrete(self._base.indices, self._base.indptr):
            self._mirror()
            return self
        return self._with_base(self._base.build_weight_indices())  # a traced structure: a new object carries it

    def _mirror_arrays(self) -> tuple:
        """``(data, indices, indptr)`` of the CSR of the canonical matrix's transpose (one shared weight
        stays one)."""
        t_indices, t_indptr, perm = self._mirror()
        return _gather_data(self._base.data, perm), t_indices, t_indptr

    def _view_data(self):
        """The weights in the current view's order."""
        return self._mirror_arrays()[0] if self._transposed else self._base.data

    @property
    def data(self):
        """The weights in the current view's CSR order (``W.T.data``: the transpose's)."""
        return self._view_data()

    @property
    def indices(self):
        """The current view's column of each entry."""
        return self._mirror()[0] if self._transposed else self._base.indices

    @property
    def indptr(self):
        """The current view's row pointers."""
        return self._mirror()[1] if self._transposed else self._base.indptr

    def _view(self, backend: str | None):
        """The current view as an :class:`evjax.CSR` (or :class:`evjax.CSC` over the same arrays), made for
        one call of a method: its errors name ``TCSR``."""
        b = self._base
        cls, shape = (CSC, b.shape[::-1]) if self._transposed else (CSR, b.shape)
        return _owned(cls._make(b.data, b.indices, b.indptr, shape, b.other_view, backend))

    # ------------------------------------------------------------ conversions
    def tocsr(self) -> CSR:
        """The current view as an :class:`evjax.CSR` (a transposed view: the mirror's arrays)."""
        if not self._transposed:
            return self._base
        return CSR._make(*self._mirror_arrays(), self.shape, backend=self.backend)

    def tocsc(self) -> CSC:
        """The current view as an :class:`evjax.CSC`."""
        if self._transposed:  # the stored arrays are the view's CSC
            b = self._base
            return CSC._make(b.data, b.indices, b.indptr, self.shape, b.other_view, self.backend)
        return CSC._make(*self._mirror_arrays(), self.shape, backend=self.backend)

    def todense(self) -> jax.Array:
        """The dense matrix of the current view (duplicates summed)."""
        return self._view(self.backend).todense()

    def toarray(self) -> jax.Array:
        return self.todense()

    def tocoo(self):
        """The current view as a ``jax.experimental.sparse.BCOO`` (see :meth:`evjax.CSR.tocoo`)."""
        return self._view(self.backend).tocoo()

    @property
    def T(self) -> "TCSR":
        """The transpose: a ``TCSR`` view of the same storage (and mirror)."""
        return self._with_base(self._base, not self._transposed)

    # --------------------------------------------------------------- weights
    def with_data(self, data) -> "TCSR":
        """The same view with new weights, given in this view's order (``W.T.with_data(v)``: ``v`` in
        ``W.T.data``'s order); shape ``(1,)``/scalar or ``(nse,)``, float."""
        new = self._base._with_weights(data, "TCSR.with_data").data
        if self._transposed and new.shape[0] != 1:
            numbers, unit = units.split(new)
            new = units.attach(numbers[self._canonical_positions()], unit)
        return self._with_base(self._base._reweighted(new))

    def _canonical_positions(self):
        """Where each canonical entry sits in the transposed view's order (the mirror's inverse
        permutation): a gather, which XLA runs several times faster than the scatter by ``perm`` on CPU
        (1 ms for 320,000 entries); computed with NumPy at trace time when the structure is concrete."""
        perm = self._mirror()[2]
        if is_concrete(perm):
            order = np.asarray(perm)
            inverse = np.empty_like(order)
            inverse[order] = np.arange(order.size, dtype=order.dtype)
            with jax.ensure_compile_time_eval():
                return jnp.asarray(inverse)
        return jnp.zeros_like(perm).at[perm].set(jnp.arange(perm.shape[0], dtype=perm.dtype))

    def apply(self, fn: Callable) -> "TCSR":
        """The same view with weights ``fn(data)`` (``fn`` elementwise, float result)."""
        return self._with_base(self._base._with_weights(fn(self._base.data), "TCSR.apply"))

    def _scaled(self, other, op: Callable, symbol: str, reverse: bool = False):
        """``*`` and ``/`` with a scalar, a dense matrix of this view's shape, or a ``TCSR`` of the same
        storage and orientation: new weights of the same structure."""
        if isinstance(other, TCSR):
            if other._transposed != self._transposed:
                raise TypeError(f"TCSR {symbol}: the two matrices must have the same orientation (both W or "
                                f"both W.T)")
            other = other._base
        elif self._transposed and np.ndim(other) == 2:
            other = (other if isinstance(other, jax.Array) else jnp.asarray(other)).T
        return self._with_base(_owned_copy(self._base)._scaled(other, op, symbol, reverse))

    def apply2(self, other, fn: Callable, *, reverse: bool = False):
        """``fn(self, other)`` (``fn(other, self)`` if ``reverse``): ``+`` and ``-`` give the dense array,
        any other ``fn`` new weights of the same structure (as ``*``)."""
        return sparse_apply2(self, other, fn, reverse)

    def sum(self, axis=None) -> jax.Array:
        """Sum of the stored entries (``axis`` as :meth:`evjax.CSR.sum`)."""
        return self._view(self.backend).sum(axis)

    # ------------------------------------------------------------------ rows
    def __getitem__(self, index) -> jax.Array:
        """Rows of the current view as a dense array (see :meth:`evjax.CSR.__getitem__`)."""
        return self._view(self.backend)[index]

    def slice_rows(self, index) -> "TCSR":
        """Rows of the current view as a new (untransposed) ``TCSR``; the structure must be concrete."""
        rows = _owned_copy(self.tocsr()).slice_rows(index)
        return type(self)(rows, backend=self.backend, binary_backend=self.binary_backend,
                          backward_algorithm=self.backward_algorithm)

    # -------------------------------------------------------------- products
    def _product(self, other, sparse_on_left: bool):
        if isinstance(other, DataRepresentation):
            raise UnsupportedOperationError("sparse @ sparse is not supported; convert one side with .todense()")
        events = isinstance(other, EventValues) or getattr(other, "dtype", None) == jnp.bool_
        view = self._view(self.binary_backend if events else self.backend)
        if (self.backward_algorithm == "pp_prop" and isinstance(other, EventValues) and not type(other).weighted
                and not other.lists_rows and jnp.issubdtype(other.dtype, jnp.floating)):
            return self._eligibility(view, other.value, sparse_on_left)
        return _matmul(view, other, sparse_on_left=sparse_on_left)

    def _eligibility(self, view, events, sparse_on_left: bool):
        """``pp_prop``'s product with float spikes (see :func:`_eligibility_product_jvp`)."""
        numbers, unit = units.split(view.data)
        how = (type(view), view.shape, sparse_on_left, view.backend)
        return units.attach(_eligibility_product(numbers, view.indices, view.indptr, events, how), unit)

    def __matmul__(self, other):
        return self._product(other, True)

    def __rmatmul__(self, other):
        return self._product(other, False)

    def dt2t(self, y_dim_arr, w_dim_arr):
        """``w[e] * y[row_e]`` for each entry ``e`` of the current view, in its order
        (:func:`evjax.csrmv_dt2t` on :meth:`tocsr`'s structure)."""
        view = self.tocsr()
        return csrmv_dt2t(y_dim_arr, w_dim_arr, view.indices, view.indptr, shape=self.shape, backend=self.backend)

    def dt2t_transposed(self, y_dim_arr, w_dim_arr):
        """``w[e] * y[col_e]`` for each entry ``e`` of the current view, in its order."""
        view = self.tocsr()
        return csrmv_dt2t(y_dim_arr, w_dim_arr, view.indices, view.indptr, shape=self.shape, transpose=True,
                          backend=self.backend)

    # ------------------------------------------------- plasticity and solve
    def update_on_pre(self, pre_spike, post_trace, w_min=None, w_max=None) -> "TCSR":
        """This view after presynaptic spikes (its rows'): :meth:`evjax.CSR.update_on_pre` on its storage."""
        updated = self._view(self.backend).update_on_pre(pre_spike, post_trace, w_min, w_max)
        return self._with_base(self._base._reweighted(updated.data))

    def update_on_post(self, pre_trace, post_spike, w_min=None, w_max=None) -> "TCSR":
        """This view after postsynaptic spikes (its columns'): :meth:`evjax.CSR.update_on_post`."""
        updated = self._view(self.backend).update_on_post(pre_trace, post_spike, w_min, w_max)
        return self._with_base(self._base._reweighted(updated.data))

    def solve(self, b, tol=1e-6, reorder=1):
        """``x`` with ``W @ x = b`` (see :meth:`evjax.CSR.solve`)."""
        return self._view(self.backend).solve(b, tol, reorder)

    def __array__(self, dtype=None, copy=None):
        raise TypeError("TCSR is a sparse matrix and does not convert implicitly to a dense array; call "
                        ".todense() for a dense jax.Array")

    def __repr__(self) -> str:
        kind = "homogeneous" if self.homogeneous else "per-synapse"
        view = ", transposed view" if self._transposed else ""
        return f"TCSR(shape={self.shape}, nse={self.nse}, {kind} {self.dtype}{view})"

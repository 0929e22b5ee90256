"""``DataRepresentation``: the base class of evjax's matrix types (brainevent's name).

A low layer (it imports nothing from evjax): the families' matrix classes
(:class:`evjax.CSR`, :class:`evjax.CSC`, :class:`evjax.Dense`,
:class:`evjax.FixedNumConn` and its subclasses, :class:`evjax.JITCMatrix` and
its subclasses) derive from it, so ``isinstance(W, evjax.DataRepresentation)``
tells a connectivity matrix from an array or an event array.
"""
from __future__ import annotations

import operator

import numpy as np

__all__ = ["DataRepresentation", "WeightArithmetic", "broadcasts_to", "dense_elementwise", "sparse_apply2"]


class DataRepresentation:
    """The base of evjax's matrix types: a matrix held as a structure, with a ``shape`` and a ``dtype``.

    It has no data of its own and is not built directly: each subclass is a
    pytree with its own fields (brainevent's ``buffers`` argument has no
    counterpart).

    Example:
        >>> W = evjax.CSR.fromdense(np.eye(3, dtype=np.float32))
        >>> isinstance(W, evjax.DataRepresentation), isinstance(W.data, evjax.DataRepresentation)
        (True, False)
    """

    __slots__ = ()

    def transpose(self, axes=None):
        """The transpose, as :attr:`T` gives it (a view where the type has one).

        Args:
            axes: ``None`` or ``(1, 0)`` (NumPy's signature).
        """
        if axes is not None and tuple(axes) != (1, 0):
            raise ValueError(f"{type(self).__name__}.transpose: axes must be None or (1, 0), got {axes!r}")
        return self.T


def broadcasts_to(shape: tuple, target: tuple) -> bool:
    """Whether an array of ``shape`` broadcasts to ``target`` without changing it."""
    try:
        return np.broadcast_shapes(tuple(shape), tuple(target)) == tuple(target)
    except ValueError:
        return False


def dense_elementwise(matrix: DataRepresentation, other, op, symbol: str, reverse: bool = False):
    """``matrix (op) other`` (``other (op) matrix`` if ``reverse``) on the dense matrix: brainevent's
    ``+`` and ``-`` of a sparse matrix, whose result is a dense array (adding to every entry fills the
    zeros).  ``other`` is a scalar, an array that broadcasts to the matrix's shape, or another matrix
    type (its dense matrix).

    Raises:
        ValueError: ``other`` does not broadcast to ``matrix.shape``.
    """
    if isinstance(other, DataRepresentation):
        other = other.todense()
    shape = tuple(np.shape(other))
    if not broadcasts_to(shape, matrix.shape):
        raise ValueError(f"{type(matrix).__name__} {symbol}: the other operand must be a scalar or broadcast to "
                         f"{tuple(matrix.shape)}, got shape {shape} (the result is the dense matrix)")
    dense = matrix.todense()
    return op(other, dense) if reverse else op(dense, other)


def sparse_apply2(matrix, other, fn, reverse: bool = False):
    """brainevent's ``apply2`` of a sparse matrix: ``fn(matrix, other)`` (``fn(other, matrix)`` if
    ``reverse``).  ``+`` and ``-`` (``operator.add``/``sub``) give the dense array
    (:func:`dense_elementwise`); any other ``fn`` new weights of the same structure, as ``*`` does
    (the matrix's ``_scaled``)."""
    if fn in (operator.add, operator.sub):
        return dense_elementwise(matrix, other, fn, "+" if fn is operator.add else "-", reverse)
    return matrix._scaled(other, fn, getattr(fn, "__name__", "apply2"), reverse)


class WeightArithmetic:
    """brainevent's arithmetic of a matrix type, through two hooks of the class.

    ``*`` and ``/`` call ``_scaled(other, op, symbol, reverse)``: new weights
    of the same structure.  ``+`` and ``-`` call ``_summed(...)``: by default
    the dense array (:func:`dense_elementwise`), as brainevent's sparse
    matrices give; :class:`evjax.Dense` keeps a ``Dense``.  Unary ``-`` and
    ``abs`` go through the class's ``apply``.
    """

    __slots__ = ()

    def _summed(self, other, op, symbol: str, reverse: bool = False):
        return dense_elementwise(self, other, op, symbol, reverse)

    def __mul__(self, other):
        return self._scaled(other, operator.mul, "*")

    def __rmul__(self, other):
        return self._scaled(other, operator.mul, "*", reverse=True)

    def __truediv__(self, other):
        return self._scaled(other, operator.truediv, "/")

    def __rtruediv__(self, other):
        return self._scaled(other, operator.truediv, "/", reverse=True)

    def __add__(self, other):
        return self._summed(other, operator.add, "+")

    def __radd__(self, other):
        return self._summed(other, operator.add, "+", reverse=True)

    def __sub__(self, other):
        return self._summed(other, operator.sub, "-")

    def __rsub__(self, other):
        return self._summed(other, operator.sub, "-", reverse=True)

    def __neg__(self):
        return self.apply(operator.neg)

    def __pos__(self):
        return self

    def __abs__(self):
        return self.apply(abs)

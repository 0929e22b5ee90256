"""``DataRepresentation``: the base class of evjax's matrix types (brainevent's name).

A low layer (it imports nothing from evjax): the families' matrix classes
(:class:`evjax.CSR`, :class:`evjax.CSC`, :class:`evjax.Dense`,
:class:`evjax.FixedNumConn` and its subclasses, :class:`evjax.JITCMatrix` and
its subclasses) derive from it, so ``isinstance(W, evjax.DataRepresentation)``
tells a connectivity matrix from an array or an event array.
"""
from __future__ import annotations

__all__ = ["DataRepresentation"]


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

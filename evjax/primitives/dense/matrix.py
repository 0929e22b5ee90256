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
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ... import units
from ...data_representation import DataRepresentation
from ..._validation import check_shape
from ..._event_values import EventValues, event_operand
from .ops import binary_densemm, binary_densemv

__all__ = ["Dense"]


@jax.tree_util.register_pytree_node_class
class Dense(DataRepresentation):
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

    def transpose(self) -> "Dense":
        """The transposed matrix (a new ``Dense``)."""
        return self.T

    def with_data(self, data) -> "Dense":
        """A ``Dense`` with new weights and the same backend."""
        return Dense(data, backend=self.backend)

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

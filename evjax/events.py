"""Event arrays: ``BinaryArray`` marks an array as spikes, and the one events-as-bool rule.

An event operand is bool, or a number where nonzero means a spike.  Event ops
read only whether each entry is nonzero (:func:`as_bool_events`); the gradient
w.r.t. a float event array is straight-through.  Sparse and connectivity types
(:class:`evjax.CSR`, ...) take over ``@`` with a ``BinaryArray`` and run their
event-driven ops: a class says so with a true ``takes_events`` class attribute.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["BinaryArray", "EventArray", "WeightedArray", "as_bool_events", "event_operand", "register_dense_matmul"]


def as_bool_events(x):
    """Events as bool: ``x`` itself if it is bool, else ``x != 0`` (one byte per entry for kernels)."""
    return x if x.dtype == jnp.bool_ else x != 0


# The dense event ops live in evjax.primitives.dense, above this module: importing them here
# would be a cycle, so evjax/primitives/dense/ops.py fills this slot when it is imported
# (register_dense_matmul); until then ``events @ array`` multiplies the events densely.
_dense_matmul = None


def register_dense_matmul(fn) -> None:
    """Install ``fn(events, weighted, other, events_on_left)`` as the event-driven ``events @ array``.

    Called by :mod:`evjax.primitives.dense.ops` at import; ``fn`` returns
    ``NotImplemented`` where it does not apply (then the dense product runs).
    """
    global _dense_matmul
    _dense_matmul = fn


def _defers(other) -> bool:
    """Whether ``other`` runs its own event ops for ``@`` with events (it sets ``takes_events``)."""
    return bool(getattr(type(other), "takes_events", False))


@jax.tree_util.register_pytree_node_class
class BinaryArray:
    """Marks an array as spikes: bool, or float where nonzero means a spike.

    Multiplying it with a sparse matrix such as :class:`evjax.CSR`, with
    :class:`evjax.Dense` or with a plain float matrix uses the event-driven
    operators (``binary_densemv``/``binary_densemm`` for dense matrices).  The gradient w.r.t. a float ``value`` is straight-through.

    Args:
        value: the spike array (any shape; vectors and matrices take part in matmul).

    Example:
        >>> spikes = evjax.BinaryArray(jnp.array([True, False, True]))
        >>> current = spikes @ W          # W: evjax.CSR of shape (3, n_post)
    """

    __array_ufunc__ = None  # numpy defers ``ndarray @ BinaryArray`` to us
    weighted = False  # WeightedArray sets it: its events carry values, not just 0/1

    def __init__(self, value: Any):
        self.value = value if isinstance(value, jax.Array) else jnp.asarray(value)

    def tree_flatten(self):
        return (self.value,), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        obj = object.__new__(cls)
        obj.value = children[0]
        return obj

    @property
    def shape(self) -> tuple:
        return tuple(self.value.shape)

    @property
    def dtype(self):
        return self.value.dtype

    @property
    def ndim(self) -> int:
        return self.value.ndim

    def __repr__(self) -> str:
        return f"BinaryArray({self.value!r})"

    def _dense(self, dtype):
        # 0/1 forward, straight-through gradient for float values
        ones = (self.value != 0).astype(dtype)
        if jnp.issubdtype(self.value.dtype, jnp.floating):
            v = self.value.astype(dtype)
            return v + jax.lax.stop_gradient(ones - v)
        return ones

    def _event_matmul(self, other, events_on_left: bool):
        """The event-driven dense op (the registered hook), or NotImplemented where it does not apply."""
        if _dense_matmul is None:
            return NotImplemented
        return _dense_matmul(self.value, type(self).weighted, other, events_on_left)

    def __matmul__(self, other):
        if _defers(other):
            return NotImplemented  # the other type's __rmatmul__ runs its event op
        other = jnp.asarray(other)
        result = self._event_matmul(other, True)
        return self._dense(other.dtype) @ other if result is NotImplemented else result

    def __rmatmul__(self, other):
        if _defers(other):
            return NotImplemented
        other = jnp.asarray(other)
        result = self._event_matmul(other, False)
        return other @ self._dense(other.dtype) if result is NotImplemented else result


EventArray = BinaryArray


@jax.tree_util.register_pytree_node_class
class WeightedArray(BinaryArray):
    """Graded or count events: each nonzero entry contributes ``value * weight``.

    Event ops given a ``WeightedArray`` (``weighted=True``) visit only its
    nonzero entries, as for spikes, and scale each visited weight by the
    entry's value; a zero entry contributes nothing, whatever its weights hold
    (NaN, inf).  The gradient w.r.t. ``value`` is the true one (the op is
    linear in it), not straight-through.

    Args:
        value: the event values (float or integer counts; vectors and matrices
            take part in matmul).

    Example:
        >>> counts = evjax.WeightedArray(jnp.array([0.0, 2.0, 0.5]))
        >>> current = counts @ W          # W: evjax.CSR or evjax.Dense, (3, n_post)
    """

    weighted = True

    def __repr__(self) -> str:
        return f"WeightedArray({self.value!r})"

    def _dense(self, dtype):
        # graded values; zero entries select zero (a NaN weight there stays out)
        return self.value.astype(dtype)


def event_operand(x) -> tuple[Any, bool]:
    """Split an event operand into ``(array, weighted)``.

    A :class:`WeightedArray` gives its value and ``True``; a
    :class:`BinaryArray` its value and ``False``; anything else is returned
    as is with ``False``.
    """
    if isinstance(x, BinaryArray):
        return x.value, type(x).weighted
    return x, False

"""Event arrays: ``BinaryArray`` marks an array as spikes, ``WeightedArray`` as graded events.

An event operand is bool, or a number where nonzero means a spike.  Event ops
read only whether each entry is nonzero (:func:`as_bool_events`); the gradient
w.r.t. a float event array is straight-through.

``@`` between an event array and a matrix:

* sparse and connectivity types (:class:`evjax.CSR`, :class:`evjax.Dense`,
  ...) take it over and run their event-driven ops: a class says so with a
  true ``takes_events`` class attribute, and the event array returns
  ``NotImplemented`` so that the matrix's ``__rmatmul__``/``__matmul__`` runs;
* a plain float matrix (vector or matrix events) runs the dense event ops
  (:func:`evjax.primitives.dense.ops.dense_event_matmul`); anything else
  multiplies the 0/1 (or graded) events densely.

This module sits above the dense family (it imports the dense ops); what the
ops themselves need of events (:func:`as_bool_events`, :func:`event_operand`,
the base class) is in the low layer :mod:`evjax._event_values`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ._event_values import EventValues, as_bool_events, event_operand
from .primitives.dense.ops import dense_event_matmul

__all__ = ["EventRepresentation", "BinaryArray", "EventArray", "WeightedArray", "as_bool_events", "event_operand"]

# brainevent's name for the base of the event array types
EventRepresentation = EventValues


def _defers(other) -> bool:
    """Whether ``other`` runs its own event ops for ``@`` with events (it sets ``takes_events``)."""
    return bool(getattr(type(other), "takes_events", False))


@jax.tree_util.register_pytree_node_class
class BinaryArray(EventValues):
    """Marks an array as spikes: bool, or float where nonzero means a spike.

    Multiplying it with a sparse matrix such as :class:`evjax.CSR`, with
    :class:`evjax.Dense` or with a plain float matrix uses the event-driven
    operators (``binary_densemv``/``binary_densemm`` for dense matrices).
    The gradient w.r.t. a float ``value`` is straight-through.

    Args:
        value: the spike array (any shape; vectors and matrices take part in matmul).

    Example:
        >>> spikes = evjax.BinaryArray(jnp.array([True, False, True]))
        >>> current = spikes @ W          # W: evjax.CSR of shape (3, n_post)
    """

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
        """The event-driven dense op, or NotImplemented where it does not apply."""
        return dense_event_matmul(self.value, type(self).weighted, other, events_on_left)

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

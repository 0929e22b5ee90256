"""Event values: the one events-as-bool rule and the base of the event array types.

A low layer (it imports only JAX): the ops and the validation read event
operands through :func:`event_operand` and :func:`as_bool_events`, and the
matrix types recognise an event array by its base class :class:`EventValues`.
The user-facing types (:class:`evjax.BinaryArray`, :class:`evjax.WeightedArray`)
live in :mod:`evjax.events`, above the dense family whose ops their ``@`` runs.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .units import is_quantity

__all__ = ["EventValues", "as_bool_events", "event_operand"]


def as_bool_events(x):
    """Events as bool: ``x`` itself if it is bool, else ``x != 0`` (one byte per entry for kernels)."""
    return x if x.dtype == jnp.bool_ else x != 0


class EventValues:
    """An array marked as events: the data and the array-like attributes of every event array type.

    Subclasses say what an event contributes (``weighted``) and how ``@`` runs:
    :class:`evjax.BinaryArray` and :class:`evjax.WeightedArray`.  Exported as
    ``evjax.EventRepresentation``, brainevent's name for this base.

    Args:
        value: the array (converted with ``jnp.asarray`` unless it is a JAX array).

    Example:
        >>> spikes = evjax.BinaryArray(jnp.array([True, False]))
        >>> isinstance(spikes, evjax.EventRepresentation)
        True
    """

    __array_ufunc__ = None  # numpy defers ``ndarray @ events`` to us
    weighted = False  # WeightedArray sets it: its events carry values, not just 0/1

    def __init__(self, value: Any):
        if type(self) is EventValues:
            raise TypeError("EventRepresentation is the base of the event array types and is not built "
                            "directly; use evjax.BinaryArray(x) (spikes) or evjax.WeightedArray(x) (graded events)")
        self.value = value if isinstance(value, jax.Array) or is_quantity(value) else jnp.asarray(value)

    def with_value(self, value: Any):
        """A new event array of the same type holding ``value`` (this one is unchanged)."""
        return type(self)(value)

    def tree_flatten(self):
        return (self.value,), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        obj = object.__new__(cls)
        obj.value = children[0]
        return obj

    lists_rows = False  # CompactBinary sets it: its vectors carry the list of their active entries

    def active_rows(self):
        """``(active_ids, n_active)``: the list of the active entries of a vector of events, where
        the type carries one (:class:`evjax.CompactBinary`), else None: the ops scan ``value``."""
        return None

    @property
    def shape(self) -> tuple:
        return tuple(self.value.shape)

    @property
    def dtype(self):
        return self.value.dtype

    @property
    def ndim(self) -> int:
        return self.value.ndim

    @property
    def size(self) -> int:
        """The number of entries of ``value``."""
        return int(self.value.size)

    def __len__(self) -> int:
        """The length of ``value``'s first axis (a 0-d value has none: ``TypeError``, as NumPy)."""
        if self.value.ndim == 0:
            raise TypeError(f"len() of a 0-d {type(self).__name__}")
        return self.value.shape[0]

    def __getitem__(self, index):
        """``value[index]``: the entries themselves (a plain array, not an event array)."""
        return self.value[index]

    def __iter__(self):
        """The entries of ``value`` along its first axis."""
        return iter(self.value)

    def __array__(self, dtype=None, copy=None):
        """``np.asarray(events)``: ``value`` as a NumPy array (one transfer, not entry by entry)."""
        out = np.asarray(self.value, dtype=dtype)
        return out.copy() if copy else out


def event_operand(x) -> tuple[Any, bool]:
    """Split an event operand into ``(array, weighted)``.

    A :class:`evjax.WeightedArray` gives its value and ``True``; a
    :class:`evjax.BinaryArray` its value and ``False``; anything else is
    returned as is with ``False``.
    """
    if isinstance(x, EventValues):
        return x.value, type(x).weighted
    return x, False

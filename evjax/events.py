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
from ._validation import check_active_list
from .primitives.compact.ops import active_list
from .primitives.dense.ops import dense_event_matmul

__all__ = ["EventRepresentation", "BinaryArray", "EventArray", "WeightedArray", "BitPackedBinary", "CompactBinary",
           "bitpack", "as_bool_events", "event_operand"]

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

    def bitpack(self) -> "BitPackedBinary":
        """The same spikes with their bits packed along every axis (:class:`BitPackedBinary`)."""
        return BitPackedBinary(self.value)

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


# ---------------------------------------------------------------------------
# compact forms: packed bits, and the list of the active entries
# ---------------------------------------------------------------------------
_BIT_WIDTH = 32


def bitpack(arr, axis: int) -> jax.Array:
    """Pack events into ``uint32`` words along ``axis``, 32 entries per word.

    Bit ``b`` of word ``w`` is entry ``32 w + b`` along ``axis`` (least significant bit first); an
    entry is set when it is active: ``True``, or nonzero (negative values and NaN are active).
    The last word is padded with zeros.

    Args:
        arr: events of any shape and of bool, integer or floating dtype.
        axis: the axis to pack (negative counts from the end).

    Returns:
        ``uint32`` array of ``arr``'s shape with ``ceil(arr.shape[axis] / 32)`` along ``axis``.

    Raises:
        ValueError: ``axis`` out of range, or a 0-d ``arr``.

    Example:
        >>> evjax.bitpack(jnp.array([False, True, False, True]), axis=0)   # 0b1010
        Array([10], dtype=uint32)
    """
    arr = jnp.asarray(arr)
    if arr.ndim == 0:
        raise ValueError("bitpack: arr must have at least one axis, got a 0-d array")
    if not -arr.ndim <= axis < arr.ndim:
        raise ValueError(f"bitpack: axis {axis} is out of range for an array of shape {arr.shape}")
    active = jnp.moveaxis(as_bool_events(arr), axis, -1)
    n = active.shape[-1]
    words = -(-n // _BIT_WIDTH)
    pad = words * _BIT_WIDTH - n
    if pad:
        active = jnp.concatenate([active, jnp.zeros(active.shape[:-1] + (pad,), jnp.bool_)], axis=-1)
    bits = active.reshape(active.shape[:-1] + (words, _BIT_WIDTH)).astype(jnp.uint32)
    packed = jnp.sum(bits << jnp.arange(_BIT_WIDTH, dtype=jnp.uint32), axis=-1, dtype=jnp.uint32)
    return jnp.moveaxis(packed, -1, axis)


@jax.tree_util.register_pytree_node_class
class BitPackedBinary(BinaryArray):
    """Spikes together with their bits packed along every axis (``uint32`` words, see :func:`bitpack`).

    It is a :class:`BinaryArray`: ``@`` and the gradients use ``value``, so
    every operator accepts it and gives the same result as for the plain
    spikes.  The packed words (32x smaller than bool) are for storing and
    moving spike trains; evjax's kernels read ``value``.

    Args:
        arr: the spikes (bool, or a number where nonzero means a spike).

    Attributes:
        packed: one packed array per axis, ``packed[a] = bitpack(value, a)``.

    Example:
        >>> spikes = evjax.BinaryArray(jnp.array([True, False, True])).bitpack()
        >>> current = spikes @ W
    """

    def __init__(self, arr):
        super().__init__(arr.value if isinstance(arr, EventValues) else arr)
        self.packed = tuple(bitpack(self.value, a) for a in range(self.value.ndim))

    def tree_flatten(self):
        return (self.value, self.packed), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        obj = object.__new__(cls)
        obj.value, obj.packed = children[0], tuple(children[1])
        return obj

    def __repr__(self) -> str:
        return f"BitPackedBinary({self.value!r})"

    @property
    def original_shape(self) -> tuple:
        """The shape of the spikes (``value``)."""
        return self.shape

    def with_value(self, value) -> "BitPackedBinary":
        """New packed spikes from ``value``."""
        return BitPackedBinary(value)

    def transpose(self, *axes) -> "BitPackedBinary":
        """The spikes transposed (``axes`` as in ``jnp.transpose``; none reverses them), packed again."""
        return BitPackedBinary(jnp.transpose(self.value, axes or None))

    @property
    def T(self) -> "BitPackedBinary":
        return self.transpose()


@jax.tree_util.register_pytree_node_class
class CompactBinary(BinaryArray):
    """Spikes together with the list of their active entries, so that an op visits those alone.

    ``CompactBinary.from_array(spikes) @ W`` (``W`` an :class:`evjax.CSR`,
    or ``W @ ...`` for an :class:`evjax.CSC`) reads the active rows from the
    list instead of scanning all ``n`` spikes (:func:`evjax.binary_csrmv_active`):
    the same result, bit for bit.  Make the list once and use it for several
    matrices (layers, or the weight gradient's rows).  Every other use (other
    matrix types, the gather orientation, a batch of spikes ``(n, batch)``,
    ``vmap``, gradients in the spikes) reads ``value`` as a :class:`BinaryArray`
    does.

    Args:
        packed: ``uint32`` words: :func:`bitpack` of ``value`` along axis 0
            (vector) or 1 (a batch ``(n, batch_size)``).
        active_ids: ``(n,)`` integers: the active entries in ascending order
            (a batch: the rows active in any column), then zeros; ``None`` for
            no list (:meth:`from_array_light`).
        n_active: ``(1,)`` integer, the number of listed entries.
        value: the spikes, ``(n,)`` or ``(n, batch_size)``.
        n_orig: ``n``.
        batch_size: ``None`` for a vector, else the columns of ``value``.
        bit_width: 32 (the only width).

    Example:
        >>> cb = evjax.CompactBinary.from_array(spikes)     # spikes: (n_pre,) bool
        >>> current = cb @ W                                # W: evjax.CSR (n_pre, n_post)
    """

    def __init__(self, packed, active_ids, n_active, value, n_orig, batch_size=None, bit_width=32):
        super().__init__(value)
        _check_bit_width(bit_width)
        if self.value.ndim not in (1, 2) or self.value.shape[0] != n_orig:
            raise ValueError(f"CompactBinary: value must be (n_orig,) or (n_orig, batch_size) with n_orig = "
                             f"{n_orig}, got shape {self.value.shape}")
        if (batch_size is None) != (self.value.ndim == 1) or (batch_size is not None
                                                              and self.value.shape[1] != batch_size):
            raise ValueError(f"CompactBinary: batch_size = {batch_size!r} does not match value's shape "
                             f"{self.value.shape} (None for a vector)")
        self.packed = jnp.asarray(packed)
        if active_ids is not None:
            active_ids, n_active = check_active_list(active_ids, n_active, n_orig, "CompactBinary")
        self.active_ids, self.n_active = active_ids, n_active
        self.n_orig, self.batch_size, self.bit_width = int(n_orig), batch_size, int(bit_width)

    def tree_flatten(self):
        return (self.packed, self.active_ids, self.n_active, self.value), (self.n_orig, self.batch_size,
                                                                           self.bit_width)

    @classmethod
    def tree_unflatten(cls, aux, children):
        obj = object.__new__(cls)
        obj.packed, obj.active_ids, obj.n_active, obj.value = children
        obj.n_orig, obj.batch_size, obj.bit_width = aux
        return obj

    def __repr__(self) -> str:
        return (f"CompactBinary(shape={self.shape}, n_orig={self.n_orig}, batch_size={self.batch_size}, "
                f"value={self.value!r})")

    lists_rows = True

    def active_rows(self):
        """``(active_ids, n_active)`` for a vector with a list (what the CSR scatter reads), else None."""
        if self.batch_size is not None or self.active_ids is None:
            return None
        return self.active_ids, self.n_active

    @classmethod
    def from_array(cls, x, bit_width: int = 32) -> "CompactBinary":
        """Pack and list the spikes ``x``: ``(n,)``, or ``(n, batch_size)`` (rows active in any column).

        Raises:
            ValueError: ``x`` not 1-d or 2-d, or ``bit_width`` not 32.
        """
        x = _spike_array(x, "from_array")
        active = as_bool_events(x) if x.ndim == 1 else jnp.any(as_bool_events(x), axis=1)
        ids, count = active_list(active)  # one pass (Numba on CPU), not XLA's prefix sum and scatter
        return cls._made(bitpack(x, x.ndim - 1), ids, count, x, bit_width)

    @classmethod
    def from_array_light(cls, x, bit_width: int = 32) -> "CompactBinary":
        """As :meth:`from_array` for a batch; a vector gets no list (``active_ids`` None): its ops
        scan ``value``, which saves the listing where it does not pay (e.g. under ``vmap``)."""
        x = _spike_array(x, "from_array_light")
        if x.ndim == 2:
            return cls.from_array(x, bit_width)
        return cls._made(bitpack(x, 0), None, None, x, bit_width)

    @classmethod
    def from_packed(cls, packed, active_ids, n_active, value, n_orig, batch_size=None,
                    bit_width=32) -> "CompactBinary":
        """From packed words and a list made elsewhere; a concrete list is checked (ascending rows in
        range), and must list the active entries of ``value``."""
        return cls(packed, active_ids, n_active, value, n_orig, batch_size, bit_width)

    @classmethod
    def compact_only_vector(cls, x) -> "CompactBinary":
        """A vector with its list and no packed words (``packed`` is an empty ``uint32`` array)."""
        x = _spike_array(x, "compact_only_vector")
        if x.ndim != 1:
            raise ValueError(f"CompactBinary.compact_only_vector only supports 1D arrays: x must be (n,), got shape "
                             f"{x.shape}; use CompactBinary.from_array for a batch")
        return cls._made(jnp.zeros((0,), jnp.uint32), *active_list(as_bool_events(x)), x, _BIT_WIDTH)

    compacy_only_vector = compact_only_vector  # brainevent 0.3.0's spelling

    @classmethod
    def _made(cls, packed, ids, count, x, bit_width):
        _check_bit_width(bit_width)
        obj = object.__new__(cls)
        obj.packed, obj.active_ids, obj.n_active, obj.value = packed, ids, count, x
        obj.n_orig, obj.batch_size, obj.bit_width = x.shape[0], (x.shape[1] if x.ndim == 2 else None), bit_width
        return obj

    def to_dense(self) -> jax.Array:
        """The spikes (``value``)."""
        return self.value

    def with_value(self, value) -> "CompactBinary":
        """New spikes in the same form: listed (:meth:`from_array`), or without a list where this one
        has none (:meth:`from_array_light`)."""
        make = CompactBinary.from_array_light if self.active_ids is None else CompactBinary.from_array
        return make(value, self.bit_width)


def _check_bit_width(bit_width) -> None:
    if bit_width != _BIT_WIDTH:
        raise ValueError(f"CompactBinary: Only bit_width={_BIT_WIDTH} is supported, got bit_width={bit_width!r}; "
                         f"leave it out")


def _spike_array(x, who: str):
    x = x.value if isinstance(x, EventValues) else jnp.asarray(x)
    if x.ndim not in (1, 2):
        raise ValueError(f"CompactBinary.{who} only supports 1D and 2D arrays: x must be (n,) or (n, batch_size), "
                         f"got shape {x.shape}")
    return x

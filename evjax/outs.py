"""Validation of ``outs`` (output specifications) shared by every wrapper."""
from __future__ import annotations

import operator
from typing import Sequence

import jax
import numpy as np


def normalize_outs(outs, *, who: str) -> tuple[tuple[jax.ShapeDtypeStruct, ...], bool]:
    """Return ``(tuple_of_structs, single)`` for one struct or a sequence of them.

    Raises:
        TypeError: an entry is not a ``jax.ShapeDtypeStruct`` (or an array-like
            with ``shape`` and ``dtype``).
        ValueError: a dimension of an entry is negative or not an integer.
    """
    single = not isinstance(outs, (list, tuple))
    items: Sequence = [outs] if single else list(outs)
    if not items:
        raise TypeError(f"{who}: `outs` is empty; give at least one jax.ShapeDtypeStruct.")
    structs = []
    for i, o in enumerate(items):
        if isinstance(o, type) or not (hasattr(o, "shape") and hasattr(o, "dtype")):
            raise TypeError(
                f"{who}: outs[{i}] is {type(o).__name__} {o!r}; each output must be a "
                f"jax.ShapeDtypeStruct(shape, dtype), e.g. jax.ShapeDtypeStruct((64,), jnp.float32)."
            )
        structs.append(jax.ShapeDtypeStruct(_dims(o.shape, i, who), np.dtype(o.dtype)))
    return tuple(structs), single


def _dims(shape, i: int, who: str) -> tuple[int, ...]:
    """The dimensions of ``outs[i]`` as Python ints, each an integer >= 0."""
    dims = []
    for d in shape:
        try:
            d = operator.index(d)
        except TypeError:
            raise ValueError(
                f"{who}: outs[{i}] has shape {tuple(shape)}; a dimension must be an integer, got "
                f"{type(d).__name__} {d!r}"
            ) from None
        if d < 0:
            raise ValueError(
                f"{who}: outs[{i}] has shape {tuple(shape)}; dimensions must be >= 0, got {d}. "
                f"Fix the output shape given in `outs`."
            )
        dims.append(d)
    return tuple(dims)

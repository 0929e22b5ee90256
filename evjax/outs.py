"""Validation of ``outs`` (output specifications) shared by every wrapper."""
from __future__ import annotations

from typing import Sequence

import jax
import numpy as np


def normalize_outs(outs, *, who: str) -> tuple[tuple[jax.ShapeDtypeStruct, ...], bool]:
    """Return ``(tuple_of_structs, single)`` for one struct or a sequence of them.

    Raises:
        TypeError: an entry is not a ``jax.ShapeDtypeStruct`` (or an array-like
            with ``shape`` and ``dtype``).
    """
    single = not isinstance(outs, (list, tuple))
    items: Sequence = [outs] if single else list(outs)
    if not items:
        raise TypeError(f"{who}: `outs` is empty; give at least one jax.ShapeDtypeStruct.")
    structs = []
    for i, o in enumerate(items):
        if isinstance(o, jax.ShapeDtypeStruct):
            structs.append(jax.ShapeDtypeStruct(tuple(int(d) for d in o.shape), np.dtype(o.dtype)))
        elif hasattr(o, "shape") and hasattr(o, "dtype") and not isinstance(o, type):
            structs.append(jax.ShapeDtypeStruct(tuple(int(d) for d in o.shape), np.dtype(o.dtype)))
        else:
            raise TypeError(
                f"{who}: outs[{i}] is {type(o).__name__} {o!r}; each output must be a "
                f"jax.ShapeDtypeStruct(shape, dtype), e.g. jax.ShapeDtypeStruct((64,), jnp.float32)."
            )
    return tuple(structs), single

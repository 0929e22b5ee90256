"""Physical units on weights and operands (brainunit quantities), an optional dependency.

With ``brainunit`` installed (``pip install evjax[units]``), the event ops
accept ``brainunit.Quantity`` weights and operands, as brainevent does: the op
runs on their numbers (mantissas) and the result carries the product of
their units (``nS`` weights times ``mV`` values give ``pA``).  Event operands
(spikes) select and carry no unit; weighted events do.  Without brainunit, or
with plain arrays, nothing changes: the check is a look at each argument's
type, and brainunit is never imported by evjax itself.

A low layer: it imports no evjax module.
"""
from __future__ import annotations

import functools
import inspect
from typing import Callable, Sequence

__all__ = ["is_quantity", "split", "attach", "product", "in_unit_of", "carries_units"]

_MODULES = ("saiunit", "brainunit")


def is_quantity(x) -> bool:
    """Whether ``x`` is a brainunit ``Quantity`` (read off its type's module: brainunit is not imported)."""
    return type(x).__module__.split(".")[0] in _MODULES and hasattr(x, "mantissa") and hasattr(x, "unit")


def split(x):
    """``(mantissa, unit)`` of a quantity, ``(x, None)`` of anything else."""
    if is_quantity(x):
        return x.mantissa, x.unit
    return x, None


def attach(y, unit):
    """``y`` as a quantity of ``unit`` (a dimensionless product stays a plain array); ``unit`` None: ``y``."""
    if unit is None:
        return y
    import brainunit

    return brainunit.maybe_decimal(brainunit.Quantity(y, unit=unit))


def in_unit_of(x, unit, name: str, who: str):
    """The mantissa of ``x`` expressed in ``unit`` (for parameters that must share the weights' unit,
    such as a normal law's scale); a plain ``x`` beside a unit, or a unit of another dimension, raises."""
    if x is None or (unit is None and not is_quantity(x)):  # an optional parameter left out, or no units
        return x
    if not is_quantity(x) or unit is None:
        raise TypeError(f"{who}: {name} and the weights must both be quantities or both be plain numbers")
    if x.unit.dim != unit.dim:
        raise _unit_mismatch_error()(f"{who}: {name} has unit {x.unit}, which is not a unit of the weights' "
                                     f"dimension ({unit})", x.unit, unit)
    return x.to_decimal(unit)


@functools.cache
def _unit_mismatch_error() -> type:
    """brainunit's ``UnitMismatchError`` that is also a ``TypeError`` (what evjax raised before; made
    on first use, where a quantity was passed, so brainunit is installed)."""
    import brainunit

    base = brainunit.UnitMismatchError

    def __init__(self, description, *units):
        base.__init__(self, description, *units)

    return type("UnitMismatchError", (base, TypeError),
                {"__init__": __init__, "__module__": __name__,
                 "__doc__": "Units of different dimensions: brainunit's UnitMismatchError and a TypeError."})


def product(*units) -> object | None:
    """The product of the units that are not None; None if all are."""
    units = [u for u in units if u is not None]
    if not units:
        return None
    out = units[0]
    for u in units[1:]:
        out = out * u
    return out


def carries_units(*names: str, events: Sequence[str] = (), weighted: str | None = None,
                  shared: dict[str, str] | None = None) -> Callable:
    """Decorate a public op function so that its ``names`` arguments may be quantities.

    The function runs on the mantissas; the result (each array of a tuple) is
    multiplied by the product of their units.  ``events``: arguments that are
    spikes, whose unit multiplies in only when the keyword argument
    ``weighted`` is true (weighted events); a quantity of spikes otherwise
    raises a ``TypeError``.  ``shared``: ``{argument: other}``, arguments
    expressed in the unit of ``other`` (one of ``names``; a law's scale beside
    its location), plain where ``other`` is.  Any other quantity argument
    raises a ``TypeError`` naming it.
    """
    shared = dict(shared or {})

    def decorate(fn: Callable) -> Callable:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not any(map(is_quantity, args)) and not any(map(is_quantity, kwargs.values())):
                return fn(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            graded = bool(bound.arguments.get(weighted, False)) if weighted else False
            for name, other in shared.items():
                if name in bound.arguments:
                    bound.arguments[name] = in_unit_of(bound.arguments[name], split(bound.arguments.get(other))[1],
                                                       name, fn.__name__)
            units = []
            for name, value in bound.arguments.items():
                if not is_quantity(value):
                    continue
                if name in names or (name in events and graded):
                    bound.arguments[name], unit = split(value)
                    units.append(unit)
                elif name in events:
                    raise TypeError(f"{fn.__name__}: {name} are spikes, which carry no unit; pass their numbers "
                                    f"({name}.mantissa), or weighted=True for graded events with a unit")
                else:
                    raise TypeError(f"{fn.__name__}: {name} cannot carry a unit; pass its numbers ({name}.mantissa)")
            out = fn(*bound.args, **bound.kwargs)
            unit = product(*units)
            if isinstance(out, tuple):
                return tuple(attach(o, unit) for o in out)
            return attach(out, unit)

        return wrapper

    return decorate

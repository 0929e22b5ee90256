"""Sharding rules: how XLA's SPMD partitioner splits an evjax op under plain ``jax.jit``.

An evjax op lowers to an XLA custom call that XLA knows nothing about; left
alone, the partitioner all-gathers its operands and runs it whole on every
device.  An op that declares a :class:`PartitionRule` (see
:meth:`evjax.XLACustomKernel.def_partition_rule`) is lowered through
:func:`jax.experimental.custom_partitioning` instead: the rule names, for each
dimension of each operand and result, a *factor* (as in an einsum), and says
which factors a device may hold a slice of:

* ``batch`` factors run through the op untouched (the columns of ``spikes.T``
  in ``spikes @ W``): each device runs the kernel on its own slice, and its
  result is its slice of the result;
* ``reduced`` factors are summed by the op (the batch of a weight gradient):
  each device sums its own slice, and a ``psum`` over the devices holding the
  slices adds the partial results;
* every other factor (the matrix, its structure, its seed) is kept whole:
  the partitioner replicates an operand sharded along it (an all-gather,
  which is what a rule-less op does for every operand).

The local kernel is the op itself, bound again on the local shapes (its
``outs`` with each sliced dimension divided by its number of devices), so
every backend and every kernel variant partitions the same way.  Inside
``shard_map`` (every mesh axis manual) and on one device, ``custom_partitioning``
lowers the op as it is: the rule costs nothing there.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import jax
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from .. import _compat

__all__ = ["PartitionRule", "partitioned"]


@dataclasses.dataclass(frozen=True)
class PartitionRule:
    """The factors of an op's operands and results, and which of them may be split across devices.

    Args:
        operands: one string per operand, its dimensions' factor names separated by spaces
            (``""`` for a scalar), e.g. ``("w", "w", "r", "i k")``.
        results: the same for each result, e.g. ``("o k",)``.
        batch: factors that each device may hold a slice of, in operands and results alike.
        reduced: factors that the op sums over (absent from the results): each device sums its
            slice, then the partial results are added over the devices (``psum``).
        localize: ``localize(operands, firsts) -> operands`` for an op whose kernel must know
            where its slice starts: ``firsts`` maps each split batch factor to the global index of
            the device's first element along it (a traced integer); the operands it returns are
            what the op is bound with on the device (e.g. a generated matrix keyed by global
            indices).
    """

    operands: tuple[str, ...]
    results: tuple[str, ...]
    batch: tuple[str, ...] = ()
    reduced: tuple[str, ...] = ()
    localize: Callable | None = None

    @property
    def sharding_rule(self) -> str:
        """The einsum-like rule Shardy reads, e.g. ``"w, w, r, i k -> o k"``."""
        return f"{', '.join(self.operands)} -> {', '.join(self.results)}"

    @property
    def kept_whole(self) -> tuple[str, ...]:
        """The factors that no device holds a slice of, in order of appearance (Shardy's order)."""
        split = set(self.batch) | set(self.reduced)
        factors = [f for value in self.operands + self.results for f in value.split()]
        return tuple(f for f in dict.fromkeys(factors) if f not in split)


# ---------------------------------------------------------------------------
# which mesh axes split which factor
# ---------------------------------------------------------------------------
def _axes_of(entry) -> tuple[str, ...]:
    """A PartitionSpec entry as a tuple of mesh axis names."""
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (entry,)


def _spec_entries(sharding, rank: int) -> list[tuple[str, ...]]:
    spec = tuple(sharding.spec) if isinstance(sharding, NamedSharding) else ()
    return [_axes_of(spec[d]) if d < len(spec) else () for d in range(rank)]


def _factor_sizes(values: Sequence[str], shapes: Sequence[Sequence[int]]) -> dict[str, int]:
    sizes = {}
    for value, shape in zip(values, shapes):
        for factor, size in zip(value.split(), shape):
            sizes.setdefault(factor, size)
    return sizes


def factor_axes(rule: PartitionRule, mesh, arg_shapes, result_shapes=()) -> dict[str, tuple[str, ...]]:
    """The mesh axes that split each splittable factor: those of the first operand (then result)
    sharded along it, if the factor's size divides evenly among them and no other factor uses them;
    else none."""
    values = rule.operands + rule.results[:len(result_shapes)]
    shaped = list(arg_shapes) + list(result_shapes)
    sizes = _factor_sizes(values, [s.shape for s in shaped])
    found: dict[str, tuple[str, ...]] = {}
    used: set[str] = set()
    for value, arg in zip(values, shaped):
        for factor, axes in zip(value.split(), _spec_entries(getattr(arg, "sharding", None), len(arg.shape))):
            if factor not in rule.batch + rule.reduced or factor in found or not axes:
                continue
            count = math.prod(mesh.shape[a] for a in axes)
            if used.isdisjoint(axes) and sizes[factor] % count == 0:
                found[factor] = axes
                used.update(axes)
    return found


def _spec(value: str, axes: dict[str, tuple[str, ...]], keep: Sequence[str]) -> PartitionSpec:
    entries = []
    for factor in value.split():
        names = axes.get(factor, ()) if factor in keep else ()
        entries.append(None if not names else names[0] if len(names) == 1 else names)
    return PartitionSpec(*entries)


# ---------------------------------------------------------------------------
# the custom_partitioning callbacks
# ---------------------------------------------------------------------------
def _result_shardings(rule: PartitionRule, mesh, axes) -> list[NamedSharding]:
    return [NamedSharding(mesh, _spec(value, axes, rule.batch)) for value in rule.results]


def _firsts(rule: PartitionRule, axes, local_sizes: dict[str, int]) -> dict:
    """Per split batch factor, the global index of this device's first element along it."""
    return {f: jax.lax.axis_index(axes[f] if len(axes[f]) > 1 else axes[f][0]) * local_sizes[f]
            for f in rule.batch if f in axes}


def _partition(rule: PartitionRule, bind_local: Callable, outs, mesh, arg_shapes, result_shape):
    axes = factor_axes(rule, mesh, arg_shapes, _as_list(result_shape))
    arg_shardings = tuple(NamedSharding(mesh, _spec(value, axes, rule.batch + rule.reduced))
                          for value in rule.operands)
    sizes = _factor_sizes(rule.operands + rule.results, [a.shape for a in arg_shapes] + [o.shape for o in outs])
    local_sizes = {f: sizes[f] // math.prod(mesh.shape[a] for a in names) for f, names in axes.items()}
    local_outs = [jax.ShapeDtypeStruct(tuple(local_sizes.get(f, size) for f, size in zip(value.split(), o.shape)),
                                       o.dtype)
                  for value, o in zip(rule.results, outs)]
    summed = tuple(a for f in rule.reduced for a in axes.get(f, ()))

    def lower_fn(*args):
        if rule.localize is not None and any(f in axes for f in rule.batch):
            args = rule.localize(args, _firsts(rule, axes, local_sizes))
        results = list(bind_local(args, local_outs))
        if summed:  # each device summed its slice of a reduced factor: add the partial sums
            results = [jax.lax.psum(r, summed) for r in results]
        return results

    return mesh, lower_fn, _result_shardings(rule, mesh, axes), arg_shardings


def _as_list(result_shape) -> list:
    return list(result_shape) if isinstance(result_shape, (list, tuple)) else [result_shape]


def _infer(rule: PartitionRule, mesh, arg_shapes, result_shape):
    return _result_shardings(rule, mesh, factor_axes(rule, mesh, arg_shapes))


def _with_constants(rule: PartitionRule, consts) -> PartitionRule:
    """``rule`` with the kernel's captured constants as extra operands, each kept whole."""
    extra = tuple(" ".join(f"const{i}d{d}" for d in range(np.ndim(c))) for i, c in enumerate(consts))
    return dataclasses.replace(rule, operands=rule.operands + extra)


def partitioned(run: Callable, rule: PartitionRule, bind_local: Callable, avals_in, outs) -> Callable:
    """``run`` (the op's kernel on whole arrays) as a function the SPMD partitioner splits by ``rule``.

    Args:
        run: ``run(*arrays) -> list of results``, as lowered without sharding.
        rule: the op's factors.
        bind_local: ``bind_local(arrays, local_outs) -> list of results``: the op on one device's
            slices, with the results' local shapes.
        avals_in: the operands' abstract values.
        outs: the results' global ``ShapeDtypeStruct``s.

    Returns:
        A function of the operands with the results of ``run``.
    """
    # custom_partitioning traces a function without constants: the kernel's own (tables, seeds made
    # at generation) become extra operands, kept whole
    traced = jax.make_jaxpr(run)(*[jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals_in])
    consts, n = list(traced.consts), len(avals_in)
    rule = _with_constants(rule, consts)
    fn = custom_partitioning(lambda *arrays: _compat.eval_jaxpr(traced.jaxpr, arrays[n:], *arrays[:n]))
    fn.def_partition(
        lambda mesh, arg_shapes, result_shape: _partition(rule, lambda args, local: bind_local(args[:n], local),
                                                          outs, mesh, arg_shapes, result_shape),
        infer_sharding_from_operands=lambda mesh, arg_shapes, result_shape: _infer(rule, mesh, arg_shapes,
                                                                                  result_shape),
        sharding_rule=rule.sharding_rule,
        reduction_factors=rule.reduced,
        need_replication_factors=rule.kept_whole,
    )
    return lambda *arrays: fn(*arrays, *consts)

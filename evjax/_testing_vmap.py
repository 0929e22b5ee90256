"""The vmap checks of the property harness (re-exported by :mod:`evjax.testing`).

The oracle of every vmap check is a loop: the reference on each batch
element, stacked along ``out_axes``.  It never relies on the op's (or the
reference's) batching, and it compiles nothing new: every element has the
shapes of the unbatched example.  Batch elements differ in every batched
argument, integer structures included (drawn by the spec's ``resample``).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ._testing_core import OpSpec, reference_vjp, weighted_sum

__all__ = ["VmapCase", "vmap_cases", "check_vmap", "check_nested_vmap", "check_jit_grad_vmap"]


@dataclasses.dataclass(frozen=True)
class VmapCase:
    """One vmap of the op: ``in_axes`` per argument (others ``None``) and ``out_axes``.

    ``pytree``: the batched arguments reach the op through one dict argument,
    with a dict ``in_axes`` (a pytree prefix) instead of one axis per argument.
    """

    in_axes: tuple[tuple[int, int], ...]
    out_axes: int = 0
    pytree: bool = False

    @property
    def argnums(self) -> tuple[int, ...]:
        return tuple(i for i, _ in self.in_axes)

    def __str__(self) -> str:
        axes = ", ".join(f"arg {i}: {a}" for i, a in self.in_axes)
        return f"in_axes {{{axes}}}{' as a dict' if self.pytree else ''}, out_axes={self.out_axes}"


def vmap_cases(spec: OpSpec, args: Sequence) -> list[VmapCase]:
    """Every argument alone at axes 0, -1 and (rank >= 2) 1; out_axes -1 and 1; all at once as a pytree."""
    argnums = spec.batchable(args)
    cases = []
    for i in argnums:
        rank = np.ndim(args[i])
        axes = (0,) if rank == 0 else (0, -1) if rank == 1 else (0, 1, -1)
        cases += [VmapCase(((i, axis),)) for axis in axes]
    if not argnums:
        return cases
    out_rank = min(np.ndim(o) for o in jax.tree_util.tree_leaves(spec.expected(args)))
    first = ((argnums[0], 0),)
    cases.append(VmapCase(first, out_axes=-1))
    if out_rank >= 1:
        cases.append(VmapCase(first, out_axes=1))
    if len(argnums) > 1:
        mixed = tuple((i, 0 if k % 2 == 0 or np.ndim(args[i]) == 0 else -1) for k, i in enumerate(argnums))
        cases.append(VmapCase(mixed, out_axes=-1 if out_rank >= 1 else 0, pytree=True))
    return cases


# ---------------------------------------------------------------------------
# batches and their expected results
# ---------------------------------------------------------------------------
def _stack(values: Sequence, axis: int):
    # Stacked in NumPy: an eager jnp.stack and moveaxis would compile two XLA programs per new shape
    # (7 % of a harness file's time).  jnp.asarray first, so that the elements get JAX's dtypes.
    stacked = np.stack([np.asarray(jnp.asarray(v)) for v in values])
    return jnp.asarray(np.moveaxis(stacked, 0, axis))


def _stack_outputs(outputs: Sequence, axis: int):
    return jax.tree_util.tree_map(lambda *leaves: _stack(leaves, axis), *outputs)


def _batched_dynamic(spec: OpSpec, elements: Sequence, axes: dict[int, int]) -> tuple:
    """The dynamic arguments with ``axes[i]`` batch axes, stacked from the elements."""
    statics, dynamic = spec.split(elements[0])
    dynamic = list(dynamic)
    for i, axis in axes.items():
        dynamic[spec.position(i)] = _stack([e[i] for e in elements], axis)
    return statics, tuple(dynamic)


def _vmapped(spec: OpSpec, case: VmapCase, n_dynamic: int):
    """``f(statics, dynamic)``: the op under ``jax.vmap`` as ``case`` says."""
    axes = dict((spec.position(i), a) for i, a in case.in_axes)

    def run(statics, dynamic):
        if case.pytree:
            tree = {f"arg{p}": dynamic[p] for p in range(n_dynamic)}
            in_axes = ({f"arg{p}": axes.get(p) for p in range(n_dynamic)},)
            f = lambda d: spec.op(statics, [d[f"arg{p}"] for p in range(n_dynamic)])  # noqa: E731
            return jax.vmap(f, in_axes=in_axes, out_axes=case.out_axes)(tree)
        in_axes = tuple(axes.get(p) for p in range(n_dynamic))
        return jax.vmap(lambda *d: spec.op(statics, d), in_axes=in_axes, out_axes=case.out_axes)(*dynamic)

    return run


def check_vmap(spec: OpSpec, args: Sequence, seed: int = 3) -> None:
    """``jit(vmap(op))`` for every :func:`vmap_cases` case (and eager ``vmap`` for the first).

    The cases of one example are compiled as one program (a tuple of their
    results), which costs one compile instead of one per case.
    """
    rng = np.random.default_rng(seed)
    cases = tuple(vmap_cases(spec, args))
    batches, expected = [], []
    for case in cases:
        elements = spec.elements(rng, args, case.argnums, spec.batch_size)
        expected.append(_stack_outputs([spec.expected(e) for e in elements], case.out_axes))
        batches.append(_batched_dynamic(spec, elements, dict(case.in_axes)))
    if not cases:
        return
    statics = batches[0][0]
    runs = [_vmapped(spec, case, len(batch[1])) for case, batch in zip(cases, batches)]

    def make():
        def all_cases(statics, dynamics):
            results = []
            for case, run, dynamic in zip(cases, runs, dynamics):
                try:
                    results.append(run(statics, dynamic))
                except Exception as exc:
                    exc.add_note(f"{spec.name}: while tracing jit(vmap) {case}")
                    raise
            return tuple(results)

        return all_cases

    actual = spec.program(("vmap", cases), make)(statics, tuple(b[1] for b in batches))
    for case, got, want in zip(cases, actual, expected):
        spec.close(got, want, f"jit(vmap) {case}")
    spec.close(runs[0](statics, batches[0][1]), expected[0], f"vmap {cases[0]}")  # eager: the rules without jit


def check_nested_vmap(spec: OpSpec, args: Sequence, seed: int = 4) -> None:
    """vmap of vmap: the outer over every batchable argument (axis 0), the inner over the last (axis -1).

    Element ``(i, j)`` redraws all of them for ``i`` and then the last one for
    ``j``; the result has the outer batch first and the inner batch last.
    """
    argnums = spec.batchable(args)
    if not argnums:
        return
    rng = np.random.default_rng(seed)
    last = argnums[-1]
    outer_size, inner_size = spec.batch_size, 2
    grid = []
    for base in spec.elements(rng, args, argnums, outer_size):
        grid.append(spec.elements(rng, base, (last,), inner_size))
    expected = _stack_outputs([_stack_outputs([spec.expected(e) for e in row], -1) for row in grid], 0)
    statics, dynamic = spec.split(args)
    dynamic = list(dynamic)
    for i in argnums:
        if i == last:
            dynamic[spec.position(i)] = _stack([_stack([e[i] for e in row], -1) for row in grid], 0)
        else:
            dynamic[spec.position(i)] = _stack([row[0][i] for row in grid], 0)
    n = len(dynamic)
    inner_axes = tuple(-1 if p == spec.position(last) else None for p in range(n))
    outer_axes = tuple(0 if p in {spec.position(i) for i in argnums} else None for p in range(n))

    def make():
        def run(statics, dynamic):
            inner = jax.vmap(lambda *d: spec.op(statics, d), in_axes=inner_axes, out_axes=-1)
            return jax.vmap(inner, in_axes=outer_axes)(*dynamic)

        return run

    actual = spec.program(("nested_vmap", last), make)(statics, tuple(dynamic))
    spec.close(actual, expected, f"nested vmap (outer over args {argnums}, inner over arg {last} at axis -1)")


def check_jit_grad_vmap(spec: OpSpec, args: Sequence, seed: int = 5) -> None:
    """``jit(grad(weighted sum of vmap(op)))``, vmapped over the last batchable argument.

    The gradient of an argument that is not batched sums the elements'
    gradients (the transpose of the batched op); that of the batched one
    stacks them.
    """
    argnums = spec.batchable(args)
    if not (spec.diff_argnums and argnums):
        return
    rng = np.random.default_rng(seed)
    v = argnums[-1]
    elements = spec.elements(rng, args, (v,), spec.batch_size)
    statics, dynamic = _batched_dynamic(spec, elements, {v: 0})
    outs = jax.tree_util.tree_leaves(spec.expected(args))
    weights = [jnp.asarray(rng.standard_normal((spec.batch_size,) + np.shape(o)), jnp.float32) for o in outs]
    diff = [spec.position(i) for i in spec.diff_argnums]
    in_axes = tuple(0 if p == spec.position(v) else None for p in range(len(dynamic)))

    def make():
        def run(statics, dynamic, weights):
            def loss(*primals):
                full = list(dynamic)
                for p, x in zip(diff, primals):
                    full[p] = x
                return weighted_sum(jax.vmap(lambda *d: spec.op(statics, d), in_axes=in_axes)(*full), weights)

            return jax.grad(loss, argnums=tuple(range(len(diff))))(*[dynamic[p] for p in diff])

        return run

    actual = spec.program(("jit_grad_vmap", v), make)(statics, dynamic, weights)
    per_element = []
    for b, element in enumerate(elements):
        cotangent = [w[b].astype(o.dtype) for w, o in zip(weights, outs)]
        per_element.append(reference_vjp(spec, element, cotangent))
    expected = []
    for k, i in enumerate(spec.diff_argnums):
        grads = [g[k] for g in per_element]
        if i == v:
            expected.append(_stack(grads, 0))
        else:
            wide = jnp.promote_types(grads[0].dtype, jnp.float32)  # float16/bfloat16 summed in float32
            expected.append(sum(jnp.asarray(g, wide) for g in grads).astype(grads[0].dtype))
    spec.close(tuple(actual), tuple(expected), f"jit(grad(vmap)) over arg {v}")

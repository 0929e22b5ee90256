"""Property harness: check any op against a dense reference under every transform.

Describe the op with an :class:`OpSpec` (the op, a dense ``jax.numpy``
reference with the same signature, which arguments are differentiable and
which may be vmapped), then call :func:`check_all` on example arguments, or
build a Hypothesis test with :func:`property_test`::

    spec = OpSpec(fn=my_op, reference=my_dense_ref, diff_argnums=(0, 1))
    test_my_op = property_test(spec, my_args_strategy, max_examples=10)

The checks: eager and jit forward, ``jax.jvp``, ``jax.vjp`` and ``jax.grad``,
``jax.test_util.check_grads`` for smooth ops, ``jax.vmap`` over every argument
with ``in_axes`` 0, 1 (where valid) and ``None``, nested vmap and
``jit(grad(vmap))``.  Low-precision floats (float16/bfloat16) are upcast to
float32 for the reference, so it is the op's accuracy that is measured.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .dtypes import LOW_PRECISION

__all__ = [
    "OpSpec",
    "tolerance",
    "assert_close",
    "check_forward",
    "check_jvp",
    "check_vjp",
    "check_grads_smooth",
    "check_vmap",
    "check_nested_vmap",
    "check_jit_grad_vmap",
    "check_all",
    "property_test",
]

_TOLERANCES = {
    np.dtype(np.float64): (1e-9, 1e-9),
    np.dtype(np.complex128): (1e-9, 1e-9),
    np.dtype(np.float32): (2e-4, 2e-5),
    np.dtype(np.complex64): (2e-4, 2e-5),
    np.dtype(np.float16): (2e-2, 2e-3),
    np.dtype(jnp.bfloat16): (4e-2, 8e-3),
}


def tolerance(dtype) -> tuple[float, float]:
    """``(rtol, atol)`` for comparing results of ``dtype`` (atol scales with |ref|)."""
    return _TOLERANCES.get(np.dtype(dtype), (0.0, 0.0))


def assert_close(actual, desired, *, what: str = "", rtol: float | None = None, atol: float | None = None):
    """Compare pytrees of arrays with dtype-aware tolerances.

    ``atol`` is relative to the largest magnitude in ``desired`` (at least 1),
    so sums of many terms are judged by their scale.
    """
    actual_leaves, actual_tree = jax.tree_util.tree_flatten(actual)
    desired_leaves, desired_tree = jax.tree_util.tree_flatten(desired)
    assert actual_tree == desired_tree, f"{what}: structure {actual_tree} != {desired_tree}"
    for k, (a, d) in enumerate(zip(actual_leaves, desired_leaves)):
        a, d = np.asarray(a), np.asarray(d)
        assert a.shape == d.shape, f"{what}[{k}]: shape {a.shape} != reference {d.shape}"
        if a.dtype == jax.dtypes.float0 or d.dtype == jax.dtypes.float0:
            continue
        r, t = tolerance(a.dtype)
        r = r if rtol is None else rtol
        t = t if atol is None else atol
        a64, d64 = a.astype(np.complex128 if np.iscomplexobj(a) else np.float64), d.astype(
            np.complex128 if np.iscomplexobj(d) else np.float64
        )
        scale = max(1.0, float(np.max(np.abs(d64)))) if d64.size else 1.0
        np.testing.assert_allclose(a64, d64, rtol=r, atol=t * scale, err_msg=f"{what}[{k}]")


@dataclasses.dataclass
class OpSpec:
    """What the harness needs to know about an op.

    Attributes:
        fn: the op under test, ``fn(*args) -> array or tuple of arrays``.
        reference: a dense reference with the same signature, written with
            ``jax.numpy`` so that it can itself be differentiated and vmapped.
        diff_argnums: the (float) arguments to differentiate.
        vmap_argnums: the arguments to vmap over (default: all).
        smooth: run ``jax.test_util.check_grads`` (finite differences).
        perturb: ``perturb(argnum, value, k) -> variation k`` used to build
            batches; by default floats are scaled and shifted, bools rolled and
            integers repeated (so index structures stay valid).
        batch_size: the vmapped size.
        name: shown in failure messages.
    """

    fn: Callable
    reference: Callable
    diff_argnums: Sequence[int] = ()
    vmap_argnums: Sequence[int] | None = None
    smooth: bool = True
    perturb: Callable | None = None
    batch_size: int = 3
    name: str = "op"
    rtol: float | None = None
    atol: float | None = None

    @property
    def jitted_reference(self) -> Callable:
        """The reference under ``jax.jit`` (eager jnp would compile op by op)."""
        if getattr(self, "_jitted_reference", None) is None:
            self._jitted_reference = jax.jit(self.reference)
        return self._jitted_reference

    def close(self, actual, desired, what: str) -> None:
        assert_close(actual, desired, what=f"{self.name}: {what}", rtol=self.rtol, atol=self.atol)


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------
def _is_low_precision(x) -> bool:
    return hasattr(x, "dtype") and np.dtype(x.dtype) in LOW_PRECISION


def _reference_call(spec: OpSpec, args):
    upcast = [jnp.asarray(a, jnp.float32) if _is_low_precision(a) else a for a in args]
    out = spec.jitted_reference(*upcast)
    dtypes = jax.tree_util.tree_map(lambda o: o.dtype, jax.eval_shape(spec.fn, *args))
    return jax.tree_util.tree_map(lambda o, dt: jnp.asarray(o).astype(dt), out, dtypes)


def _random_like(rng: np.random.Generator, x):
    x = np.asarray(x)
    return rng.standard_normal(x.shape).astype(x.dtype)


def _default_perturb(argnum: int, value, k: int):
    value = np.asarray(value)
    if value.dtype == np.bool_:
        return np.roll(value, k, axis=-1) if value.ndim else value
    if np.issubdtype(value.dtype, np.inexact):
        return (value * (1.0 + 0.25 * k) + 0.125 * k).astype(value.dtype)
    return value


def _make_batch(spec: OpSpec, argnum: int, value, axis: int):
    perturb = spec.perturb or _default_perturb
    stacked = np.stack([np.asarray(perturb(argnum, value, k)) for k in range(spec.batch_size)])
    return jnp.asarray(np.moveaxis(stacked, 0, axis))


def _close_over(fn, args, argnums):
    """``g(*diff_args)`` that calls ``fn`` with the other arguments fixed."""

    def g(*diff_args):
        full = list(args)
        for i, v in zip(argnums, diff_args):
            full[i] = v
        return fn(*full)

    return g


def _weighted_sum(out, weights):
    leaves = jax.tree_util.tree_leaves(out)
    return sum(jnp.sum(leaf.astype(jnp.float32) * w) for leaf, w in zip(leaves, weights))


def _out_weights(spec, args, rng):
    shapes = jax.tree_util.tree_leaves(jax.eval_shape(spec.fn, *args))
    return [jnp.asarray(rng.standard_normal(s.shape), jnp.float32) for s in shapes]


# ---------------------------------------------------------------------------
# checks
# ---------------------------------------------------------------------------
def check_forward(spec: OpSpec, args: Sequence) -> None:
    """Eager and jit forward against the reference."""
    expected = _reference_call(spec, args)
    spec.close(spec.fn(*args), expected, "eager forward")
    spec.close(jax.jit(spec.fn)(*args), expected, "jit forward")


def check_jvp(spec: OpSpec, args: Sequence, seed: int = 0) -> None:
    """``jax.jvp`` (eager and jit) against the reference's JVP."""
    if not spec.diff_argnums:
        return
    rng = np.random.default_rng(seed)
    primals = [jnp.asarray(args[i]) for i in spec.diff_argnums]
    tangents = [jnp.asarray(_random_like(rng, p)) for p in primals]
    f = _close_over(spec.fn, args, spec.diff_argnums)
    r = _close_over(lambda *a: _reference_call(spec, a), args, spec.diff_argnums)
    expected = jax.jvp(r, primals, tangents)
    spec.close(jax.jvp(f, primals, tangents), expected, "jvp")
    spec.close(jax.jit(lambda p, t: jax.jvp(f, p, t))(primals, tangents), expected, "jit(jvp)")


def check_vjp(spec: OpSpec, args: Sequence, seed: int = 1) -> None:
    """``jax.vjp`` and ``jax.jit(jax.grad)`` against the reference."""
    if not spec.diff_argnums:
        return
    rng = np.random.default_rng(seed)
    primals = [jnp.asarray(args[i]) for i in spec.diff_argnums]
    f = _close_over(spec.fn, args, spec.diff_argnums)
    r = _close_over(lambda *a: _reference_call(spec, a), args, spec.diff_argnums)
    out, f_vjp = jax.vjp(f, *primals)
    _, r_vjp = jax.vjp(r, *primals)
    cotangent = jax.tree_util.tree_map(lambda o: jnp.asarray(_random_like(rng, o)), out)
    spec.close(f_vjp(cotangent), r_vjp(cotangent), "vjp")
    weights = _out_weights(spec, args, rng)
    argnums = tuple(range(len(primals)))
    grad_f = jax.jit(jax.grad(lambda *p: _weighted_sum(f(*p), weights), argnums=argnums))
    grad_r = jax.grad(lambda *p: _weighted_sum(r(*p), weights), argnums=argnums)
    spec.close(grad_f(*primals), grad_r(*primals), "jit(grad)")


def check_grads_smooth(spec: OpSpec, args: Sequence) -> None:
    """Finite-difference check of first-order forward and reverse derivatives."""
    if not (spec.smooth and spec.diff_argnums):
        return
    from jax.test_util import check_grads

    primals = [jnp.asarray(args[i]) for i in spec.diff_argnums]
    if any(_is_low_precision(p) for p in primals):
        return
    f = _close_over(spec.fn, args, spec.diff_argnums)
    wide = any(np.dtype(p.dtype) == np.float64 for p in primals)
    tol = 1e-5 if wide else 5e-2
    check_grads(f, primals, order=1, modes=("fwd", "rev"), atol=tol, rtol=tol, eps=1e-3 if not wide else 1e-6)


def _vmap_cases(spec: OpSpec, args):
    argnums = range(len(args)) if spec.vmap_argnums is None else spec.vmap_argnums
    for i in argnums:
        for axis in (0, 1):
            if axis > np.ndim(args[i]):
                continue
            in_axes = [None] * len(args)
            in_axes[i] = axis
            batched = list(args)
            batched[i] = _make_batch(spec, i, args[i], axis)
            yield tuple(in_axes), batched


def check_vmap(spec: OpSpec, args: Sequence) -> None:
    """vmap over each argument (in_axes 0 and 1; None elsewhere) and over all at once."""
    ref = lambda *a: _reference_call(spec, a)  # noqa: E731
    for case, (in_axes, batched) in enumerate(_vmap_cases(spec, args)):
        expected = jax.jit(jax.vmap(ref, in_axes=in_axes))(*batched)
        spec.close(
            jax.jit(jax.vmap(spec.fn, in_axes=in_axes))(*batched), expected, f"jit(vmap) in_axes={in_axes}"
        )
        if case == 0:  # eager once: the same rules, without jit
            spec.close(jax.vmap(spec.fn, in_axes=in_axes)(*batched), expected, f"vmap in_axes={in_axes}")
    argnums = list(range(len(args)) if spec.vmap_argnums is None else spec.vmap_argnums)
    if len(argnums) > 1:
        in_axes = [None] * len(args)
        batched = list(args)
        for i in argnums:
            in_axes[i] = 0
            batched[i] = _make_batch(spec, i, args[i], 0)
        expected = jax.jit(jax.vmap(ref, in_axes=in_axes))(*batched)
        spec.close(jax.jit(jax.vmap(spec.fn, in_axes=in_axes))(*batched), expected, "vmap over all batched args")


def check_nested_vmap(spec: OpSpec, args: Sequence) -> None:
    """vmap of vmap: the outer over one argument, the inner over another (or the same)."""
    argnums = list(range(len(args)) if spec.vmap_argnums is None else spec.vmap_argnums)
    if not argnums:
        return
    outer, inner = argnums[0], argnums[-1]
    batched = list(args)
    inner_axes = [None] * len(args)
    outer_axes = [None] * len(args)
    inner_axes[inner] = 0
    batched[inner] = _make_batch(spec, inner, args[inner], 0)
    outer_axes[outer] = 0
    batched[outer] = _make_batch(spec, outer, batched[outer], 0)
    ref = lambda *a: _reference_call(spec, a)  # noqa: E731
    expected = jax.jit(jax.vmap(jax.vmap(ref, in_axes=inner_axes), in_axes=outer_axes))(*batched)
    actual = jax.vmap(jax.vmap(spec.fn, in_axes=inner_axes), in_axes=outer_axes)(*batched)
    spec.close(actual, expected, f"nested vmap (outer arg {outer}, inner arg {inner})")


def check_jit_grad_vmap(spec: OpSpec, args: Sequence, seed: int = 2) -> None:
    """``jit(grad(sum of vmap(op)))`` against the reference."""
    if not spec.diff_argnums:
        return
    argnums = list(range(len(args)) if spec.vmap_argnums is None else spec.vmap_argnums)
    if not argnums:
        return
    rng = np.random.default_rng(seed)
    v = argnums[-1]
    in_axes = [None] * len(args)
    in_axes[v] = 0
    batched = list(args)
    batched[v] = _make_batch(spec, v, args[v], 0)
    d = spec.diff_argnums[0]
    ref = lambda *a: _reference_call(spec, a)  # noqa: E731
    out_shapes = jax.tree_util.tree_leaves(jax.eval_shape(jax.vmap(spec.fn, in_axes=in_axes), *batched))
    weights = [jnp.asarray(rng.standard_normal(s.shape), jnp.float32) for s in out_shapes]

    def loss(fn):
        def value(x):
            full = list(batched)
            full[d] = x
            return _weighted_sum(jax.vmap(fn, in_axes=in_axes)(*full), weights)

        return value

    x = jnp.asarray(batched[d])
    spec.close(jax.jit(jax.grad(loss(spec.fn)))(x), jax.jit(jax.grad(loss(ref)))(x), "jit(grad(vmap))")


ALL_CHECKS = {
    "forward": check_forward,
    "jvp": check_jvp,
    "vjp": check_vjp,
    "check_grads": check_grads_smooth,
    "vmap": check_vmap,
    "nested_vmap": check_nested_vmap,
    "jit_grad_vmap": check_jit_grad_vmap,
}


def check_all(spec: OpSpec, args: Sequence, *, skip: Sequence[str] = ()) -> None:
    """Run every check (minus ``skip``) on one set of arguments."""
    unknown = set(skip) - set(ALL_CHECKS)
    if unknown:
        raise ValueError(f"unknown checks {sorted(unknown)}; known: {sorted(ALL_CHECKS)}")
    for name, check in ALL_CHECKS.items():
        if name not in skip:
            check(spec, args)


def property_test(
    spec: OpSpec,
    args_strategy: Any,
    *,
    max_examples: int = 10,
    skip: Sequence[str] = (),
) -> Callable[[], None]:
    """A Hypothesis test running :func:`check_all` on drawn arguments.

    Args:
        spec: the op description.
        args_strategy: a Hypothesis strategy producing a tuple of arguments.
        max_examples: how many examples Hypothesis draws (keep it small: each
            new shape may compile).
        skip: names of checks to leave out (see ``ALL_CHECKS``).
    """
    from hypothesis import HealthCheck, given, settings

    @settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        derandomize=True,
    )
    @given(args_strategy)
    def test(args):
        check_all(spec, args, skip=skip)

    test.__name__ = f"test_{spec.name}_properties"
    return test

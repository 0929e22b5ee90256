"""Property harness: check an op against a reference under every transform, on a named backend.

Describe the op with an :class:`OpSpec` (the op, a ``jax.numpy`` reference
with the same signature, the backend it asks for, which arguments are
differentiable, static or batched, and how to draw a new valid batch element),
then call :func:`check_all` on example arguments, or build a Hypothesis test
with :func:`property_test`.  ``docs/testing.md`` shows a whole example.

The checks, each on the backend the spec names:

* ``backend``: the program binds the op with that backend and its compiled
  form calls that backend's kernels (a backend whose library is missing is a
  ``pytest.skip``, never a pass);
* ``forward``: eager and ``jit``; dtypes and shapes first, then values;
* ``jvp``, ``vjp`` (eager and ``jit``), ``jit(grad)``, and ``check_grads``
  (finite differences) for smooth ops;
* ``vmap``: each argument alone at ``in_axes`` 0, -1 and 1, every other one
  ``None``; ``out_axes`` -1 and 1; all arguments at once through a dict
  (a pytree ``in_axes``); nested vmap; ``jit(grad(vmap))``.  Batch elements
  differ in every batched argument, integer structures included.

Low-precision floats (float16/bfloat16) are upcast to float32 for the
reference, so it is the op's accuracy that is measured; the op must still
return the dtypes of the reference on the original dtypes (or ``out_dtype``).

Non-finite mode (``OpSpec(nonfinite=True)``) puts NaN and infinities into the
float arguments and requires the reference's NaN and infinities exactly.

Hypothesis profiles: :func:`register_profiles` (called by the test suite's
``conftest.py``) registers ``default`` (two examples per test, random seeds)
and ``thorough`` (hundreds), chosen with ``HYPOTHESIS_PROFILE``.
"""
from __future__ import annotations

import os
import re
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from . import registry
from ._testing_core import (
    OpSpec, assert_close, jvp_program, positions, reference_jvp, reference_vjp, tolerance, vjp_program,
    weighted_sum, with_primals,
)
from ._testing_data import NNZ, SIZES, csr_resampler, inject_nonfinite, random_csr, redraw
from ._testing_vmap import VmapCase, check_jit_grad_vmap, check_nested_vmap, check_vmap, vmap_cases

__all__ = [
    "OpSpec", "tolerance", "assert_close",
    "check_backend", "require_backend", "check_forward", "check_jvp", "check_vjp", "check_grads_smooth",
    "check_vmap", "check_nested_vmap", "check_jit_grad_vmap", "ALL_CHECKS", "check_all", "property_test",
    "VmapCase", "vmap_cases", "redraw", "random_csr", "csr_resampler", "inject_nonfinite", "SIZES", "NNZ",
    "BACKEND_TARGETS", "PROFILES", "register_profiles",
]

# the custom-call targets through which each built-in backend runs its kernels
# (numba_cuda: its launch handlers on a GPU, a host callback in Numba's simulator)
BACKEND_TARGETS = {
    "numba_cuda": r"evjax_numba_cuda_launch|evjax_python_cuda|xla_ffi_python_cpu_callback",
    "numba": r"evjax_numba_\w+",
    "warp": r"evjax_warp_\w+",
}
_CUSTOM_CALL = re.compile(r"custom_call @([\w.$-]+)")


# ---------------------------------------------------------------------------
# the backend statement
# ---------------------------------------------------------------------------
def require_backend(spec: OpSpec) -> None:
    """``pytest.skip`` (with the reason) when the library of ``spec.backend`` is not installed."""
    missing = None if spec.backend is None else registry.missing_library(spec.backend)
    if missing is None:
        return
    reason = f"{spec.name}: backend {spec.backend!r} cannot run here: {missing}"
    try:
        import pytest
    except ImportError:  # pragma: no cover - the harness is used from pytest
        import unittest

        raise unittest.SkipTest(reason) from None
    pytest.skip(reason)


def _bound_ops(jaxpr):
    """``(primitive name, backend param)`` of every evjax op in ``jaxpr`` and its sub-jaxprs."""
    for eqn in jaxpr.eqns:
        if "outs" in eqn.params and "backend" in eqn.params:
            yield eqn.primitive.name, eqn.params["backend"]
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _bound_ops(inner)


def _target_backend(spec: OpSpec, target: str) -> str | None:
    if spec.backend_target and re.fullmatch(spec.backend_target, target):
        return spec.backend
    return next((name for name, pattern in BACKEND_TARGETS.items() if re.fullmatch(pattern, target)), None)


def check_backend(spec: OpSpec, args: Sequence, seed: int = 0) -> set[str]:
    """Check that the op runs on ``spec.backend``; return the backends whose kernels the programs call.

    Two signals: the backend each evjax op of the traced program is bound
    with, and the custom calls of the lowered forward (and gradient)
    program, which name the kernels that run.  With the reference, no kernel
    of another backend may appear; with a kernel backend, one of its kernels
    must (unless every output is empty, where a backend may skip the call).
    """
    if spec.backend is None:
        return set()
    require_backend(spec)
    statics, dynamic = spec.split(args)
    jaxpr = jax.make_jaxpr(lambda *d: spec.op(statics, d))(*dynamic)
    bound = list(_bound_ops(jaxpr.jaxpr))
    assert bound, f"{spec.name}: the program binds no evjax op, so backend {spec.backend!r} never ran"
    wrong = sorted({f"{n} with backend={b.per_call!r}" for n, b in bound  # b: a BackendChoice
                    if b.per_call is not None and b.per_call != spec.backend})
    assert not wrong, f"{spec.name}: asked for backend {spec.backend!r}, but the program binds {', '.join(wrong)}"
    texts = [spec.program("forward", lambda: spec.op).lower(statics, dynamic).as_text()]
    outs = jax.tree_util.tree_leaves(jax.eval_shape(lambda *d: spec.op(statics, d), *dynamic))
    if spec.diff_argnums:
        cotangent = tuple(np.zeros(o.shape, o.dtype) for o in outs)
        vjp = spec.program("vjp", lambda: vjp_program(spec.op, positions(spec)))
        texts.append(vjp.lower(statics, dynamic, cotangent).as_text())
    targets = {t for text in texts for t in _CUSTOM_CALL.findall(text)}
    found = {b for b in (_target_backend(spec, t) for t in targets) if b is not None}
    others = sorted(found - {spec.backend})
    assert not others, (f"{spec.name}: asked for backend {spec.backend!r}, but the compiled program calls "
                        f"kernels of {others} (custom calls: {sorted(targets)})")
    knows_targets = spec.backend in BACKEND_TARGETS or spec.backend_target is not None
    if knows_targets and spec.backend not in found and not any(0 in o.shape for o in outs):
        raise AssertionError(
            f"{spec.name}: asked for backend {spec.backend!r}, but the compiled program calls none of its "
            f"kernels (custom calls: {sorted(targets) or 'none'}): the op fell back to something else"
        )
    return found or {spec.backend}


# ---------------------------------------------------------------------------
# forward and derivatives
# ---------------------------------------------------------------------------
def _random_like(rng: np.random.Generator, shape, dtype):
    if not jnp.issubdtype(dtype, jnp.inexact):
        return np.zeros(shape, jax.dtypes.float0)
    return jnp.asarray(rng.standard_normal(shape), dtype)


def check_forward(spec: OpSpec, args: Sequence, seed: int = 0) -> None:
    """Eager and jit forward against the reference."""
    expected = spec.expected(args)
    statics, dynamic = spec.split(args)
    spec.close(spec.fn(*args), expected, "eager forward")
    spec.close(spec.program("forward", lambda: spec.op)(statics, dynamic), expected, "jit forward")


def check_jvp(spec: OpSpec, args: Sequence, seed: int = 1) -> None:
    """``jax.jvp``, eager and under jit, against the reference's JVP."""
    if not spec.diff_argnums:
        return
    rng = np.random.default_rng(seed)
    statics, dynamic = spec.split(args)
    pos = positions(spec)
    tangents = tuple(_random_like(rng, dynamic[p].shape, dynamic[p].dtype) for p in pos)
    expected = reference_jvp(spec, args, tangents)
    eager = jax.jvp(with_primals(spec.op, statics, dynamic, pos), [dynamic[p] for p in pos], list(tangents))
    spec.close(eager, expected, "jvp")
    jitted = spec.program("jvp", lambda: jvp_program(spec.op, pos))(statics, dynamic, tangents)
    spec.close(jitted, expected, "jit(jvp)")


def _grad_program(spec: OpSpec) -> Callable:
    pos = positions(spec)

    def run(statics, dynamic, weights):
        g = with_primals(spec.op, statics, dynamic, pos)
        loss = lambda *p: weighted_sum(g(*p), weights)  # noqa: E731
        return jax.grad(loss, argnums=tuple(range(len(pos))))(*[dynamic[p] for p in pos])

    return run


def check_vjp(spec: OpSpec, args: Sequence, seed: int = 2) -> None:
    """``jax.vjp`` (eager and under jit) and ``jit(grad)`` of a weighted sum, against the reference."""
    if not spec.diff_argnums:
        return
    rng = np.random.default_rng(seed)
    statics, dynamic = spec.split(args)
    pos = positions(spec)
    outs = jax.tree_util.tree_leaves(spec.expected(args))
    cotangent = tuple(_random_like(rng, o.shape, o.dtype) for o in outs)
    expected = tuple(reference_vjp(spec, args, cotangent))
    out, pullback = jax.vjp(with_primals(spec.op, statics, dynamic, pos), *[dynamic[p] for p in pos])
    treedef = jax.tree_util.tree_structure(out)
    spec.close(tuple(pullback(jax.tree_util.tree_unflatten(treedef, list(cotangent)))), expected, "vjp")
    jitted = spec.program("vjp", lambda: vjp_program(spec.op, pos))(statics, dynamic, cotangent)
    spec.close(tuple(jitted), expected, "jit(vjp)")
    weights = tuple(jnp.asarray(rng.standard_normal(o.shape), jnp.float32) for o in outs)
    expected = reference_vjp(spec, args, tuple(w.astype(o.dtype) for w, o in zip(weights, outs)))
    actual = spec.program("grad", lambda: _grad_program(spec))(statics, dynamic, weights)
    spec.close(tuple(actual), tuple(expected), "jit(grad)")


def check_grads_smooth(spec: OpSpec, args: Sequence, seed: int = 0) -> None:
    """Finite-difference check of first-order forward and reverse derivatives (float32/64 only)."""
    if not (spec.smooth and spec.diff_argnums) or spec.nonfinite:
        return
    from jax.test_util import check_grads

    statics, dynamic = spec.split(args)
    pos = positions(spec)
    primals = [dynamic[p] for p in pos]
    if any(np.dtype(p.dtype) not in (np.dtype(np.float32), np.dtype(np.float64)) for p in primals):
        return
    wide = any(np.dtype(p.dtype) == np.float64 for p in primals)
    tol = 1e-5 if wide else 5e-2
    check_grads(with_primals(spec.op, statics, dynamic, pos), primals, order=1, modes=("fwd", "rev"),
                atol=tol, rtol=tol, eps=1e-6 if wide else 1e-3)


ALL_CHECKS = {
    "backend": check_backend,
    "forward": check_forward,
    "jvp": check_jvp,
    "vjp": check_vjp,
    "check_grads": check_grads_smooth,
    "vmap": check_vmap,
    "nested_vmap": check_nested_vmap,
    "jit_grad_vmap": check_jit_grad_vmap,
}


def check_all(spec: OpSpec, args: Sequence, *, skip: Sequence[str] = (), seed: int = 0) -> None:
    """Run every check (minus ``skip``) on one set of arguments.

    Args:
        spec: the op description.
        args: one example, a tuple of the op's arguments.
        skip: names of checks to leave out (keys of ``ALL_CHECKS``).
        seed: seeds the tangents, cotangents, batch elements and (non-finite
            mode) where NaN and infinities go.

    Raises:
        AssertionError: a check failed; the message names the op and the check.
        ValueError: an unknown check name, or a batch over an integer argument
            the spec cannot redraw (give it ``resample``).
    """
    unknown = set(skip) - set(ALL_CHECKS)
    if unknown:
        raise ValueError(f"unknown checks {sorted(unknown)}; known: {sorted(ALL_CHECKS)}")
    require_backend(spec)
    args = tuple(args)
    if spec.nonfinite:
        args = spec.with_nonfinite(np.random.default_rng(seed), args, spec.nonfinite_targets(args))
    for offset, (name, check) in enumerate(ALL_CHECKS.items()):
        if name not in skip:
            check(spec, args, seed=seed + offset)


# ---------------------------------------------------------------------------
# Hypothesis
# ---------------------------------------------------------------------------
PROFILES = {"default": 2, "thorough": 300}  # examples per test (default: docs/testing.md, "Profiles")


def register_profiles(name: str | None = None) -> str:
    """Register the Hypothesis profiles ``default`` and ``thorough`` and load one.

    ``default`` (CI): two examples per test, a fresh random seed each run
    (a real search; a failure prints the blob that replays it).  ``thorough``:
    hundreds of examples per test.  Both: no deadline (compiles are slow).

    Args:
        name: the profile to load (default: ``$HYPOTHESIS_PROFILE``, else ``default``).

    Returns:
        The loaded profile's name.
    """
    from hypothesis import HealthCheck, settings

    common = dict(deadline=None, print_blob=True, derandomize=False,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    for profile, examples in PROFILES.items():
        settings.register_profile(profile, max_examples=examples, **common)
    name = name or os.environ.get("HYPOTHESIS_PROFILE") or "default"
    if name not in PROFILES:
        raise ValueError(f"unknown Hypothesis profile {name!r}: HYPOTHESIS_PROFILE must be one of {list(PROFILES)}")
    settings.load_profile(name)
    return name


def property_test(spec: OpSpec | Callable[[str], OpSpec], args_strategy: Any, *,
                  backends: Sequence[str] | None = None, skip: Sequence[str] = (),
                  max_examples: int | None = None) -> Callable[..., None]:
    """A pytest test that runs :func:`check_all` on examples Hypothesis draws.

    Args:
        spec: the op description, or (with ``backends``) a function
            ``backend -> OpSpec``, called once per backend and test.
        args_strategy: a Hypothesis strategy of argument tuples.
        backends: make one test per backend (``pytest.mark.parametrize``;
            the test id names the backend).
        skip: names of checks to leave out (see ``ALL_CHECKS``).
        max_examples: override the loaded profile's count (avoid: the
            profile is how CI and thorough runs differ).

    The batch seed is drawn too, so Hypothesis searches and replays the
    batch elements and the non-finite positions with the arguments.
    """
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    def run(one: OpSpec) -> None:
        require_backend(one)
        extra = {} if max_examples is None else {"max_examples": max_examples}

        @settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], **extra)
        @given(args=args_strategy, seed=st.integers(0, 2**32 - 1))
        def examples(args, seed):
            check_all(one, args, skip=skip, seed=seed)

        examples()

    if backends is None:
        if not isinstance(spec, OpSpec):
            raise TypeError("property_test: pass an OpSpec, or a function backend -> OpSpec with backends=[...]")

        def test_properties():
            run(spec)

        test_properties.__name__ = f"test_{spec.name}_properties"
        return test_properties

    import pytest

    if isinstance(spec, OpSpec):
        raise TypeError("property_test: with backends=, pass a function backend -> OpSpec, not an OpSpec")
    built: dict[str, OpSpec] = {}

    @pytest.mark.parametrize("backend", list(backends))
    def test_properties(backend):
        if backend not in built:
            built[backend] = spec(backend)
        run(built[backend])

    return test_properties

"""The op description of the property harness, its comparisons and its compiled programs.

Re-exported by :mod:`evjax.testing` (see there).  The checks reuse compiled
programs across examples: each transform of the op is jitted once per
:class:`OpSpec` and key, each transform of the reference once per reference
(shared by the specs of every backend), with the static arguments as static
jit arguments, so a new example of known shapes compiles nothing.
"""
from __future__ import annotations

import dataclasses
import functools
import types
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from . import _testing_data as data
from .dtypes import LOW_PRECISION

__all__ = ["OpSpec", "tolerance", "assert_close"]

_TOLERANCES = {
    np.dtype(np.float64): (1e-9, 1e-9),
    np.dtype(np.complex128): (1e-9, 1e-9),
    np.dtype(np.float32): (2e-4, 2e-5),
    np.dtype(np.complex64): (2e-4, 2e-5),
    np.dtype(np.float16): (2e-2, 2e-3),
    np.dtype(jnp.bfloat16): (4e-2, 8e-3),
}


def tolerance(dtype) -> tuple[float, float]:
    """``(rtol, atol)`` for comparing results of ``dtype`` (atol scales with |reference|)."""
    return _TOLERANCES.get(np.dtype(dtype), (0.0, 0.0))


def assert_close(actual, desired, *, what: str = "", rtol: float | None = None, atol: float | None = None):
    """Compare pytrees of arrays: structure, then shapes, then dtypes, then values.

    Dtypes must be equal (nothing is cast).  Values: NaN where the reference
    has NaN and nowhere else, the same infinities, and the finite entries
    within ``rtol`` and ``atol`` times the largest finite magnitude of the
    reference (at least 1), so that sums of many terms are judged by their
    scale.  Integer and bool results must be equal.

    Raises:
        AssertionError: the first difference, named by ``what`` and the leaf.
    """
    actual_leaves, actual_tree = jax.tree_util.tree_flatten(actual)
    desired_leaves, desired_tree = jax.tree_util.tree_flatten(desired)
    assert actual_tree == desired_tree, f"{what}: structure {actual_tree} != reference {desired_tree}"
    for k, (a, d) in enumerate(zip(actual_leaves, desired_leaves)):
        a, d = np.asarray(a), np.asarray(d)
        where = f"{what}[{k}]"
        assert a.shape == d.shape, f"{where}: shape {a.shape} != reference {d.shape}"
        assert a.dtype == d.dtype, f"{where}: dtype {a.dtype} != expected {d.dtype}"
        if a.dtype == jax.dtypes.float0:
            continue
        if not jnp.issubdtype(a.dtype, jnp.inexact):
            np.testing.assert_array_equal(a, d, err_msg=where)
            continue
        r, t = tolerance(a.dtype)
        _compare_floats(a, d, where, r if rtol is None else rtol, t if atol is None else atol)


def _compare_floats(a, d, where: str, rtol: float, atol: float) -> None:
    wide = np.complex128 if np.iscomplexobj(a) or np.iscomplexobj(d) else np.float64
    a, d = a.astype(wide), d.astype(wide)
    nan_a, nan_d = np.isnan(a), np.isnan(d)
    if not np.array_equal(nan_a, nan_d):
        first = np.argwhere(nan_a != nan_d)[0]
        raise AssertionError(
            f"{where}: NaN positions differ ({int(nan_a.sum())} NaN, reference {int(nan_d.sum())}); first at "
            f"{tuple(int(i) for i in first)}: got {a[tuple(first)]}, reference {d[tuple(first)]}"
        )
    inf_a, inf_d = np.isinf(a), np.isinf(d)
    same_inf = np.array_equal(inf_a, inf_d) and np.array_equal(a[inf_a], d[inf_d])
    if not same_inf:
        first = np.argwhere((inf_a != inf_d) | (inf_a & (a != d)))[0]
        raise AssertionError(f"{where}: infinities differ; first at {tuple(int(i) for i in first)}: got "
                             f"{a[tuple(first)]}, reference {d[tuple(first)]}")
    finite = np.isfinite(d)
    scale = max(1.0, float(np.max(np.abs(d[finite])))) if finite.any() else 1.0
    np.testing.assert_allclose(np.where(finite, a, 0), np.where(finite, d, 0), rtol=rtol, atol=atol * scale,
                               err_msg=where)


# Every compiled XLA:CPU program keeps about 18 memory mappings until JAX's caches drop it; a long
# run (the ``thorough`` profile draws hundreds of shapes per test, each a new compile) reached the
# kernel's limit of 65530 mappings (``vm.max_map_count``), and XLA then crashed in LLVM ("Cannot
# allocate memory") instead of raising.  So every CHECK_EVERY program uses the harness counts this
# process's mappings (Linux) and clears JAX's caches above MAX_MAPPINGS (programs recompile on use).
CHECK_EVERY = 100
MAX_MAPPINGS = 30000
_uses = 0


def _mappings() -> int:
    try:
        with open("/proc/self/maps", "rb") as maps:
            return sum(1 for _ in maps)
    except OSError:  # not Linux: nothing to count
        return 0


def _relieve_mappings() -> None:
    global _uses
    _uses += 1
    if _uses % CHECK_EVERY == 0 and _mappings() > MAX_MAPPINGS:
        jax.clear_caches()


# Reference programs shared between specs.  A family's tests build one spec per backend around the
# same reference, and Hypothesis's first example is the same minimal one for each, so without
# sharing every backend compiled the same reference programs again: a third of a harness file's
# compiles.  The key holds everything ``OpSpec.exact_reference`` depends on.
_SHARED_REFERENCES: dict = {}


def _callable_key(f: Any) -> Any:
    """A key equal for two callables that compute the same: code, globals, defaults and closure values.

    Values count with their types (a closure over ``2`` is not one over ``2.0``, nor ``1`` one over
    ``True``).  Falls back to the callable itself (its identity) when a part is not hashable (an
    array, a dict).
    """
    if isinstance(f, functools.partial):
        key = ("partial", _callable_key(f.func), _value_key(f.args), _value_key(tuple(sorted(f.keywords.items()))))
    elif isinstance(f, types.FunctionType):
        try:
            cells = tuple(c.cell_contents for c in f.__closure__ or ())
        except ValueError:  # an empty cell (a closure not yet filled)
            return f
        kwdefaults = tuple(sorted((f.__kwdefaults__ or {}).items()))
        key = ("function", f.__code__, id(f.__globals__), _value_key(f.__defaults__), _value_key(kwdefaults),
               _value_key(cells))
    else:
        return f
    try:
        hash(key)
    except TypeError:
        return f
    return key


def _value_key(value: Any) -> Any:
    """``value`` with its type (tuples element by element), callables by :func:`_callable_key`."""
    if isinstance(value, tuple):
        return (tuple, tuple(_value_key(v) for v in value))
    if callable(value):
        return _callable_key(value)
    return (type(value), value)


def _cached_program(store: dict, key: Any, make: Callable[[], Callable]) -> Callable:
    """``store[key]``, else ``jax.jit(make(), static_argnums=0)`` stored there (the first argument: the statics)."""
    _relieve_mappings()
    program = store.get(key)
    if program is None:
        program = store[key] = jax.jit(make(), static_argnums=0)
    return program


@dataclasses.dataclass(eq=False)
class OpSpec:
    """What the harness needs to know about an op.

    Attributes:
        fn: the op under test, ``fn(*args) -> array or pytree of arrays``.
        reference: a reference with the same signature, written with
            ``jax.numpy`` (differentiable; it need not be vmappable).  Its
            result dtypes, on the arguments' own dtypes, are the dtypes the op
            must return.  Specs with the same reference (the same function, or
            functions of the same code whose closures hold equal hashable
            values), ``out_dtype``, static and differentiated arguments share
            its compiled programs: the spec of each backend compiles it once.
        diff_argnums: the (float) arguments to differentiate.
        vmap_argnums: the arguments to vmap over (default: every non-static one).
        static_argnums: arguments that are hashable Python values (a shape, a
            flag): never batched nor differentiated, static under ``jit``.
        backend: the backend ``fn`` asks for.  The harness checks that the
            program really runs it, and skips (``pytest.skip``) when its
            library is not installed.  ``None``: not checked.
        resample: ``resample(rng, args, argnums) -> args``: a new valid argument
            tuple with the same shapes and dtypes, in which the arguments
            ``argnums`` are redrawn and the others kept.  The harness builds
            vmap batches from it.  Default: :func:`evjax.testing.redraw`, which
            refuses integer arguments (use :func:`evjax.testing.csr_resampler`
            for CSR structures).
        out_dtype: ``out_dtype(*args) -> dtype or pytree of dtypes`` the op
            must return, where the reference's dtypes are not that rule.
        smooth: run ``jax.test_util.check_grads`` (finite differences).
        nonfinite: put NaN, +inf and -inf into the float arguments
            ``nonfinite_argnums`` (default: every float argument) and require
            the same NaN and infinities as the reference; no finite differences.
        batch_size: the vmapped size.
        name: shown in failure messages.
        rtol, atol: override the dtype's tolerances.
        backend_target: a regular expression matching the custom-call target
            of a backend the harness does not know (it knows numba, warp and
            numba_cuda).
        perturb: (older form of ``resample``, float and bool arguments only)
            ``perturb(argnum, value, k) -> value`` of batch element ``k``.
    """

    fn: Callable
    reference: Callable
    diff_argnums: Sequence[int] = ()
    vmap_argnums: Sequence[int] | None = None
    static_argnums: Sequence[int] = ()
    backend: str | None = None
    resample: Callable | None = None
    out_dtype: Callable | None = None
    smooth: bool = True
    nonfinite: bool = False
    nonfinite_argnums: Sequence[int] | None = None
    batch_size: int = 3
    name: str = "op"
    rtol: float | None = None
    atol: float | None = None
    backend_target: str | None = None
    perturb: Callable | None = None
    _programs: dict = dataclasses.field(default_factory=dict, init=False, repr=False)

    def close(self, actual, desired, what: str) -> None:
        """:func:`assert_close` with this op's name and tolerances."""
        assert_close(actual, desired, what=f"{self.name}: {what}", rtol=self.rtol, atol=self.atol)

    # ------------------------------------------------------------ arguments
    def split(self, args: Sequence) -> tuple[tuple, tuple]:
        """``(static values, dynamic arrays)``; arrays become ``jnp`` arrays."""
        statics = tuple(args[i] for i in self.static_argnums)
        dynamic = tuple(jnp.asarray(a) for i, a in enumerate(args) if i not in self.static_argnums)
        return statics, dynamic

    def join(self, statics: tuple, dynamic: Sequence) -> list:
        """The full argument list from :meth:`split`'s parts."""
        n = len(statics) + len(dynamic)
        it_s, it_d = iter(statics), iter(dynamic)
        static = set(self.static_argnums)
        return [next(it_s) if i in static else next(it_d) for i in range(n)]

    def position(self, argnum: int) -> int:
        """Index of argument ``argnum`` among the dynamic arguments."""
        return argnum - sum(1 for s in self.static_argnums if s < argnum)

    def batchable(self, args: Sequence) -> list[int]:
        """The arguments vmap runs over."""
        if self.vmap_argnums is not None:
            return list(self.vmap_argnums)
        return [i for i in range(len(args)) if i not in self.static_argnums]

    # ------------------------------------------------------------- programs
    def program(self, key: Any, make: Callable[[], Callable]) -> Callable:
        """``jax.jit(make(), static_argnums=0)``, built once per key (the first argument: the statics)."""
        return _cached_program(self._programs, key, make)

    def reference_program(self, kind: str, make: Callable[[], Callable]) -> Callable:
        """:meth:`program` for the reference's programs, shared by every spec with the same reference."""
        key = (kind, _callable_key(self.reference), _callable_key(self.out_dtype), tuple(self.static_argnums),
               positions(self))
        return _cached_program(_SHARED_REFERENCES, key, make)

    def op(self, statics: tuple, dynamic: Sequence):
        return self.fn(*self.join(statics, dynamic))

    def exact_reference(self, statics: tuple, dynamic: Sequence):
        """The reference on float32 copies of low-precision arrays, in the dtypes the op must return."""
        dtypes = self.expected_dtypes(statics, dynamic)
        upcast = [jnp.asarray(a, jnp.float32) if _low_precision(a) else a for a in dynamic]
        out = self.reference(*self.join(statics, upcast))
        return jax.tree_util.tree_map(lambda o, dt: jnp.asarray(o).astype(dt), out, dtypes)

    def expected_dtypes(self, statics: tuple, dynamic: Sequence):
        """The result dtypes: ``out_dtype(*args)``, else those of the reference on the original dtypes."""
        if self.out_dtype is not None:
            dtypes = self.out_dtype(*self.join(statics, dynamic))
            if not isinstance(dtypes, (list, tuple, dict)):
                shapes = jax.eval_shape(lambda *d: self.reference(*self.join(statics, d)), *_structs(dynamic))
                return jax.tree_util.tree_map(lambda _: np.dtype(dtypes), shapes)
            return jax.tree_util.tree_map(np.dtype, dtypes)
        shapes = jax.eval_shape(lambda *d: self.reference(*self.join(statics, d)), *_structs(dynamic))
        return jax.tree_util.tree_map(lambda s: np.dtype(s.dtype), shapes)

    def expected(self, args: Sequence):
        """The reference's result for ``args`` (one compiled program per shape)."""
        statics, dynamic = self.split(args)
        return self.reference_program("reference", lambda: self.exact_reference)(statics, dynamic)

    # ------------------------------------------------------------ batches
    def elements(self, rng: np.random.Generator, args: Sequence, argnums: Sequence[int], size: int) -> list:
        """``size`` valid argument tuples: ``args`` first, then ones with ``argnums`` redrawn."""
        elements = [tuple(args)]
        for k in range(1, size):
            elements.append(self.redraw(rng, args, argnums, k))
        return elements

    def redraw(self, rng: np.random.Generator, args: Sequence, argnums: Sequence[int], k: int = 1) -> tuple:
        """One new valid argument tuple with ``argnums`` redrawn (see ``resample``)."""
        argnums = list(argnums)
        if self.resample is not None:
            new = tuple(self.resample(rng, tuple(args), tuple(argnums)))
        elif self.perturb is not None:
            ints = [i for i in argnums if not _float_or_bool(args[i])]
            new = data.redraw(rng, args, ints)  # raises: integers need resample
            new = tuple(self.perturb(i, a, k) if i in argnums else a for i, a in enumerate(new))
        else:
            new = data.redraw(rng, args, argnums)
        for i, (old, fresh) in enumerate(zip(args, new)):
            if i in self.static_argnums:
                continue
            if np.shape(old) != np.shape(fresh) or np.asarray(old).dtype != np.asarray(fresh).dtype:
                raise ValueError(
                    f"{self.name}: resample changed argument {i} from {np.asarray(old).dtype}{np.shape(old)} to "
                    f"{np.asarray(fresh).dtype}{np.shape(fresh)}; batch elements must keep shapes and dtypes"
                )
        if self.nonfinite:
            new = self.with_nonfinite(rng, new, [i for i in argnums if i in self.nonfinite_targets(new)])
        return new

    def nonfinite_targets(self, args: Sequence) -> list[int]:
        """The arguments that get NaN and infinities in non-finite mode."""
        if self.nonfinite_argnums is not None:
            return list(self.nonfinite_argnums)
        return [i for i, a in enumerate(args) if i not in self.static_argnums and _float(a)]

    def with_nonfinite(self, rng: np.random.Generator, args: Sequence, argnums: Sequence[int]) -> tuple:
        return tuple(data.inject_nonfinite(rng, a) if i in argnums else a for i, a in enumerate(args))


def _structs(arrays: Sequence) -> list:
    return [jax.ShapeDtypeStruct(np.shape(a), a.dtype) for a in arrays]


def _float(x) -> bool:
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)


def _float_or_bool(x) -> bool:
    return _float(np.asarray(x)) or np.asarray(x).dtype == np.bool_


def _low_precision(x) -> bool:
    return hasattr(x, "dtype") and np.dtype(x.dtype) in LOW_PRECISION


# ---------------------------------------------------------------------------
# transforms of the op and of the reference, as cached programs
# ---------------------------------------------------------------------------
def with_primals(f: Callable, statics: tuple, dynamic: Sequence, positions: Sequence[int]) -> Callable:
    """``g(*primals)``: ``f(statics, dynamic)`` with the dynamic arguments at ``positions`` replaced."""

    def g(*primals):
        full = list(dynamic)
        for p, x in zip(positions, primals):
            full[p] = x
        return f(statics, full)

    return g


def jvp_program(f: Callable, positions: Sequence[int]) -> Callable:
    """``run(statics, dynamic, tangents) -> (outputs, output tangents)``."""

    def run(statics, dynamic, tangents):
        primals = [dynamic[p] for p in positions]
        return jax.jvp(with_primals(f, statics, dynamic, positions), primals, list(tangents))

    return run


def vjp_program(f: Callable, positions: Sequence[int]) -> Callable:
    """``run(statics, dynamic, cotangent leaves) -> cotangents of the arguments at positions``."""

    def run(statics, dynamic, cotangent):
        out, pullback = jax.vjp(with_primals(f, statics, dynamic, positions), *[dynamic[p] for p in positions])
        return pullback(jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out), list(cotangent)))

    return run


def positions(spec: OpSpec) -> tuple[int, ...]:
    """The dynamic positions of ``spec.diff_argnums``."""
    return tuple(spec.position(i) for i in spec.diff_argnums)


def reference_jvp(spec: OpSpec, args: Sequence, tangents: Sequence):
    statics, dynamic = spec.split(args)
    make = lambda: jvp_program(spec.exact_reference, positions(spec))  # noqa: E731
    return spec.reference_program("reference_jvp", make)(statics, dynamic, tuple(tangents))


def reference_vjp(spec: OpSpec, args: Sequence, cotangent: Sequence):
    """Cotangents of ``spec.diff_argnums`` for output cotangent leaves ``cotangent``."""
    statics, dynamic = spec.split(args)
    make = lambda: vjp_program(spec.exact_reference, positions(spec))  # noqa: E731
    return spec.reference_program("reference_vjp", make)(statics, dynamic, tuple(cotangent))


def weighted_sum(out, weights):
    """``sum_i sum(out_i * weights_i)`` in float32: the scalar loss whose gradient the checks compare."""
    leaves = jax.tree_util.tree_leaves(out)
    return sum(jnp.sum(leaf.astype(jnp.float32) * w) for leaf, w in zip(leaves, weights))

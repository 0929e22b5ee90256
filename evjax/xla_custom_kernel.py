"""``XLACustomKernel``: one JAX primitive per operator, with backends and rules.

An op bundles

* a JAX primitive with several results, whose abstract eval comes from ``outs``;
* a table of backends per platform (``_kernels[platform][backend] = generator``),
  a default per platform (``defaults``) and a pure-JAX ``reference``;
* kernel generators, called once per distinct signature (static params,
  ``outs``, input shapes and dtypes) and cached;
* rule slots for JVP, transpose and batching.

Fill it either by calling the ``def_*`` methods on an instance, or by
subclassing and defining ``reference``, ``jvp_rule``, ``transpose_rule`` and
``batching_rule`` as methods.
"""
from __future__ import annotations

import functools
import inspect
import threading
from typing import Any, Callable, Sequence

import jax
import numpy as np

from . import _compat, config
from .outs import normalize_outs
from .rules import ad as ad_rules
from .rules import batching as batching_rules

PLATFORMS = ("cpu", "gpu")
_LOWERING_PLATFORMS = {"cpu": "cpu", "cuda": "gpu", "rocm": "gpu"}
REFERENCE = "reference"

__all__ = ["XLACustomKernel", "KernelGenerator"]


def call_with_accepted(fn: Callable, *args, **kwargs):
    """Call ``fn``, passing only the keyword arguments its signature accepts."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return fn(*args, **kwargs)
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return fn(*args, **kwargs)
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return fn(*args, **{k: v for k, v in kwargs.items() if k in names})


def as_list(result) -> list:
    """A kernel's or rule's result as a list of arrays."""
    if isinstance(result, (list, tuple)):
        return list(result)
    return [result]


class KernelGenerator:
    """A backend's kernel generator, with a cache of kernels per signature.

    The generator is called as ``generator(outs=..., ins=..., **params)`` (only
    the keywords it accepts are passed) and returns a function of the input
    arrays that returns the outputs; it runs once per distinct signature.
    """

    def __init__(self, generator: Callable[..., Callable]):
        if not callable(generator):
            raise TypeError(f"a kernel generator must be callable, got {type(generator).__name__}")
        self.generator = generator
        self._cache: dict[Any, Callable] = {}
        self._lock = threading.Lock()

    def __call__(self, outs, ins, params: dict) -> Callable:
        key = (outs, ins, tuple(sorted(params.items())))
        with self._lock:
            kernel = self._cache.get(key)
            if kernel is None:
                kernel = call_with_accepted(self.generator, outs=outs, ins=ins, **params)
                if not callable(kernel):
                    raise TypeError(
                        f"kernel generator {getattr(self.generator, '__name__', self.generator)!r} "
                        f"returned {type(kernel).__name__}, not a callable kernel"
                    )
                self._cache[key] = kernel
            return kernel


def _check_hashable(op_name: str, params: dict) -> None:
    for name, value in params.items():
        try:
            hash(value)
        except TypeError:
            raise TypeError(
                f"op '{op_name}': parameter {name}={value!r} is unhashable ({type(value).__name__}). "
                f"Static parameters must be hashable: pass a tuple instead of a list, or an array as "
                f"a positional operand."
            ) from None


class XLACustomKernel:
    """A JAX primitive with per-platform backends and explicit transform rules.

    Args:
        name: the primitive's name (shown in jaxprs and error messages).

    Example:
        >>> op = XLACustomKernel("my_scale")
        >>> op.def_numba_kernel(my_generator)          # CPU backend
        >>> op.def_reference(lambda x, s, **kw: [x * s])
        >>> y, = op(x, s, outs=[jax.ShapeDtypeStruct(x.shape, x.dtype)])
    """

    def __init__(self, name: str):
        self.name = name
        self.primitive = _compat.VaryingPrimitive(name)
        self.primitive.multiple_results = True
        self._kernels: dict[str, dict[str, KernelGenerator]] = {}
        self.defaults: dict[str, str] = {}
        self._reference: Callable | None = None
        self._jvp_whole: Callable | None = None
        self._jvp_per_input: tuple[Callable | None, ...] | None = None
        self._transpose: Callable | None = None
        self._batching: Callable | None = None
        self._register_with_jax()
        self._adopt_subclass_methods()

    def __repr__(self) -> str:
        backends = {p: sorted(b) for p, b in self._kernels.items()}
        return f"XLACustomKernel({self.name!r}, backends={backends}, defaults={self.defaults})"

    # ------------------------------------------------------------------ backends
    def def_kernel(self, backend: str, platform: str, generator: Callable, *, default: bool | None = None):
        """Register ``generator`` as ``backend`` on ``platform`` ("cpu" or "gpu").

        The first backend registered on a platform becomes its default unless
        ``default=False``; ``default=True`` makes this one the default.
        """
        if platform not in PLATFORMS:
            raise ValueError(f"op '{self.name}': unknown platform {platform!r}; use one of {PLATFORMS}")
        if backend == REFERENCE:
            raise ValueError(f"op '{self.name}': use def_reference for the pure-JAX reference backend")
        self._kernels.setdefault(platform, {})[backend] = KernelGenerator(generator)
        if default or (default is None and platform not in self.defaults):
            self.defaults[platform] = backend
        return generator

    def def_numba_kernel(self, generator: Callable, *, default: bool | None = None):
        """Register a Numba CPU kernel generator (backend ``"numba"``, platform cpu)."""
        return self.def_kernel("numba", "cpu", generator, default=default)

    def def_numba_cuda_kernel(self, generator: Callable, *, default: bool | None = None):
        """Register a Numba CUDA kernel generator (backend ``"numba_cuda"``, platform gpu)."""
        return self.def_kernel("numba_cuda", "gpu", generator, default=default)

    def def_warp_kernel(self, generator: Callable, *, default: bool | None = None):
        """Register a Warp kernel generator (backend ``"warp"``) for cpu and gpu.

        On CPU it becomes the default only if no other CPU backend exists.
        """
        self.def_kernel("warp", "cpu", generator, default=False if default is None else default)
        if "cpu" not in self.defaults:
            self.defaults["cpu"] = "warp"
        return self.def_kernel("warp", "gpu", generator, default=default)

    def def_reference(self, fn: Callable):
        """Register the pure-JAX reference: ``fn(*args, outs=..., **params)``.

        It runs on every platform, is the fallback when no backend is
        registered, is selectable as ``backend="reference"`` and is the tests'
        oracle.
        """
        self._reference = fn
        return fn

    def set_default(self, platform: str, backend: str) -> None:
        """Make ``backend`` the default on ``platform`` (clears JAX's compilation caches)."""
        if backend != REFERENCE and backend not in self._kernels.get(platform, {}):
            raise ValueError(
                f"op '{self.name}' has no backend {backend!r} on {platform}; "
                f"registered: {sorted(self._kernels.get(platform, {}))}"
            )
        self.defaults[platform] = backend
        jax.clear_caches()  # compiled calls made before chose their backend under the old default

    def backends(self, platform: str) -> list[str]:
        """The backends available on ``platform``, the reference included."""
        names = sorted(self._kernels.get(platform, {}))
        return names + ([REFERENCE] if self._reference is not None else [])

    # --------------------------------------------------------------------- rules
    def def_jvp_rule(self, rule: Callable):
        """Whole-op JVP: ``rule(primals, tangents, *, outs, **params) -> (primals_out, tangents_out)``.

        Tangents of inputs that do not vary are symbolic zeros
        (:func:`evjax.rules.ad.is_zero`).
        """
        self._jvp_whole, self._jvp_per_input = rule, None
        return rule

    def def_jvp_rule2(self, *rules: Callable | None):
        """One JVP rule per input: ``rule_i(tangent_i, *primals, outs, **params) -> tangents_out``.

        ``None`` means the outputs do not depend (differentiably) on that input.
        The number of rules must equal the number of operands at each call.
        """
        self._jvp_per_input, self._jvp_whole = tuple(rules), None
        return rules

    def def_transpose_rule(self, rule: Callable):
        """Transpose: ``rule(cotangents, *args, outs, **params) -> cotangent per arg``.

        Linear arguments arrive as :class:`jax.interpreters.ad.UndefinedPrimal`;
        return ``None`` for arguments that need no cotangent.
        """
        self._transpose = rule
        return rule

    def def_batching_rule(self, rule: Callable):
        """Batching: ``rule(args, axes, *, outs, **params) -> (outputs, out_axes)``.

        Without one, vmap runs a correct sequential loop over the batch.
        """
        self._batching = rule
        return rule

    def _adopt_subclass_methods(self) -> None:
        cls = type(self)
        for method, setter in (
            ("reference", self.def_reference),
            ("jvp_rule", self.def_jvp_rule),
            ("transpose_rule", self.def_transpose_rule),
            ("batching_rule", self.def_batching_rule),
        ):
            if callable(getattr(cls, method, None)):
                setter(getattr(self, method))

    # ----------------------------------------------------------------- calling
    def __call__(self, *args, outs, backend: str | None = None, **params) -> list:
        """Bind the primitive: ``op(*arrays, outs=[...], backend=None, **static_params)``.

        Returns:
            A list of output arrays, one per entry of ``outs``.
        """
        return self.bind(*args, outs=outs, backend=backend, **params)

    def bind(self, *args, outs, backend: str | None = None, **params) -> list:
        """Same as calling the op."""
        outs, _ = normalize_outs(outs, who=f"op '{self.name}'")
        _check_hashable(self.name, params)
        if backend is not None:
            self._check_backend_known(backend)
        else:  # a global/context choice applies only where this op has that backend
            chosen = config.get_backend()
            if chosen is not None and chosen in self._all_backends():
                backend = chosen
        return self.primitive.bind(*args, outs=outs, backend=backend, **params)

    def _all_backends(self) -> set[str]:
        known = {b for table in self._kernels.values() for b in table}
        return known | ({REFERENCE} if self._reference is not None else set())

    def _check_backend_known(self, backend: str) -> None:
        known = self._all_backends()
        if backend == REFERENCE and self._reference is None:
            raise ValueError(f"op '{self.name}' has no reference implementation; define one with def_reference")
        if backend != REFERENCE and backend not in known:
            raise ValueError(
                f"op '{self.name}' has no backend {backend!r}. Registered: "
                f"{ {p: sorted(t) for p, t in self._kernels.items()} }"
                f"{' and reference' if self._reference else ''}."
            )

    # ---------------------------------------------------------- JAX machinery
    def _register_with_jax(self) -> None:
        prim = self.primitive
        prim.def_impl(functools.partial(_compat.apply_primitive, prim))
        prim.def_abstract_eval(self._abstract_eval)
        for lowering_platform, platform in _LOWERING_PLATFORMS.items():
            _compat.register_lowering(
                prim, functools.partial(self._lower, platform), platform=lowering_platform
            )
        _compat.primitive_jvps[prim] = self._jvp
        _compat.primitive_transposes[prim] = self._transpose_dispatch
        _compat.primitive_batchers[prim] = self._batch

    @staticmethod
    def _abstract_eval(*avals, outs, **params):
        return [_compat.output_aval(o.shape, o.dtype, avals) for o in outs]

    def _choose_backend(self, platform: str, requested: str | None) -> str:
        table = self._kernels.get(platform, {})
        if requested is not None:
            if requested == REFERENCE or requested in table:
                return requested
            raise ValueError(
                f"op '{self.name}': backend {requested!r} is not available on {platform}; "
                f"available there: {self.backends(platform)}"
            )
        default = self.defaults.get(platform)
        if default is not None:
            return default
        if self._reference is not None:
            return REFERENCE
        raise NotImplementedError(
            f"op '{self.name}' has no backend for platform '{platform}' and no reference. Register one "
            f"with def_numba_kernel / def_warp_kernel / def_numba_cuda_kernel, or def_reference."
        )

    def kernel_for(self, platform: str, backend: str | None, args_avals, outs, params) -> Callable:
        """The function of arrays that implements the op for this signature."""
        name = self._choose_backend(platform, backend)
        if name == REFERENCE:
            return functools.partial(call_with_accepted, self._reference, outs=outs, **params)
        ins = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args_avals)
        return self._kernels[platform][name](outs, ins, params)

    def _lower(self, platform, ctx, *args, outs, backend, **params):
        kernel = self.kernel_for(platform, backend, ctx.avals_in, outs, params)
        expected = [(tuple(o.shape), np.dtype(o.dtype)) for o in outs]

        def run(*arrays):
            results = as_list(kernel(*arrays))
            got = [(tuple(r.shape), np.dtype(r.dtype)) for r in results]
            if got != expected:
                raise TypeError(
                    f"op '{self.name}': the {backend or 'default'} kernel returned {got}, but `outs` "
                    f"promised {expected}"
                )
            return results

        return _compat.lower_fun(run, multiple_results=True)(ctx, *args)

    def _jvp(self, primals, tangents, *, outs, **params):
        if self._jvp_whole is not None:
            primals_out, tangents_out = self._jvp_whole(primals, tangents, outs=outs, **params)
            return as_list(primals_out), as_list(tangents_out)
        if self._jvp_per_input is None:
            raise NotImplementedError(
                f"op '{self.name}' has no JVP rule, so jax.jvp/jax.grad cannot differentiate it. "
                f"Add one with op.def_jvp_rule(rule) or op.def_jvp_rule2(*per_input_rules) "
                f"(evjax.rules.ad.linear_jvp_rules builds them for linear arguments)."
            )
        return ad_rules.apply_per_input_jvp(
            self.name, self.primitive, self._jvp_per_input, primals, tangents, outs=outs, **params
        )

    def _transpose_dispatch(self, cotangents, *args, outs, **params):
        if self._transpose is None:
            raise NotImplementedError(
                f"op '{self.name}' has no transpose rule, so reverse-mode differentiation (jax.grad, "
                f"jax.vjp) cannot run through it. Add one with op.def_transpose_rule(rule)."
            )
        cotangents = [ad_rules.instantiate(ct, o) for ct, o in zip(cotangents, outs)]
        result = as_list(self._transpose(cotangents, *args, outs=outs, **params))
        if len(result) != len(args):
            raise ValueError(
                f"op '{self.name}': the transpose rule returned {len(result)} cotangents for "
                f"{len(args)} operands; return one per operand (None where not needed)"
            )
        return result

    def _batch(self, args, axes, *, outs, **params):
        if self._batching is not None:
            result, out_axes = self._batching(args, axes, outs=outs, **params)
            return as_list(result), as_list(out_axes)
        return batching_rules.sequential_batch(self.primitive, args, axes, outs=outs, **params)

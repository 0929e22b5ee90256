"""``XLACustomKernel``: one JAX primitive per operator, with backends and rules.

An op bundles

* a JAX primitive with several results, whose abstract eval comes from ``outs``;
* backends per platform: kernel generators registered with :meth:`def_kernel`
  (or declared by an operator family and imported on first use, see
  :meth:`declare_backends`), and a pure-JAX ``reference``;
* kernel generators, called once per distinct signature (static params,
  ``outs``, input shapes and dtypes) and cached;
* rule slots for JVP, transpose and batching.

:meth:`resolve_backend` is the one place that decides which backend runs; see
:mod:`evjax.config` for the order.

Fill an op either by calling the ``def_*`` methods on an instance, or by
subclassing and defining ``reference``, ``jvp_rule``, ``transpose_rule`` and
``batching_rule`` as methods.
"""
from __future__ import annotations

import dataclasses
import functools
import threading
import warnings
from typing import Any, Callable, Mapping

import jax
import numpy as np

from . import _compat, config, registry
from .backends import compile_log
from .benchmark import BenchmarkRecord, BenchmarkResult, benchmark_function
from .errors import (
    BackendNotAvailableError, BenchmarkDataFnNotProvidedError, KernelCompilationError, KernelError,
    KernelNotFoundError, KernelRegistrationError,
)
from .outs import normalize_outs
from .rules import ad as ad_rules
from .rules import batching as batching_rules
from .rules import partitioning

PLATFORMS = registry.PLATFORMS
REFERENCE = registry.REFERENCE
BackendChoice = registry.BackendChoice
_LOWERING_PLATFORMS = {"cpu": "cpu", "cuda": "gpu", "rocm": "gpu"}

__all__ = ["XLACustomKernel", "KernelGenerator", "KernelEntry", "BackendChoice", "REFERENCE", "PLATFORMS"]


@dataclasses.dataclass(frozen=True)
class KernelEntry:
    """One registered kernel of an op: its backend, platform and generator (brainevent's name).

    :meth:`XLACustomKernel.kernel_entries` lists them.

    Args:
        backend: the backend's name (``"numba"``, ``"warp"``, ``"numba_cuda"``, or your own).
        platform: ``"cpu"`` or ``"gpu"``.
        kernel_generator: the generator, ``generator(outs, ins, **params) -> kernel``.

    Example:
        >>> names = [e.backend for e in evjax.binary_csrmv_p.kernel_entries("cpu")]   # numba, warp
    """

    backend: str
    platform: str
    kernel_generator: Callable[..., Callable]


def as_list(result) -> list:
    """A kernel's or rule's result as a list of arrays."""
    if isinstance(result, (list, tuple)):
        return list(result)
    return [result]


class KernelGenerator:
    """A backend's kernel generator, with a cache of kernels per signature.

    The generator is called as ``generator(outs=..., ins=..., **params)``, with
    every static parameter the op was bound with (so a misspelled or missing
    parameter raises ``TypeError``), and returns a function of the input arrays
    that returns the outputs; it runs once per distinct signature.
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
                kernel = self.generator(outs=outs, ins=ins, **params)
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


def _signature(structs) -> str:
    """``float32[3], int32[7]``: the shapes and dtypes of a signature, for messages."""
    return ", ".join(f"{np.dtype(s.dtype).name}{list(s.shape)}" for s in structs) or "none"


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
        if not isinstance(name, str) or not name:
            raise TypeError(f"XLACustomKernel: name must be a non-empty string, got {name!r}")
        self.name = name
        self.primitive = _compat.VaryingPrimitive(name)
        self.primitive.multiple_results = True
        self._kernels: dict[str, dict[str, KernelGenerator]] = {}  # registered generators
        self._modules: dict[str, dict[str, Callable[[], object]]] = {}  # declared backend loaders, run on first use
        self._candidates: dict[str, list[str]] = {}  # default candidates, in registration order
        self._explicit: dict[str, str] = {}  # defaults named with default=True or set_default
        self._chosen: dict[str, str] = {}  # defaults chosen lazily from the candidates
        self._lock = threading.RLock()
        self._reference: Callable | None = None
        self._jvp_whole: Callable | None = None
        self._jvp_per_input: tuple[Callable | None, ...] | None = None
        self._transpose: Callable | None = None
        self._batching: Callable | None = None
        self._partition_rule: Callable | None = None
        self._benchmark_data: Callable | None = None
        self._call: Callable | None = None
        self._register_with_jax()
        self._adopt_subclass_methods()

    def __repr__(self) -> str:
        backends = {p: self.backends(p) for p in PLATFORMS if self._has_any(p)}
        return f"XLACustomKernel({self.name!r}, backends={backends})"

    # ------------------------------------------------------------------ backends
    def def_kernel(self, backend: str, platform: str, generator: Callable, *, default: bool | None = None):
        """Register ``generator`` as ``backend`` on ``platform`` ("cpu" or "gpu").

        Args:
            backend: the backend's name, e.g. ``"numba"`` or one of your own.
            platform: ``"cpu"`` or ``"gpu"``.
            generator: ``generator(outs=..., ins=..., **params) -> kernel`` (see
                :class:`KernelGenerator`).
            default: ``True`` makes it the platform's default; ``None`` makes it
                a candidate (the first available candidate, in registration
                order, is the default); ``False`` never makes it the default.

        Raises:
            TypeError: ``backend`` or ``platform`` is not a string, ``generator``
                is not callable, or ``default`` is not ``True``, ``False`` or ``None``.
            ValueError: an unknown platform.
            evjax.errors.KernelRegistrationError: (a ``ValueError``) the name
                ``"reference"`` (use :meth:`def_reference`).
        """
        if not isinstance(backend, str) or not backend:
            raise TypeError(
                f"op '{self.name}': a backend name is a non-empty string, got {type(backend).__name__} "
                f"{backend!r}"
            )
        if not isinstance(platform, str):
            raise TypeError(
                f"op '{self.name}': platform must be 'cpu' or 'gpu', got {type(platform).__name__} {platform!r}"
            )
        if default is not None and not isinstance(default, bool):
            raise TypeError(f"op '{self.name}': default must be True, False or None, got {default!r}")
        platform = registry.platform_of(platform, who=f"op '{self.name}'")
        if backend == REFERENCE:
            raise KernelRegistrationError(f"op '{self.name}': use def_reference for the pure-JAX reference backend")
        if not callable(generator):
            raise TypeError(
                f"op '{self.name}': the kernel generator of backend {backend!r} must be callable, "
                f"got {type(generator).__name__}"
            )
        with self._lock:
            registered = self._kernels.setdefault(platform, {})
            previous = registered.get(backend)
            if previous is None or previous.generator is not generator:
                if previous is not None:
                    warnings.warn(
                        f"op '{self.name}': backend {backend!r} on {platform} was already registered "
                        f"(generator {getattr(previous.generator, '__name__', previous.generator)!r}); "
                        f"the new generator replaces it",
                        UserWarning, stacklevel=2,
                    )
                registered[backend] = KernelGenerator(generator)
            declared = backend in self._modules.get(platform, {})
            # a family's backend module registers with default=None: the declaration decides
            if not declared or default is not None:
                self._set_candidacy(platform, backend, default)
        registry.note_backend_name(backend)
        return generator

    def _set_candidacy(self, platform: str, backend: str, default: bool | None) -> None:
        candidates = self._candidates.setdefault(platform, [])
        if default is not False and backend not in candidates:
            candidates.append(backend)
        if default is False and backend in candidates:
            candidates.remove(backend)
        if default is True:
            self._explicit[platform] = backend
        self._chosen.pop(platform, None)

    def def_numba_kernel(self, generator: Callable, *, default: bool | None = None):
        """Register a Numba CPU kernel generator (backend ``"numba"``, platform cpu)."""
        return self.def_kernel("numba", "cpu", generator, default=default)

    def def_numba_cuda_kernel(self, generator: Callable, *, default: bool | None = None):
        """Register a Numba CUDA kernel generator (backend ``"numba_cuda"``, platform gpu)."""
        return self.def_kernel("numba_cuda", "gpu", generator, default=default)

    def def_warp_kernel(self, generator: Callable, *, default: bool | None = None):
        """Register a Warp kernel generator (backend ``"warp"``) for cpu and gpu.

        On CPU it is the default only where the op has no other CPU candidate
        (Warp's CPU kernels run on one thread).
        """
        self.def_kernel("warp", "cpu", generator, default=default)
        return self.def_kernel("warp", "gpu", generator, default=default)

    def def_reference(self, fn: Callable):
        """Register the pure-JAX reference: ``fn(*args, outs=..., **params)``.

        It runs on every platform, is the backend of a platform where the op
        has no kernel (or none whose library is installed), is selectable as
        ``backend="reference"`` and is the tests' oracle.  It never stands in
        for a kernel that is still compiling: a first call waits for its
        kernel, so a jitted function returns the same bits on every call.

        Args:
            fn: the reference.
        """
        if not callable(fn):
            raise TypeError(f"op '{self.name}': the reference must be callable, got {type(fn).__name__}")
        self._reference = fn
        return fn

    def declare_backends(self, loaders: Mapping[str, Callable[[], object]],
                         table: Mapping[str, Mapping[str, bool]]) -> None:
        """Declare an operator family's backend modules, loaded the first time they are needed.

        Args:
            loaders: ``{backend: load}``; ``load()`` imports and returns the
                family's module of that backend (``from . import numba`` in the
                family's package), which registers its generators with
                :meth:`def_kernel` when imported.
            table: ``{backend: {platform: is_default_candidate}}``, candidates
                in order of preference; every backend in it has a loader.

        Raises:
            TypeError: ``loaders`` is not a mapping of callables, ``table`` not a
                mapping of mappings, or a backend of ``table`` has no loader.
        """
        if not isinstance(loaders, Mapping) or not all(
            isinstance(b, str) and callable(load) for b, load in loaders.items()
        ):
            raise TypeError(
                f"op '{self.name}': loaders must be {{backend: a function importing its module}}, got {loaders!r}"
            )
        if not isinstance(table, Mapping) or not all(
            isinstance(b, str) and isinstance(p, Mapping) for b, p in table.items()
        ):
            raise TypeError(
                f"op '{self.name}': the backend table must be {{backend: {{platform: is_default_candidate}}}}, "
                f"got {table!r}"
            )
        unloaded = sorted(set(table) - set(loaders))
        if unloaded:
            raise TypeError(f"op '{self.name}': backends {unloaded} of the table have no loader")
        with self._lock:
            for backend, platforms in table.items():
                for platform, candidate in platforms.items():
                    platform = registry.platform_of(platform, who=f"op '{self.name}'")
                    self._modules.setdefault(platform, {})[backend] = loaders[backend]
                    self._set_candidacy(platform, backend, None if candidate else False)
                registry.note_backend_name(backend)

    def set_default(self, platform: str, backend: str) -> None:
        """Make ``backend`` the default on ``platform``.

        Jitted functions are retraced on their next call (the change is part of
        ``jax.jit``'s cache key); no cache is cleared.
        """
        platform = registry.platform_of(platform, who=f"op '{self.name}'")
        backend = registry.canonical_backend_name(backend)
        if not self._has(platform, backend):
            raise BackendNotAvailableError(
                f"op '{self.name}' has no backend {backend!r} on {platform}; it has: {self.backends(platform)}"
            )
        with self._lock:
            self._explicit[platform] = backend
            self._chosen.pop(platform, None)
        config.defaults_changed()

    def clear_backends(self) -> None:
        """Remove every registered and declared kernel backend of this op (brainevent's name).

        The reference (:meth:`def_reference`) and the transform rules stay.
        Programs compiled before (``f.lower(...).compile()``) keep their
        kernels; jitted functions are retraced on their next call (as after
        :func:`evjax.set_backend`: the change is part of ``jax.jit``'s cache
        key) and resolve the backend again, to the reference or to a kernel
        registered before that call.  Registering a kernel later changes no
        cache key: a function traced in between keeps the reference until it
        is jitted anew.  A declared family backend module that was already
        imported is not loaded again.

        Example:
            >>> op.clear_backends()
            >>> op.backends("cpu")
            ['reference']
        """
        with self._lock:
            self._kernels.clear()
            self._modules.clear()
            self._candidates.clear()
            self._explicit.clear()
            self._chosen.clear()
        config.defaults_changed()

    def _has_any(self, platform: str) -> bool:
        return bool(self._kernels.get(platform) or self._modules.get(platform))

    def _has(self, platform: str, backend: str) -> bool:
        if backend == REFERENCE:
            return self._reference is not None
        return backend in self._kernels.get(platform, {}) or backend in self._modules.get(platform, {})

    def backends(self, platform: str) -> list[str]:
        """The backends of this op on ``platform``, the reference last (installed or not)."""
        platform = registry.platform_of(platform, who=f"op '{self.name}'")
        names = sorted(set(self._kernels.get(platform, {})) | set(self._modules.get(platform, {})))
        return names + ([REFERENCE] if self._reference is not None else [])

    def available_backends(self, platform: str) -> list[str]:
        """The backends of this op that can run on ``platform`` here (their library is installed)."""
        return [b for b in self.backends(platform) if registry.missing_library(b) is None]

    def default_backend(self, platform: str) -> str:
        """The op's default on ``platform``: the one named with ``default=True`` / :meth:`set_default`,
        else the first candidate whose library is installed, else the reference.

        The choice is made on first use (for the GPU: at the first lowering for
        it), not at import.
        """
        platform = registry.platform_of(platform, who=f"op '{self.name}'")
        with self._lock:
            chosen = self._chosen.get(platform)
            if chosen is None:
                chosen = self._explicit.get(platform)
                if chosen is None:
                    ordered = sorted(self._candidates.get(platform, []),
                                     key=lambda b: registry.default_rank(platform, b))
                    chosen = next((b for b in ordered if registry.missing_library(b) is None), REFERENCE)
                self._chosen[platform] = chosen
            return chosen

    @property
    def defaults(self) -> dict[str, str]:
        """``{platform: default backend}`` for each platform the op has a backend on."""
        return {p: self.default_backend(p) for p in PLATFORMS if self._has_any(p)}

    def resolve_backend(self, platform: str, requested: BackendChoice | str | None = None) -> str:
        """The backend this op runs on ``platform``: the one function that decides.

        In order: the per-call ``backend=``, the :func:`evjax.use_backend` /
        :func:`evjax.set_backend` choice in force when the op was bound, the
        op's default on ``platform``, the reference.

        Args:
            platform: ``"cpu"`` or ``"gpu"`` (``"cuda"``/``"rocm"`` mean gpu).
            requested: the :class:`~evjax.registry.BackendChoice` the op was
                bound with; a backend name or ``None`` stand for
                ``BackendChoice(per_call=name)``.

        Returns:
            A backend name, or ``"reference"``.

        Raises:
            BackendNotAvailableError: (a ``ValueError``) a named backend the op
                lacks on ``platform``, or whose library is not installed; the
                message lists what it has.
            KernelNotFoundError: (also a ``NotImplementedError``) no backend at
                all for ``platform`` and no reference.
        """
        platform = registry.platform_of(platform, who=f"op '{self.name}'")
        choice = (requested if isinstance(requested, BackendChoice)
                  else BackendChoice(per_call=registry.canonical_backend_name(requested)))
        if choice.per_call is not None:
            return self._usable(platform, choice.per_call, "backend=")
        for entry_platform, name in choice.in_force:
            if entry_platform == platform and name is not None and self._has(platform, name):
                return self._usable(platform, name, "evjax.use_backend / evjax.set_backend")
        name = self.default_backend(platform)
        if name == REFERENCE and self._reference is None:
            has = [p for p in PLATFORMS if self._has_any(p)]
            raise KernelNotFoundError(
                f"op '{self.name}' has no backend for platform '{platform}' and no reference (it has backends "
                f"on: {has or 'no platform'}). Register one with def_numba_kernel / def_warp_kernel / "
                f"def_numba_cuda_kernel, or def_reference."
            )
        return self._usable(platform, name, "the op's default")

    def _usable(self, platform: str, name: str, how: str) -> str:
        if not self._has(platform, name):
            what = "reference implementation" if name == REFERENCE else f"backend {name!r}"
            raise BackendNotAvailableError(
                f"op '{self.name}' has no {what} on {platform} (chosen by {how}); available on {platform}: "
                f"{self.available_backends(platform)}"
            )
        missing = registry.missing_library(name)
        if missing is not None:
            raise BackendNotAvailableError(
                f"op '{self.name}': backend {name!r} (chosen by {how}) is not available on {platform}: {missing}. "
                f"Available on {platform}: {self.available_backends(platform)}"
            )
        return name

    def _generator(self, platform: str, name: str) -> KernelGenerator:
        generator = self._kernels.get(platform, {}).get(name)
        if generator is None:
            load = self._modules.get(platform, {}).get(name)
            if load is not None:
                load()  # imports the family's backend module, which registers its generators
                generator = self._kernels.get(platform, {}).get(name)
            if generator is None:
                raise RuntimeError(f"op '{self.name}': the {name!r} backend module loaded by {load!r} "
                                   f"registered no kernel")
        return generator

    def backend_module(self, platform: str, backend: str):
        """The module of a declared backend on ``platform``, loaded by its loader (once).

        Raises:
            BackendNotAvailableError: the op declares no such backend on ``platform``.
        """
        platform = registry.platform_of(platform, who=f"op '{self.name}'")
        load = self._modules.get(platform, {}).get(backend)
        if load is None:
            raise BackendNotAvailableError(
                f"op '{self.name}' declares no backend module {backend!r} on {platform}: "
                f"{sorted(self._modules.get(platform, {}))}"
            )
        return load()

    def kernel_generator(self, platform: str, backend: str) -> Callable:
        """The generator registered as ``backend`` on ``platform`` (importing a declared backend module)."""
        platform = registry.platform_of(platform, who=f"op '{self.name}'")
        if not self._has(platform, backend) or backend == REFERENCE:
            raise BackendNotAvailableError(
                f"op '{self.name}' has no backend {backend!r} on {platform}: {self.backends(platform)}"
            )
        return self._generator(platform, backend).generator

    def kernel_for(self, platform: str, backend: BackendChoice | str | None, args_avals, outs, params) -> Callable:
        """The function of arrays that implements the op for this signature."""
        return self._kernel(platform, backend, args_avals, outs, params)[1]

    def _kernel(self, platform, backend, args_avals, outs, params, name: str | None = None) -> tuple[str, Callable]:
        name = self.resolve_backend(platform, backend) if name is None else name
        outs = tuple(outs)
        if name == REFERENCE:
            return name, functools.partial(self._reference, outs=outs, **params)
        ins = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args_avals)
        generator = self._generator(platform, name)
        try:
            return name, generator(outs, ins, params)
        except KernelError:  # already says what is wrong (e.g. a backend that cannot take this size)
            raise
        except Exception as err:
            others = [b for b in self.available_backends(platform) if b != name]
            raise KernelCompilationError(
                f"op '{self.name}': the kernel generator of backend {name!r} on {platform} raised "
                f"{type(err).__name__}: {err} (inputs {_signature(ins)}; outputs {_signature(outs)}; params "
                f"{params}). Other backends of this op on {platform}: {others or 'none'}; choose one with "
                f"backend=... or evjax.use_backend(...)."
            ) from err

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

    def def_partition_rule(self, rule: Callable):
        """Sharding: ``rule(*avals_in, outs, **params) -> evjax.rules.partitioning.PartitionRule | None``.

        With a rule, plain ``jax.jit`` over sharded inputs splits the op as the
        rule says (each device runs the op on its slices) instead of gathering
        its operands; ``None`` (or no rule) keeps the op whole.
        """
        self._partition_rule = rule
        _compat.lower_with_devices(self.primitive)  # custom_partitioning needs the devices when it lowers
        return rule

    def _adopt_subclass_methods(self) -> None:
        cls = type(self)
        for method, setter in (
            ("reference", self.def_reference),
            ("jvp_rule", self.def_jvp_rule),
            ("transpose_rule", self.def_transpose_rule),
            ("batching_rule", self.def_batching_rule),
            ("partition_rule", self.def_partition_rule),
        ):
            if callable(getattr(cls, method, None)):
                setter(getattr(self, method))

    def kernel_entries(self, platform: str) -> list[KernelEntry]:
        """The kernels registered on ``platform`` whose library is installed (a declared backend module is
        imported to get its generator), as :class:`KernelEntry` objects, by backend name."""
        platform = registry.platform_of(platform, who=f"op '{self.name}'")
        return [KernelEntry(name, platform, self._generator(platform, name).generator)
                for name in self.available_backends(platform) if name != REFERENCE]

    # --------------------------------------------------------------- benchmark
    def def_benchmark_data(self, fn: Callable):
        """Register ``fn(*, platform) -> list[BenchmarkConfig]``, the configurations :meth:`benchmark` times."""
        if not callable(fn):
            raise TypeError(f"op '{self.name}': the benchmark data function must be callable, got {fn!r}")
        self._benchmark_data = fn
        return fn

    def def_call(self, fn: Callable):
        """Register ``fn(*args, backend=..., **kernel_kwargs) -> outputs``, how :meth:`benchmark` calls the op
        (default: the op itself, ``op(*args, backend=..., **kernel_kwargs)``, with ``outs`` among the kwargs)."""
        if not callable(fn):
            raise TypeError(f"op '{self.name}': the call function must be callable, got {fn!r}")
        self._call = fn
        return fn

    def benchmark(self, *, platform: str, n_warmup: int = 5, n_runs: int = 20, n_batch_per_run: int = 1,
                  compare_results: bool = True, rtol: float = 1e-3, atol: float = 1e-3, verbose: bool = False,
                  catch_errors: bool = True, backends: list[str] | None = None) -> BenchmarkResult:
        """Time every backend (or ``backends``) on every configuration of :meth:`def_benchmark_data`.

        Each (configuration, backend) is a jitted call timed by
        :func:`evjax.benchmark_function` on ``platform``'s first device.  The
        result only reports: choosing a backend from it (``result.fastest()``,
        then :meth:`set_default` or :func:`evjax.set_backend`) is yours.

        Args:
            platform: ``"cpu"`` or ``"gpu"``.
            n_warmup: untimed calls first (the first compiles).
            n_runs: timed calls (intervals) per pair.
            n_batch_per_run: calls per timed interval.
            compare_results: warn where a backend's outputs differ from the first backend's
                beyond ``rtol``/``atol``.
            rtol: relative tolerance of the comparison.
            atol: absolute tolerance of the comparison.
            verbose: print one line per pair.
            catch_errors: record a failing pair (``success=False``) instead of raising.
            backends: the backends to time (default: every available one, the reference included).

        Returns:
            A :class:`evjax.BenchmarkResult`.

        Raises:
            evjax.errors.BenchmarkDataFnNotProvidedError: no benchmark data function.
            ValueError: no device of ``platform`` here.
        """
        if self._benchmark_data is None:
            raise BenchmarkDataFnNotProvidedError(
                f"op '{self.name}' has no benchmark data: register a function with "
                f"op.def_benchmark_data(lambda *, platform: [evjax.BenchmarkConfig(...)])")
        platform = registry.platform_of(platform, who=f"op '{self.name}'")
        try:
            device = jax.devices(platform)[0]
        except RuntimeError:
            raise ValueError(f"op '{self.name}': no {platform} device here to benchmark on") from None
        names = list(backends) if backends is not None else self.available_backends(platform)
        call = self._call or self
        records = []
        for config_ in self._benchmark_data(platform=platform):
            first = None
            for name in names:
                record, output = self._time_one(call, config_, name, platform, device, n_warmup, n_runs,
                                                n_batch_per_run, catch_errors)
                records.append(record)
                if verbose:
                    state = f"{record.mean_ms:.4g} ms" if record.success else f"failed: {record.error}"
                    print(f"{self.name} [{config_.name}] {platform}/{name}: {state}")
                if record.success and compare_results:
                    if first is None:
                        first = (name, output)
                    elif not all(np.allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol, equal_nan=True)
                                 for a, b in zip(jax.tree_util.tree_leaves(first[1]),
                                                 jax.tree_util.tree_leaves(output))):
                        warnings.warn(f"op '{self.name}' [{config_.name}]: backend {name!r} differs from "
                                      f"{first[0]!r} beyond rtol={rtol}, atol={atol}", RuntimeWarning, stacklevel=2)
        return BenchmarkResult(records, self.name)

    def _time_one(self, call, config_, name, platform, device, n_warmup, n_runs, n_batch_per_run, catch_errors):
        """One (configuration, backend) pair: its record and its output (None where it failed)."""
        def run(*args):
            return call(*args, backend=name, **config_.kernel_kwargs)

        try:
            with jax.default_device(device):
                mean, std, low, _, output = benchmark_function(jax.jit(run), n_warmup, n_runs, n_batch_per_run,
                                                               data=tuple(config_.args))
        except Exception as exc:  # noqa: BLE001 - recorded, or raised below
            if not catch_errors:
                raise
            return BenchmarkRecord(platform, name, config_.name, float("nan"), float("nan"), float("nan"), None,
                                   False, f"{type(exc).__name__}: {exc}", dict(config_.kernel_kwargs),
                                   dict(config_.data_kwargs)), None
        return BenchmarkRecord(platform, name, config_.name, 1e3 * mean, 1e3 * std, 1e3 * low, None, True, None,
                               dict(config_.kernel_kwargs), dict(config_.data_kwargs)), output

    # ----------------------------------------------------------------- calling
    def __call__(self, *args, outs, backend: str | None = None, **params) -> list:
        """Bind the primitive: ``op(*arrays, outs=[...], backend=None, **static_params)``.

        Returns:
            A list of output arrays, one per entry of ``outs``.
        """
        return self.bind(*args, outs=outs, backend=backend, **params)

    def bind(self, *args, outs, backend: str | BackendChoice | None = None, **params) -> list:
        """Same as calling the op.

        ``backend`` is a per-call choice (a name), or, as rules pass it on to
        the ops they bind, the :class:`~evjax.registry.BackendChoice` of the
        calling op.  Without one, the :func:`evjax.use_backend` /
        :func:`evjax.set_backend` choices in force now are recorded.
        """
        outs, _ = normalize_outs(outs, who=f"op '{self.name}'")
        _check_hashable(self.name, params)
        return self.primitive.bind(*args, outs=outs, backend=self._choice(backend), **params)

    def _choice(self, backend) -> BackendChoice:
        if isinstance(backend, BackendChoice):
            return backend
        if backend is None:
            return BackendChoice(in_force=config.choices_snapshot())
        if isinstance(backend, str):
            return BackendChoice(per_call=self._check_known(backend))
        raise TypeError(f"op '{self.name}': backend must be a backend name or None, got {backend!r}")

    def _check_known(self, backend: str) -> str:
        """``backend`` as recorded (brainevent's aliases mapped), once the op is known to have it."""
        backend = registry.check_backend_name(backend, who=f"op '{self.name}'")
        if not any(self._has(p, backend) for p in PLATFORMS):
            has = {p: self.backends(p) for p in PLATFORMS if self._has_any(p)}
            raise BackendNotAvailableError(
                f"op '{self.name}' has no backend {backend!r}. Its backends: {has}"
                f"{'' if self._reference is not None else ' (and no reference)'}."
            )
        return backend

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

    def _lower(self, platform, ctx, *args, outs, backend, **params):
        # The resolved backend is lowered, compiling its kernel on the spot if needed: no stand-in
        # ever runs in its place, so a program's numerics never depend on how far a compile got.
        name = self.resolve_backend(platform, backend)
        with compile_log.lowering(self.name):
            return self._lower_with(name, platform, ctx, *args, outs=outs, params=params)

    def _lower_with(self, name, platform, ctx, *args, outs, params):
        name, kernel = self._kernel(platform, None, ctx.avals_in, outs, params, name=name)
        expected = [(tuple(o.shape), np.dtype(o.dtype)) for o in outs]

        def run(*arrays):
            results = as_list(kernel(*arrays))
            got = [(tuple(r.shape), np.dtype(r.dtype)) for r in results]
            if got != expected:
                raise TypeError(
                    f"op '{self.name}': the {name} kernel returned {got}, but `outs` promised {expected}"
                )
            return results

        rule = None
        if self._partition_rule is not None and _compat.lowering_may_partition(ctx):
            rule = self._partition_rule(*ctx.avals_in, outs=outs, **params)
        if rule is not None:  # XLA's partitioner may split it (see evjax.rules.partitioning)
            choice = BackendChoice(per_call=name)

            def bind_local(arrays, local_outs):
                return self.primitive.bind(*arrays, outs=tuple(local_outs), backend=choice, **params)

            run = partitioning.partitioned(run, rule, bind_local, ctx.avals_in, outs)
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

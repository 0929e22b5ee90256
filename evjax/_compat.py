"""The one module of evjax that touches JAX internals.

Everything else in the package imports JAX's private or semi-private names
from here, so that a JAX upgrade breaks (at most) this file.
"""
from __future__ import annotations

import functools

import jax
from jax.interpreters import ad, batching, mlir

try:  # jax >= 0.4.36
    from jax.extend.core import Primitive
except ImportError:  # pragma: no cover - older jax
    from jax.core import Primitive  # type: ignore

from jax._src import config as _config
from jax._src import core as _core
from jax._src import dispatch as _dispatch

ShapedArray = _core.ShapedArray
Tracer = _core.Tracer
get_aval = jax.typeof if hasattr(jax, "typeof") else _core.get_aval
float0 = jax.dtypes.float0

UndefinedPrimal = ad.UndefinedPrimal
Zero = ad.Zero
is_undefined_primal = ad.is_undefined_primal
instantiate_zeros = ad.instantiate_zeros
primitive_jvps = ad.primitive_jvps
primitive_transposes = ad.primitive_transposes

not_mapped = None  # jax marks an unbatched operand with a batch axis of None
primitive_batchers = batching.primitive_batchers

lower_fun = mlir.lower_fun
register_lowering = mlir.register_lowering


class VaryingPrimitive(Primitive):
    """A primitive whose operands are made to vary over the same manual mesh axes.

    Inside ``jax.shard_map`` (with ``check_vma``) every value records the mesh
    axes it varies over.  Like JAX's own primitives, ``bind`` first casts
    operands that do not vary (replicated weights, index arrays) to vary like
    the others (``pvary``, whose transpose is a ``psum``), so that gradients of
    replicated operands are summed over devices.
    """

    def bind(self, *args, **params):
        insert = getattr(_core, "auto_insert_reshard", None)
        if insert is not None and args:
            args = tuple(insert(*args))
        return super().bind(*args, **params)


def output_aval(shape, dtype, avals_in):
    """The aval of a result computed from ``avals_in``: it varies over the same manual axes."""
    varying = frozenset().union(*(getattr(getattr(a, "mat", None), "varying", frozenset()) for a in avals_in))
    if not varying:
        return ShapedArray(shape, dtype)
    return ShapedArray(shape, dtype, sharding=_core.get_cur_mesh_sharding(),
                       manual_axis_type=_core.ManualAxisType(varying=varying))


def trace_state(name: str, default, help: str):
    """A JAX config state whose value is part of ``jax.jit``'s cache key and trace context.

    A function jitted under one value is retraced when called under another,
    and each value keeps its own compiled version.  The state has a global value
    (``state._set(value)``) and a thread-local one (``with state(value): ...``).
    """
    try:
        return _config.string_or_object_state(name, default, help, include_in_jit_key=True,
                                              include_in_trace_context=True)
    except TypeError:  # pragma: no cover - a JAX whose helper takes fewer keywords
        return _config.State(name, default, help, include_in_jit_key=True, include_in_trace_context=True)


def apply_primitive(prim, *args, **params):
    """Eager evaluation of ``prim`` (compile-and-run one op)."""
    return _dispatch.apply_primitive(prim, *args, **params)


def lower_with_devices(prim) -> None:
    """Lower ``prim`` knowing the devices of the computation: a primitive that may lower through
    ``custom_partitioning`` needs them (JAX's own list of such primitives)."""
    _dispatch.prim_requires_devices_during_lowering.add(prim)


def lowering_may_partition(ctx) -> bool:
    """Whether XLA's SPMD partitioner may split what this lowering emits: a ``jit`` over several devices.
    Not inside ``shard_map`` (the ops see their local shapes there) nor on one device."""
    from jax._src import sharding_impls

    axis_context = ctx.module_context.axis_context
    return isinstance(axis_context, sharding_impls.ShardingContext) and axis_context.num_devices > 1


def eval_jaxpr(jaxpr, consts, *args):
    """Evaluate an open ``jaxpr`` (its ``constvars`` bound to ``consts``) on ``args``."""
    return _core.eval_jaxpr(jaxpr, consts, *args)


def zeros_like_aval(aval):
    """A concrete zero array for ``aval`` (float0 for integer/bool avals)."""
    import numpy as np
    import jax.numpy as jnp

    if jax.dtypes.issubdtype(aval.dtype, np.inexact):
        return jnp.zeros(aval.shape, aval.dtype)
    return np.zeros(aval.shape, float0)


def symbolic_zero(aval):
    """A symbolic-zero tangent for ``aval``."""
    return Zero(aval.to_tangent_aval())


@functools.lru_cache(maxsize=None)
def ffi_api_header_version() -> tuple[int, int]:
    """(major, minor) of the XLA FFI C API in the installed jaxlib headers."""
    import os
    import re

    header = os.path.join(jax.ffi.include_dir(), "xla", "ffi", "api", "c_api.h")
    try:
        with open(header) as f:
            text = f.read()
        major = int(re.search(r"#define XLA_FFI_API_MAJOR (\d+)", text).group(1))
        minor = int(re.search(r"#define XLA_FFI_API_MINOR (\d+)", text).group(1))
        return major, minor
    except (OSError, AttributeError):  # pragma: no cover - header missing
        return 0, 1

"""Helpers for JVP and transpose rules: linear arguments and symbolic zeros."""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp

from .. import _compat

UndefinedPrimal = _compat.UndefinedPrimal
Zero = _compat.Zero


def is_zero(tangent) -> bool:
    """Whether ``tangent`` is a symbolic zero (the input does not vary)."""
    return type(tangent) is Zero


def is_undefined(x) -> bool:
    """Whether ``x`` is a linear input of a transpose rule (an UndefinedPrimal)."""
    return _compat.is_undefined_primal(x)


def aval_of(x):
    """The abstract value of an array, tracer or UndefinedPrimal."""
    if is_undefined(x):
        return x.aval
    return jax.typeof(x) if hasattr(jax, "typeof") else jax.core.get_aval(x)


def instantiate(tangent, like):
    """Replace a symbolic zero by a zero array shaped like ``like`` (aval or struct)."""
    if is_zero(tangent):
        return jnp.zeros(like.shape, like.dtype)
    return tangent


def zero_tangents(outs: Sequence) -> list:
    """Symbolic-zero tangents for outputs described by ``outs``."""
    return [Zero(_compat.ShapedArray(o.shape, o.dtype).to_tangent_aval()) for o in outs]


def apply_per_input_jvp(op_name, primitive, rules, primals, tangents, *, outs, **params):
    """Evaluate per-input JVP rules and add their contributions.

    Maths: for y = f(x_1, ..., x_n),  dy = sum_i (df/dx_i) . dx_i ; the term of
    an input whose tangent is a symbolic zero, or whose rule is ``None``, is 0.
    """
    if len(rules) != len(primals):
        raise ValueError(
            f"op '{op_name}' has {len(rules)} per-input JVP rules but was called with {len(primals)} "
            f"operands; give exactly one rule (or None) per operand"
        )
    primals_out = primitive.bind(*primals, outs=outs, **params)
    total = None
    for rule, tangent in zip(rules, tangents):
        if rule is None or is_zero(tangent):
            continue
        term = rule(tangent, *primals, outs=outs, **params)
        term = list(term) if isinstance(term, (list, tuple)) else [term]
        total = term if total is None else [a + b for a, b in zip(total, term)]
    return primals_out, (zero_tangents(outs) if total is None else total)


def linear_jvp_rules(op, n_args: int, linear_argnums: Sequence[int]) -> tuple:
    """Per-input JVP rules for an op that is linear in each of ``linear_argnums``.

    Maths: if f is linear in x_i (others fixed), df/dx_i . t = f(..., t, ...),
    i.e. the op itself applied with the tangent in place of x_i.  Arguments not
    listed (indices, events) get ``None``: no derivative.

    Use as ``op.def_jvp_rule2(*linear_jvp_rules(op, 4, (0, 3)))``.
    """

    def rule_for(i: int) -> Callable:
        def rule(tangent, *primals, outs, **params):
            args = list(primals)
            args[i] = tangent
            return op.primitive.bind(*args, outs=outs, **params)

        return rule

    return tuple(rule_for(i) if i in linear_argnums else None for i in range(n_args))


def linear_cotangents(args: Sequence, per_argument: Mapping[int, Callable[[], object]], *, name: str = "op") -> list:
    """The cotangents a transpose rule returns, one per argument.

    ``per_argument[i]()`` computes the cotangent of argument ``i``; it is
    called only when that argument is undefined (linear in the traced
    computation).  Other arguments get ``None``: defined ones, and undefined
    integers or bools (index arrays, events), which have no cotangent.

    Raises:
        NotImplementedError: an undefined float argument that ``per_argument``
            does not cover: the op is not linear in it.
    """
    result = []
    for i, arg in enumerate(args):
        if not is_undefined(arg):
            result.append(None)
        elif i in per_argument:
            result.append(per_argument[i]())
        elif not jnp.issubdtype(arg.aval.dtype, jnp.inexact):
            result.append(None)
        else:
            raise NotImplementedError(
                f"{name}: transpose w.r.t. argument {i} is not defined; the op is not linear in it"
            )
    return result


def linear_transpose_rule(per_argument: Mapping[int, Callable], *, name: str = "op") -> Callable:
    """A transpose rule from one function per linear argument.

    ``per_argument[i](cotangents, *args, outs=..., **params)`` returns the
    cotangent of argument ``i``, as in :func:`linear_cotangents`.
    """

    def rule(cotangents, *args, outs, **params):
        thunks = {i: (lambda f=f: f(cotangents, *args, outs=outs, **params)) for i, f in per_argument.items()}
        return linear_cotangents(args, thunks, name=name)

    return rule


def plain_primitive_jvp(primitive, rules, primals, tangents, **params):
    """The JVP of a plain JAX primitive from per-input rules (see :func:`defjvp`).

    Maths: ``dy = sum_i rule_i(dx_i, *x, **params)`` over the inputs whose
    tangent is not a symbolic zero and whose rule is not ``None``; with no
    such input the tangent is a symbolic zero.  With ``multiple_results`` a
    rule returns one tangent per output.
    """
    if len(rules) != len(primals):
        raise ValueError(
            f"primitive '{primitive.name}' has {len(rules)} per-input JVP rules but was bound with "
            f"{len(primals)} operands; give exactly one rule (or None) per operand"
        )
    primals_out = primitive.bind(*primals, **params)
    many = primitive.multiple_results
    outs = list(primals_out) if many else [primals_out]
    total = None
    for rule, tangent in zip(rules, tangents):
        if rule is None or is_zero(tangent):
            continue
        term = rule(tangent, *primals, **params)
        term = list(term) if many else [term]
        if len(term) != len(outs):
            raise ValueError(
                f"primitive '{primitive.name}': a JVP rule returned {len(term)} tangents for {len(outs)} outputs"
            )
        total = term if total is None else [a + b for a, b in zip(total, term)]
    if total is None:
        total = [_compat.symbolic_zero(aval_of(o)) for o in outs]
    return (primals_out, total) if many else (primals_out, total[0])


def defjvp(primitive, *jvp_rules: Callable | None) -> None:
    """Define one JVP rule per input of an op or of any JAX primitive (brainevent's name).

    Args:
        primitive: an :class:`~evjax.XLACustomKernel`, or a plain JAX
            ``Primitive`` (``jax.extend.core.Primitive``) with one output or
            ``multiple_results``.
        jvp_rules: one per operand, in order: ``rule(tangent, *primals,
            **params) -> tangent of the output(s)`` (an ``XLACustomKernel``'s
            params include ``outs``), or ``None`` where the outputs do not
            depend differentiably on that operand.  For a primitive with
            ``multiple_results`` a rule returns one tangent per output.

    For an ``XLACustomKernel`` this is ``primitive.def_jvp_rule2(*jvp_rules)``;
    for a plain primitive it replaces the primitive's JVP rule.  Maths: the
    JVP is the sum of the rules' terms, ``dy = sum_i (df/dx_i) . dx_i``, over
    the inputs whose tangent is not a symbolic zero.  Reverse mode
    (``jax.grad``) also needs the primitive to be linear in the tangent, as a
    transpose rule, or the rules to be built from differentiable JAX code.

    Raises:
        TypeError: ``primitive`` is neither an ``XLACustomKernel`` nor a JAX
            ``Primitive``, or a rule is neither callable nor ``None``.

    Example:
        >>> # an op linear in both operands: d out = op(dx, y) + op(x, dy)
        >>> evjax.defjvp(op, lambda dx, x, y, *, outs, **p: op(dx, y, outs=outs),
        ...                  lambda dy, x, y, *, outs, **p: op(x, dy, outs=outs))
        >>> # a plain primitive y = x * s
        >>> evjax.defjvp(mul_p, lambda dx, x, s: mul_p.bind(dx, s), lambda ds, x, s: mul_p.bind(x, ds))
    """
    for i, rule in enumerate(jvp_rules):
        if rule is not None and not callable(rule):
            raise TypeError(f"defjvp: rule {i} must be a function or None, got {type(rule).__name__}")
    define = getattr(primitive, "def_jvp_rule2", None)
    if callable(define):
        define(*jvp_rules)
        return
    if not isinstance(primitive, _compat.Primitive):
        raise TypeError(
            f"defjvp: expected an evjax.XLACustomKernel or a JAX Primitive, got {type(primitive).__name__}"
        )
    rules = tuple(jvp_rules)

    def jvp(primals, tangents, **params):
        return plain_primitive_jvp(primitive, rules, primals, tangents, **params)

    _compat.primitive_jvps[primitive] = jvp

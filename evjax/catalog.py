"""The ops evjax defines, by name and by tag (brainevent's ``get_registry`` and friends).

The catalogue is built on each call from every family's ``OPS`` table
(:mod:`evjax.primitives.csr`, ``dense``, ``fixed``, ``jitc``); nothing is
recorded at import, and ops that users build with
:class:`evjax.XLACustomKernel` are not in it.  The neuron family has no
primitive of its own (its functions are JAX code with custom rules).

Each op is keyed by its primitive's name (``op.name``, as jaxprs show it,
e.g. ``"evjax_binary_csrmv"``) and carries these tags:

* its family: ``"csr"``, ``"dense"``, ``"jitc"``, ``"plasticity"``, ``"delay"``, ``"compact"`` (the
  listing of active entries, ``"binary"``), ``"sparse_backward"`` (the products over nonzero entries,
  ``"float"``; not also ``"csr"``/``"dense"``: those tags name the event families); the ops the fixed
  family binds (CSR's own) also carry ``"fixed"``;
* its kind: ``"binary"`` (event operand) or ``"float"`` (the delay ops take either, per call); ``"mv"`` (vector),
  ``"mm"`` (matrix), ``"sddmm"``, ``"outer"`` or ``"materialize"`` (JITC's
  dense ``jits``/``jitn``/``jitu``);
* for JITC, its weight law: ``"scalar"``, ``"normal"`` or ``"uniform"``.
"""
from __future__ import annotations

from typing import Iterable

from .primitives import compact, csr, delay, dense, fixed, jitc, plasticity, sparse_backward
from .xla_custom_kernel import XLACustomKernel

__all__ = ["get_registry", "get_primitives_by_tags", "get_all_primitive_names", "primitive_tags"]


def _kind(op: XLACustomKernel) -> set[str]:
    """The kind tags read off an op's name (``evjax_[binary_]<family><kind>``)."""
    name = op.name.removeprefix("evjax_")
    tags = {"binary" if name.startswith("binary_") else "float"}
    for suffix in ("sddmm", "outer", "mv", "mm"):
        if name.endswith(suffix):
            tags.add(suffix)
            break
    return tags


def _tagged() -> dict[str, tuple[XLACustomKernel, frozenset[str]]]:
    """``{name: (op, tags)}`` for every op of every family."""
    tags: dict[int, set[str]] = {}
    ops: dict[int, XLACustomKernel] = {}

    def add(op: XLACustomKernel, *more: str) -> None:
        ops[id(op)] = op
        tags.setdefault(id(op), set()).update(more)

    for op in csr.OPS:
        add(op, "csr", *_kind(op))
    for op in fixed.OPS:
        add(op, "fixed")
    for op in dense.OPS:
        add(op, "dense", *_kind(op))
    for op in plasticity.OPS:
        add(op, "plasticity", "binary", "update")
    for op in delay.OPS:
        add(op, "delay")
    for op in compact.OPS:
        add(op, "compact", "binary")
    for op in sparse_backward.OPS:
        add(op, "sparse_backward", "float", "sddmm" if "sddmm" in op.name else "outer" if "outer" in op.name else "mv")
    for (law, _rank, _event), op in jitc.MATMUL_OPS.items():
        add(op, "jitc", law, *_kind(op))
    for law, op in jitc.DENSE_OPS.items():
        add(op, "jitc", law, "float", "materialize")
    return {op.name: (op, frozenset(tags[key])) for key, op in ops.items()}


def get_registry() -> dict[str, XLACustomKernel]:
    """Every op evjax defines, by primitive name.

    Returns:
        ``{name: op}``, a new dict on each call, sorted by name.

    Example:
        >>> ops = evjax.get_registry()
        >>> ops["evjax_binary_csrmv"] is evjax.binary_csrmv_p
        True
    """
    return {name: op for name, (op, _) in sorted(_tagged().items())}


def get_all_primitive_names() -> list[str]:
    """The primitive names of every op evjax defines, sorted.

    Example:
        >>> "evjax_jitsmv" in evjax.get_all_primitive_names()
        True
    """
    return sorted(_tagged())


def primitive_tags(name: str) -> frozenset[str]:
    """The tags of the op named ``name`` (see :mod:`evjax.catalog`).

    Args:
        name: a primitive name, as in :func:`get_all_primitive_names`.

    Raises:
        KeyError: no op of evjax has that name.

    Example:
        >>> sorted(evjax.catalog.primitive_tags("evjax_binary_csrmv"))
        ['binary', 'csr', 'fixed', 'mv']
    """
    entry = _tagged().get(name)
    if entry is None:
        raise KeyError(f"primitive_tags: evjax has no op named {name!r}; see evjax.get_all_primitive_names()")
    return entry[1]


def get_primitives_by_tags(tags: Iterable[str]) -> dict[str, XLACustomKernel]:
    """The ops that carry every one of ``tags``.

    Args:
        tags: a set (or any iterable) of tag names, see :mod:`evjax.catalog`;
            a single string is one tag.  An empty set selects every op.

    Returns:
        ``{name: op}``, sorted by name; empty when no op has all the tags.

    Raises:
        TypeError: a tag that is not a string.

    Example:
        >>> sorted(evjax.get_primitives_by_tags({"csr", "binary"}))
        ['evjax_binary_csrmm', 'evjax_binary_csrmv']
    """
    wanted = {tags} if isinstance(tags, str) else set(tags)
    bad = [t for t in wanted if not isinstance(t, str)]
    if bad:
        raise TypeError(f"get_primitives_by_tags: tags are strings, got {bad[0]!r}")
    return {name: op for name, (op, have) in sorted(_tagged().items()) if wanted <= have}

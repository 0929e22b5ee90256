"""``print_diagnostics``: what evjax runs on here (brainevent's name).

Reads versions from the installed distributions' metadata (no optional
library is imported), the devices JAX sees, every op's backends per platform
from :mod:`evjax.catalog`, the cache folder and the thread count.
"""
from __future__ import annotations

import importlib.metadata
import platform as _platform
import sys

import jax

from . import catalog, registry
from .backends.threads import get_num_threads
from .cache import get_cache_dir

__all__ = ["print_diagnostics", "FAMILIES", "DISTRIBUTIONS"]

FAMILIES = ("csr", "fixed", "dense", "jitc", "plasticity", "delay", "compact", "sparse_backward")
"""The operator families whose ops are listed, by their catalog tag."""

DISTRIBUTIONS = (("evjax", "evjax"), ("jax", "jax"), ("jaxlib", "jaxlib"), ("numba", "numba"),
                 ("warp", "warp-lang"), ("numba-cuda", "numba-cuda"), ("numpy", "numpy"), ("scipy", "scipy"))
"""``(label, distribution)`` of every library whose version is printed."""


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _backend_line(op, platform: str) -> str:
    have = op.backends(platform)
    available = op.available_backends(platform)
    missing = [b for b in have if b not in available]
    text = ", ".join(available) or "none"
    return text + (f" (not installed: {', '.join(missing)})" if missing else "")


def _lines() -> list[str]:
    lines = ["evjax diagnostics", "", "Versions:"]
    lines += [f"  {label:<11} {_version(dist)}" for label, dist in DISTRIBUTIONS]
    lines.append(f"  {'python':<11} {sys.version.split()[0]} ({_platform.platform()})")
    lines += ["", "Platforms:", f"  default     {jax.default_backend()}"]
    for device in jax.devices():
        lines.append(f"  device      {device.platform}:{device.id} {getattr(device, 'device_kind', '')}".rstrip())
    lines += ["", f"Cache dir:    {get_cache_dir()}", f"Threads:      {get_num_threads()}"]
    lines += ["", "Backends per op and platform (those whose library is installed; the others in brackets):"]
    shown: set[str] = set()
    for family in FAMILIES:
        ops = catalog.get_primitives_by_tags({family})
        if set(ops) <= shown:  # the fixed family binds CSR's ops
            lines.append(f"  {family}: the ops above ({', '.join(ops)})")
            continue
        lines.append(f"  {family}:")
        for name, op in ops.items():
            per_platform = "; ".join(f"{p}: {_backend_line(op, p)}" for p in registry.PLATFORMS)
            lines.append(f"    {name:<28} {per_platform}")
        shown.update(ops)
    return lines


def print_diagnostics() -> None:
    """Print the versions, platforms, backends, cache folder and thread count evjax sees.

    Printed: the versions of evjax, jax, jaxlib, numba, warp, numba-cuda, numpy
    and scipy ("not installed" where absent; read from package metadata, so
    nothing is imported); JAX's default platform and devices; the cache folder
    (:func:`evjax.get_cache_dir`); the thread count of the parallel kernels
    (:func:`evjax.get_num_threads`); and for every op of each family, the
    backends it has on each platform whose library is installed, with those
    whose library is missing in brackets.  Useful in bug reports.

    Returns:
        None.

    Example:
        >>> evjax.print_diagnostics()
        evjax diagnostics
        ...
    """
    print("\n".join(_lines()))

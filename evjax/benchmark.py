"""Timing an op's backends (brainevent's benchmark API): ``benchmark_function`` and the result types.

:meth:`evjax.XLACustomKernel.benchmark` runs every backend of an op on the
configurations its :meth:`~evjax.XLACustomKernel.def_benchmark_data` function
gives, and returns a :class:`BenchmarkResult`.  Choosing a backend from it is
the user's act (``result.fastest()``, then ``op.set_default`` or
``evjax.set_backend``): evjax never switches a backend by itself, and every
backend gives the same bits.

This module imports only JAX and NumPy (the op class imports it).
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import pathlib
import statistics
import time
from typing import Any, Callable, Optional, Sequence

import jax

__all__ = ["benchmark_function", "BenchmarkConfig", "BenchmarkRecord", "BenchmarkResult"]


def benchmark_function(fn: Callable, n_warmup: int, n_runs: int, n_batch_per_run: int = 1,
                       data: tuple = ()) -> tuple[float, float, float, float, Any]:
    """Time ``fn(*data)``: per-call mean, standard deviation, minimum and maximum, in seconds.

    Each of the ``n_runs`` timed intervals issues ``n_batch_per_run`` calls back
    to back and then waits for the last result (``jax.block_until_ready``); the
    times are per call (the interval divided by ``n_batch_per_run``).  The
    ``n_warmup`` calls before them are not timed (the first one compiles a
    jitted ``fn``).

    Args:
        fn: the callable, called as ``fn(*data)``.
        n_warmup: untimed calls first (``>= 0``).
        n_runs: timed intervals (``>= 1``).
        n_batch_per_run: calls per interval (``>= 1``).
        data: the positional arguments of every call.

    Returns:
        ``(mean, std, min, max, output)``: seconds per call, and the last call's result.

    Raises:
        ValueError: a count out of range.

    Example:
        >>> mean, std, low, high, y = evjax.benchmark_function(jax.jit(f), 3, 20, data=(x,))
    """
    for name, value, low in (("n_warmup", n_warmup, 0), ("n_runs", n_runs, 1), ("n_batch_per_run", n_batch_per_run, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"benchmark_function: {name} must be an int >= {low}, got {value!r}")
    output = None
    for _ in range(n_warmup):
        output = jax.block_until_ready(fn(*data))
    times = []
    for _ in range(n_runs):
        start = time.perf_counter()
        for _ in range(n_batch_per_run):
            output = fn(*data)
        jax.block_until_ready(output)
        times.append((time.perf_counter() - start) / n_batch_per_run)
    std = statistics.pstdev(times) if len(times) > 1 else 0.0
    return statistics.fmean(times), std, min(times), max(times), output


@dataclasses.dataclass
class BenchmarkConfig:
    """One configuration to time: the call's arguments and its parameters.

    A :meth:`~evjax.XLACustomKernel.def_benchmark_data` function returns a list of them.

    Args:
        name: a short label (``"T, homogeneous, bool"``).
        args: the positional arrays of the call.
        kernel_kwargs: keyword arguments of the call (``outs``, ``shape``, ``transpose``, ...).
        data_kwargs: facts about the data recorded with the timings, not passed (``nnz``, ``rate``).

    Example:
        >>> BenchmarkConfig("n=1000", (data, indices, indptr, spikes), dict(outs=outs, shape=shape,
        ...                 transpose=True, weighted=False), dict(rate=0.01))
    """

    name: str
    args: tuple
    kernel_kwargs: dict = dataclasses.field(default_factory=dict)
    data_kwargs: dict = dataclasses.field(default_factory=dict)

    def put_args(self, device=None) -> None:
        """Move ``args`` to ``device`` (``None``: JAX's default device) before timing, in place."""
        self.args = tuple(jax.device_put(a, device) for a in self.args)


@dataclasses.dataclass
class BenchmarkRecord:
    """One timed (configuration, backend) pair: a row of a :class:`BenchmarkResult`.

    Args:
        platform: ``"cpu"`` or ``"gpu"``.
        backend: the backend's name.
        label: the configuration's name.
        mean_ms: mean milliseconds per call.
        std_ms: their standard deviation.
        min_ms: the fastest call.
        throughput: an optional rate (None when not computed).
        success: whether the backend ran.
        error: the error's message where it did not.
        kernel_kwargs: the configuration's call parameters (as text where not JSON values).
        data_kwargs: the configuration's data facts.

    Example:
        >>> record = result.fastest("n=1000"); record.backend, record.mean_ms
    """

    platform: str
    backend: str
    label: str
    mean_ms: float
    std_ms: float
    min_ms: float
    throughput: Optional[float]
    success: bool
    error: Optional[str]
    kernel_kwargs: dict
    data_kwargs: dict


_COLUMNS = [f.name for f in dataclasses.fields(BenchmarkRecord)]


def _plain(value):
    """A JSON value for a record's field (shapes and dtypes as text)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return repr(value)


class BenchmarkResult:
    """The records of one benchmark run, with ways to read, print, save and plot them.

    Args:
        records: the :class:`BenchmarkRecord` rows.
        primitive_name: the op's name.

    Example:
        >>> result = evjax.binary_csrmv_p.benchmark(platform="cpu")
        >>> result.print(group_by="label")
        >>> evjax.binary_csrmv_p.set_default("cpu", result.fastest().backend)   # the user's choice
    """

    def __init__(self, records: Sequence[BenchmarkRecord], primitive_name: str = ""):
        self.records = list(records)
        self.primitive_name = primitive_name

    def __repr__(self) -> str:
        return f"BenchmarkResult({self.primitive_name!r}, {len(self.records)} records)"

    def fastest(self, label: str | None = None) -> BenchmarkRecord | None:
        """The successful record of least mean time (of configuration ``label``, or of all); None if none ran."""
        ran = [r for r in self.records if r.success and (label is None or r.label == label)]
        return min(ran, key=lambda r: r.mean_ms) if ran else None

    def to_dict(self) -> dict:
        """A JSON-serialisable dict: ``{"primitive_name": ..., "records": [...]}``."""
        return {"primitive_name": self.primitive_name,
                "records": [{k: _plain(v) for k, v in dataclasses.asdict(r).items()} for r in self.records]}

    def save(self, path, format: str = "json") -> None:
        """Write the records to ``path`` as ``"json"`` (readable by :meth:`load`) or ``"csv"``.

        Raises:
            ValueError: another format (brainevent's ``"pkl"`` is not written: pickles run code when loaded).
        """
        path = pathlib.Path(path)
        if format == "json":
            path.write_text(json.dumps(self.to_dict(), indent=2))
        elif format == "csv":
            buffer = io.StringIO()
            writer = csv.DictWriter(buffer, fieldnames=_COLUMNS)
            writer.writeheader()
            for row in self.to_dict()["records"]:
                writer.writerow({k: json.dumps(v) if isinstance(v, dict) else v for k, v in row.items()})
            path.write_text(buffer.getvalue())
        else:
            raise ValueError(f"BenchmarkResult.save: format must be 'json' or 'csv', got {format!r}")

    @staticmethod
    def load(path) -> "BenchmarkResult":
        """A result written by :meth:`save` in JSON."""
        raw = json.loads(pathlib.Path(path).read_text())
        return BenchmarkResult([BenchmarkRecord(**r) for r in raw["records"]], raw.get("primitive_name", ""))

    def _rows(self, sort_by=None) -> list[BenchmarkRecord]:
        rows = list(self.records)
        for key in reversed([sort_by] if isinstance(sort_by, str) else list(sort_by or [])):
            rows.sort(key=lambda r: (getattr(r, key) is None, getattr(r, key)))
        return rows

    def table(self, sort_by=None, group_by=None, speedup_vs: str | None = None) -> str:
        """The records as a markdown table (see :meth:`print`)."""
        groups = [group_by] if isinstance(group_by, str) else list(group_by or ["label"])
        rows = self._rows(sort_by or groups)

        def key(r):
            return tuple(getattr(r, g) for g in groups)

        best = {}
        base = {}
        for r in rows:
            if r.success and (key(r) not in best or r.mean_ms < best[key(r)]):
                best[key(r)] = r.mean_ms
            if speedup_vs is not None and r.success and r.backend == speedup_vs:
                base[key(r)] = r.mean_ms
        header = ["label", "platform", "backend", "mean (ms)", "std (ms)", "min (ms)"]
        header += [f"vs {speedup_vs}"] if speedup_vs is not None else []
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for r in rows:
            mark = " *" if r.success and best.get(key(r)) == r.mean_ms else ""
            if r.success:
                cells = [f"{r.mean_ms:.4g}{mark}", f"{r.std_ms:.3g}", f"{r.min_ms:.4g}"]
            else:
                cells = [f"failed: {r.error}", "-", "-"]
            if speedup_vs is not None:
                ref = base.get(key(r))
                cells.append(f"{ref / r.mean_ms:.2f}x" if ref and r.success else "-")
            lines.append("| " + " | ".join([r.label, r.platform, r.backend] + cells) + " |")
        return "\n".join(lines)

    def print(self, sort_by=None, group_by=None, compare_by=None, highlight_best: bool = True, order_by=None,
              speedup_vs=None, vary_by=None) -> None:
        """Print the records as a markdown table, the fastest of each group marked ``*``.

        Args:
            sort_by: column name(s) to sort by (default: the groups).
            group_by: column name(s) that form a group (default ``"label"``).
            compare_by: not supported (accepted as None only).
            highlight_best: mark the fastest of each group.
            order_by: column names: the leading ones group, as ``group_by``.
            speedup_vs: a backend name: a ``vs <name>`` column of its mean over each row's.
            vary_by: column name(s) grouped, as ``group_by``.
        """
        if compare_by is not None:
            raise ValueError("BenchmarkResult.print: compare_by is not supported; use speedup_vs=<backend>")
        if order_by:
            group_by = list(order_by)[:-1] or None
            sort_by = list(order_by)
        group_by = group_by if group_by is not None else vary_by
        text = self.table(sort_by, group_by, speedup_vs)
        print(text if highlight_best else text.replace(" *", ""))

    def plot(self, ax=None, x: str | None = None, y: str = "mean_ms", hue: str | None = None, style=None,
             kind: str = "line", show: bool = False, **kwargs):
        """A bar chart of ``y`` per label (``x``, default ``"label"``), one bar per backend (``hue``);
        needs matplotlib.  Returns the axes."""
        import matplotlib.pyplot as plt
        import numpy as np

        x, hue = x or "label", hue or "backend"
        ran = [r for r in self.records if r.success]
        xs = list(dict.fromkeys(getattr(r, x) for r in ran))
        hues = list(dict.fromkeys(getattr(r, hue) for r in ran))
        if ax is None:
            _, ax = plt.subplots()
        width = 0.8 / max(len(hues), 1)
        for k, h in enumerate(hues):
            values = [next((getattr(r, y) for r in ran if getattr(r, x) == v and getattr(r, hue) == h), math.nan)
                      for v in xs]
            ax.bar(np.arange(len(xs)) + k * width, values, width, label=str(h), **kwargs)
        ax.set_xticks(np.arange(len(xs)) + width * (len(hues) - 1) / 2, xs)
        ax.set_ylabel(y)
        ax.set_title(self.primitive_name)
        ax.legend()
        if show:
            plt.show()
        return ax

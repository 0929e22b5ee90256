"""Timing, tables and plots shared by the benchmark scripts.

Timings are medians over many calls, and the candidates of one comparison are
measured interleaved (round-robin), so machine noise hits all of them alike;
every claim is a ratio from the same run.
"""
from __future__ import annotations

import os
import time
from typing import Callable

import numpy as np

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def provenance(argv: list[str] | None = None) -> str:
    """The first line of a results file: ``<!-- run DATE on MACHINE: command -->``.

    ``benchmarks/readme_figures.py`` reads it to give each figure the README
    quotes its date and machine.
    """
    import datetime
    import platform
    import shutil
    import sys

    gpu = "a GPU" if shutil.which("nvidia-smi") else "no GPU"
    command = " ".join(["python", os.path.relpath(sys.argv[0]) if sys.argv and sys.argv[0] else "?",
                        *(sys.argv[1:] if argv is None else argv)])
    return f"<!-- run {datetime.date.today()} on {os.cpu_count()} CPU cores, {gpu}, {platform.machine()}: {command} -->"


def freeze_import_heap() -> None:
    """Exempt every object alive now (the imports: evjax, JAX, brainevent, ...) from Python's cyclic GC.

    Call once, after the imports and before timing.  A process that imports
    brainevent tracks some 1250 modules' objects, and each full collection
    rescans them: amortised over the calls that trigger it, every JAX call in
    the process then took about 4 us more (a jitted identity: 6.0 -> 8.3-10.0 us
    on the development VM; with the heap frozen, 5.9 us).  That cost belongs to
    the benchmark's import set, not to any op, and it would hide the
    microsecond-scale ops behind the floor; ``gc.freeze()`` removes it for
    every peer alike.
    """
    import gc

    gc.collect()
    gc.freeze()


def block(x):
    """Wait for JAX results (no-op for numpy)."""
    import jax

    return jax.block_until_ready(x)


def settle_kernels() -> None:
    """Hand every serial tier evjax has used so far over to its full kernel (compiled, or loaded from
    the disk cache, now), so that the calls timed next measure the kernels' steady state.

    evjax's first calls run small serial tiers and take the full kernels over only when a call needs
    them, or once the tier has been busy for a second (``evjax.backends.numba_cpu.call``): a benchmark
    of a few hundred calls would otherwise time the tier where the full kernel splits the work across
    threads.  Call it after the warm-up calls, then call each candidate once more (a chain of tiers
    hands over one stage per call).  First calls are measured by ``cold_start.py`` and
    ``first_calls.py``, not here.
    """
    import sys

    if "evjax" in sys.modules:
        from evjax.backends import numba_cpu

        numba_cpu.compile_full_kernels(hand_over=True)


def median_times(candidates: dict[str, Callable[[], object]], *, rounds: int = 15, calls: int = 40,
                 warmup: int = 3) -> dict[str, float]:
    """Median seconds per call of each candidate, measured round-robin (after :func:`settle_kernels`)."""
    for fn in candidates.values():
        for _ in range(warmup):
            block(fn())
    settle_kernels()
    for fn in candidates.values():
        for _ in range(2):
            block(fn())
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            for _ in range(calls):
                start = time.perf_counter()
                block(fn())
                samples[name].append(time.perf_counter() - start)
    return {name: float(np.median(v)) for name, v in samples.items()}


def median_wall_cpu(candidates: dict[str, Callable[[], object]], *, rounds: int, calls: int, warmup: int = 2,
                    settle: bool = False) -> dict[str, tuple[float, float]]:
    """``{name: (median wall s, median CPU s)}`` per call, candidates round-robin; CPU time is the
    process's (all threads).  ``settle``: one untimed call before each block of calls (the previous
    candidate's memory traffic leaves this one's caches cold).  After :func:`settle_kernels`."""
    for fn in candidates.values():
        for _ in range(warmup):
            block(fn())
    settle_kernels()
    for fn in candidates.values():
        for _ in range(2):
            block(fn())
    wall: dict[str, list[float]] = {name: [] for name in candidates}
    cpu: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            if settle:
                block(fn())
            for _ in range(calls):
                w0, c0 = time.perf_counter(), time.process_time()
                block(fn())
                cpu[name].append(time.process_time() - c0)
                wall[name].append(time.perf_counter() - w0)
    return {name: (float(np.median(wall[name])), float(np.median(cpu[name]))) for name in candidates}


def fmt_time(seconds: float) -> str:
    if seconds != seconds:  # nan
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def save_bar_plot(path: str, labels: list[str], series: dict[str, list[float]], *, ylabel: str, title: str,
                  log: bool = True) -> str | None:
    """Grouped bar chart; returns the path, or None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no plot)")
        return None
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(labels) * max(1, len(series)) / 2), 4))
    width = 0.8 / max(1, len(series))
    x = np.arange(len(labels))
    for k, (name, values) in enumerate(series.items()):
        ax.bar(x + k * width, values, width, label=name)
    ax.set_xticks(x + width * (len(series) - 1) / 2, labels, rotation=15)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if log:
        ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

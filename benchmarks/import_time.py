"""How long ``import evjax`` takes, against ``import jax, numba`` (what it cannot avoid).

    python benchmarks/import_time.py [--runs 9]

Each import runs in a fresh process under ``python -X importtime``; the time
of an import is the cumulative microseconds of its top-level modules (for
``import evjax``, the ``evjax`` line, which includes JAX and Numba; for
``import jax, numba``, the two lines summed).  Runs alternate between the two
commands, and the table gives medians and their ratio (goal: at most 1.5x).
The same processes check what the import must not do: import Warp or
``numba.cuda``, or start Numba's threads.  Writes
``benchmarks/results/import_time.{md,png}``.
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import RESULTS, markdown_table, save_bar_plot  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOAL = 1.5
CHECK = ("import sys; from numba.np.ufunc import parallel; "
         "print('LOADED', sorted(m for m in sys.modules if m == 'warp' or m.startswith('numba.cuda')), "
         "parallel._is_initialized)")


def import_seconds(statement: str, top: tuple[str, ...]) -> tuple[float, str]:
    """Seconds of ``statement``'s top-level imports (``-X importtime``), and what the check printed."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", f"{statement}; {CHECK}"], env=env,
                         capture_output=True, text=True, cwd=ROOT, timeout=300, check=True)
    total = 0
    for line in out.stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            _, cumulative, name = (part.strip() for part in line.split("|"))
            if name in top:
                total += int(cumulative)
    return total / 1e6, out.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    cases = {"import evjax": ("import evjax", ("evjax",)), "import jax, numba": ("import jax, numba", ("jax", "numba"))}
    samples: dict[str, list[float]] = {name: [] for name in cases}
    checks = set()
    import_seconds(*cases["import evjax"])  # warm the file system cache
    for _ in range(args.runs):
        for name, (statement, top) in cases.items():
            seconds, check = import_seconds(statement, top)
            samples[name].append(seconds)
            if name == "import evjax":
                checks.add(check)
    medians = {name: float(np.median(v)) for name, v in samples.items()}
    ratio = medians["import evjax"] / medians["import jax, numba"]
    rows = [[name, f"{medians[name] * 1e3:.0f} ms", f"{min(v) * 1e3:.0f}-{max(v) * 1e3:.0f} ms"]
            for name, v in samples.items()]
    lines = [
        f"# Import time ({time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()})",
        "",
        markdown_table(["statement", f"median of {args.runs}", "range"], rows),
        "",
        f"`import evjax` / `import jax, numba`: **{ratio:.2f}x** (goal: at most {GOAL}x: "
        f"{'met' if ratio <= GOAL else 'MISSED'}).",
        f"After `import evjax`: {sorted(checks)} (no Warp, no numba.cuda, Numba's threads not started).",
    ]
    report = "\n".join(lines)
    print(report)
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "import_time.md"), "w") as f:
        f.write(report + "\n")
    save_bar_plot(os.path.join(RESULTS, "import_time.png"), list(medians),
                  {"median seconds": list(medians.values())}, ylabel="seconds", title="import time", log=False)


if __name__ == "__main__":
    main()

"""What the scripts that time evjax against brainevent 0.3.0 in alternating fresh processes share.

brainevent 0.3.0 needs Python 3.12 and jax 0.12, evjax pins jax < 0.12, so the two cannot share a process:
a script runs itself as a child (``--child LIBRARY --calls N``) in each library's interpreter, the libraries
alternate, and the whole comparison runs twice, on a quiet machine and under ``benchmarks/contention.py``'s
load.  Used by ``benchmarks/versus_brainevent.py`` and ``benchmarks/tcsr.py``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parser(doc: str) -> argparse.ArgumentParser:
    """The options every side-by-side script takes."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--calls", type=int, default=None)
    p.add_argument("--brainevent-python", default=os.environ.get("BRAINEVENT_PYTHON"),
                   help="a Python (3.12+) with brainevent 0.3.0 installed")
    p.add_argument("--quick", action="store_true", help="fewer calls and rounds")
    p.add_argument("--neighbours", type=int, default=2)
    p.add_argument("--spinners", type=int, default=2)
    p.add_argument("--out", default=None)
    return p


def pythons_of(p: argparse.ArgumentParser, args) -> dict:
    """``{library: interpreter}``; an error naming the option when brainevent's is missing."""
    if not args.brainevent_python:
        p.error("--brainevent-python (or $BRAINEVENT_PYTHON) is required: brainevent 0.3.0 runs in its own "
                "interpreter")
    return {"evjax": sys.executable, "brainevent": args.brainevent_python}


def calls_and_rounds(args) -> tuple[int, int]:
    return (args.calls or 30, 2) if args.quick else (args.calls or 100, 3)


def run_child(script: str, python: str, library: str, calls: int) -> dict:
    """``script --child library --calls calls`` in ``python``; the JSON its last line prints."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    res = subprocess.run([python, os.path.abspath(script), "--child", library, "--calls", str(calls)],
                         env=env, capture_output=True, text=True, timeout=3600, cwd=ROOT)
    if res.returncode != 0:
        raise RuntimeError(f"{library} child failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def quiet_and_loaded(script: str, pythons: dict, measure: Callable[[], dict], args) -> tuple[dict, dict, float]:
    """``(measure() on a quiet machine, measure() under load, the load average seen)``, after one
    untimed child of ``script`` per library has filled the kernel caches (``measure`` runs the
    timed children)."""
    from benchmarks.contention import start_load, stop_load

    for library, python in pythons.items():
        run_child(script, python, library, 3)
    quiet = measure()
    load = start_load(args.neighbours, args.spinners, seconds=3600)
    try:
        time.sleep(2.0)
        load_avg = os.getloadavg()[0]
        loaded = measure()
        load_avg = max(load_avg, os.getloadavg()[0])
    finally:
        stop_load(load)
    return quiet, loaded, load_avg


def run(script: str, doc: str, argv, child: Callable[[str, int], dict],
        measure: Callable[[dict, int, int], dict]):
    """A side-by-side script's start: parse ``argv``; as a child, print ``child(library, calls)`` as
    JSON and return None; else ``(args, calls, rounds, quiet, loaded, load_avg)`` with
    ``measure(pythons, rounds, calls)`` on a quiet machine and under load."""
    p = parser(doc)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.calls)))
        return None
    pythons = pythons_of(p, args)
    calls, rounds = calls_and_rounds(args)
    quiet, loaded, load_avg = quiet_and_loaded(script, pythons, lambda: measure(pythons, rounds, calls), args)
    return args, calls, rounds, quiet, loaded, load_avg

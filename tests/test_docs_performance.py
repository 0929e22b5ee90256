"""docs/performance.md runs, in a fresh process (its dispatch setting must come before JAX's CPU client)."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from tests.helpers import HANG_GUARD_S

ROOT = pathlib.Path(__file__).resolve().parent.parent

SCRIPT = """
import doc_runner
ns = doc_runner.run_markdown("docs/performance.md")
import jax
assert jax.config.read("jax_cpu_enable_async_dispatch") is False
print("OK performance", int(ns["counts"].sum()))
"""


def test_performance_page_runs_with_synchronous_dispatch():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=HANG_GUARD_S)
    assert proc.returncode == 0, f"STDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr[-6000:]}"
    assert "OK performance" in proc.stdout
    assert int(proc.stdout.split("OK performance")[1].split()[0]) > 0

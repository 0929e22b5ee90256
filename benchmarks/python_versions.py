"""Python 3.11-3.13 and both ends of the pinned jax range: evjax installs, runs, exits promptly, stops on Ctrl-C.

    python benchmarks/python_versions.py                    # every configuration in CONFIGS, one after another
    python benchmarks/python_versions.py py3.13 lowest      # the named ones
    python benchmarks/python_versions.py --keep             # keep (and reuse) the virtualenvs in /tmp/evjax-venvs/<name>
    python benchmarks/python_versions.py above              # the newest jax the index offers, past the pin

For each configuration the script makes a virtualenv (a temporary folder, or
``/tmp/evjax-venvs/<name>`` with ``--keep``) with that configuration's Python
and installs into it, with ``pip install``, a copy of this checkout's package
(``pyproject.toml``, ``README.md``, ``evjax/``: no stale ``build/`` folder
can reach the wheel), pytest and hypothesis (what the tests below import;
the ``[test]`` extra adds Warp, matplotlib and mkdocs, which they don't need)
and the configuration's requirements.  Then, each in a fresh process with
new, empty ``NUMBA_CACHE_DIR`` and ``EVJAX_CACHE_DIR`` and no ``XLA_FLAGS``:

* exit: a script imports evjax, runs a jitted ``spikes @ W`` on an
  ``evjax.CSR`` (n = 500, p = 0.02) and its jitted ``jax.grad`` with respect to
  the weights (both compile their kernels on the spot), and prints
  ``time.monotonic()`` as its last statement; the time from that line to the
  process's exit, seen by this script, has to be at most 1 s (issue 29).  Its
  standard error must not hold a traceback (Python 3.12+ once printed
  "can't create new thread at interpreter shutdown" for compiles queued at exit);
* Ctrl-C: the same script gets SIGINT 1 s after it printed that its first
  call starts (inside the first kernel's compile, several seconds long); it has
  to stop within 5 s with ``KeyboardInterrupt`` on its standard error;
* tests: ``pytest`` on TESTS (the README's path under a user's defaults, and
  the CSR API tests whose kernels compile quickest), run in a copy of
  ``tests/`` outside the checkout, so that ``import evjax`` is the installed
  package; passed / failed / skipped counts.

Configurations: Python 3.11, 3.12 and 3.13 with the newest releases the
package index offers within ``pyproject.toml``'s pins, and Python 3.11 with the
lowest ones.  ``above`` (only when named) installs the package without its
dependencies and then the newest jax, jaxlib, numba, numpy and scipy the
index offers, pins aside: whether the jax pin could be widened.  The Pythons are found as ``python3.X`` on ``PATH`` or under
``$PYENV_ROOT/versions`` (``--python 3.12=/path/to/python`` names one).  The
configurations run one after another (each install and each cold compile uses
every core).  Prints a markdown table and writes
``benchmarks/results/python_versions.md``.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchmarks.common import RESULTS, markdown_table, provenance  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEEP_DIR = "/tmp/evjax-venvs"

# What the tests import beyond evjax's own requirements.
TEST_REQUIREMENTS = ["pytest>=8", "hypothesis>=6.100"]
# The lowest releases pyproject.toml's pins allow (numpy>=2.0 and scipy>=1.14 are jax 0.10.0's own floors;
# numba 0.60.0 requires numpy<2.1 and llvmlite 0.43).
LOWEST = ["jax==0.10.0", "jaxlib==0.10.0", "numba==0.60.0", "numpy==2.0.0", "scipy==1.14.0"]
CONFIGS = {
    # name: (Python "3.X", requirements added to the package's own: none = the newest within the pins)
    "py3.11": ("3.11", []),
    "py3.12": ("3.12", []),
    "py3.13": ("3.13", []),
    "lowest": ("3.11", LOWEST),
}
# Run only when named: the package installed without its dependencies, then these (pins aside).
ABOVE = {"above": ("3.13", ["jax", "jaxlib", "numba", "numpy", "scipy"])}
PACKAGES = ["jax", "jaxlib", "numba", "llvmlite", "numpy", "scipy", "ml_dtypes"]
# The CSR API tests without the brainevent comparison and two error-message tests (40 s of kernel compiles).
TESTS = ["tests/test_smoke_user_defaults.py", "tests/test_csr_api.py", "-k",
         "not brainevent and not workspace_keyword and not implicit_dense_conversion"]

EXIT_GOAL_S = 1.0
CTRL_C_DELAY_S = 1.0  # after the script says its first call starts
CTRL_C_GOAL_S = 5.0
HANG_GUARD_S = 1800  # subprocess timeouts: hang guards only

SCRIPT = r'''
import sys, time
t0 = time.perf_counter()
import jax, jax.numpy as jnp, numpy as np
import evjax
n = 500
rng = np.random.default_rng(0)
W = evjax.CSR.fromdense(((rng.random((n, n)) < 0.02) * rng.standard_normal((n, n))).astype(np.float32))
spikes = jnp.asarray(rng.random(n) < 0.1)
forward = jax.jit(lambda d: spikes @ W.with_data(d))
grad = jax.jit(jax.grad(lambda d: jnp.sum((spikes @ W.with_data(d)) ** 2)))
dense = np.asarray(W.todense())
print("FIRST_CALL", flush=True)
t1 = time.perf_counter()
out = np.asarray(forward(W.data))
g = np.asarray(grad(W.data))
t2 = time.perf_counter()
np.testing.assert_allclose(out, np.asarray(spikes, np.float32) @ dense, rtol=1e-4, atol=1e-4)
assert g.shape == W.data.shape and np.isfinite(g).all()
print("TIMES", t1 - t0, t2 - t1, flush=True)
print("LAST", repr(time.monotonic()), flush=True)
'''


# ---------------------------------------------------------------------------
# Pythons, virtualenvs, installs
# ---------------------------------------------------------------------------
def python_version_of(exe: str) -> str | None:
    try:
        res = subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def find_python(version: str, given: dict[str, str]) -> str | None:
    """An interpreter of ``version`` ("3.12"): named by --python, ``python3.12`` on PATH, or pyenv's."""
    if version in given:
        return given[version]
    candidates = [shutil.which(f"python{version}")]
    pyenv_root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates += sorted(glob.glob(os.path.join(pyenv_root, "versions", f"{version}.*", "bin", "python")), reverse=True)
    for exe in candidates:
        if exe and python_version_of(exe) == version:
            return exe
    return None


def package_copy(folder: str) -> tuple[str, str]:
    """Copies of this checkout's package (without build leftovers) and, in a folder of its own, of its tests
    (so that their ``import evjax`` finds the installed package, not the copy): (package root, tests root)."""
    src, suite = os.path.join(folder, "evjax-src"), os.path.join(folder, "suite")
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so")
    shutil.copytree(os.path.join(ROOT, "evjax"), os.path.join(src, "evjax"), ignore=skip)
    shutil.copytree(os.path.join(ROOT, "tests"), os.path.join(suite, "tests"), ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), src)
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), suite)  # pytest's settings
    return src, suite


def clean_env(**extra: str) -> dict:
    """This environment without what would leak into the child: venv, PYTHONPATH, XLA and JAX settings."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "XLA_FLAGS", "JAX_ENABLE_X64", "JAX_PLATFORMS", "EVJAX_USER_XLA_FLAGS",
            "NUMBA_CACHE_DIR", "EVJAX_CACHE_DIR", "PYTHONHOME")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("PYENV_VERSION")}
    env.update(extra)
    return env


def tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def make_venv(name: str, python: str, keep: bool, scratch: str) -> str:
    venv = os.path.join(KEEP_DIR, name) if keep else os.path.join(scratch, "venv")
    if not os.path.exists(os.path.join(venv, "bin", "python")):
        subprocess.run([python, "-m", "venv", venv], check=True, capture_output=True, text=True, timeout=600)
    return os.path.join(venv, "bin", "python")


def install(vpy: str, src: str, requirements: list[str], pins: bool = True) -> tuple[float, str | None]:
    """``pip install <src> pytest hypothesis <requirements>``, or without ``pins`` ``<src>`` without its
    dependencies first: (seconds, None or the error's last lines)."""
    pip = [vpy, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    steps = [[*pip, src, *TEST_REQUIREMENTS, *requirements]]
    if not pins:
        steps = [[*pip, "--no-deps", src], [*pip, "--upgrade", *TEST_REQUIREMENTS, *requirements]]
    start = time.perf_counter()
    for step in steps:
        res = subprocess.run(step, capture_output=True, text=True, timeout=HANG_GUARD_S, env=clean_env())
        if res.returncode != 0:
            return time.perf_counter() - start, tail(res.stdout + "\n" + res.stderr, 20)
    return time.perf_counter() - start, None


def newest_on_index(vpy: str, package: str = "jax") -> str:
    """The newest release of ``package`` the package index offers for this interpreter, pins aside."""
    res = subprocess.run([vpy, "-m", "pip", "index", "versions", package], capture_output=True, text=True,
                         timeout=600, env=clean_env())
    found = re.search(rf"^{package} \((\S+)\)", res.stdout, re.M)
    return found.group(1) if found else "?"


def installed_versions(vpy: str) -> dict:
    code = ("import importlib.metadata as m, json, platform\n"
            f"d = {{'python': platform.python_version()}}\n"
            f"for p in {PACKAGES!r}:\n"
            "    try: d[p] = m.version(p)\n"
            "    except m.PackageNotFoundError: d[p] = '-'\n"
            "print(json.dumps(d))")
    res = subprocess.run([vpy, "-c", code], capture_output=True, text=True, timeout=120, env=clean_env())
    return json.loads(res.stdout) if res.returncode == 0 else {"python": "?"}


# ---------------------------------------------------------------------------
# the checks, each in a fresh process with empty caches
# ---------------------------------------------------------------------------
def cache_env(folder: str) -> dict:
    return clean_env(NUMBA_CACHE_DIR=os.path.join(folder, "numba"), EVJAX_CACHE_DIR=os.path.join(folder, "evjax"))


def check_exit(vpy: str, scratch: str) -> dict:
    """Run SCRIPT; the seconds from its last statement to its exit, its first calls' seconds, problems."""
    with tempfile.TemporaryDirectory(prefix="cache-", dir=scratch) as cache:
        proc = subprocess.Popen([vpy, "-c", SCRIPT], env=cache_env(cache), cwd=cache, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=HANG_GUARD_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            return {"error": f"no exit within {HANG_GUARD_S} s", "stderr": tail(err)}
        ended = time.monotonic()
    result = {"returncode": proc.returncode, "stderr": tail(err)}
    for line in out.splitlines():
        if line.startswith("LAST "):
            result["exit_s"] = ended - float(line.split()[1])
        elif line.startswith("TIMES "):
            result["import_s"], result["first_calls_s"] = map(float, line.split()[1:3])
    if proc.returncode != 0 or "exit_s" not in result:
        result["error"] = f"exit status {proc.returncode}"
    elif "Traceback" in err or "can't create new thread" in err:
        result["error"] = "a traceback on stderr after a normal exit"
    return result


def check_ctrl_c(vpy: str, scratch: str) -> dict:
    """SIGINT inside the first compile: how long until the process ended, and how."""
    with tempfile.TemporaryDirectory(prefix="cache-", dir=scratch) as cache:
        # A shell starts a background job ('... &') with SIGINT ignored, and a child inherits that: Python then
        # installs no KeyboardInterrupt handler and the signal does nothing.  The child gets the default back.
        proc = subprocess.Popen([vpy, "-c", SCRIPT], env=cache_env(cache), cwd=cache, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        while True:
            line = proc.stdout.readline()
            if not line or line.startswith("FIRST_CALL"):
                break
        if not line:
            proc.wait(timeout=HANG_GUARD_S)
            return {"error": f"ended (status {proc.returncode}) before its first call", "stderr": tail(proc.stderr.read())}
        time.sleep(CTRL_C_DELAY_S)
        if proc.poll() is not None:
            out, err = proc.communicate()
            if proc.returncode != 0:
                return {"error": f"failed (exit status {proc.returncode}) before the signal", "stderr": tail(err)}
            return {"error": "finished its calls before the signal: no compile to interrupt"}
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        try:
            out, err = proc.communicate(timeout=60)
            waited = time.monotonic() - sent
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            return {"error": "still running 60 s after SIGINT (killed)", "stderr": tail(err)}
    result = {"stop_s": waited, "returncode": proc.returncode, "stderr": tail(err, 6)}
    if "LAST" in out:
        result["error"] = "the SIGINT was lost: the script ran to its end"
    elif "KeyboardInterrupt" not in err:
        result["error"] = f"exit status {proc.returncode} without KeyboardInterrupt"
    return result


def run_tests(vpy: str, suite: str, scratch: str) -> dict:
    """pytest on TESTS in the copy of tests/ (outside the checkout), with empty caches."""
    with tempfile.TemporaryDirectory(prefix="cache-", dir=scratch) as cache:
        start = time.perf_counter()
        res = subprocess.run([vpy, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS], cwd=suite,
                             env=cache_env(cache), capture_output=True, text=True, timeout=HANG_GUARD_S)
        seconds = time.perf_counter() - start
    summary = next((line for line in reversed(res.stdout.splitlines()) if re.search(r"\d+ (passed|failed|error)", line)),
                   "")
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?)", summary)}
    counts["errors"] = counts.pop("error", 0) + counts.pop("errors", 0)
    result = {"seconds": seconds, "returncode": res.returncode, "summary": summary.strip("= "), **counts}
    if res.returncode != 0:
        result["error"] = f"pytest exit status {res.returncode}"
        result["output"] = tail(res.stdout + "\n" + res.stderr, 30)
    return result


def brief(result: dict) -> dict:
    """A check's result without its standard error (for the progress lines)."""
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in result.items() if k != "stderr"}


def run_config(name: str, python: str | None, requirements: list[str], keep: bool, pins: bool = True) -> dict:
    result = {"name": name, "requirements": requirements}
    if python is None:
        result["error"] = "no such Python found"
        return result
    scratch = tempfile.mkdtemp(prefix=f"evjax-versions-{name}-")
    try:
        src, suite = package_copy(scratch)
        vpy = make_venv(name, python, keep, scratch)
        result["install_s"], error = install(vpy, src, requirements, pins)
        if error:
            result["error"] = "pip install failed"
            result["install_error"] = error
            return result
        result["versions"] = installed_versions(vpy)
        result["newest_jax"] = newest_on_index(vpy)
        print(f"  installed in {result['install_s']:.0f} s: {result['versions']}", flush=True)
        result["exit"] = check_exit(vpy, scratch)
        print(f"  exit: {brief(result['exit'])}", flush=True)
        result["ctrl_c"] = check_ctrl_c(vpy, scratch)
        print(f"  Ctrl-C: {brief(result['ctrl_c'])}", flush=True)
        result["tests"] = run_tests(vpy, suite, scratch)
        print(f"  tests: {result['tests'].get('summary')} ({result['tests']['seconds']:.0f} s)", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return result


# ---------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------
def row(r: dict) -> list[str]:
    v = r.get("versions")
    if not v:
        return [r["name"], "-", "-", "-", "-", "-", "-", "-", r.get("error", "-")]
    exit_, ctrl_c, tests = r["exit"], r["ctrl_c"], r["tests"]
    if "exit_s" in exit_:
        exit_cell = f"{exit_['exit_s']:.2f} s " + ("(met)" if exit_["exit_s"] <= EXIT_GOAL_S else "(NOT met)")
        if exit_.get("error"):
            exit_cell += f"; {exit_['error']}"
    else:
        exit_cell = exit_.get("error", "-")
    if "error" in ctrl_c:
        ctrl_cell = ctrl_c["error"]
    else:
        ok = ctrl_c["stop_s"] <= CTRL_C_GOAL_S
        ctrl_cell = f"KeyboardInterrupt after {ctrl_c['stop_s']:.2f} s" + ("" if ok else " (NOT met)")
    test_cell = f"{tests.get('passed', 0)} passed, {tests.get('failed', 0)} failed"
    if tests.get("errors"):
        test_cell += f", {tests['errors']} errors"
    if tests.get("skipped"):
        test_cell += f", {tests['skipped']} skipped"
    return [
        r["name"], v["python"], f"{v['jax']} / {v['jaxlib']}", f"{v['numba']} / {v['llvmlite']}",
        f"{v['numpy']} / {v['scipy']}", f"{exit_['first_calls_s']:.1f} s" if "first_calls_s" in exit_ else "-", exit_cell, ctrl_cell,
        test_cell,
    ]


def pins() -> list[str]:
    text = open(os.path.join(ROOT, "pyproject.toml")).read()
    deps = re.search(r"^dependencies = \[(.*?)\]", text, re.S | re.M).group(1)
    python = re.search(r'^requires-python = "(.*?)"', text, re.M).group(1)
    return [f"python{python}"] + re.findall(r'"([^"]+)"', deps)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="*", help=f"configurations to run (default: all of {list(CONFIGS)}; "
                                                   f"also {list(ABOVE)})")
    parser.add_argument("--keep", action="store_true", help=f"keep and reuse the virtualenvs in {KEEP_DIR}/<name>")
    parser.add_argument("--python", action="append", default=[], metavar="3.X=PATH",
                        help="the interpreter to use for Python 3.X (repeatable)")
    parser.add_argument("--out", default=None, help="markdown output (default benchmarks/results/python_versions.md)")
    args = parser.parse_args(argv)
    names = args.configs or list(CONFIGS)
    unknown = sorted(set(names) - set(CONFIGS) - set(ABOVE))
    if unknown:
        parser.error(f"unknown configurations {unknown}; known: {list(CONFIGS) + list(ABOVE)}")
    given = dict(item.split("=", 1) for item in args.python)
    lines = []

    def emit(text=""):
        print(text, flush=True)
        lines.append(text)

    pinned = pins()  # as the packages installed below have them
    results = []
    for name in names:
        version, requirements = {**CONFIGS, **ABOVE}[name]
        python = find_python(version, given)
        print(f"{name}: Python {version} ({python}), {' '.join(requirements) or 'newest within the pins'}", flush=True)
        results.append(run_config(name, python, requirements, args.keep, pins=name not in ABOVE))

    above = ("; `above` installs the package without its dependencies, then the newest jax, jaxlib, numba, numpy "
             "and scipy, pins aside" if set(names) & set(ABOVE) else "")
    emit(provenance(argv))
    emit("# evjax on Python 3.11-3.13 and at both ends of the jax pin")
    emit()
    emit(f"Pins (pyproject.toml): {', '.join(f'`{p}`' for p in pinned)}. Each configuration is a fresh "
         f"virtualenv with `pip install` of the package, pytest and hypothesis; `lowest` adds "
         f"{', '.join(f'`{p}`' for p in LOWEST)}{above}; the others get the newest releases the index offers within "
         f"the pins. Every check is a fresh process with empty NUMBA_CACHE_DIR and EVJAX_CACHE_DIR. First calls: "
         f"the first jitted `spikes @ W` (CSR, n = 500) and its first jitted `jax.grad`, wall seconds (their "
         f"kernels compile). Exit: from the script's last statement to the process's end, goal <= "
         f"{EXIT_GOAL_S:.0f} s. Ctrl-C: SIGINT {CTRL_C_DELAY_S:.0f} s into the first compile, goal: "
         f"KeyboardInterrupt within {CTRL_C_GOAL_S:.0f} s. Tests: `pytest -q {shlex.join(TESTS)}`, "
         f"with empty caches. {os.cpu_count()} CPUs, load average at the end "
         f"{os.getloadavg()[0]:.2f}.")
    emit()
    emit(markdown_table(["configuration", "Python", "jax / jaxlib", "numba / llvmlite", "numpy / scipy",
                         "first calls", "exit after last statement", "Ctrl-C in a compile", "tests"],
                        [row(r) for r in results]))
    tested = sorted({r["versions"]["jax"] for r in results if r.get("versions")},
                    key=lambda v: [int(x) for x in re.findall(r"\d+", v)])
    offered = sorted({f"{r['newest_jax']} for Python {r['versions']['python'].rsplit('.', 1)[0]}"
                      for r in results if r.get("newest_jax")})
    emit()
    emit(f"jax releases tested: {', '.join(tested) or 'none'}. The newest jax the package index offers, pins "
         f"aside: {', '.join(offered) or '?'}.")
    problems = []
    for r in results:
        for step in ("install_error",):
            if r.get(step):
                problems.append(f"- {r['name']}: pip install failed:\n\n```text\n{r[step]}\n```")
        if r.get("error") and not r.get("install_error"):
            problems.append(f"- {r['name']}: {r['error']}")
        for step in ("exit", "ctrl_c", "tests"):
            s = r.get(step) or {}
            if s.get("error"):
                detail = s.get("output") or s.get("stderr") or ""
                problems.append(f"- {r['name']}, {step}: {s['error']}" +
                                (f"\n\n```text\n{detail}\n```" if detail else ""))
    emit()
    emit("## Failures")
    emit()
    if set(names) & set(ABOVE):
        emit("`above` runs past the pins: a failure there says the jax pin cannot be widened yet.")
        emit()
    emit("\n".join(problems) if problems else "None.")
    os.makedirs(RESULTS, exist_ok=True)
    out = args.out or os.path.join(RESULTS, "python_versions.md")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

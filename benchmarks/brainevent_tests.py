"""brainevent 0.3.0's own test files, run against evjax through a naming-only import shim.

    python benchmarks/brainevent_tests.py --brainevent-dir /path/to/site-packages/brainevent \\
        --python /path/to/venv/bin/python

What a brainevent user meets when they change the import: every ``brainevent``
module name resolves to evjax's public names (``brainevent._csr.binary.binary_csrmv``
is ``evjax.binary_csrmv``); brainevent's test utilities (``_test_util.py`` files)
are loaded from its own files, since they are test code, not library code.  The
test files are copied from the brainevent installation given (nothing of
brainevent is kept in this repository) and run with ``pytest -n 2``.

``--python`` is an interpreter with evjax, pytest, pytest-xdist and the packages
brainevent's tests import (``brainstate``, ``braintools``, ``brainunit``); its
tests need no brainevent install.  The failures are sorted by what they hit:

* a name that is not one of brainevent's 174 public names (a private module
  attribute such as ``_csrmv_cuda_kernel``, or a test-only helper): not API;
* one of the public names evjax does not have (``docs/migrating_from_brainevent.md``
  says which and why);
* anything else: a behaviour of a name both libraries have.  These are listed
  one by one, with the first line of their error, for review.

Writes ``benchmarks/results/brainevent_tests.md``.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.common import RESULTS, markdown_table, provenance  # noqa: E402

SHIM = r'''
"""Every brainevent module is a view of evjax's public names; brainevent's test utilities load from its files."""
import importlib.abc, importlib.util, os, sys, types
import evjax
BE = {be_dir!r}
TEST_UTILS = {{"brainevent." + p[:-3].replace(os.sep, ".") for p in {test_utils!r}}}


class NameModule(types.ModuleType):
    def __getattr__(self, name):
        if name == "__all__":
            return list(evjax.__all__)
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return getattr(evjax, name)
        except AttributeError:
            raise AttributeError(f"shim: evjax has no {{name!r}} (asked as {{self.__name__}}.{{name}})") from None


class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname != "brainevent" and not fullname.startswith("brainevent."):
            return None
        if fullname in TEST_UTILS:
            rel = fullname.split(".", 1)[1].replace(".", os.sep) + ".py"
            return importlib.util.spec_from_file_location(fullname, os.path.join(BE, rel))
        rel = os.path.join(BE, *fullname.split(".")[1:])
        if fullname != "brainevent" and not (os.path.exists(rel + ".py") or os.path.isdir(rel)):
            return None  # not a module of brainevent: "from m import name" asks the module for the name
        return importlib.util.spec_from_loader(fullname, self, is_package=True)

    def create_module(self, spec):
        module = NameModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        if module.__name__ == "brainevent":
            module.__version__ = "0.3.0"


sys.meta_path.insert(0, Finder())
'''

FAILURE_LINE = re.compile(r"^(?P<path>/\S+?\.py):(?P<line>\d+): (?P<error>.*)$")
MISSING = re.compile(r"(?:evjax has no|cannot import name|has no attribute) '(?P<name>\w+)'")


def public_names() -> set[str]:
    """brainevent 0.3.0's 174 public names (the list the tests of this repository check)."""
    with open(os.path.join(ROOT, "tests", "brainevent_0_3_0_names.txt")) as f:
        return {line.strip() for line in f if line.strip() and not line.startswith("#")}


def prepare(be_dir: str, work: str) -> tuple[str, int]:
    """Copy brainevent's test files into ``work/tests`` with the shim's conftest; return that folder
    and the number of test files."""
    tests = os.path.join(work, "tests")
    os.makedirs(tests)
    utils, count = [], 0
    for folder, _, files in os.walk(be_dir):
        for name in files:
            rel = os.path.relpath(os.path.join(folder, name), be_dir)
            if name.endswith("_test.py"):
                shutil.copy(os.path.join(folder, name), os.path.join(tests, rel.replace(os.sep, "_")))
                count += 1
            elif name == "_test_util.py":
                utils.append(rel)
    with open(os.path.join(work, "brainevent_shim.py"), "w") as f:
        f.write(SHIM.format(be_dir=be_dir, test_utils=sorted(utils)))
    with open(os.path.join(tests, "conftest.py"), "w") as f:
        f.write(f"import sys\nsys.path.insert(0, {work!r})\nimport brainevent_shim  # noqa: F401,E402\n")
    return tests, count


def classify(error: str, names: set[str], evjax_names: set[str]) -> str:
    found = MISSING.search(error)
    if found and found.group("name") not in names:
        return "a name outside brainevent's public API (private or test-only)"
    if found and found.group("name") not in evjax_names:
        return "a public brainevent name evjax does not have (documented)"
    return "a behaviour of a name both have"


def _short(error: str) -> str:
    """The first line of an error, with printed arrays elided (so that equal failures group)."""
    return re.sub(r"\[[-+0-9.eE\[\] ,]*(\.\.\.)?.*", "[...]", error)[:160]


def tally(lines: list[str], names: set[str], evjax_names: set[str]):
    """``(failures by kind, behaviour failures by file and error, test modules that did not import by
    kind)`` from pytest's ``--tb=line`` output."""
    kinds, behaviours, modules = collections.Counter(), collections.Counter(), collections.Counter()
    in_module_error = False
    for line in lines:
        if line.startswith("ImportError while importing test module") or "ERROR collecting" in line:
            in_module_error = True
            continue
        if in_module_error and line.startswith("E   ") and MISSING.search(line):
            modules[classify(line, names, evjax_names)] += 1
            in_module_error = False
            continue
        match = FAILURE_LINE.match(line)
        if not match or os.sep + "importlib" + os.sep in match.group("path"):
            continue
        kind = classify(match.group("error"), names, evjax_names)
        kinds[kind] += 1
        if kind == "a behaviour of a name both have":
            behaviours[f"{os.path.basename(match.group('path'))}: {_short(match.group('error'))}"] += 1
    return kinds, behaviours, modules


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brainevent-dir", required=True, help="the brainevent package folder of a 0.3.0 install")
    parser.add_argument("--python", default=sys.executable, help="interpreter with evjax and the tests' packages")
    parser.add_argument("--timeout", type=int, default=3600)
    args = parser.parse_args(argv)
    names = public_names()
    probe = subprocess.run([args.python, "-c", "import evjax; print(' '.join(dir(evjax)))"],
                           capture_output=True, text=True, check=True)
    evjax_names = set(probe.stdout.split())
    with tempfile.TemporaryDirectory(prefix="evjax-be-tests-") as work:
        tests, n_files = prepare(os.path.abspath(args.brainevent_dir), work)
        run = subprocess.run([args.python, "-m", "pytest", "-q", "-n", "2", "--continue-on-collection-errors",
                              "-p", "no:cacheprovider", "-W", "ignore", "--tb=line", "-rN"],
                             cwd=tests, capture_output=True, text=True, timeout=args.timeout)
    out = run.stdout + run.stderr
    summary = next((line for line in reversed(out.splitlines()) if re.search(r"\d+ (passed|failed)", line)), "?")
    kinds, behaviours, modules = tally(out.splitlines(), names, evjax_names)
    lines = [provenance(argv), "# brainevent 0.3.0's tests against evjax", "",
             f"The {n_files} test files brainevent ships in its wheel, run against evjax through a naming-only "
             "import shim (`benchmarks/brainevent_tests.py`: every `brainevent` module name resolves to evjax's "
             "public names; brainevent's test utilities load from its own files).", "",
             f"- pytest: {summary.strip('= ')}", "",
             "## Failures by what they hit", "",
             markdown_table(["what the failure hit", "failed tests", "test modules that did not import"],
                            [[k, str(kinds[k]), str(modules[k])] for k in sorted(set(kinds) | set(modules))]),
             "", "## Behaviours of names both libraries have", "",
             markdown_table(["test file: first line of the error", "failures"],
                            [[k.replace("|", "\\|"), str(v)] for k, v in behaviours.most_common()])]
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "brainevent_tests.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

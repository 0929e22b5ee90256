"""No module of the test suite imports a test module: what several modules share lives in
tests/helpers.py (or a non-test helper module: doc_runner.py, threads.py, kernels_for_tests.py, ...).

Every ``tests/**/*.py`` is parsed with :mod:`ast`; each ``import`` / ``from ... import`` statement
(module level or inside a function, absolute or relative) and each ``importlib.import_module`` /
``__import__`` call with a literal name is resolved to the files it could load, and naming a
``test_*.py`` file of the suite fails the test.
"""
from __future__ import annotations

import ast
import pathlib

TESTS = pathlib.Path(__file__).resolve().parent
ROOT = TESTS.parent


def _package_of(path: pathlib.Path) -> list[str]:
    """The dotted package of a file under tests/ (``tests/cudasim/x.py`` -> ``["tests", "cudasim"]``)."""
    return list(path.relative_to(ROOT).parent.parts)


def _test_module_file(dotted: str) -> pathlib.Path | None:
    """The suite's ``test_*.py`` that the module name ``dotted`` loads, if any: the name read from the
    repository root (``tests.test_x``) or from tests/ on ``sys.path`` (``test_x``, ``cudasim.test_x``)."""
    parts = [p for p in dotted.split(".") if p]
    if not parts or not parts[-1].startswith("test_"):
        return None
    for base in (ROOT, TESTS):
        candidate = base.joinpath(*parts).with_suffix(".py")
        if candidate.is_file() and TESTS in candidate.resolve().parents:
            return candidate
    return None


def imported_modules(path: pathlib.Path, source: str | None = None) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of every module (and every ``from X import name`` as ``X.name``) that
    ``path`` (or ``source``, read as if it were the file ``path``) imports."""
    tree = ast.parse(path.read_text() if source is None else source, filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = _package_of(path)
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names if alias.name != "*"]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("import_module", "__import__"):
                found.append((node.lineno, node.args[0].value))
    return found


def cross_imports(files) -> list[str]:
    problems = []
    for path in files:
        for line, module in imported_modules(path):
            target = _test_module_file(module)
            if target is not None and target.resolve() != path.resolve():
                problems.append(f"{path.relative_to(ROOT)}:{line} imports {module} "
                                f"({target.relative_to(ROOT)}, a test module)")
    return sorted(set(problems))


def suite_files() -> list[pathlib.Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_module_of_the_suite_imports_a_test_module():
    problems = cross_imports(suite_files())
    assert not problems, "move what they share to tests/helpers.py:\n" + "\n".join(problems)


def test_the_check_sees_every_form_of_import():
    """The forms the suite once used (and a few more) are all caught; helper modules are not."""
    sub = TESTS / "cudasim"
    sources = {
        "a": "from .test_csr_ops import random_structure\n",
        "b": "from tests.test_csr_ops import (\n    cases,\n)\n",
        "c": "def f():\n    from tests.cudasim.test_sim_tutorial import run\n",
        "d": "from tests import test_dense_ops as dense_tests\n",
        "e": "import tests.test_warp\n",
        "f": "import importlib\nimportlib.import_module('tests.test_jitc_ops')\n",
        "g": "from .. import test_sharding\n",
        "ok": "from tests.helpers import HANG_GUARD_S\nfrom tests import doc_runner, threads\nfrom .threads import x\n"
              "from tests import kernels_for_tests as K\nimport test_data_that_does_not_exist\n",
    }
    flagged = {}
    for name, source in sources.items():
        path = (sub if name == "g" else TESTS) / f"test_probe_{name}.py"
        flagged[name] = [m for _, m in imported_modules(path, source) if _test_module_file(m)]
    assert {name for name, hits in flagged.items() if hits} == set("abcdefg"), flagged

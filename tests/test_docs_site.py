"""The documentation site: its pages' code runs, it builds in strict mode, the API reference is complete."""
import inspect
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

import evjax
import evjax.compat  # noqa: F401 (docs/api.md documents evjax.compat.jax_kernel)

from .doc_runner import ROOT, run_markdown
from tests.helpers import HANG_GUARD_S, run_warp_page

PAGES = ["docs/getting_started.md", "docs/concepts.md", "docs/own_op.md", "docs/custom_kernels.md",
         "docs/compact_events.md", "docs/sparse_backward.md"]


@pytest.mark.parametrize("page", PAGES)
def test_page_code_runs(page):
    run_markdown(page)


def test_migration_page_code_runs():
    pytest.importorskip("warp")
    run_warp_page("docs/migrating_from_brainevent.md")


def test_api_reference_lists_every_public_name():
    text = (ROOT / "docs" / "api.md").read_text()
    listed = set(re.findall(r"^::: evjax\.(\w+)", text, flags=re.M))
    # an alias (another name for a listed object) is named in the page's text instead
    aliases = {name for name in re.findall(r"`evjax\.(\w+)`", text)
               if any(getattr(evjax, name, None) is getattr(evjax, other) for other in listed)}
    # an op (an XLACustomKernel object, which mkdocstrings cannot render) is named in the page's text
    ops = {name for name in re.findall(r"`evjax\.(\w+)`", text)
           if isinstance(getattr(evjax, name, None), evjax.XLACustomKernel)}
    missing = sorted(set(evjax.__all__) - listed - aliases - ops)
    assert not missing, f"docs/api.md lacks: {missing}"


def _public_callables():
    for name in evjax.__all__:
        obj = getattr(evjax, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            yield name, obj


@pytest.mark.parametrize("name", [n for n, _ in _public_callables()])
def test_public_docstring_has_args_and_example(name):
    obj = getattr(evjax, name)
    doc = inspect.getdoc(obj) or ""
    assert "Example" in doc, f"evjax.{name}'s docstring has no Example section"
    target = obj.__init__ if inspect.isclass(obj) else obj
    params = [p for p in inspect.signature(target).parameters if p not in ("self", "args", "kwargs")]
    if params:
        assert "Args:" in doc, f"evjax.{name}'s docstring has no Args section"


def test_every_docs_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = [p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")]
    missing = [p for p in pages if p not in nav]
    assert not missing, f"pages not in mkdocs.yml's nav: {missing}"


def test_site_builds_strict(tmp_path):
    mkdocs = shutil.which("mkdocs", path=str(pathlib.Path(sys.executable).parent)) or shutil.which("mkdocs")
    assert mkdocs, "mkdocs is not installed: pip install '.[test]' installs it"
    result = subprocess.run([mkdocs, "build", "--strict", "-d", str(tmp_path / "site")], cwd=ROOT,
                            capture_output=True, text=True, timeout=HANG_GUARD_S,
                            env={"NO_MKDOCS_2_WARNING": "1", **__import__("os").environ})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (tmp_path / "site" / "api" / "index.html").exists()

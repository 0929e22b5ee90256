"""Run the ```python code blocks of a markdown page, in order, in one namespace.

Used by the tests so that the docs cannot drift from the code.  A block whose
info string is ```python skip (or that is inside an HTML comment) is not run.
"""
from __future__ import annotations

import pathlib
import re

_BLOCK = re.compile(r"^```python([^\n]*)\n(.*?)^```", re.S | re.M)
ROOT = pathlib.Path(__file__).resolve().parent.parent


def code_blocks(path: str | pathlib.Path) -> list[str]:
    """The runnable ```python blocks of ``path`` (relative to the repo root)."""
    text = (ROOT / path).read_text()
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    return [code for info, code in _BLOCK.findall(text) if "skip" not in info.split()]


def run_markdown(path: str | pathlib.Path, namespace: dict | None = None) -> dict:
    """Execute every runnable block of ``path``; return the shared namespace.

    Raises:
        AssertionError: the page has no runnable block.
        Exception: whatever a block raises, with the block number in the note.
    """
    blocks = code_blocks(path)
    assert blocks, f"{path} has no ```python blocks"
    namespace = {"__name__": f"doc:{path}"} if namespace is None else namespace
    for number, code in enumerate(blocks, 1):
        try:
            exec(compile(code, f"{path}#block{number}", "exec", dont_inherit=True), namespace)
        except Exception as exc:
            exc.add_note(f"in code block {number} of {path}")
            raise
    return namespace

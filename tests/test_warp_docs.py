"""The Warp tutorial's code blocks run as written, on Warp's CPU device."""
import linecache

import pytest

pytest.importorskip("warp")

from tests.doc_runner import code_blocks  # noqa: E402

PAGE = "docs/tutorials/warp.md"


def run_page(path: str) -> dict:
    """Like ``doc_runner.run_markdown``, with two things Warp needs.

    * ``dont_inherit=True``: the blocks must not inherit this package's
      ``from __future__ import annotations`` (Warp evaluates the annotations of
      kernels built inside generators, which refer to local types);
    * each block's lines in ``linecache``: Warp reads a kernel's source there.
    """
    namespace = {"__name__": "warp_tutorial"}
    blocks = code_blocks(path)
    assert blocks, f"{path} has no python blocks"
    for number, code in enumerate(blocks, 1):
        name = f"{path}#block{number}"
        linecache.cache[name] = (len(code), None, code.splitlines(keepends=True), name)
        try:
            exec(compile(code, name, "exec", dont_inherit=True), namespace)
        except Exception as exc:
            exc.add_note(f"in code block {number} of {path}")
            raise
    return namespace


def test_warp_tutorial_runs():
    namespace = run_page(PAGE)
    assert "spikes_times_csr_op" in namespace and "multi_op" in namespace
    assert namespace["multi_op"].defaults == {"cpu": "numba", "gpu": "warp"}

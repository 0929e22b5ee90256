"""docs/tutorials/numba_cuda.md runs in Numba's CUDA simulator: every code block
except those marked ```python gpu (tests/test_numba_cuda_gpu.py runs all of
them on a GPU)."""
from __future__ import annotations

import re

from tests.doc_runner import ROOT, _BLOCK

PAGE = "docs/tutorials/numba_cuda.md"


def blocks(include_gpu: bool) -> list[str]:
    text = re.sub(r"<!--.*?-->", "", (ROOT / PAGE).read_text(), flags=re.S)
    chosen = []
    for info, code in _BLOCK.findall(text):
        words = info.split()
        if "skip" in words or ("gpu" in words and not include_gpu):
            continue
        chosen.append(code)
    return chosen


def run(include_gpu: bool) -> dict:
    namespace: dict = {"__name__": "tutorial_numba_cuda"}
    for number, code in enumerate(blocks(include_gpu), 1):
        try:
            exec(compile(code, f"{PAGE}#block{number}", "exec"), namespace)
        except Exception as exc:
            exc.add_note(f"in code block {number} of {PAGE}")
            raise
    return namespace


def test_tutorial_runs_in_the_simulator():
    assert len(blocks(False)) >= 12 and len(blocks(True)) > len(blocks(False))
    namespace = run(include_gpu=False)
    assert namespace["ON_GPU"] is False
    assert "lif_step" in namespace and "leaky_relu_op" in namespace

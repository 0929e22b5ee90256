"""``BinaryArray @ CSR`` reaches ``bind`` in at most 5 evjax frames, and a warm eager forward
moves between evjax files at most 25 times (issue "Structure v3"; benchmarks/call_depth.py
prints the same counts)."""
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _call_depth():
    spec = importlib.util.spec_from_file_location("call_depth", os.path.join(ROOT, "benchmarks", "call_depth.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.fresh_process  # file_moves settles every serial tier the process has used: only this test's
def test_at_most_five_frames_before_bind_and_25_file_moves_for_a_forward():
    depth = _call_depth()
    data, fns = depth.cases()
    for name, fn in fns.items():
        assert depth.frames_before_bind(fn, data) <= depth.GOAL_FRAMES, name
    moves, files = depth.file_moves(lambda: fns["forward"](data))
    assert 0 < moves <= depth.GOAL_MOVES and files > 1

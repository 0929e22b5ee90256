"""The Numba CPU tutorial's code blocks run as written."""
from tests.doc_runner import run_markdown


def test_numba_cpu_tutorial_runs():
    namespace = run_markdown("docs/tutorials/numba_cpu.md")
    assert "trace_op" in namespace and "matvec_op" in namespace

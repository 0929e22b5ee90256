"""The Warp tutorial's code blocks run as written, on Warp's CPU device."""
import pytest

pytest.importorskip("warp")

from tests.helpers import run_warp_page  # noqa: E402

PAGE = "docs/tutorials/warp.md"


def test_warp_tutorial_runs():
    namespace = run_warp_page(PAGE)
    assert "spikes_times_csr_op" in namespace and "multi_op" in namespace
    assert namespace["multi_op"].defaults == {"cpu": "numba", "gpu": "warp"}

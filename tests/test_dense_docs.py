"""docs/dense_events.md: its code blocks run as written."""
from tests.doc_runner import run_markdown


def test_dense_events_page_runs():
    namespace = run_markdown("docs/dense_events.md")
    assert "W" in namespace and "per_w" in namespace

"""The ``fresh_process`` marker of tests/conftest.py: a marked test runs in a new process, and its outcome
(pass, skip, failure) is the outer test's."""
from __future__ import annotations

import os

import pytest

INSIDE = "EVJAX_TEST_IN_FRESH_PROCESS"


@pytest.mark.fresh_process
def test_a_marked_test_runs_in_a_new_process():
    assert os.environ.get(INSIDE) == "1"


@pytest.mark.fresh_process
def test_a_skip_in_the_new_process_is_the_outer_tests_skip():
    # Outside, the hook must not run this body: it starts a new process, which skips, and reports the
    # skip with its reason (before 2026-11-29 it reported a failure: no " passed" line).
    if os.environ.get(INSIDE) == "1":
        pytest.skip("skipped in the new process, as it should be (the marker's skip path)")
    raise AssertionError("the fresh_process hook ran the test body in the worker")

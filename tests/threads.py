"""A helper for the concurrency tests: run a check from several Python threads at once."""
from __future__ import annotations

import threading
from typing import Callable


def check_in_threads(check: Callable[[int], None], n_threads: int = 4) -> None:
    """Run ``check(k)`` for k in ``range(n_threads)``, each on its own thread, all at once.

    Raises:
        AssertionError: listing what any of the checks raised.
    """
    errors = []

    def run(k):
        try:
            check(k)
        except Exception as exc:  # noqa: BLE001 - reported below, with the thread's index
            errors.append((k, exc))

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors

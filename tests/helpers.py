"""What several test modules share (test modules never import each other)."""
from __future__ import annotations

# Subprocess timeouts in the tests are hang guards only: far above the normal time of any
# subprocess here (seconds to a couple of minutes with empty caches), so a loaded machine
# (the issue saw a 3.8 s test pass 300 s at load 12-19 on 2 cores) never fails a test by time.
HANG_GUARD_S = 1800


def handler_count() -> int:
    """How many (kernel, signature) pairs have a Numba CPU handler in this process."""
    from evjax.backends import numba_cpu

    return sum(len(by_signature) for by_signature in list(numba_cpu._handlers.values()))

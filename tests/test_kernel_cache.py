"""Numba's disk cache of a kernel is fresh only while the files it inlines code from are unchanged.

Numba's own cache checks only the file that defines the kernel, so a kernel
that inlines a helper (or reads a constant) from another file kept its old
machine code after that file changed.  evjax registers a cache locator for
its own files (:func:`evjax._kernel_compat.stamp_kernel_caches`); these tests
run it on a throwaway two-file package, in fresh processes sharing one
``NUMBA_CACHE_DIR``, with the stamp and (to show the test can fail) without.
"""
import os
import subprocess
import sys

import numba
import pytest

import evjax  # noqa: F401 (registers evjax's own locator)
from evjax import _kernel_compat
from evjax.backends import numba_cpu
from tests.helpers import HANG_GUARD_S

HELPERS = '''
import numba

STEP = {step}


@numba.njit(inline="always", cache=True)
def bump(x):
    return x + STEP
'''

KERNEL = '''
import numba

from helpers import bump


@numba.njit(cache=True)
def run(x):
    return bump(x)
'''

SCRIPT = '''
import sys
sys.path.insert(0, {pkg!r})
from evjax import _kernel_compat
if {stamp}:
    _kernel_compat.stamp_kernel_caches({pkg!r}, support=())
import kernel
print(kernel.run(0), sum(kernel.run.stats.cache_hits.values()))
'''


def _write_helpers(pkg, step: int, mtime: float) -> None:
    path = pkg / "helpers.py"
    path.write_text(HELPERS.format(step=step))
    os.utime(path, (mtime, mtime))  # a distinct time, whatever the file system's clock resolution


def _run_cached_kernel(pkg, cache, stamp: bool) -> tuple[int, int]:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(pkg=str(pkg), stamp=stamp)], env=env,
                         capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert out.returncode == 0, out.stderr
    value, hits = out.stdout.split()[-2:]
    return int(value), int(hits)


@pytest.mark.parametrize("stamp", [True, False], ids=["stamped", "numba-alone"])
def test_a_changed_helper_file_recompiles_the_kernel_that_inlines_it(tmp_path, stamp):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "kernel.py").write_text(KERNEL)
    _write_helpers(pkg, 1, 1_000_000_000)
    cache = tmp_path / "numba_cache"

    assert _run_cached_kernel(pkg, cache, stamp) == (1, 0)  # compiled, then saved
    assert _run_cached_kernel(pkg, cache, stamp) == (1, 1)  # unchanged: loaded from the cache
    _write_helpers(pkg, 2, 1_000_000_100)
    if stamp:
        assert _run_cached_kernel(pkg, cache, stamp) == (2, 0)  # the helper changed: compiled again
        assert _run_cached_kernel(pkg, cache, stamp) == (2, 1)
    else:
        assert _run_cached_kernel(pkg, cache, stamp) == (1, 1)  # Numba alone: the stale machine code


def test_stamp_covers_the_folder_and_the_support_files_only(tmp_path):
    family, support, other = tmp_path / "family", tmp_path / "support", tmp_path.parent / "elsewhere.py"
    family.mkdir()
    support.mkdir()
    (family / "kernels.py").write_text("")
    (family / "rows.py").write_text("A = 1\n")
    (support / "core.py").write_text("")
    kernel = str(family / "kernels.py")

    def stamp():
        _kernel_compat._stamps.clear()  # read once per process: forget it to read the files again
        return _kernel_compat.kernel_source_stamp(kernel, str(tmp_path), ("support",))

    first = stamp()
    assert first is not None and stamp() == first
    (family / "rows.py").write_text("A = 22\n")  # a sibling file changes (size)
    second = stamp()
    assert second != first
    (support / "core.py").write_text("X = 1\n")  # a support file changes
    assert stamp() != second
    assert _kernel_compat.kernel_source_stamp(str(other), str(tmp_path), ("support",)) is None


def test_evjax_kernels_and_handlers_carry_the_stamp(monkeypatch):
    from numba.core import caching

    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl")
    assert getattr(impl._locator_classes[0], "_evjax_root", None) == os.path.dirname(_kernel_compat.__file__)

    from evjax.primitives.csr import numba as csr_numba

    kernel = csr_numba.scatter_mv
    assert kernel._cache._cache_file._source_stamp[1] == _kernel_compat.kernel_source_stamp(
        kernel.py_func.__code__.co_filename)
    before, _ = numba_cpu._kernel_fingerprint(kernel)
    monkeypatch.setattr(_kernel_compat, "kernel_source_stamp", lambda *args, **kwargs: "changed")
    after, cacheable = numba_cpu._kernel_fingerprint(kernel)
    assert cacheable and after != before  # the handler (which holds the kernel's code) is renamed too


def test_code_outside_evjax_keeps_numbas_own_stamp(tmp_path):
    @numba.njit(cache=True)
    def outside(x):
        return x

    stamp = outside._cache._cache_file._source_stamp
    assert not (isinstance(stamp, tuple) and len(stamp) == 2 and isinstance(stamp[1], str))


pytestmark = pytest.mark.filterwarnings("ignore::numba.NumbaWarning")


def test_a_kernel_reached_through_an_unnormalised_path_keeps_its_handler_name(monkeypatch):
    """``sys.path`` entries such as ``benchmarks/..`` give a module a file name with ``..`` in it; the
    handler's name (and so its disk cache) must not depend on it (a first process after
    ``python -m evjax.precompile`` compiled its handlers again where it did)."""
    import inspect
    import os

    from evjax.backends import numba_cpu

    from . import kernels_for_tests as kft

    real = inspect.getsourcefile(kft.add_kernel.py_func)
    before = numba_cpu._kernel_fingerprint(kft.add_kernel)
    folder = os.path.dirname(real)
    odd = os.path.join(folder, "..", os.path.basename(folder), os.path.basename(real))
    monkeypatch.setattr(numba_cpu.inspect, "getsourcefile", lambda f: odd)
    assert numba_cpu._kernel_fingerprint(kft.add_kernel) == before

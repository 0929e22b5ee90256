"""set_cache_dir / get_cache_dir / clear_cache (brainevent's names) over evjax's cache folder."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import evjax
from tests.helpers import HANG_GUARD_S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def cache_env(monkeypatch):
    """Restore EVJAX_CACHE_DIR (set_cache_dir changes it) when the test ends."""
    monkeypatch.setenv("EVJAX_CACHE_DIR", os.environ.get("EVJAX_CACHE_DIR", ""))
    if not os.environ["EVJAX_CACHE_DIR"]:
        monkeypatch.delenv("EVJAX_CACHE_DIR")


def _touch(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("x")


def test_set_then_get(tmp_path, cache_env, monkeypatch):
    target = tmp_path / "new" / "cache"
    assert evjax.set_cache_dir(target) is None
    assert evjax.get_cache_dir() == str(target) and target.is_dir()
    assert os.environ["EVJAX_CACHE_DIR"] == str(target)
    monkeypatch.chdir(tmp_path)
    evjax.set_cache_dir("relative")
    assert evjax.get_cache_dir() == str(tmp_path / "relative")
    with pytest.raises(TypeError, match="str or a path"):
        evjax.set_cache_dir(3)
    with pytest.raises(ValueError, match="empty"):
        evjax.set_cache_dir("")


def test_clear_cache_removes_entries_by_part_or_name(tmp_path, cache_env):
    evjax.set_cache_dir(tmp_path)
    handlers = tmp_path / "handlers"
    files = [handlers / "_evjax_handler_aaa.py", handlers / "_evjax_handler_bbb.py",
             handlers / "__pycache__" / "_evjax_handler_aaa.handler-12.py312.nbi",
             handlers / "__pycache__" / "_evjax_handler_aaa.handler-12.py312.1.nbc",
             handlers / "__pycache__" / "_evjax_handler_bbb.handler-12.py312.nbi",
             tmp_path / "warp" / "wp_kernel" / "k.o"]
    for f in files:
        _touch(str(f))
    assert evjax.clear_cache("_evjax_handler_aaa") == 3
    assert sorted(p.name for p in handlers.rglob("*") if p.is_file()) == [
        "_evjax_handler_bbb.handler-12.py312.nbi", "_evjax_handler_bbb.py"]
    assert evjax.clear_cache("_evjax_handler_aaa") == 0
    assert evjax.clear_cache("warp") == 1 and not (tmp_path / "warp").exists()
    assert evjax.clear_cache() == 2
    assert list(tmp_path.iterdir()) == [] and tmp_path.is_dir()  # the folder itself stays
    assert evjax.clear_cache() == 0
    with pytest.raises(ValueError, match="handler module name"):
        evjax.clear_cache("../x")
    with pytest.raises(TypeError, match="string or None"):
        evjax.clear_cache(3)


_CODE = """
    import os, sys
    import jax, jax.numpy as jnp, numpy as np
    import evjax
    from evjax.backends import numba_cpu
    from tests import kernels_for_tests as K
    evjax.set_cache_dir(sys.argv[1])
    assert evjax.get_cache_dir() == sys.argv[1]
    f = evjax.numba_kernel(K.add_kernel, jax.ShapeDtypeStruct((4,), jnp.float32))
    y = f(jnp.arange(4, dtype=jnp.float32), jnp.ones(4, jnp.float32))
    np.testing.assert_array_equal(y, [1, 2, 3, 4])
    (h,) = numba_cpu._handlers[K.add_kernel].values()
    written = [name for name in os.listdir(os.path.join(sys.argv[1], "handlers")) if name.endswith(".py")]
    print("HITS", h.module.handler.cache_hits, "WRITTEN", len(written))
    if sys.argv[2] == "clear":
        print("CLEARED", evjax.clear_cache() > 0, os.listdir(sys.argv[1]))
        np.testing.assert_array_equal(f(jnp.zeros(4, jnp.float32), jnp.ones(4, jnp.float32)), [1, 1, 1, 1])
"""


def _run(cache: str, action: str) -> str:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), JAX_PLATFORMS="cpu")
    env.pop("EVJAX_CACHE_DIR", None)
    env.pop("NUMBA_CACHE_DIR", None)  # else Numba caches the handler there, where clear_cache does not look
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(_CODE), cache, action], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_a_cleared_cache_is_recompiled_and_refilled(tmp_path):
    cache = str(tmp_path / "cache")
    first = _run(cache, "clear")  # compiles into the new folder, then empties it (still runs from memory)
    assert "WRITTEN 1" in first and "CLEARED True []" in first, first
    second = _run(cache, "keep")  # nothing on disk: compiled again, correctly, and written back
    assert "HITS 0 WRITTEN 1" in second, second
    third = _run(cache, "keep")   # the refilled cache is used
    assert "HITS 1 WRITTEN 1" in third, third

"""A corrupted or read-only disk cache costs a rebuild and one logged line, never a failure.

evjax reads three disk caches: Numba's (``.nbi`` index and ``.nbc`` data
files, in ``NUMBA_CACHE_DIR``), its own handler modules (``.py`` files in
``EVJAX_CACHE_DIR/handlers``) and Warp's (``.o`` and ``.meta`` files in
``EVJAX_CACHE_DIR/warp``).  Each test fills a cache in a fresh process,
damages one entry, and checks in fresh processes that the next run gives the
same result with exactly one ``evjax:`` line naming the damaged file, and that
the run after it is clean (the entry was rebuilt).  A cache folder that cannot
be written gives one line and a compile in memory.

Running as root, a read-only folder is made by dropping the capability that
lets root write anywhere (``CAP_DAC_OVERRIDE``) in the child process.
"""
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap

import pytest

NUMBA_KERNEL = '''
import numba


@numba.njit(cache=True)
def affine(x, out):
    for i in range(x.shape[0]):
        out[i] = 2.0 * x[i] + 1.0
'''

WARP_KERNEL = '''
import warp as wp


@wp.kernel(enable_backward=False)
def triple(a: wp.array(dtype=wp.float32), out: wp.array(dtype=wp.float32)):
    i = wp.tid()
    out[i] = 3.0 * a[i] + 0.5
'''

SCRIPT = '''
import json, sys
sys.path.insert(0, {kernels!r})
import jax, jax.numpy as jnp, numpy as np
import evjax

results = []
for op in {ops!r}:
    x = jnp.arange(5.0, dtype=jnp.float32)
    if op == "numba":
        import numba_kernels
        call = evjax.numba_kernel(numba_kernels.affine, jax.ShapeDtypeStruct((5,), jnp.float32))
        results.append(np.asarray(jax.jit(call)(x)).tolist())
    elif op == "csr":
        dense = np.array([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0], [4.0, 0.0, 5.0]], np.float32)
        matrix = evjax.CSR.fromdense(jnp.asarray(dense))
        results.append(np.asarray(jax.jit(lambda s: s @ matrix)(jnp.array([True, False, True]))).tolist())
    elif op == "warp":
        import warp as wp
        wp.config.quiet = True
        import warp_kernels
        call = evjax.warp_kernel(warp_kernels.triple, jax.ShapeDtypeStruct((5,), jnp.float32), launch_dims=5)
        results.append(np.asarray(jax.jit(call)(x)).tolist())
print("RESULTS", json.dumps(results))
'''


def _has_warp() -> bool:
    try:
        import warp  # noqa: F401
    except ImportError:
        return False
    return True


# Gives up CAP_DAC_OVERRIDE (from the bounding set: PR_CAPBSET_DROP), then runs the rest of the
# command line: root then obeys file modes.  A launcher process rather than a preexec_fn, which
# would fork this (multithreaded, JAX-running) process.
DROP_ROOT_OVERRIDE = (
    "import ctypes, os, sys\n"
    "if ctypes.CDLL(None, use_errno=True).prctl(24, 1, 0, 0, 0) != 0:\n"
    "    sys.exit('evjax-test: prctl(PR_CAPBSET_DROP) failed')\n"
    "os.execv(sys.executable, [sys.executable] + sys.argv[1:])\n"
)


def _python(read_only: bool) -> list[str]:
    """The command that starts Python; as root with ``read_only``, without root's write override."""
    if read_only and os.geteuid() == 0:
        return [sys.executable, "-c", DROP_ROOT_OVERRIDE]
    return [sys.executable]


def _run_ops_in_fresh_process(root, ops, *, read_only_root=False) -> tuple[list, list[str], str]:
    """Run ``ops`` in a fresh process on the caches under ``root`` (kernels in ``root/../kernels``):
    (results, evjax lines, stderr)."""
    env = {k: v for k, v in os.environ.items() if k not in ("EVJAX_WARP_CACHE_DIR", "WARP_CACHE_PATH")}
    env.update(NUMBA_CACHE_DIR=str(root / "numba"), EVJAX_CACHE_DIR=str(root / "evjax"), JAX_PLATFORMS="cpu")
    script = SCRIPT.format(kernels=str(root.parent / "kernels"), ops=list(ops))
    out = subprocess.run(_python(read_only_root) + ["-c", script], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.split("RESULTS", 1)[1])
    lines = [line for line in out.stderr.splitlines() if line.startswith("evjax:")]
    return results, lines, out.stderr


def _warnings(lines: list[str]) -> list[str]:
    """The lines that are not the notice of a slow first compile (which a rebuild may log too)."""
    return [line for line in lines if not line.startswith("evjax: compiling ")]


class Filled:
    """A cache filled once by ``ops``; :meth:`restore` puts it back as filled (same paths, so
    that Numba's cache of the handler modules, keyed by their folder, stays valid)."""

    def __init__(self, base, ops):
        self.root, self.pristine, self.ops = base / "cache", base / "pristine", ops
        kernels = base / "kernels"
        kernels.mkdir()
        (kernels / "numba_kernels.py").write_text(NUMBA_KERNEL)
        (kernels / "warp_kernels.py").write_text(WARP_KERNEL)
        self.results, lines, stderr = _run_ops_in_fresh_process(self.root, ops)
        assert not _warnings(lines) and "Traceback" not in stderr, stderr
        shutil.copytree(self.root, self.pristine, symlinks=True)

    def restore(self):
        shutil.rmtree(self.root)
        shutil.copytree(self.pristine, self.root, symlinks=True)
        return self.root

    def files(self, pattern):
        found = sorted(self.root.glob(pattern))
        assert found, f"no cache file matches {pattern} in {self.root}"
        return found


@pytest.fixture(scope="module")
def numba_cache(tmp_path_factory):
    return Filled(tmp_path_factory.mktemp("numba_op"), ["numba"])


@pytest.fixture(scope="module")
def csr_cache(tmp_path_factory):
    return Filled(tmp_path_factory.mktemp("csr_op"), ["csr"])


@pytest.fixture(scope="module")
def warp_cache(tmp_path_factory):
    if not _has_warp():
        pytest.skip("warp-lang is not installed")
    return Filled(tmp_path_factory.mktemp("warp_op"), ["warp"])


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _garble(path):
    data = bytearray(path.read_bytes())
    data[:16] = b"\xff\xfe\x00garbage\x80\x81\x82\x83\x84\x85"
    path.write_bytes(bytes(data))


def _check_rebuilt(cache: Filled, damaged, before):
    """Damage ``damaged`` files, then: one line naming them, same results; then a clean run."""
    root = cache.root
    results, lines, stderr = _run_ops_in_fresh_process(root, cache.ops)
    assert results == cache.results
    assert "Traceback" not in stderr, stderr
    warnings = _warnings(lines)
    assert len(warnings) == 1, stderr
    assert "rebuilding" in warnings[0] and all(str(path) in warnings[0] for path in damaged), warnings[0]
    for path, old in zip(damaged, before):
        assert path.exists() and path.read_bytes() != old, f"{path} was not rebuilt"
    results, lines, stderr = _run_ops_in_fresh_process(root, cache.ops)
    assert results == cache.results
    assert lines == [], stderr  # loaded from the rebuilt cache: nothing to discard, nothing to compile


def _damage(files, how):
    for path in files:
        how(path)
    return [path.read_bytes() for path in files]


# ---------------------------------------------------------------------------
# Numba's cache
# ---------------------------------------------------------------------------
def test_truncated_index_of_a_handler(numba_cache):
    numba_cache.restore()
    damaged = numba_cache.files("numba/handlers_*/_evjax_handler_*.handler-*.nbi")
    _check_rebuilt(numba_cache, damaged, _damage(damaged, _truncate))


def test_truncated_data_file_of_a_handler(numba_cache):
    numba_cache.restore()
    damaged = numba_cache.files("numba/handlers_*/_evjax_handler_*.handler-*.nbc")
    _check_rebuilt(numba_cache, damaged, _damage(damaged, _truncate))


def test_truncated_index_of_the_users_kernel(numba_cache):
    """The handler is rebuilt (its cache is gone) and the user's kernel, which Numba loads
    from its own cache entry meanwhile, has a truncated index."""
    root = numba_cache.restore()
    for path in root.glob("numba/handlers_*/*.nb?"):
        path.unlink()
    damaged = numba_cache.files("numba/kernels_*/numba_kernels.affine-*.nbi")
    _check_rebuilt(numba_cache, damaged, _damage(damaged, _truncate))


def test_truncated_index_of_an_evjax_operator(csr_cache):
    csr_cache.restore()
    damaged = csr_cache.files("numba/handlers_*/_evjax_handler_*.handler-*.nbi")
    _check_rebuilt(csr_cache, damaged, _damage(damaged, _truncate))


def test_truncated_data_files_of_evjaxs_own_kernels(csr_cache):
    """The operator's handler is rebuilt, and Numba loads evjax's kernels from their (all
    truncated) cache entries meanwhile: one line per file it reads, each rebuilt once."""
    root = csr_cache.restore()
    for path in root.glob("numba/handlers_*/*.nb?"):
        path.unlink()
    damaged = [path for path in csr_cache.files("numba/*/*.nbc") if "handlers_" not in path.parent.name]
    _damage(damaged, _truncate)
    results, lines, stderr = _run_ops_in_fresh_process(root, csr_cache.ops)
    assert results == csr_cache.results and "Traceback" not in stderr, stderr
    named = [next(str(path) for path in damaged if str(path) in line) for line in _warnings(lines)]
    assert named and len(named) == len(set(named)), stderr
    results, lines, stderr = _run_ops_in_fresh_process(root, csr_cache.ops)
    assert results == csr_cache.results and lines == [], stderr


def test_a_broken_entry_is_discarded_alone(tmp_path):
    """A function cached at two signatures: the broken data file goes, the other entry stays."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "twice.py").write_text("import numba\n\n\n@numba.njit(cache=True)\ndef plus(x):\n    return x + 1\n")
    script = textwrap.dedent(f'''
        import sys
        sys.path.insert(0, {str(pkg)!r})
        from evjax import _kernel_compat
        _kernel_compat.stamp_kernel_caches({str(pkg)!r}, support=())
        import twice
        print(twice.plus(1), twice.plus(1.5), sum(twice.plus.stats.cache_hits.values()))
    ''')
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"))

    def run():
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return out.stdout.split(), [line for line in out.stderr.splitlines() if line.startswith("evjax:")]

    assert run() == (["2", "2.5", "0"], [])
    assert run() == (["2", "2.5", "2"], [])
    data = sorted((tmp_path / "numba").glob("*/twice.plus-*.nbc"))
    assert len(data) == 2
    _truncate(data[1])
    values, lines = run()
    assert values == ["2", "2.5", "1"]  # the intact entry is still loaded
    assert len(lines) == 1 and str(data[1]) in lines[0], lines
    assert run() == (["2", "2.5", "2"], [])


# ---------------------------------------------------------------------------
# evjax's handler modules
# ---------------------------------------------------------------------------
def test_garbled_handler_module(numba_cache):
    numba_cache.restore()
    damaged = numba_cache.files("evjax/handlers/_evjax_handler_*.py")
    _check_rebuilt(numba_cache, damaged, _damage(damaged, _garble))


# ---------------------------------------------------------------------------
# Warp's cache
# ---------------------------------------------------------------------------
def test_truncated_warp_object_file(warp_cache):
    warp_cache.restore()
    damaged = warp_cache.files("evjax/warp/**/wp_warp_kernels_*.o")
    _check_rebuilt(warp_cache, damaged, _damage(damaged, _truncate))


def test_garbled_warp_metadata(warp_cache):
    warp_cache.restore()
    damaged = warp_cache.files("evjax/warp/**/wp_warp_kernels_*.meta")
    _check_rebuilt(warp_cache, damaged, _damage(damaged, _garble))


# ---------------------------------------------------------------------------
# Folders that cannot be written
# ---------------------------------------------------------------------------
def _read_only(path):
    for folder, dirs, files in os.walk(path):
        for name in files:
            os.chmod(os.path.join(folder, name), stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        os.chmod(folder, stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)


def _writable(path):
    for folder, _, _ in os.walk(path):
        os.chmod(folder, stat.S_IRWXU)


@pytest.fixture
def read_only(tmp_path):
    """Make folders read-only for the child processes (restored for cleanup)."""
    probe = tmp_path / "probe"
    probe.mkdir()
    _read_only(probe)
    made = [probe]
    code = f"open({str(probe / 'x')!r}, 'w')"
    out = subprocess.run(_python(True) + ["-c", code], capture_output=True, text=True, timeout=60)
    if "prctl(PR_CAPBSET_DROP) failed" in out.stderr:
        _writable(probe)
        pytest.skip("cannot give up root's write override here")
    if out.returncode == 0:
        _writable(probe)
        pytest.skip("a read-only folder is still writable here")

    def make(path):
        path.mkdir(parents=True, exist_ok=True)
        _read_only(path)
        made.append(path)
        return path

    yield make
    for path in made:
        _writable(path)


def test_read_only_evjax_cache_compiles_in_memory(tmp_path, read_only):
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "numba_kernels.py").write_text(NUMBA_KERNEL)
    (kernels / "warp_kernels.py").write_text(WARP_KERNEL)
    ops = ["numba", "warp"] if _has_warp() else ["numba"]
    root = tmp_path / "cache"
    folder = read_only(root / "evjax")
    expected = None
    for _ in range(2):  # nothing is cached: each process compiles again, and says so once
        results, lines, stderr = _run_ops_in_fresh_process(root, ops, read_only_root=True)
        expected = expected or results
        assert results == expected and "Traceback" not in stderr, stderr
        warnings = _warnings(lines)
        assert len(warnings) == 1 and str(folder) in warnings[0] and "in memory" in warnings[0], stderr
        assert os.listdir(folder) == []
    assert expected[0] == [1.0, 3.0, 5.0, 7.0, 9.0]


def test_read_only_filled_cache_is_used_silently(numba_cache, read_only):
    root = numba_cache.restore()
    read_only(root / "evjax")
    try:
        results, lines, stderr = _run_ops_in_fresh_process(root, numba_cache.ops, read_only_root=True)
    finally:
        _writable(root / "evjax")
    assert results == numba_cache.results
    assert lines == [], stderr


def test_no_writable_folder_for_numbas_cache(tmp_path, read_only):
    """Numba alone raises 'cannot cache function ...: no locator available' at the kernel's
    declaration when neither NUMBA_CACHE_DIR, the source's __pycache__ nor the user cache
    folder can be written; evjax's kernels compile in memory instead, with one line."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "numba_kernels.py").write_text(NUMBA_KERNEL)
    read_only(pkg)
    numba_dir, user_dir = read_only(tmp_path / "numba"), read_only(tmp_path / "user")
    script = textwrap.dedent(f'''
        import sys
        import numpy as np
        sys.path.insert(0, {str(pkg)!r})
        from evjax import _kernel_compat
        _kernel_compat.stamp_kernel_caches({str(pkg)!r}, support=())
        import numba_kernels
        out = np.zeros(3)
        numba_kernels.affine(np.arange(3.0), out)
        print(out.tolist())
    ''')
    env = dict(os.environ, NUMBA_CACHE_DIR=str(numba_dir), XDG_CACHE_HOME=str(user_dir), HOME=str(user_dir))
    for _ in range(2):
        out = subprocess.run(_python(True) + ["-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split("\n")[0] == "[1.0, 3.0, 5.0]"
        lines = [line for line in out.stderr.splitlines() if line.startswith("evjax:")]
        assert len(lines) == 1 and str(numba_dir) in lines[0] and "in memory" in lines[0], out.stderr
    assert os.listdir(numba_dir) == [] and os.listdir(user_dir) == []

"""Core v2: the FFI core (one prologue for every handler), re-wrapping identical kernels, the memory a
wrapper keeps, and the layering rules of docs/architecture.md."""
import ast
import ctypes
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np

import evjax
from evjax.backends import ffi_abi, ffi_core, numba_cpu
from tests import kernels_for_tests as K
from tests.helpers import HANG_GUARD_S

S = jax.ShapeDtypeStruct
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "evjax")
HANDLER_T = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)


# ---------------------------------------------------------------------------
# re-wrapping an identical kernel
# ---------------------------------------------------------------------------
def test_rewrapping_an_identical_kernel_registers_one_handler():
    """A factory called twice gives two function objects of the same content: both calls work and
    share one handler (before, the second registration crashed XLA: 'Duplicate FFI handler')."""
    x = jnp.ones(4, jnp.float32)
    first, second = K.make_add_one(), K.make_add_one()
    assert first is not second
    targets = len(numba_cpu._by_target)
    np.testing.assert_array_equal(evjax.numba_kernel(first, outs=S((4,), jnp.float32))(x), 2.0)
    np.testing.assert_array_equal(evjax.numba_kernel(second, outs=S((4,), jnp.float32))(x), 2.0)
    np.testing.assert_array_equal(jax.jit(evjax.numba_kernel(second, outs=S((4,), jnp.float32)))(x), 2.0)
    assert len(numba_cpu._by_target) == targets + 1
    handlers = {h.target_name for kernel in (first, second) for h in numba_cpu._handlers[kernel].values()}
    assert len(handlers) == 1


def test_a_notebook_cell_run_again_shares_its_handler():
    """Kernels defined by exec (no source file) are named by their compiled code."""
    source = "import numba\n@numba.njit\ndef triple(x, out):\n    for i in range(out.size):\n        out[i] = 3 * x[i]\n"
    kernels = []
    for _ in range(2):
        namespace = {}
        exec(compile(source, "<cell>", "exec"), namespace)
        kernels.append(namespace["triple"])
    targets = len(numba_cpu._by_target)
    for kernel in kernels:
        np.testing.assert_array_equal(evjax.numba_kernel(kernel, outs=S((3,), jnp.float32))(jnp.ones(3)), 3.0)
    assert len(numba_cpu._by_target) == targets + 1


def test_different_kernels_get_different_handlers():
    source = "import numba\n@numba.njit\ndef k(x, out):\n    for i in range(out.size):\n        out[i] = {} * x[i]\n"
    outs = []
    for factor in (2, 5):
        namespace = {}
        exec(compile(source.format(factor), "<cell>", "exec"), namespace)
        outs.append(float(evjax.numba_kernel(namespace["k"], outs=S((1,), jnp.float32))(jnp.ones(1))[0]))
    assert outs == [2.0, 5.0]


# ---------------------------------------------------------------------------
# what a wrapper keeps
# ---------------------------------------------------------------------------
LEAK_CHECK = textwrap.dedent("""
    import gc, os, sys
    import jax, jax.numpy as jnp
    import evjax
    from tests import kernels_for_tests as K

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    x = jnp.ones(4, jnp.float32)
    outs = jax.ShapeDtypeStruct((4,), jnp.float32)

    def wrapper_in_each_jitted_call(kernel):
        jax.jit(lambda x: evjax.numba_kernel(kernel, outs=outs)(x))(x).block_until_ready()

    for label, make in (("same kernel", lambda: K.add_one_kernel), ("new kernel object", K.make_add_one)):
        for _ in range(20):
            wrapper_in_each_jitted_call(make())
        gc.collect()
        before = rss()
        for _ in range(300):
            wrapper_in_each_jitted_call(make())
        gc.collect()
        print(label, (rss() - before) / 300)
""")


def test_a_wrapper_made_in_each_jitted_call_keeps_under_50_kb():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", LEAK_CHECK], env=env, capture_output=True, text=True, cwd=ROOT,
                         timeout=HANG_GUARD_S)
    assert out.returncode == 0, out.stderr[-3000:]
    per_wrapper = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in out.stdout.splitlines()}
    assert set(per_wrapper) == {"same kernel", "new kernel object"}, out.stdout
    assert max(per_wrapper.values()) <= 50 * 1024, per_wrapper


# ---------------------------------------------------------------------------
# one prologue for every handler
# ---------------------------------------------------------------------------
class _Frame:
    """A call frame (the struct sizes XLA writes) with an API table of version (0, 7), or no API table."""

    def __init__(self, with_api: bool, stage: int = ffi_abi.STAGE_EXECUTE):
        self.api = (ctypes.c_int32 * 64)()
        self.api[ffi_abi.API_VERSION_MAJOR // 4], self.api[ffi_abi.API_VERSION_MINOR // 4] = 0, 7
        self.metadata = (ctypes.c_int32 * 16)()
        ctypes.c_int64.from_address(ctypes.addressof(self.metadata)).value = ffi_abi.METADATA_STRUCT_SIZE
        self.ext = (ctypes.c_int64 * 4)()
        self.ext[0] = ffi_abi.METADATA_EXTENSION_STRUCT_SIZE
        ctypes.c_int32.from_address(ctypes.addressof(self.ext) + ffi_abi.EXT_TYPE).value = ffi_abi.EXT_TYPE_METADATA
        self.ext[ffi_abi.EXT_METADATA_PTR // 8] = ctypes.addressof(self.metadata)
        self.raw = (ctypes.c_int64 * 24)()
        self.raw[0] = ffi_abi.CALL_FRAME_STRUCT_SIZE
        self.raw[ffi_abi.FRAME_EXTENSION_START // 8] = ctypes.addressof(self.ext)
        self.raw[ffi_abi.FRAME_API // 8] = ctypes.addressof(self.api) if with_api else 0
        ctypes.c_int32.from_address(ctypes.addressof(self.raw) + ffi_abi.FRAME_STAGE).value = stage

    def answer(self, address: int) -> tuple:
        assert not HANDLER_T(address)(ctypes.addressof(self.raw))
        m = self.metadata
        return m[ffi_abi.METADATA_API_MAJOR // 4], m[ffi_abi.METADATA_API_MINOR // 4], m[ffi_abi.METADATA_TRAITS // 4]


def _every_handler():
    from evjax.backends import numba_cuda_launch, warp

    handler = numba_cpu.get_handler(K.add_kernel, [(np.dtype(np.float32), 1)] * 2, [(np.dtype(np.float32), 1)])
    python = ffi_core.PythonHandler("probe", lambda frame: 0)
    addresses = {"numba cpu": handler.address, "numba cuda launch": numba_cuda_launch.handler_address(),
                 "python": python.address}
    if _has_warp():
        addresses.update(warp_cpu=warp.handler_address("cpu"), warp_cuda=warp.handler_address("CUDA"))
    return addresses, python


def _has_warp() -> bool:
    try:
        import warp  # noqa: F401
    except ImportError:
        return False
    return True


def test_every_handler_answers_the_metadata_query_the_same_way():
    """With the API version the handlers were built for, whatever XLA's table says: XLA checks that
    number against the versions it supports, so echoing its own would defeat the check."""
    built_for = ffi_abi.handler_api_version()
    assert built_for == (ffi_abi.API_MAJOR, ffi_abi.API_MINOR)  # jaxlib 0.10's header is API 0.3
    addresses, _keep = _every_handler()
    assert len(addresses) >= 3
    for name, address in addresses.items():
        # the CUDA launchers neither synchronise nor allocate: CUDA-graph safe
        traits = ffi_abi.TRAIT_COMMAND_BUFFER_COMPATIBLE if name in ("warp_cuda", "numba cuda launch") else 0
        assert _Frame(with_api=True).answer(address) == (*built_for, traits), name  # not the table's (0, 7)
        assert _Frame(with_api=False).answer(address) == (*built_for, traits), name


def test_generated_handlers_share_the_core_prologue():
    """Every handler module is made by ffi_core.compile_handler: one template, one prologue call."""
    folder = os.path.join(ffi_core.cache_dir(), "handlers")
    _every_handler()
    # the modules of this process (a cache folder may keep older formats' files: they are never loaded)
    paths = [os.path.join(folder, f"{name}.py") for name in list(ffi_core._modules)]
    sources = [open(path).read() for path in paths if os.path.exists(path)]
    assert sources and all("= prologue(frame, " in s and "ffi_core import prologue" in s for s in sources)


# ---------------------------------------------------------------------------
# layering (docs/architecture.md)
# ---------------------------------------------------------------------------
def _modules():
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".").removesuffix(".__init__")
                yield module, path


def _imports(module: str, path: str) -> set[str]:
    """evjax modules imported by ``module`` (at any level of the file)."""
    tree = ast.parse(open(path).read())
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("evjax"):
                if node.module:  # ``from .x import y``: module x (and y, if y is a module)
                    found.add(target)
                found.update(f"{target}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("evjax"))
    known = dict(_modules())
    return {m for m in found if m in known and m != module}


def test_no_two_modules_import_each_other_and_ops_never_import_backends():
    graph = {m: _imports(m, p) for m, p in _modules()}
    for module, imported in graph.items():
        for other in imported:
            assert module not in graph.get(other, set()), f"{module} and {other} import each other"
    # layers import downward only: no cycle of any length
    state: dict[str, int] = {}

    def visit(module, path):
        state[module] = 1
        for other in graph.get(module, ()):
            assert state.get(other) != 1, f"import cycle: {' -> '.join(path + [other])}"
            if other not in state:
                visit(other, path + [other])
        state[module] = 2

    for module in graph:
        if module not in state:
            visit(module, [module])
    # Within every family package, only backend modules (numba*, warp*, numba_cuda*) import backend
    # modules: the ops, data types and helpers never do (a registry loads backends lazily).
    backend_prefixes = ("numba", "warp")
    families = {m.split(".")[2] for m in graph if m.startswith("evjax.primitives.") and m.count(".") == 3}
    assert {"csr", "neuron", "dense", "fixed", "jitc"} <= families, families
    for module, imports in graph.items():
        parts = module.split(".")
        if len(parts) != 4 or parts[1] != "primitives" or parts[3].startswith(backend_prefixes):
            continue
        backends = {m for m in imports if m.startswith(f"evjax.primitives.{parts[2]}.")
                    and m.split(".")[3].startswith(backend_prefixes)}
        assert not backends, f"{module} imports its family's backend modules {sorted(backends)}"
    # Validation: what families share lives in evjax._validation, a low layer that imports only evjax
    # modules whose own evjax imports are leaves (_compat; _event_values, which imports the leaf units);
    # a family's validation module holds its own structural checks and no other family imports it.
    assert "evjax._validation" in graph
    for other in graph["evjax._validation"]:
        assert not other.startswith("evjax.primitives"), f"evjax._validation imports the family module {other}"
        for leaf in graph.get(other, ()):
            assert not graph.get(leaf), (f"evjax._validation imports {other}, which imports {leaf}, which imports "
                                         f"{sorted(graph[leaf])}")
    for module, imports in graph.items():
        if not module.startswith("evjax.primitives."):
            continue
        family = module.split(".")[2]
        foreign = sorted(m for m in imports if m.startswith("evjax.primitives.") and m.count(".") == 3
                         and m.endswith(".validation") and m.split(".")[2] != family)
        assert not foreign, f"{module} imports another family's validation module {foreign}; shared checks " \
                            f"belong in evjax/_validation.py"


def test_private_apis_have_one_home():
    private = {"jax._src": "evjax._compat", "jax.interpreters": "evjax._compat", "numba.core": "evjax._kernel_compat",
               "numba.np": "evjax._kernel_compat", "numba.cuda.args": "evjax._kernel_compat",
               "warp._src": "evjax._kernel_compat"}
    for module, path in _modules():
        tree = ast.parse(open(path).read())
        for node in ast.walk(tree):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                for prefix, home in private.items():
                    if name.startswith(prefix):
                        assert module == home, f"{module} imports {name}; only {home} may"


def test_architecture_page_runs():
    from tests.doc_runner import run_markdown

    run_markdown("docs/architecture.md")

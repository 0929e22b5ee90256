"""What several test modules share (test modules never import each other: tests/test_no_cross_imports.py).

Sections: processes and pages (subprocess guards, the 4-device runner, the doc pages that need
special handling), then one section per operator family with its references (oracles), the
harness's op descriptions (``OpSpec``) and the arguments several modules draw.  Where two
modules had helpers of one name that do different things (a CSR and a fixed-table ``dense_of``,
say), both are here under names that say which is which.  Warp kernels cannot live here (Warp
is optional, and reads a kernel's source from its file): see tests/warp_kernels_for_tests.py.
"""
from __future__ import annotations

import functools
import linecache
import os
import pathlib
import re
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp
from hypothesis import strategies as st

import evjax
from evjax.primitives import csr
from evjax.primitives.fixed import fcn_sddmm
from evjax.primitives.jitc.generation import dense_generated
from evjax.primitives.jitc.ops import generated_shape
from evjax.testing import NNZ, SIZES, OpSpec, check_all, csr_resampler, random_csr, redraw

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Subprocess timeouts in the tests are hang guards only: far above the normal time of any
# subprocess here (seconds to a couple of minutes with empty caches), so a loaded machine
# (the issue saw a 3.8 s test pass 300 s at load 12-19 on 2 cores) never fails a test by time.
HANG_GUARD_S = 1800


# the Hypothesis profile that runs every case of the tests' full products (see tests/conftest.py);
# under the default (CI) profile some tests run a diagonal of them
THOROUGH = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"

# The checks of evjax.testing.check_all that the tests/cudasim modules leave out: check_grads and the
# nested vmap always (the simulator runs each CUDA thread as a Python thread), and under the simulator in
# the default profile also check_vmap (every in_axes case: 43 % of test_sim_harness.py's time).  The
# batching rules are the same for every backend and check_vmap runs them on the CPU backends;
# check_jit_grad_vmap still drives the batched kernels here.  The thorough profile and a GPU run
# (EVJAX_CUDA_TESTS_ON_GPU=1) keep check_vmap.
SIM_SKIP = ("check_grads", "nested_vmap") + (
    () if THOROUGH or os.environ.get("EVJAX_CUDA_TESTS_ON_GPU") == "1" else ("vmap",))


# tests/cudasim runs the Numba CUDA kernels in Numba's simulator (NUMBA_ENABLE_CUDASIM=1), or, with
# this variable set to 1 on a machine with a CUDA GPU, the same tests on the device
# (tests/test_numba_cuda_gpu.py starts that run).
CUDA_TESTS_ON_GPU_ENV = "EVJAX_CUDA_TESTS_ON_GPU"


def cuda_kernel_tests_on_simulator(ops=()) -> bool:
    """Where a tests/cudasim module runs its CUDA kernels: True in the simulator, False on a GPU.

    In the simulator, each op of ``ops`` gets its ``numba_cuda`` GPU generator registered as a
    CPU backend of the same name too (this process only), so ``backend="numba_cuda"`` runs the
    CUDA kernels on the host; on a GPU the ops' own GPU backends run.  Neither: an error.
    """
    from evjax.backends import numba_cuda as bridge

    if bridge.simulator_enabled():
        for op in ops:
            op.def_kernel("numba_cuda", "cpu", op.kernel_generator("gpu", "numba_cuda"), default=False)
        return True
    if os.environ.get(CUDA_TESTS_ON_GPU_ENV) == "1" and bridge.gpu_devices():
        return False
    raise RuntimeError(f"run with NUMBA_ENABLE_CUDASIM=1, or with {CUDA_TESTS_ON_GPU_ENV}=1 on a CUDA GPU")


def handler_count() -> int:
    """How many (kernel, signature) pairs have a Numba CPU handler in this process."""
    from evjax.backends import numba_cpu

    return sum(len(by_signature) for by_signature in list(numba_cpu._handlers.values()))


# ===========================================================================
# processes and pages
# ===========================================================================
# the main example's small network and one Adam step (``step(params, state, x, y) -> (params, state,
# loss, grads)``), as code for run_on_four_cpu_devices: its tests run it on 4 devices in several ways
EXAMPLE_TRAINING_STEP = """
import importlib.util, sys
import jax, jax.numpy as jnp, numpy as np, optax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

assert len(jax.devices()) == 4, jax.devices()
spec = importlib.util.spec_from_file_location("train_sparse_snn", "examples/train_sparse_snn.py")
snn = importlib.util.module_from_spec(spec); sys.modules[spec.name] = snn; spec.loader.exec_module(snn)

cfg = snn.Config(n_in=40, n_hidden=96, n_classes=3, n_steps=16, p_in=0.3, p_rec=0.1, batch=16)
params, s_in, s_rec = snn.init_params(cfg)
x, y = snn.make_randman(cfg, cfg.batch, seed=7)
loss = snn.make_loss(cfg, snn.make_trial(cfg, snn.make_synapses(s_in, s_rec, dense=False)))
opt = optax.adam(1e-2)
state = opt.init(params)

def step(params, state, x, y):
    (value, (acc, counts)), grads = jax.value_and_grad(loss, has_aux=True)(params, x, y)
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state, value, grads
"""


# The environment variable through which run_in_cuda_simulator gives the simulator's process its CPU
# (tests/cudasim/conftest.py pins the process's main thread, hence the simulated CUDA threads, to it).
SIMULATOR_CPU_ENV = "EVJAX_SIM_CPU"


def simulator_cpu() -> int | None:
    """The CPU for this pytest worker's simulator processes: worker i (xdist's ``gw<i>``) gets allowed CPU i mod n.

    The simulator runs each CUDA thread as a Python thread, and they hand the GIL to each other
    constantly.  Spread over cores, each hand-off wakes a thread on another core; on 2 busy cores
    (CI's two workers) that made tests/cudasim/test_sim_harness.py's matmul cases 3.7x slower than
    alone (63.8 s against 17 s), and pinned to one core 21.9 s (2026-11-28).  One CPU per worker
    keeps two workers' simulators on different cores.  None where the system has no CPU affinity
    (macOS): the processes then run unpinned.
    """
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    worker = re.fullmatch(r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", ""))
    return cpus[int(worker.group(1)) % len(cpus) if worker else 0]


def run_in_cuda_simulator(args: list[str], timeout: int = HANG_GUARD_S) -> subprocess.CompletedProcess:
    """Run ``python <args>`` from the repository root with Numba's CUDA simulator on (JAX on the CPU).

    NUMBA_ENABLE_CUDASIM must be set before numba is imported, which a pytest process has done,
    hence a process of its own; its main thread runs on :func:`simulator_cpu`.
    """
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": path, "JAX_PLATFORMS": "cpu"}
    cpu = simulator_cpu()
    if cpu is not None:
        env[SIMULATOR_CPU_ENV] = str(cpu)
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def run_simulator_tests(module: str) -> None:
    """Run the pytest module ``tests/cudasim/<module>`` in the CUDA simulator; fail unless it passes."""
    result = run_in_cuda_simulator(["-m", "pytest", "-q", "-p", "no:cacheprovider", f"tests/cudasim/{module}"])
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and " failed" not in result.stdout


def run_on_four_cpu_devices(code: str, timeout: int = HANG_GUARD_S) -> str:
    """Run ``code`` in a fresh Python with ``XLA_FLAGS=--xla_force_host_platform_device_count=4``
    (the flag must be set before JAX initialises), the repository root as working directory and
    ``tests/`` on the path; its stdout, after an assertion that it exited 0."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    # os._exit: a failing script once hung at interpreter exit (thread pools of the 4 devices); the
    # result is printed and flushed before, so nothing is lost
    wrapped = ("import os, sys, traceback\ntry:\n" + textwrap.indent(textwrap.dedent(code), "    ") +
               "\nexcept BaseException:\n    traceback.print_exc()\n    sys.stdout.flush(); sys.stderr.flush()\n"
               "    os._exit(1)\nsys.stdout.flush(); sys.stderr.flush()\nos._exit(0)\n")
    proc = subprocess.run([sys.executable, "-c", wrapped], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"subprocess failed:\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr[-6000:]}"
    return proc.stdout


def run_warp_page(path: str) -> dict:
    """Like ``doc_runner.run_markdown``, with two things Warp needs.

    * ``dont_inherit=True``: the blocks must not inherit this package's
      ``from __future__ import annotations`` (Warp evaluates the annotations of
      kernels built inside generators, which refer to local types);
    * each block's lines in ``linecache``: Warp reads a kernel's source there.
    """
    from tests.doc_runner import code_blocks

    namespace = {"__name__": "warp_tutorial"}
    blocks = code_blocks(path)
    assert blocks, f"{path} has no python blocks"
    for number, code in enumerate(blocks, 1):
        name = f"{path}#block{number}"
        linecache.cache[name] = (len(code), None, code.splitlines(keepends=True), name)
        try:
            exec(compile(code, name, "exec", dont_inherit=True), namespace)
        except Exception as exc:
            exc.add_note(f"in code block {number} of {path}")
            raise
    return namespace


NUMBA_CUDA_TUTORIAL = "docs/tutorials/numba_cuda.md"


def numba_cuda_tutorial_blocks(include_gpu: bool) -> list[str]:
    """The code blocks of docs/tutorials/numba_cuda.md: all but ```python skip, and without
    ``include_gpu`` all but ```python gpu (the simulator runs the others)."""
    from tests.doc_runner import _BLOCK

    text = re.sub(r"<!--.*?-->", "", (ROOT / NUMBA_CUDA_TUTORIAL).read_text(), flags=re.S)
    chosen = []
    for info, code in _BLOCK.findall(text):
        words = info.split()
        if "skip" in words or ("gpu" in words and not include_gpu):
            continue
        chosen.append(code)
    return chosen


def run_numba_cuda_tutorial(include_gpu: bool) -> dict:
    """Execute :func:`numba_cuda_tutorial_blocks` in order in one namespace; return it."""
    namespace: dict = {"__name__": "tutorial_numba_cuda"}
    for number, code in enumerate(numba_cuda_tutorial_blocks(include_gpu), 1):
        try:
            exec(compile(code, f"{NUMBA_CUDA_TUTORIAL}#block{number}", "exec"), namespace)
        except Exception as exc:
            exc.add_note(f"in code block {number} of {NUMBA_CUDA_TUTORIAL}")
            raise
    return namespace


# ===========================================================================
# CSR: structural references (jax.numpy: differentiable, vmappable), specs, structures
# ===========================================================================
CSR_OPS = {(1, False): evjax.csrmv, (2, False): evjax.csrmm, (1, True): evjax.binary_csrmv,
           (2, True): evjax.binary_csrmm}
# every op x orientation, and the weighted (graded-event) cases, with their test ids
OP_CASES = [(rank, event, transpose) for event in (False, True) for rank in (1, 2) for transpose in (False, True)]
OP_IDS = [f"{CSR_OPS[(r, e)].__name__}-{'scatter' if t else 'gather'}" for r, e, t in OP_CASES]
WEIGHTED_CASES = [(rank, transpose) for rank in (1, 2) for transpose in (False, True)]
WEIGHTED_IDS = [f"{'mv' if r == 1 else 'mm'}-{'scatter' if t else 'gather'}" for r, t in WEIGHTED_CASES]


def equations(jaxpr):
    """Every equation of a (closed) jaxpr, those of its sub-jaxprs (jit, cond, scan, custom rules) included."""
    found = []
    for eqn in jaxpr.eqns:
        found.append(eqn)
        for p in eqn.params.values():
            for sub in (p if isinstance(p, (tuple, list)) else (p,)):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found += equations(inner)
    return found


def primitive_names(jaxpr):
    """Every primitive of a closed jaxpr, its sub-jaxprs (jit, cond, scan, custom rules) included."""
    return [eqn.primitive.name for eqn in equations(jaxpr)]


def row_of_entries(indptr, nnz: int):
    """Row of each stored entry: row[k] = #{i >= 1 : indptr[i] <= k}."""
    return jnp.sum(jnp.arange(nnz)[:, None] >= indptr[None, 1:], axis=1)


@jax.custom_jvp
def _float_event_terms(w, s):
    # forward: w where the spike is nonzero, else 0 (select: an inactive spike never meets w)
    return jnp.where(s != 0, w, jnp.zeros_like(w))


@_float_event_terms.defjvp
def _float_event_terms_jvp(primals, tangents):
    # d/dw: the same select; d/ds: straight-through, as if the term were w * s
    w, s = primals
    dw, ds = tangents
    out = _float_event_terms(w, s)
    return out, jnp.where(s != 0, dw, jnp.zeros_like(dw)) + (w * ds).astype(out.dtype)


@jax.custom_jvp
def _weighted_event_terms(w, v):
    # forward: w * v where the event is nonzero, else 0 (select: a zero event never meets w)
    return jnp.where(v != 0, w * v, jnp.zeros_like(w * v))


@_weighted_event_terms.defjvp
def _weighted_event_terms_jvp(primals, tangents):
    # d/dw: the same select, scaled by v; d/dv: the true derivative of the linear map, w
    w, v = primals
    dw, dv = tangents
    out = _weighted_event_terms(w, v)
    return out, _weighted_event_terms(dw, v) + (w * dv).astype(out.dtype)


def structural_matmul(data, indices, indptr, x, shape, transpose: bool, event: bool, weighted: bool = False):
    """y = A x (or A.T x) summed over the stored entries only; events select their weights;
    weighted events select and scale them."""
    nnz = indices.shape[0]
    w = jnp.broadcast_to(data, (nnz,)) if data.shape[0] != nnz else data
    rows = row_of_entries(indptr, nnz)
    src, dst, n_out = (indices, rows, shape[0]) if not transpose else (rows, indices, shape[1])
    xs = x[src]  # the operand entry each stored weight meets
    w = w[:, None] if x.ndim == 2 else w
    if weighted:
        terms = _weighted_event_terms(jnp.broadcast_to(w, xs.shape).astype(jnp.result_type(w, xs)), xs)
    elif not event:
        terms = w * xs
    elif x.dtype == jnp.bool_:
        terms = jnp.where(xs, w, jnp.zeros_like(w))
    else:
        terms = _float_event_terms(jnp.broadcast_to(w, xs.shape), xs)
    return jax.ops.segment_sum(terms, dst, num_segments=n_out)


def csr_reference(shape, transpose, event):
    """The structural reference of one CSR op as a function of (data, indices, indptr, x)."""
    return lambda d, i, p, x: structural_matmul(d, i, p, x, shape, transpose, event)


def csr_op_fn(rank, event, shape, transpose, backend):
    """The CSR op as a function of (data, indices, indptr, x)."""
    fn = CSR_OPS[(rank, event)]
    return lambda d, i, p, x: fn(d, i, p, x, shape=shape, transpose=transpose, backend=backend)


def keep_spikes(argnum, value, k):
    """Batch element k for OpSpec(perturb=...): spikes rolled (still 0/1), floats scaled and shifted."""
    value = np.asarray(value)
    if argnum == 3:
        return np.roll(value, k, axis=0)
    return (value * (1.0 + 0.25 * k) + 0.125 * k).astype(value.dtype)


def csr_op_name(rank, event, transpose, backend):
    return f"{'binary_' if event else ''}csrm{'v' if rank == 1 else 'm'}(T={transpose},{backend})"


def csr_matmul_spec(rank, event, transpose, backend, *, float_spikes=False, nonfinite=False, weighted=False):
    """The harness's description of one CSR op; arguments (data, indices, indptr, x, shape)."""
    fn = CSR_OPS[(rank, event)]
    extra = {"weighted": True} if weighted else {}
    return OpSpec(
        fn=lambda d, i, p, x, shape: fn(d, i, p, x, shape=shape, transpose=transpose, backend=backend, **extra),
        reference=lambda d, i, p, x, shape: structural_matmul(d, i, p, x, shape, transpose, event, weighted),
        diff_argnums=(0, 3) if (not event or float_spikes or weighted) else (0,),
        static_argnums=(4,),
        backend=backend,
        resample=csr_resampler(indices=1, indptr=2, shape=4),
        smooth=not event or weighted,  # finite differences of a step function are meaningless
        nonfinite=nonfinite,
        batch_size=2,
        name=csr_op_name(rank, event, transpose, backend) + (" weighted" if weighted else "")
        + (" nonfinite" if nonfinite else ""),
    )


def weighted_sddmm_reference(mode):
    """csr_sddmm(weighted=mode)'s reference: g_k = where(e != 0, r_i q_j, 0), e the weighted operand."""
    def reference(indices, indptr, r, q, shape):
        rows = row_of_entries(indptr, indices.shape[0])
        rv, qv = r[rows], q[indices]
        # where(e != 0, r q, 0); derivative w.r.t. e the plain product, w.r.t. the other selected
        terms = _weighted_event_terms(qv, rv) if mode == "r" else _weighted_event_terms(rv, qv)
        return terms if r.ndim == 1 else jnp.sum(terms, axis=1)

    return reference


def weighted_sddmm_spec(mode, backend):
    return csr_sddmm_spec(backend, weighted=mode)


def csr_sddmm_reference(indices, indptr, r, q, shape):
    """The CSR weight gradient g[k] = <r[row k], q[indices[k]]> in jax.numpy."""
    products = r[row_of_entries(indptr, indices.shape[0])] * q[indices]
    return products if r.ndim == 1 else jnp.sum(products, axis=1)


def csr_sddmm_spec(backend, weighted=None):
    """The CSR weight gradient's spec, plain or with weighted events (``weighted`` "r" or "q")."""
    return OpSpec(
        fn=lambda i, p, r, q, shape: csr.csr_sddmm(i, p, r, q, shape=shape, backend=backend, weighted=weighted),
        reference=csr_sddmm_reference if weighted is None else weighted_sddmm_reference(weighted),
        diff_argnums=(2, 3),
        static_argnums=(4,),
        backend=backend,
        resample=csr_resampler(indices=0, indptr=1, shape=4),
        batch_size=2,
        name=f"csr_sddmm({backend})" if weighted is None else f"csr_sddmm(weighted={weighted},{backend})",
    )


def random_structure(rng, n_rows, n_cols, *, index_dtype=np.int32):
    """Rows of 0..n_cols+1 entries (empty rows and duplicate columns happen)."""
    counts = rng.integers(0, n_cols + 2, size=n_rows) if n_cols else np.zeros(n_rows, np.int64)
    if n_rows and rng.random() < 0.3:
        counts[rng.integers(0, n_rows)] = 0
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(index_dtype)
    indices = rng.integers(0, max(n_cols, 1), size=int(indptr[-1])).astype(index_dtype)
    return indices, indptr


def seeded_csr(seed=0, shape=(6, 5), sort=False):
    """``(data, indices, indptr)`` of a :func:`random_structure` of ``shape`` drawn from ``seed``, with
    empty rows and duplicate columns (sorted within rows if ``sort``), weights in [0.5, 1.5)."""
    rng = np.random.default_rng(seed)
    indices, indptr = random_structure(rng, *shape)
    if sort:
        for r in range(shape[0]):
            indices[indptr[r]:indptr[r + 1]].sort()
    data = rng.uniform(0.5, 1.5, indices.shape[0]).astype(np.float32)
    return data, indices, indptr


def csr_from_coo(rows, cols, shape):
    """A CSR structure from sorted COO coordinates: ``rows``, ``cols``, ``indices``, ``indptr``, ``shape``."""
    rows, cols = np.asarray(rows), np.asarray(cols)
    indptr = np.searchsorted(rows, np.arange(shape[0] + 1)).astype(np.int32)
    return SimpleNamespace(rows=rows, cols=cols, indices=cols.astype(np.int32), indptr=indptr, shape=shape)


def small_scipy_csr(seed=0, m=6, n=5, density=0.5, dtype=np.float32):
    """A random ``m x n`` ``scipy.sparse.csr_matrix`` with weights in [0.5, 1.5)."""
    a = sp.random(m, n, density=density, format="csr", random_state=seed, dtype=dtype)
    a.data[:] = np.random.default_rng(seed).uniform(0.5, 1.5, a.nnz)
    return a


def dense_matrix(data, indices, indptr, shape):
    """Dense A of a CSR in jax.numpy; duplicates summed."""
    nnz = indices.shape[0]
    w = jnp.broadcast_to(data, (nnz,)) if data.shape[0] != nnz else data
    return jnp.zeros(shape, w.dtype).at[row_of_entries(indptr, nnz), indices].add(w)


def csr_or_csc_dense(kind, data, indices, indptr, shape):
    """Dense reference in jax.numpy (vmappable) of a CSR (``kind="csr"``) or of a CSC of ``shape``
    whose arrays are the CSR of its transpose (``kind="csc"``): duplicates summed."""
    if kind == "csr":
        return dense_matrix(data, indices, indptr, shape)
    return dense_matrix(data, indices, indptr, shape[::-1]).T


def sddmm_numpy(indices, indptr, r, q):
    """The NumPy SDDMM oracle (the weight gradient of a CSR op), in float64:
    ``g[k] = sum_c term(r[row k, c], q[indices[k], c])``, where a bool operand selects the other
    (a silent event gives 0 whatever the other holds, NaN and inf included) and two numeric
    operands multiply as IEEE does (``0 * inf`` is NaN).  Rows come from a well-formed ``indptr``."""
    indices, indptr = np.asarray(indices), np.asarray(indptr)
    rows = np.repeat(np.arange(indptr.shape[0] - 1), np.diff(indptr))
    a, b = np.asarray(r)[rows], np.asarray(q)[indices]
    with np.errstate(invalid="ignore"):
        if a.dtype == np.bool_:
            terms = np.where(a, b.astype(np.float64), 0.0)
        elif b.dtype == np.bool_:
            terms = np.where(b, a.astype(np.float64), 0.0)
        else:
            terms = a.astype(np.float64) * b.astype(np.float64)
    return terms if terms.ndim == 1 else np.sum(terms, axis=1)


@st.composite
def csr_cases(draw, *, rank, transpose, event, dtype=np.float32, index_dtype=np.int32, float_spikes=False,
              weighted=False):
    """``(shape, (data, indices, indptr, x))`` from the size buckets."""
    n_rows, n_cols, nnz = draw(st.sampled_from(SIZES)), draw(st.sampled_from(SIZES)), draw(st.sampled_from(NNZ))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    indices, indptr = random_csr(rng, n_rows, n_cols, nnz, index_dtype=index_dtype)
    homogeneous = draw(st.booleans())
    data = (rng.uniform(0.5, 1.5, 1 if homogeneous else indices.shape[0]) * rng.choice([-1.0, 1.0])).astype(dtype)
    n_in = n_cols if not transpose else n_rows
    x_shape = (n_in,) if rank == 1 else (n_in, draw(st.sampled_from([1, 3])))
    if event:
        rate = draw(st.sampled_from([0.0, 0.4, 1.0]))  # no spikes, some, all
        x = rng.random(x_shape) < rate
        x = x.astype(dtype) * rng.uniform(0.5, 2.0, x_shape).astype(dtype) if float_spikes else x
        x = (x * rng.standard_normal(x_shape)).astype(dtype) if weighted else x  # graded, zeros kept
    else:
        x = rng.standard_normal(x_shape).astype(dtype)
    return (n_rows, n_cols), (data, indices, indptr, x)


def csr_args(**kwargs):
    """Argument tuples (data, indices, indptr, x, shape) for :func:`csr_matmul_spec`."""
    return csr_cases(**kwargs).map(lambda case: (*case[1], case[0]))


def run_csr_case(case, *, rank, transpose, event, backend, float_spikes=False, skip=()):
    """One ``csr_cases`` example through every check of the harness."""
    shape, args = case
    check_all(csr_matmul_spec(rank, event, transpose, backend, float_spikes=float_spikes), (*args, shape),
              skip=skip)


def run_csr_sddmm_case(seed, width, backend, skip=()):
    """One random 4 x 3 structure (empty rows possible) through the harness; r has zero rows (silent)."""
    rng = np.random.default_rng(seed)
    shape = (4, 3)
    indices, indptr = random_structure(rng, *shape)
    extra = () if width is None else (width,)
    r = (rng.standard_normal((4, *extra)) * (rng.random((4, *extra)) < 0.6)).astype(np.float32)
    q = rng.standard_normal((3, *extra)).astype(np.float32)
    check_all(csr_sddmm_spec(backend), (indices, indptr, r, q, shape), skip=skip)


# ===========================================================================
# dense event ops: y[i, c] = sum_j where(s[j, c] != 0, v[j, c] * W_rows[j, i], 0)
# ===========================================================================
DENSE_OPS = {1: evjax.binary_densemv, 2: evjax.binary_densemm}


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _event_sum(rows, s, weighted):
    active = s != 0
    v = s.astype(rows.dtype) if weighted else jnp.ones(s.shape, rows.dtype)
    terms = jnp.where(active[:, None, :], rows[:, :, None] * v[:, None, :], jnp.zeros((), rows.dtype))
    return jnp.sum(terms, axis=0)


@_event_sum.defjvp
def _event_sum_jvp(weighted, primals, tangents):
    # d/d rows: the same select (linear); d/ds: rows.T @ ds (straight-through / linear in values), IEEE
    rows, s = primals
    d_rows, d_s = tangents
    out = _event_sum(rows, s, weighted)
    tangent = _event_sum(d_rows, s, weighted)
    if jnp.issubdtype(s.dtype, jnp.floating):
        tangent = tangent + (rows.T @ d_s.astype(rows.dtype)).astype(out.dtype)
    return out, tangent


def dense_events_reference(w, s, transpose: bool, weighted: bool):
    """The reference of binary_densemv/mm: the dense event product, term by term; accumulates in
    float32 for low-precision weights."""
    dtype = jnp.result_type(w.dtype, s.dtype) if weighted and jnp.issubdtype(s.dtype, jnp.floating) else w.dtype
    acc = jnp.float32 if jnp.dtype(dtype).itemsize < 4 else dtype
    rows = (w if transpose else w.T).astype(acc)  # (k, m): the row of event j
    s2 = s if s.ndim == 2 else s[:, None]
    y = _event_sum(rows, s2, weighted)
    return (y if s.ndim == 2 else y[:, 0]).astype(dtype)


def event_resample(rng, args, argnums):
    """Batch elements: floats and bools redrawn by the harness; integer (count) events as 0/1/2."""
    ints = [i for i in argnums if jnp.issubdtype(np.asarray(args[i]).dtype, jnp.integer)]
    out = list(redraw(rng, args, [i for i in argnums if i not in ints]))
    for i in ints:
        out[i] = rng.integers(0, 3, np.shape(args[i])).astype(np.asarray(args[i]).dtype)
    return tuple(out)


def dense_spec(rank, transpose, weighted, backend, *, float_events=False, nonfinite=False):
    """The harness's description of one dense event op; arguments (weights, spikes)."""
    fn = DENSE_OPS[rank]
    name = f"{fn.__name__}(T={transpose},weighted={weighted},{backend})" + (" nonfinite" if nonfinite else "")
    return OpSpec(
        fn=lambda w, s: fn(w, s, transpose=transpose, weighted=weighted, backend=backend),
        reference=lambda w, s: dense_events_reference(w, s, transpose, weighted),
        diff_argnums=(0, 1) if float_events else (0,),
        backend=backend,
        resample=event_resample,
        smooth=weighted and float_events,  # binary: finite differences of a step are meaningless
        nonfinite=nonfinite,
        batch_size=2,
        name=name,
    )


def dense_one_example(rank, transpose, weighted, seed, k=3, m=2):
    """One ``(weights, events)`` example for check_all: event 0 silent, event 1 active, the rest drawn;
    weighted events are graded (0.5 to 2)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, m) if transpose else (m, k)).astype(np.float32)
    s = rng.random((k,) if rank == 1 else (k, 2)) < 0.5
    s[0], s[1] = False, True
    if weighted:
        s = (s * rng.uniform(0.5, 2.0, s.shape)).astype(np.float32)
    return w, s


# ===========================================================================
# JITC: dense references built with the pure-JAX generation scheme;
# arguments (params..., seed, x, shape, prob, transpose, corder)
# ===========================================================================
JITC_LAWS = {"scalar": 1, "normal": 2, "uniform": 2}
JITC_FUNCTIONS = {
    (law, rank, event): getattr(evjax, f"{'binary_' if event else ''}jit{law[0]}m{'v' if rank == 1 else 'm'}")
    for law in JITC_LAWS for rank in (1, 2) for event in (False, True)
}


def jitc_op_matrix(law, params, seed, shape, prob, transpose, corder):
    """``(D, mask)``: the matrix the op applies (``M`` or ``M.T``), dense."""
    n_outer, n_inner = generated_shape(shape, transpose, corder)
    w, mask = dense_generated(law, [p.astype(jnp.float32) for p in params], jnp.asarray(seed).reshape(()),
                              prob, n_outer, n_inner, jnp.float32)
    return (w, mask) if corder else (w.T, mask.T)


@jax.custom_jvp
def _jitc_spike_terms(w, s):
    return jnp.where(s != 0, w, jnp.zeros_like(w))  # select: a silent spike never meets w


@_jitc_spike_terms.defjvp
def _jitc_spike_terms_jvp(primals, tangents):
    w, s = primals
    dw, ds = tangents  # d/ds straight-through, as if the term were w * s
    return _jitc_spike_terms(w, s), jnp.where(s != 0, dw, jnp.zeros_like(dw)) + w * ds


@jax.custom_jvp
def _jitc_weighted_terms(w, s):
    return jnp.where(s != 0, w * s, jnp.zeros_like(w))  # graded: zero entries select 0


@_jitc_weighted_terms.defjvp
def _jitc_weighted_terms_jvp(primals, tangents):
    w, s = primals
    dw, ds = tangents  # the true derivative of w * s
    return _jitc_weighted_terms(w, s), jnp.where(s != 0, dw * s, jnp.zeros_like(dw)) + w * ds


def jitc_structural(law, params, seed, x, shape, prob, transpose, corder, mode):
    """``y_o = sum_{i in structure} term(w_oi, x_i)``: floats multiply, spikes select, weighted scale."""
    w, mask = jitc_op_matrix(law, params, seed, shape, prob, transpose, corder)
    if x.ndim == 2:
        w, mask = w[:, :, None], mask[:, :, None]
    xs = jnp.broadcast_to(x[None], jnp.broadcast_shapes(w.shape, x[None].shape))
    w = jnp.broadcast_to(w, xs.shape)
    if mode == "float":
        terms = w * xs.astype(jnp.float32)
    elif x.dtype == jnp.bool_:
        terms = jnp.where(xs, w, jnp.zeros_like(w))
    else:
        terms = (_jitc_weighted_terms if mode == "weighted" else _jitc_spike_terms)(w, xs.astype(jnp.float32))
    return jnp.sum(jnp.where(mask, terms, 0.0), axis=1)


def jitc_spec_for(law: str, rank: int, event: bool, weighted: bool = False, x_float: bool = True,
                  nonfinite=False):
    """``make(backend) -> OpSpec`` of one JITC product."""
    n = JITC_LAWS[law]
    fn_public = JITC_FUNCTIONS[(law, rank, event)]
    mode = "float" if not event else ("weighted" if weighted else "binary")

    def make(backend):
        def fn(*a):
            kw = {"weighted": True} if weighted else {}
            return fn_public(*a[:n], a[n + 3], a[n + 1], a[n], shape=a[n + 2], transpose=a[n + 4], corder=a[n + 5],
                             backend=backend, **kw)

        def reference(*a):
            return jitc_structural(law, a[:n], a[n], a[n + 1], a[n + 2], a[n + 3], a[n + 4], a[n + 5], mode)

        def resample(rng, args, argnums):
            out = list(redraw(rng, args, [i for i in argnums if i != n]))
            if n in argnums:
                out[n] = rng.integers(0, 2**32, size=(1,), dtype=np.uint64).astype(np.uint32)
            return tuple(out)

        diff = tuple(range(n)) + ((n + 1,) if x_float else ())
        return OpSpec(fn=fn, reference=reference, diff_argnums=diff, static_argnums=(n + 2, n + 3, n + 4, n + 5),
                      backend=backend, resample=resample, nonfinite=nonfinite,
                      smooth=not (event and x_float and not weighted),  # straight-through: not finite differences
                      nonfinite_argnums=tuple(range(n)) if nonfinite else None,
                      name=f"{fn_public.__name__}[{backend}{', weighted' if weighted else ''}]")

    return make


# ===========================================================================
# fixed fan-in / fan-out tables: (weights, indices, x, shape), indices of shape (n_rows, k)
# ===========================================================================
FIXED_OPS = {(1, False): evjax.fcnmv, (2, False): evjax.fcnmm, (1, True): evjax.binary_fcnmv,
             (2, True): evjax.binary_fcnmm}


def fixed_dense(weights, indices, shape):
    """The dense matrix of a fixed table, A[i, j] = sum_{l: indices[i, l] = j} w[i, l] (duplicates
    summed), in jax.numpy."""
    n, k = indices.shape
    w = jnp.broadcast_to(weights.reshape(-1) if weights.ndim == 1 else weights, (n, k))
    rows = jnp.repeat(jnp.arange(n), k)
    return jnp.zeros(shape, w.dtype).at[rows, indices.reshape(-1)].add(w.reshape(-1))


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def pp_prop_product(a, s, sparse_on_left: bool):
    """brainevent's ``pp_prop`` oracle: ``a @ 1[s != 0]`` (``sparse_on_left``) or ``1[s != 0] @ a``, whose
    weight tangent uses the event values (``da @ where(s != 0, s, 0)``) and whose event tangent is
    straight-through (``a @ ds``)."""
    mask = (s != 0).astype(a.dtype)
    return a @ mask if sparse_on_left else mask @ a


@pp_prop_product.defjvp
def _pp_prop_product_jvp(sparse_on_left, primals, tangents):
    a, s = primals
    da, ds = tangents
    graded = jnp.where(s != 0, s, jnp.zeros_like(s)).astype(a.dtype)
    dy = (da @ graded + a @ ds) if sparse_on_left else (graded @ da + ds @ a)
    return pp_prop_product(a, s, sparse_on_left), dy


def events_01(s):
    """Spikes as 0/1 in the forward pass, straight-through (identity) in the gradient."""
    if s.dtype == jnp.bool_:
        return s
    return s + jax.lax.stop_gradient((s != 0).astype(s.dtype) - s)


def fixed_dense_reference(transpose: bool, event: bool):
    """A fixed op's reference through :func:`fixed_dense`: A @ x (gather) or A.T @ x (scatter)."""
    def reference(weights, indices, x, shape):
        a = fixed_dense(weights, indices, shape)
        x = events_01(x).astype(a.dtype) if event else x
        return a.T @ x if transpose else a @ x

    return reference


def fixed_structural_reference(transpose: bool, event: bool):
    """Sums over the stored synapses only; an event selects its weight (never multiplies it)."""
    def reference(weights, indices, x, shape):
        n, k = indices.shape
        w = jnp.broadcast_to(weights.reshape(-1) if weights.ndim == 1 else weights, (n, k))
        if n == 0 or k == 0:
            return jnp.zeros(((shape[0] if not transpose else shape[1]),) + x.shape[1:], w.dtype)
        xs = x[indices] if not transpose else jnp.broadcast_to(x[:, None], (n, k) + x.shape[1:])
        w = w[..., None] if x.ndim == 2 else w
        terms = jnp.where(xs, w, 0) if event else w * xs
        if not transpose:
            return jnp.sum(terms, axis=1)
        return jnp.zeros((shape[1],) + x.shape[1:], w.dtype).at[indices].add(terms)

    return reference


def table_resampler(indices: int, shape: int):
    """``resample(rng, args, argnums)`` for the harness: a new valid table (same shape, targets in
    ``[0, n_cols)``, duplicates possible) where ``indices`` is batched; other arguments redrawn."""
    def resample(rng, args, argnums):
        out = list(args)
        n_cols = args[shape][1]
        if indices in argnums:
            table = np.asarray(args[indices])
            out[indices] = rng.integers(0, max(n_cols, 1), table.shape).astype(table.dtype)
        rest = [i for i in argnums if i != indices]
        return redraw(rng, tuple(out), rest) if rest else tuple(out)

    return resample


def fixed_matmul_spec(rank, event, transpose, backend, *, nonfinite=False, float_spikes=False, weighted=False):
    """The harness's description of one fixed-table op; arguments (weights, indices, x, shape)."""
    fn = FIXED_OPS[(rank, event)]
    extra = {"weighted": True} if weighted else {}
    # weighted events: finite weights times graded values, A @ v (a zero value adds 0), linear in v
    reference = (fixed_structural_reference if nonfinite else fixed_dense_reference)(transpose,
                                                                                     event and not weighted)
    return OpSpec(
        fn=lambda w, i, x, shape: fn(w, i, x, shape=shape, transpose=transpose, backend=backend, **extra),
        reference=reference,
        diff_argnums=(0, 2) if (not event or float_spikes or weighted) else (0,),
        static_argnums=(3,),
        backend=backend,
        resample=table_resampler(indices=1, shape=3),
        smooth=not event or weighted,
        nonfinite=nonfinite,
        batch_size=2,
        name=f"{fn.__name__}(T={transpose},{backend}){' nonfinite' if nonfinite else ''}"
             f"{' weighted' if weighted else ''}",
    )


def fixed_sddmm_reference(indices, r, q, shape):
    """The fixed-table weight gradient g[i, l] = <r[i], q[indices[i, l]]> in jax.numpy."""
    products = r[:, None] * q[indices]
    return products if r.ndim == 1 else jnp.sum(products, axis=-1)


def fixed_sddmm_spec(backend):
    return OpSpec(
        fn=lambda i, r, q, shape: fcn_sddmm(i, r, q, shape=shape, backend=backend),
        reference=fixed_sddmm_reference, diff_argnums=(1, 2), static_argnums=(3,), backend=backend,
        resample=table_resampler(indices=0, shape=3), batch_size=2, name=f"fcn_sddmm({backend})",
    )


# ---------------------------------------------------------------------------
# plasticity: the oracle of evjax.primitives.plasticity (tests/test_plasticity.py, the simulator)
# ---------------------------------------------------------------------------
def line_update_reference(weight, indices, indptr, positions, trace, spikes, w_min, w_max):
    """``w[p(e)] <- clip(w[p(e)] + trace[indices[e]], w_min, w_max)`` for the entries ``e`` of the lines
    ``i`` with ``spikes[i] != 0`` (``p(e) = positions[e]``, or ``e`` when ``positions`` is None); the
    other weights unchanged.  jnp, differentiable; the weights' dtype (float16 via float32)."""
    weight, trace = jnp.asarray(weight), jnp.asarray(trace)
    acc = jnp.float32 if weight.dtype in (jnp.float16, jnp.bfloat16) else weight.dtype
    nnz = weight.shape[0]
    ptr = jnp.asarray(indptr)
    lines = jnp.repeat(jnp.arange(ptr.shape[0] - 1), jnp.diff(ptr), total_repeat_length=nnz)
    pos = jnp.arange(nnz) if positions is None else jnp.asarray(positions)
    active = (jnp.asarray(spikes) != 0)[lines]
    current = weight.astype(acc)[pos]
    lo = None if w_min is None else jnp.asarray(w_min).astype(acc)
    hi = None if w_max is None else jnp.asarray(w_max).astype(acc)
    moved = jnp.clip(current + trace.astype(acc)[jnp.asarray(indices)], lo, hi)
    return weight.at[pos].set(jnp.where(active, moved, current).astype(weight.dtype))


def line_update_resampler(*, indices: int, indptr: int, positions: int | None, shape: int, other_axis: int):
    """A ``resample`` for the plasticity ops: new indices (into ``args[shape][other_axis]`` neurons), a
    new split of the same nnz, or a new permutation of positions, each alone valid; floats and spikes
    by ``redraw``."""
    structural = {indices, indptr} | ({positions} if positions is not None else set())

    def resample(rng, args, argnums):
        n_other = args[shape][other_axis]
        out = list(redraw(rng, args, [i for i in argnums if i not in structural]))
        nnz = np.shape(args[indices])[0]
        dtype = np.asarray(args[indices]).dtype
        if indices in argnums:
            out[indices] = rng.integers(0, max(n_other, 1), nnz).astype(dtype)
        if indptr in argnums:
            n_lines = np.shape(args[indptr])[0] - 1
            cuts = np.sort(rng.integers(0, nnz + 1, max(n_lines - 1, 0)))
            out[indptr] = (np.concatenate([[0], cuts, [nnz]]) if n_lines else np.zeros(1)).astype(dtype)
        if positions is not None and positions in argnums:
            out[positions] = rng.permutation(nnz).astype(dtype)
        return tuple(out)

    return resample


def dense_update_reference(weight, spikes, trace, w_min, w_max, axis: int):
    """``W[i, j] <- clip(W[i, j] + trace[other])`` where row ``i`` (axis 0; other ``j``) or column ``j``
    (axis 1; other ``i``) has ``spikes != 0``; jnp, differentiable (float16 via float32)."""
    weight, trace = jnp.asarray(weight), jnp.asarray(trace)
    acc = jnp.float32 if weight.dtype in (jnp.float16, jnp.bfloat16) else weight.dtype
    active = (jnp.asarray(spikes) != 0)
    active = active[:, None] if axis == 0 else active[None, :]
    t = trace.astype(acc)
    moved = jnp.clip(weight.astype(acc) + (t[None, :] if axis == 0 else t[:, None]),
                     None if w_min is None else jnp.asarray(w_min).astype(acc),
                     None if w_max is None else jnp.asarray(w_max).astype(acc))
    return jnp.where(active, moved.astype(weight.dtype), weight)


# ---------------------------------------------------------------------------
# plasticity on CSC storage and the rule-generic updates (tests/test_plasticity.py)
# ---------------------------------------------------------------------------
def csc_pre_update_reference(weight, indices, indptr, spikes, trace, w_min, w_max):
    """Weights in CSC order after presynaptic spikes: ``w[e] <- clip(w[e] + trace[col(e)])`` where the row
    ``indices[e]`` spiked; jnp, differentiable, without any row view (float16 via float32)."""
    weight, trace = jnp.asarray(weight), jnp.asarray(trace)
    acc = jnp.float32 if weight.dtype in (jnp.float16, jnp.bfloat16) else weight.dtype
    nnz = weight.shape[0]
    ptr = jnp.asarray(indptr)
    cols = jnp.repeat(jnp.arange(ptr.shape[0] - 1), jnp.diff(ptr), total_repeat_length=nnz)
    active = (jnp.asarray(spikes) != 0)[jnp.asarray(indices)]
    lo = None if w_min is None else jnp.asarray(w_min).astype(acc)
    hi = None if w_max is None else jnp.asarray(w_max).astype(acc)
    moved = jnp.clip(weight.astype(acc) + trace.astype(acc)[cols], lo, hi)
    return jnp.where(active, moved, weight.astype(acc)).astype(weight.dtype)


def apply_rule_reference(rule, edge_state, indices, indptr, spikes, pre_vals, post_vals, params, on_pre: bool):
    """``rule`` applied (vmapped) on every synapse, selected where its row (pre) or column (post) spiked;
    plain jnp, the masked formula that brainevent documents."""
    nnz = jax.tree_util.tree_leaves(edge_state)[0].shape[0]
    ptr = jnp.asarray(indptr)
    rows = jnp.repeat(jnp.arange(ptr.shape[0] - 1), jnp.diff(ptr), total_repeat_length=nnz)
    cols = jnp.asarray(indices)
    active = (jnp.asarray(spikes) != 0)[rows if on_pre else cols]
    pre = None if pre_vals is None else jax.tree_util.tree_map(lambda v: jnp.asarray(v)[rows], pre_vals)
    post = None if post_vals is None else jax.tree_util.tree_map(lambda v: jnp.asarray(v)[cols], post_vals)
    new = jax.vmap(rule, in_axes=(0, 0, 0, None))(edge_state, pre, post, params)
    return jax.tree_util.tree_map(
        lambda n, o: jnp.where(active.reshape(active.shape + (1,) * (o.ndim - 1)), n, o), new, edge_state)


# ===========================================================================
# synaptic delays (evjax.primitives.delay): a dense oracle and a resampler
# ===========================================================================
@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _delay_sum(D, x, weighted):
    """sum_i where(x[i] != 0, D[:, i, :] x[i], 0): an inactive row adds nothing, NaN weights included."""
    return jnp.sum(jnp.where((x != 0)[None, :, None], D * x[None, :, None], jnp.zeros((), D.dtype)), axis=1)


def _delay_sum_jvp(weighted, primals, tangents):
    # d/dD: the same select (linear); d/dx (weighted only: binary x = 1[events != 0] has none): the op's
    # derivative, sum_i D[:, i, :] dx[i] over every row (linear in x; IEEE).  Symbolic zeros: a term whose
    # input does not vary is absent (not 0 * D, which a NaN weight would turn into NaN)
    D, x = primals
    dD, dx = tangents
    zero = jax.custom_derivatives.SymbolicZero
    tangent = jnp.zeros(D.shape[:1] + D.shape[2:], D.dtype)
    if not isinstance(dD, zero):
        tangent = tangent + _delay_sum(dD, x, weighted)
    if weighted and not isinstance(dx, zero):
        tangent = tangent + jnp.einsum("lij,i->lj", D, dx.astype(D.dtype))
    return _delay_sum(D, x, weighted), tangent


_delay_sum.defjvp(_delay_sum_jvp, symbolic_zeros=True)


def delay_deliver_reference(ring, events, data, indices, indptr, delays, t, weighted: bool):
    """The delivery as a dense computation: D[s, i, j] = the summed weights of row i's edges into column j
    arriving in slot s = (t mod L + clamp(d, 0, L - 1)) mod L; ring' = ring + sum_i f(x)[i] D[:, i, :] over
    active rows (f = 1, or x when weighted).  jnp, differentiable (float16 via float32)."""
    ring = jnp.asarray(ring)
    acc = jnp.float32 if ring.dtype in (jnp.float16, jnp.bfloat16) else ring.dtype
    n_slots, n_post = ring.shape
    indptr, indices = jnp.asarray(indptr), jnp.asarray(indices)
    n_pre, nnz = indptr.shape[0] - 1, indices.shape[0]
    rows = jnp.repeat(jnp.arange(n_pre), jnp.diff(indptr), total_repeat_length=nnz)
    d = jnp.broadcast_to(jnp.clip(jnp.asarray(delays).astype(jnp.int64 if jax.config.jax_enable_x64 else jnp.int32),
                                  0, n_slots - 1), (nnz,))
    s = (jnp.remainder(jnp.asarray(t), n_slots).astype(d.dtype) + d) % n_slots
    w = jnp.broadcast_to(jnp.asarray(data).astype(ring.dtype).astype(acc).reshape(-1), (nnz,))
    D = jnp.zeros((n_slots, n_pre, n_post), acc).at[s, rows, indices].add(w)
    events = jnp.asarray(events)
    x = events.astype(acc) if weighted else (events != 0).astype(acc)
    return (ring.astype(acc) + _delay_sum(D, x, bool(weighted))).astype(ring.dtype)


def delay_deliver_loop(ring, events, data, indices, indptr, delays, t, weighted: bool):
    """The delivery as the documented loop, in NumPy: rows in order, each row's edges in order, ``w_e f(x_i)``
    added at slot ``(t mod L + clamp(d_e, 0, L - 1)) mod L``; columns outside ``[0, n_post)`` skipped.  The
    order of the additions is the kernels' (a bitwise oracle for the serial ones)."""
    out = np.array(ring, copy=True)
    n_slots, n_post = out.shape
    data = np.broadcast_to(np.asarray(data, out.dtype).reshape(-1), (len(indices),))
    delays = np.broadcast_to(np.asarray(delays).reshape(-1), (len(indices),))
    for i, x in enumerate(np.asarray(events)):
        if x == 0:
            continue
        f = out.dtype.type(x) if weighted else out.dtype.type(1)
        for e in range(indptr[i], indptr[i + 1]):
            if 0 <= indices[e] < n_post:
                s = (int(t) % n_slots + min(max(int(delays[e]), 0), n_slots - 1)) % n_slots
                out[s, indices[e]] += data[e] * f
    return out


def delay_resampler(*, events: int, indices: int, indptr: int, delays: int, t: int, ring: int):
    """A ``resample`` for the delay ops' argument tuples: new columns (in ``[0, n_post)``), a new split of
    the same nnz, new delays in ``[0, L)``, a new step, integer events as 0/1/2; floats and bools by
    ``redraw``."""
    ints = {indices, indptr, delays, t}

    def resample(rng, args, argnums):
        n_slots, n_post = np.shape(args[ring])
        nnz = np.shape(args[indices])[0]
        int_events = events in argnums and jnp.issubdtype(np.asarray(args[events]).dtype, jnp.integer)
        out = list(redraw(rng, args, [i for i in argnums if i not in ints and not (i == events and int_events)]))
        if int_events:
            out[events] = rng.integers(0, 3, np.shape(args[events])).astype(np.asarray(args[events]).dtype)
        if indices in argnums:
            out[indices] = rng.integers(0, max(n_post, 1), nnz).astype(np.asarray(args[indices]).dtype)
        if indptr in argnums:
            n_rows = np.shape(args[indptr])[0] - 1
            cuts = np.sort(rng.integers(0, nnz + 1, max(n_rows - 1, 0)))
            out[indptr] = (np.concatenate([[0], cuts, [nnz]]) if n_rows else np.zeros(1)).astype(
                np.asarray(args[indptr]).dtype)
        if delays in argnums:
            out[delays] = rng.integers(0, n_slots, np.shape(args[delays])).astype(np.asarray(args[delays]).dtype)
        if t in argnums:
            out[t] = np.asarray(rng.integers(-50, 50), np.asarray(args[t]).dtype)
        return tuple(out)

    return resample


# ===========================================================================
# per-synapse products (dt2t): dense oracles and their resamplers
# (csr/csc: args (y, w, indices, indptr, shape, transpose); fixed: (weights, indices, y, shape,
# transpose); JITC: (params..., y, seed, prob, shape, transpose, corder))
# ===========================================================================
def dt2t_entry_rows(indptr, nse: int):
    """The row of each stored entry, counted densely: ``row_j = #{r : indptr[r + 1] <= j}``."""
    j = jnp.arange(nse)
    return jnp.sum(jnp.asarray(indptr)[1:][None, :] <= j[:, None], axis=1)


def dt2t_pick(y, index, n: int):
    """``y[..., index]`` as a dense one-hot selection (``sum_c where(index == c, y[..., c], 0)``): an
    index outside ``[0, n)`` picks 0; a non-finite ``y[c]`` reaches only the entries that pick ``c``."""
    onehot = jnp.asarray(index)[:, None] == jnp.arange(n)[None, :]  # (nse, n)
    y = jnp.asarray(y)
    return jnp.sum(jnp.where(onehot, y[..., None, :], jnp.zeros((), y.dtype)), axis=-1)


def csr_dt2t_reference(csc: bool):
    """``out[..., j] = w[..., j] * y[..., row_j or indices[j]]`` for CSR (or CSC: its arrays are the CSR
    arrays of the transpose), on the dense one-hot selection; jnp, differentiable."""
    def reference(y, w, indices, indptr, shape, transpose):
        n_rows, n_cols = shape[::-1] if csc else shape
        by_column = transpose != csc
        nse = jnp.shape(indices)[0]
        index = indices if by_column else dt2t_entry_rows(indptr, nse)
        return jnp.asarray(w) * dt2t_pick(y, index, n_cols if by_column else n_rows)

    return reference


def csr_dt2t_resampler(csc: bool):
    """``resample`` for the dt2t specs: a new valid structure (the CSC one over the reversed shape)."""
    def resample(rng, args, argnums):
        shape = args[4][::-1] if csc else args[4]
        return csr_resampler(indices=2, indptr=3, shape=tuple(shape))(rng, args, argnums)

    return resample


def fixed_dt2t_reference(weights, indices, y, shape, transpose):
    """``out[..., i, l] = weights[..., i, l] * y[..., i or indices[i, l]]`` on the dense one-hot selection."""
    n_rows, k = jnp.shape(indices)
    index = jnp.reshape(indices, (-1,)) if transpose else jnp.repeat(jnp.arange(n_rows), k)
    picked = dt2t_pick(y, index, shape[1] if transpose else shape[0])
    picked = picked.reshape(jnp.shape(y)[:-1] + (n_rows, k))
    weights = jnp.asarray(weights)
    if weights.size == 1:
        weights = weights.reshape(())
    return jnp.broadcast_to(weights * picked, picked.shape)


@functools.lru_cache(maxsize=None)  # the harness traces the reference once per program
def jitc_dt2t_synapses(law: str, seed: int, prob: float, shape, corder: bool, dtype=jnp.float32):
    """``(rows, cols, draws)`` of the JITC matrix ``M`` in CSR order from the pure-JAX generation
    (``dense_generated`` with unit parameters; NumPy): ``draws`` is z, u or 1 at each synapse."""
    n_outer, n_inner = generated_shape(shape, False, corder)
    unit = {"scalar": (1.0,), "normal": (0.0, 1.0), "uniform": (0.0, 1.0)}[law]
    with jax.ensure_compile_time_eval():
        w, mask = dense_generated(law, [jnp.asarray(p, dtype) for p in unit], jnp.uint32(seed), prob,
                                  n_outer, n_inner, dtype)
    w, mask = np.asarray(w), np.asarray(mask)
    if not corder:  # generated column by column: G = M.T
        w, mask = w.T, mask.T
    rows, cols = np.nonzero(mask)  # row-major: rows, then increasing columns
    return rows, cols, w[rows, cols]


def jitc_dt2t_reference(law: str):
    """The per-synapse products of the JITC matrix from :func:`jitc_dt2t_synapses`; jnp in the weight
    parameters and ``y`` (differentiable), the structure concrete (``seed`` is static)."""
    n = JITC_LAWS[law]

    def reference(*a):
        params, y, seed, prob, shape, transpose, corder = a[:n], a[n], a[n + 1], a[n + 2], a[n + 3], a[n + 4], \
            a[n + 5]
        y = jnp.asarray(y)
        dtype = jnp.result_type(*params, y)
        rows, cols, draws = jitc_dt2t_synapses(law, seed, prob, shape, corder,
                                               jnp.float64 if dtype == jnp.float64 else jnp.float32)
        p = [jnp.asarray(v, dtype).reshape(()) for v in params]
        z = jnp.asarray(draws, dtype)
        weights = p[0] if law == "scalar" else p[0] + p[1] * z if law == "normal" else p[0] + (p[1] - p[0]) * z
        picked = dt2t_pick(y.astype(dtype), cols if transpose else rows, shape[1] if transpose else shape[0])
        return jnp.broadcast_to(weights * picked, picked.shape)

    return reference

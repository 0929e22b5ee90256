"""Fill the disk caches ahead of time: ``python -m evjax.precompile``.

A Numba kernel compiles the first time an op needs it at a new signature
(dtypes and ranks; never shapes), and is then loaded from the disk cache
(``NUMBA_CACHE_DIR`` / ``EVJAX_CACHE_DIR``) in milliseconds by every later
process.  This module runs every built-in family's operators once, on tiny
inputs, under ``jit`` and ``grad``, for the operand kinds a model uses (bool
spikes, graded events, float values; vectors and batches; both sides of
``@``), so that a first training step finds its kernels compiled.

Run it once after installing (it takes several minutes of CPU with empty
caches, seconds when they are full)::

    python -m evjax.precompile                       # every family, float32
    python -m evjax.precompile csr dense --dtype float32 --dtype float64

or from Python, :func:`precompile`.  It compiles for the CPU backends
installed here (the default backend of each op on CPU); GPU kernels compile
on the GPU machine at their first call.  The tiny inputs reach the kernels'
serial tiers only (see :func:`evjax.backends.numba_cpu.call`); the full kernels
behind them are compiled after them, so that a later large call loads its
kernel too.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Callable, Iterable, Sequence

__all__ = ["precompile", "FAMILIES", "cases"]


def _api():
    """The public types and ops the cases use, from their home modules (``evjax`` imports this module)."""
    from types import SimpleNamespace

    from ..events import WeightedArray
    from ..primitives.csr import CSR
    from ..primitives.dense import Dense
    from ..primitives.fixed import FixedPostNumConn, FixedPreNumConn
    from ..primitives.jitc import JITCNormalR, JITCScalarR, JITCUniformR

    return SimpleNamespace(**{k: v for k, v in locals().items() if k != "SimpleNamespace"})

FAMILIES = ("csr", "fixed", "dense", "jitc")
DTYPES = ("float32",)
N_PRE, N_POST, BATCH = 6, 5, 3

# Operand kinds: (name, event?, batched?)
_OPERANDS = (("spikes", "bool", False), ("spike batch", "bool", True), ("graded events", "weighted", False),
             ("values", "float", False), ("value batch", "float", True))


def _operand(kind: str, batched: bool, n: int, dtype):
    import jax.numpy as jnp
    import numpy as np

    api = _api()

    shape = (BATCH, n) if batched else (n,)
    pattern = (np.arange(int(np.prod(shape))).reshape(shape) % 3) == 0
    if kind == "bool":
        return jnp.asarray(pattern)
    values = jnp.asarray(np.where(pattern, 1.5, 0.0), dtype)
    return api.WeightedArray(values) if kind == "weighted" else values


def _matrix_cases(family: str, make: Callable, initial, dtype, float_x_grad: bool = True) -> list:
    """Forward and weight/operand gradients of ``x @ M`` and ``M @ x`` for every operand kind.

    ``make(params) -> M`` builds the matrix from its differentiable parameters,
    here ``initial``.
    """
    import jax
    import jax.numpy as jnp

    api = _api()

    out = []
    for name, kind, batched in _OPERANDS:
        for side in ("x @ M", "M @ x"):
            n = N_PRE if side == "x @ M" else N_POST

            def run(name=name, kind=kind, batched=batched, side=side, n=n):
                x = _operand(kind, batched, n, dtype)
                if side == "M @ x" and batched:
                    x = x.T if not isinstance(x, api.WeightedArray) else api.WeightedArray(x.value.T)

                def forward(params, x):
                    m = make(params)
                    return x @ m if side == "x @ M" else m @ x

                def loss(params, x):
                    return jnp.sum(forward(params, x) ** 2)

                params = initial
                jax.block_until_ready(jax.jit(forward)(params, x))
                jax.block_until_ready(jax.jit(jax.grad(loss))(params, x))
                if kind == "float" and float_x_grad:
                    jax.block_until_ready(jax.jit(jax.grad(loss, argnums=1))(params, x))

            out.append((f"{family}: {side}, {name} ({jax.numpy.dtype(dtype).name})", run))
    return out


def _csr_cases(dtype) -> list:
    import jax.numpy as jnp
    import numpy as np

    api = _api()

    dense = np.zeros((N_PRE, N_POST), np.float32)
    dense[np.arange(N_PRE), np.arange(N_PRE) % N_POST] = 1.0
    dense[0, 2] = dense[3, 4] = 2.0
    W = api.CSR.fromdense(dense.astype(dtype))

    def make(data):
        return W.with_data(data)

    return _matrix_cases("csr", make, jnp.asarray(W.data), dtype)


def _fixed_cases(dtype) -> list:
    import jax
    import jax.numpy as jnp

    api = _api()

    out = []
    for cls in (api.FixedPostNumConn, api.FixedPreNumConn):
        k = 2
        rows = N_PRE if cls is api.FixedPostNumConn else N_POST
        C = cls.random(jax.random.PRNGKey(0), N_PRE, N_POST, k, weight=jnp.ones((rows, k), dtype))

        def make(data, C=C):
            return C.with_data(data)

        out += _matrix_cases(f"fixed {cls.__name__}", make, jnp.asarray(C.data), dtype)
    return out


def _dense_cases(dtype) -> list:
    import jax.numpy as jnp
    import numpy as np

    api = _api()

    def make(data):
        return api.Dense(data)

    initial = jnp.asarray(np.linspace(-1, 1, N_PRE * N_POST).reshape(N_PRE, N_POST), dtype)
    # float operands of a Dense go to XLA's own dot: their operand gradient needs no evjax kernel
    return _matrix_cases("dense", make, initial, dtype, float_x_grad=False)


def _jitc_cases(dtype) -> list:
    import jax.numpy as jnp

    api = _api()

    out = []
    laws = (("scalar", lambda p, corder: api.JITCScalarR(p[0], prob=0.5, seed=3, shape=(N_PRE, N_POST),
                                                          corder=corder), (0.5,)),
            ("normal", lambda p, corder: api.JITCNormalR(p[0], p[1], prob=0.5, seed=3, shape=(N_PRE, N_POST),
                                                          corder=corder), (0.1, 0.2)),
            ("uniform", lambda p, corder: api.JITCUniformR(p[0], p[1], prob=0.5, seed=3,
                                                            shape=(N_PRE, N_POST), corder=corder), (0.0, 1.0)))
    for law, build, initial in laws:
        for corder in (False, True):
            def make(params, build=build, corder=corder):
                return build(params, corder)

            params = tuple(jnp.asarray(v, dtype) for v in initial)
            out += _matrix_cases(f"jitc {law}{', corder' if corder else ''}", make, params, dtype)
    return out


# (The neuron ops are pure JAX, with no kernel to compile: no family here.)
_BUILDERS = {"csr": _csr_cases, "fixed": _fixed_cases, "dense": _dense_cases, "jitc": _jitc_cases}


def cases(families: Sequence[str] = FAMILIES, dtypes: Sequence[str] = DTYPES) -> list[tuple[str, Callable]]:
    """The ``(label, run)`` pairs :func:`precompile` runs, in order.

    Raises:
        ValueError: an unknown family or a dtype other than float32/float64.
    """
    import numpy as np

    unknown = [f for f in families if f not in _BUILDERS]
    if unknown:
        raise ValueError(f"evjax.precompile: unknown families {unknown}; choose from {list(FAMILIES)}")
    bad = [d for d in dtypes if np.dtype(d).name not in ("float32", "float64")]
    if bad:
        raise ValueError(f"evjax.precompile: dtypes must be float32 or float64, got {bad}")
    if any(np.dtype(d) == np.float64 for d in dtypes):
        import jax

        if not jax.config.jax_enable_x64:
            raise ValueError("evjax.precompile: float64 needs jax_enable_x64 (set JAX_ENABLE_X64=1)")
    return [case for d in dtypes for f in families for case in _BUILDERS[f](np.dtype(d))]


def _progress(done: int, total: int, label: str, started: float, stream) -> None:
    width = 24
    filled = width * done // max(total, 1)
    elapsed = time.perf_counter() - started
    line = f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {elapsed:5.0f} s  {label[:60]:<60}"
    stream.write(line)
    stream.flush()


def precompile(families: Iterable[str] = FAMILIES, dtypes: Iterable[str] = DTYPES, *,
               progress: bool = True, stream=None) -> int:
    """Compile (or load) the kernels of the built-in families into the disk caches.

    Args:
        families: any of ``"csr"``, ``"fixed"``, ``"dense"``, ``"jitc"``.
        dtypes: ``"float32"`` and/or ``"float64"`` (float64 needs ``jax_enable_x64``).
        progress: print a progress bar to ``stream``.
        stream: where the progress goes (default ``sys.stderr``).

    Returns:
        The number of cases run.

    Raises:
        ValueError: an unknown family or dtype.

    Example:
        >>> evjax.precompile(["csr"])     # the CSR kernels, float32
    """
    from ..backends import numba_cpu

    todo = cases(tuple(families), tuple(dtypes))
    known = numba_cpu.tier_targets()  # (tiers this process used before: not precompile's to finish)
    stream = sys.stderr if stream is None else stream
    started = time.perf_counter()
    logger = logging.getLogger("evjax")
    level = logger.level
    if progress:  # the bar says what compiles: no slow-compile lines through it
        logger.setLevel(logging.ERROR)
    try:
        for done, (label, run) in enumerate(todo):
            if progress:
                _progress(done, len(todo), label, started, stream)
            run()
        if progress:
            _progress(len(todo), len(todo), "full kernels behind the serial tiers", started, stream)
        numba_cpu.compile_full_kernels(skip=known)  # the tiny inputs reached the serial tiers only
    finally:
        logger.setLevel(level)
    if progress:
        _progress(len(todo), len(todo), "done", started, stream)
        stream.write("\n")
    return len(todo)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evjax.precompile", description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", default=list(FAMILIES), help=f"default: all of {list(FAMILIES)}")
    parser.add_argument("--dtype", action="append", dest="dtypes", help="float32 (default) and/or float64")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    from ..backends import ffi_core

    count = precompile(args.families, args.dtypes or DTYPES, progress=not args.quiet)
    print(f"evjax: {count} cases compiled or loaded; caches in {ffi_core.cache_dir()} and Numba's cache folder")
    return 0


"""The CSR CUDA kernels type-check and compile to PTX for every operand kind.

Compiling needs NVVM (the CUDA toolkit's libnvvm, e.g. from the
nvidia-cuda-nvcc-cu12 wheel with CUDA_HOME pointing at it) but no GPU; the
test is skipped where NVVM cannot be loaded.
"""
from __future__ import annotations

import pytest

from evjax.backends import numba_cuda as bridge


def _nvvm_available() -> bool:
    if bridge.simulator_enabled():
        return False
    try:
        from numba.cuda.cudadrv import libs, nvvm

        nvvm.NVVM()
        libs.get_libdevice()
        return True
    except Exception:  # noqa: BLE001 - any failure means "no toolkit here"
        return False


pytestmark = pytest.mark.skipif(not _nvvm_available(), reason="NVVM (CUDA toolkit compiler) not found")

# (compute dtype, index dtype, event dtype or None for float operands)
CASES = [
    ("float32", "int32", None),
    ("float64", "int64", None),
    ("float32", "int32", "boolean"),
    ("float64", "int64", "boolean"),
    ("float32", "int64", "float32"),
    ("float64", "int32", "float64"),
]


def _compile(kernel, sig):
    from numba import cuda

    ptx, _ = cuda.compile_ptx(kernel.py_func, tuple(sig), cc=(9, 0))
    assert ".entry" in ptx
    return ptx


@pytest.mark.parametrize("compute, index, event", CASES)
def test_csr_kernels_compile_to_ptx(compute, index, event):
    from numba import types

    from evjax.primitives.csr.numba_cuda import KERNELS

    f = getattr(types, compute)
    i = getattr(types, index)
    for kind in ("mv", "mm"):
        ndim = 1 if kind == "mv" else 2
        dense = getattr(types, event) if event else f
        for transpose in (False, True):
            kernel = KERNELS[(kind, event is not None, transpose)]
            sig = [types.Array(f, 1, "C"), types.Array(i, 1, "C"), types.Array(i, 1, "C"),
                   types.Array(dense, ndim, "C")]
            if transpose:
                sig.append(types.Array(f, ndim, "C"))  # the zero-filled input the output aliases
            sig.append(types.Array(f, ndim, "C"))
            ptx = _compile(kernel, sig)
            if transpose:
                assert "atom.global.add" in ptx or "red.global.add" in ptx, kernel.__name__
            elif kind == "mv":
                assert ".shared" in ptx and "bar.sync" in ptx, kernel.__name__


@pytest.mark.parametrize("compute, index", [("float32", "int32"), ("float64", "int64")])
def test_weighted_kernels_compile_to_ptx(compute, index):
    """The four kernels of weighted events (the matmul factories' "weighted" flavour)."""
    from numba import types

    from evjax.primitives.csr.numba_cuda import WEIGHTED_KERNELS

    f = getattr(types, compute)
    i = getattr(types, index)
    assert set(WEIGHTED_KERNELS) == {(k, t) for k in ("mv", "mm") for t in (False, True)}
    for (kind, transpose), kernel in WEIGHTED_KERNELS.items():
        ndim = 1 if kind == "mv" else 2
        sig = [types.Array(f, 1, "C"), types.Array(i, 1, "C"), types.Array(i, 1, "C"), types.Array(f, ndim, "C")]
        sig += [types.Array(f, ndim, "C")] * (2 if transpose else 1)
        ptx = _compile(kernel, sig)
        assert "setp.neu" in ptx or "setp.eq" in ptx or "setp.ne" in ptx, kernel.__name__  # the select on v != 0
        if transpose:
            assert "atom.global.add" in ptx or "red.global.add" in ptx, kernel.__name__


def test_float32_kernels_have_no_float64_arithmetic():
    """Every flavour's kernel (values, events, weighted; each SDDMM mode) in float32 compiles its own
    rule only: the branches of the other flavours, pruned on the closure constants, never widen
    the accumulator to float64."""
    from numba import types

    from evjax.primitives.csr.numba_cuda import KERNELS, SDDMM_KERNELS, WEIGHTED_KERNELS

    f, i = types.float32, types.int32
    matmul = [(kernel, kind, event, transpose) for (kind, event, transpose), kernel in KERNELS.items()]
    matmul += [(kernel, kind, False, transpose) for (kind, transpose), kernel in WEIGHTED_KERNELS.items()]
    for kernel, kind, event, transpose in matmul:
        ndim = 1 if kind == "mv" else 2
        sig = [types.Array(f, 1, "C"), types.Array(i, 1, "C"), types.Array(i, 1, "C"),
               types.Array(types.boolean if event else f, ndim, "C")]
        sig += [types.Array(f, ndim, "C")] * (2 if transpose else 1)
        assert ".f64" not in _compile(kernel, sig), kernel.__name__
    for (kind, mode), kernel in SDDMM_KERNELS.items():
        ndim = 1 if kind == "vec" else 2
        r_type = types.boolean if mode == "r_events" else f
        q_type = types.boolean if mode == "q_events" else f
        sig = (types.Array(i, 1, "C"), types.Array(i, 1, "C"), types.Array(r_type, ndim, "C"),
               types.Array(q_type, ndim, "C"), types.Array(f, 1, "C"), types.Array(f, 1, "C"))
        assert ".f64" not in _compile(kernel, sig), kernel.__name__


def test_all_eight_matmul_kernels_are_in_the_table():
    from evjax.primitives.csr.numba_cuda import KERNELS

    assert set(KERNELS) == {(k, e, t) for k in ("mv", "mm") for e in (False, True) for t in (False, True)}
    assert len({kernel.__name__ for kernel in KERNELS.values()}) == 8


@pytest.mark.parametrize("compute, index", [("float32", "int32"), ("float64", "int64"), ("float32", "int64")])
def test_sddmm_kernels_compile_to_ptx(compute, index):
    from numba import types

    from evjax.primitives.csr.numba_cuda import SDDMM_KERNELS

    f = getattr(types, compute)
    i = getattr(types, index)
    for (kind, mode), kernel in SDDMM_KERNELS.items():
        ndim = 1 if kind == "vec" else 2
        r_type = types.boolean if mode == "r_events" else f  # an event operand stays bool
        q_type = types.boolean if mode == "q_events" else f
        sig = (types.Array(i, 1, "C"), types.Array(i, 1, "C"), types.Array(r_type, ndim, "C"),
               types.Array(q_type, ndim, "C"), types.Array(f, 1, "C"), types.Array(f, 1, "C"))
        ptx = _compile(kernel, sig)
        assert "st.global" in ptx, (kind, mode)


@pytest.mark.parametrize("compute, index", [("float32", "int32"), ("float64", "int64")])
def test_plasticity_kernels_compile_to_ptx(compute, index):
    """The plasticity family's two CUDA kernels, as their generators call them (weights aliased to the output)."""
    from numba import types

    from evjax.primitives.plasticity.numba_cuda import update_dense, update_lines

    f, i = getattr(types, compute), getattr(types, index)
    b1 = types.Array(types.boolean, 1, "C")
    f1, i1 = types.Array(f, 1, "C"), types.Array(i, 1, "C")
    ptx = _compile(update_lines, [f1, i1, i1, i1, f1, b1, f1, f1])
    assert "atom." not in ptx  # each synapse is written by one thread: no atomics
    f2 = types.Array(f, 2, "C")
    ptx = _compile(update_dense, [f2, b1, f1, f1, b1, f2])
    assert "atom." not in ptx


@pytest.mark.parametrize("compute, index", [("float32", "int32"), ("float64", "int64"), ("float32", "int64")])
def test_delay_kernels_compile_to_ptx(compute, index):
    """The delay family's two CUDA kernels, as their generators call them: ``deliver`` adds into the ring
    with atomics (edges of different rows share targets); ``gather`` writes each row's own outputs."""
    from numba import types

    from evjax.primitives.delay.numba_cuda import deliver, gather

    f, i = getattr(types, compute), getattr(types, index)
    f1, f2, i1 = types.Array(f, 1, "C"), types.Array(f, 2, "C"), types.Array(i, 1, "C")
    ptx = _compile(deliver, [f2, f1, f1, i1, i1, i1, i1, f2])
    assert "atom.global.add" in ptx or "red.global.add" in ptx
    i32 = types.Array(types.int32, 1, "C")
    ptx = _compile(gather, [f1, f2, f1, f1, i1, i1, i1, i1, i32, f1])
    assert "atom." not in ptx and "st.global" in ptx


@pytest.mark.parametrize("compute, index", [("float32", "int32"), ("float64", "int64"), ("float32", "int64")])
def test_compact_kernels_compile_to_ptx(compute, index):
    """The listing kernel (one thread per row, plain stores) and the CSR scatter over a list of active rows
    (atomics: listed rows share targets)."""
    from numba import types

    from evjax.primitives.compact.numba_cuda import list_active
    from evjax.primitives.csr.numba_cuda import LISTED_KERNEL

    f, i = getattr(types, compute), getattr(types, index)
    f1, i1, i2 = types.Array(f, 1, "C"), types.Array(i, 1, "C"), types.Array(i, 2, "C")
    ptx = _compile(list_active, [types.Array(types.boolean, 2, "C"), i2, i2])
    assert "atom." not in ptx and "st.global" in ptx
    ptx = _compile(LISTED_KERNEL, [f1, i1, i1, i1, i1, f1, f1])
    assert "atom.global.add" in ptx or "red.global.add" in ptx


@pytest.mark.parametrize("compute, index", [("float32", "int32"), ("float64", "int64"), ("float32", "int64")])
def test_sparse_backward_kernels_compile_to_ptx(compute, index):
    """The sparse-backward family's six CUDA kernels, as their generators call them: one thread per output
    entry (plain stores, no atomics), each product ``mul.rn`` (libdevice ``fmul_rn`` / ``dmul_rn``: never
    contracted into an FMA with the following add, which would change the bits), float32 with no float64."""
    from numba import types

    from evjax.primitives.sparse_backward.numba_cuda import KERNELS

    f, i = getattr(types, compute), getattr(types, index)
    f1, f2, f3, i1 = (types.Array(f, 1, "C"), types.Array(f, 2, "C"), types.Array(f, 3, "C"),
                      types.Array(i, 1, "C"))
    signatures = {
        "csrmv_select": [f1, i1, i1, i1, i1, i1, f2, f2],
        "csrmv_columns": [f1, i1, i1, i1, i1, i1, f2, f2],
        "sddmm_nonzero": [i1, i1, i1, i1, i1, f3, f3, f2],
        "densemv": [f2, f2, f2],
        "densemv_t": [f2, f2, f2],
        "outer_nonzero": [f3, f3, f3],
    }
    assert {name for name, _ in KERNELS} == set(signatures)
    width = "f32" if compute == "float32" else "f64"
    for name, sig in signatures.items():
        ptx = _compile(KERNELS[(name, compute)], sig)
        assert "atom." not in ptx and "st.global" in ptx, name
        assert "fma." not in ptx and f"mul.rn.{width}" in ptx, name
        if compute == "float32":
            assert ".f64" not in ptx, name

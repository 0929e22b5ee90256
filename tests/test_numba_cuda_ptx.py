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

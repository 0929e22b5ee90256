"""The CSR CUDA kernels type-check and compile to PTX for every operand kind.

Compiling needs NVVM (the CUDA toolkit's libnvvm, e.g. from the
nvidia-cuda-nvcc-cu12 wheel with CUDA_HOME pointing at it) but no GPU; the
test is skipped where NVVM cannot be loaded.
"""
from __future__ import annotations

import itertools

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


CASES = [("float32", h, e) for h, e in itertools.product([False, True], [False, True])] + [("float64", False, True)]


@pytest.mark.parametrize("acc, homogeneous, event", CASES)
def test_csr_kernels_compile_to_ptx(acc, homogeneous, event):
    from numba import cuda, types

    from evjax.primitives.csr_numba_cuda import csr_cuda_kernels

    accty = getattr(types, acc)
    index = types.int32 if acc == "float32" else types.int64
    dense = types.boolean if event else accty
    for name, kernel in csr_cuda_kernels(acc, homogeneous, event).items():
        ndim = 1 if name.startswith("mv") else 2
        sig = [types.Array(accty, 1, "C"), types.Array(index, 1, "C"), types.Array(index, 1, "C"),
               types.Array(dense, ndim, "C")]
        if name.endswith("scatter"):
            sig.append(types.Array(accty, ndim, "C"))
        sig.append(types.Array(accty, ndim, "C"))
        ptx, _ = cuda.compile_ptx(kernel.py_func, tuple(sig), cc=(8, 0))
        assert ".entry" in ptx
        if name.endswith("scatter"):
            assert "atom.global.add" in ptx or "red.global.add" in ptx

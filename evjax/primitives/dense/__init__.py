"""The dense event family: a dense weight matrix fed with spikes or graded events.

* :mod:`.ops`: the ops ``binary_densemv_p``, ``binary_densemm_p`` and the weight
  gradient ``binary_dense_outer_p``, their reference, rules and registration;
* :mod:`.matrix`: the data type ``Dense``;
* :mod:`.numba`, :mod:`.warp`, :mod:`.numba_cuda`: the backends, each imported
  by the ops the first time it is needed.
"""
from .matrix import Dense
from .ops import (
    OPS,
    binary_dense_outer,
    binary_dense_outer_p,
    binary_densemm,
    binary_densemm_p,
    binary_densemv,
    binary_densemv_p,
    dense_event_matmul,
)

__all__ = [
    "Dense", "OPS", "binary_densemv", "binary_densemm", "binary_dense_outer", "dense_event_matmul",
    "binary_densemv_p", "binary_densemm_p", "binary_dense_outer_p",
]

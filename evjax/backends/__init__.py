"""Bridges from kernel languages (Numba CPU, Numba CUDA, Warp) to the XLA FFI."""

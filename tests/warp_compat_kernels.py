"""Warp kernels in the style of brainevent's Warp tutorial, for tests/test_compat.py.

Warp reads kernel source from a file, so they live in a module of their own.
"""
import warp

warp.config.quiet = True


@warp.kernel
def relu_kernel(x: warp.array(dtype=warp.float32, ndim=1), out: warp.array(dtype=warp.float32, ndim=1)):
    i = warp.tid()
    out[i] = warp.max(x[i], warp.float32(0.0))


@warp.kernel
def scatter_add_kernel(
    values: warp.array(dtype=warp.float32, ndim=1),
    targets: warp.array(dtype=warp.int32, ndim=1),
    scale: warp.array(dtype=warp.float32, ndim=1),
    acc: warp.array(dtype=warp.float32, ndim=1),
):
    i = warp.tid()
    warp.atomic_add(acc, targets[i], values[i] * scale[0])


@warp.kernel
def scale_add_kernel(
    a: warp.array(dtype=warp.float32),
    b: warp.array(dtype=warp.float32),
    c: warp.array(dtype=warp.float32),
    out: warp.array(dtype=warp.float32),
):
    i = warp.tid()
    out[i] = a[i] * b[i] + c[i]


@warp.kernel
def row_sums_kernel(m: warp.array(dtype=warp.float32, ndim=2), sums: warp.array(dtype=warp.int32, ndim=1),
                    out: warp.array(dtype=warp.float32, ndim=1)):
    i = warp.tid()
    s = float(0.0)
    for j in range(m.shape[1]):
        s += m[i, j]
    out[i] = s
    sums[i] = int(s)

"""Warp kernels that more than one test module launches (tests/test_warp.py, tests/test_warp_handlers.py).

Warp is optional and reads a kernel's source from its file, so they live in a module of their
own rather than in tests/helpers.py; import this module only after ``pytest.importorskip("warp")``.
"""
import warp as wp

wp.config.quiet = True


@wp.kernel(enable_backward=False)
def scatter_k(values: wp.array(dtype=wp.float32), targets: wp.array(dtype=wp.int32), acc: wp.array(dtype=wp.float32)):
    i = wp.tid()
    wp.atomic_add(acc, targets[i], values[i])

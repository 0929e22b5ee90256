"""Quickstart: wrap a Numba kernel as a JAX operator with rules, then use it
under jit, grad and vmap.

Run: python examples/quickstart.py
"""
import jax
import jax.numpy as jnp
import numba
import numpy as np

import evjax
from evjax.rules import ad as ad_rules


@numba.njit(parallel=True, cache=True)
def leaky_accumulate(x, gain, out):
    # out = gain * x, with gain a 1-element array
    for i in numba.prange(out.size):
        out[i] = gain[0] * x[i]


op = evjax.XLACustomKernel("quickstart_gain")
op.def_numba_kernel(lambda outs, ins: evjax.numba_kernel(leaky_accumulate, outs=outs[0]))
op.def_reference(lambda x, gain, **params: [gain[0] * x])
# Linear in x and in gain: d out = gain * dx + x * d gain.
op.def_jvp_rule2(*ad_rules.linear_jvp_rules(op, 2, linear_argnums=(0, 1)))
op.def_transpose_rule(ad_rules.linear_transpose_rule({
    0: lambda cts, x, gain, outs, **p: cts[0] * gain[0],            # x_bar = gain * out_bar
    1: lambda cts, x, gain, outs, **p: jnp.sum(cts[0] * x)[None],   # gain_bar = <x, out_bar>
}))


def apply_gain(x, gain):
    return op(x, gain, outs=[jax.ShapeDtypeStruct(x.shape, x.dtype)])[0]


def main() -> None:
    x = jnp.linspace(-1.0, 1.0, 8, dtype=jnp.float32)
    gain = jnp.array([2.5], jnp.float32)
    print("forward     :", np.asarray(jax.jit(apply_gain)(x, gain)))
    print("grad wrt x  :", np.asarray(jax.grad(lambda x: apply_gain(x, gain).sum())(x)))
    print("grad wrt g  :", np.asarray(jax.grad(lambda g: (apply_gain(x, g) ** 2).sum())(gain)))
    batch = jnp.stack([x, 2 * x, 3 * x])
    print("vmap shape  :", jax.vmap(apply_gain, in_axes=(0, None))(batch, gain).shape)
    loss = lambda g: (jax.vmap(apply_gain, in_axes=(0, None))(batch, g) ** 2).sum()  # noqa: E731
    print("jit(grad(vmap)):", np.asarray(jax.jit(jax.grad(loss))(gain)))
    print(op)


if __name__ == "__main__":
    main()

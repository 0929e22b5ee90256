"""A user's per-synapse learning rule applied on spikes: ``csr_apply_on_pre`` and ``csr_apply_on_post``.

For every stored synapse ``e = (i, j)`` of a CSR structure, with ``i`` its
row (presynaptic neuron) and ``j = indices[e]`` its column::

    new[e] = rule(edge_state[e], pre_vals[i], post_vals[j], params)   if the spike of i (pre) or j (post) is set
    new[e] = edge_state[e]                                              otherwise

``rule`` is any JAX function of one synapse's values; it runs vectorized
(``jax.vmap``) over every synapse and the result is selected per synapse, so
the cost is ``O(nnz)`` per call whatever the spike count, as brainevent's.  An
additive rule is event-driven in :func:`evjax.update_csr_on_binary_pre`.

This is pure JAX, so ``jit``, ``vmap``, ``jvp`` and ``grad`` go through the
rule.  The event semantics hold in every derivative: a synapse whose neuron
did not fire passes ``edge_state`` through unchanged, and its values reach the
rule only behind a ``stop_gradient`` branch of a select, so whatever the rule's
derivative is there (NaN weights, ``log(0)``), nothing of it reaches the
gradients of ``edge_state``, ``pre_vals``, ``post_vals`` or ``params`` (the
rule's parameters are read per synapse through the same select).
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from ..._validation import canonical, check_index_vector, check_shape
from .ops import _check_line_vector, _line_of_entries

__all__ = ["csr_apply_on_pre", "csr_apply_on_post"]


def _leading(tree, length: int, name: str, who: str):
    """``tree``'s leaves as arrays, each checked to have ``length`` rows."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    checked = []
    for k, leaf in enumerate(leaves):
        leaf = canonical(leaf)
        if leaf.ndim == 0 or leaf.shape[0] != length:
            where = name if len(leaves) == 1 else f"{name} (leaf {k})"
            raise ValueError(f"{who}: every leaf of {where} must have leading dimension {length}, got shape "
                             f"{leaf.shape}")
        checked.append(leaf)
    return jax.tree_util.tree_unflatten(treedef, checked)


def _masked_inputs(tree, active):
    # per synapse x_e -> select(active_e, x_e, stop_gradient(x_e)): the same values, but an inactive
    # synapse's cotangent (whatever the rule makes of it, NaN included) is dropped by the select
    def one(x):
        mask = active.reshape(active.shape + (1,) * (x.ndim - 1))
        return jnp.where(mask, x, jax.lax.stop_gradient(x))
    return jax.tree_util.tree_map(one, tree)


def _per_synapse_params(params, nnz: int):
    """``params`` broadcast to one copy per synapse (the rule reads it per synapse, through the select)."""
    return jax.tree_util.tree_map(lambda p: jnp.broadcast_to(canonical(p), (nnz,) + jnp.shape(p)), params)


def _check_result(new, edge_state, who: str):
    """The rule's result: ``edge_state``'s structure, shapes and dtypes, or a TypeError saying which differs."""
    new_def, old_def = jax.tree_util.tree_structure(new), jax.tree_util.tree_structure(edge_state)
    if new_def != old_def:
        raise TypeError(f"{who}: rule must return a pytree of edge_state's structure {old_def}, got {new_def}")
    for k, (a, b) in enumerate(zip(jax.tree_util.tree_leaves(new), jax.tree_util.tree_leaves(edge_state))):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise TypeError(f"{who}: rule returned leaf {k} as {a.dtype}{list(a.shape[1:])} per synapse, but "
                            f"edge_state's is {b.dtype}{list(b.shape[1:])}; return the same dtype, e.g. "
                            f"with .astype(w.dtype)")


def _apply(rule, edge_state, indices, indptr, spikes, pre_vals, post_vals, params, shape, on_pre: bool, who: str):
    # new_e = rule(state_e, pre[row_e], post[col_e], params) where the spike of row_e (pre) / col_e (post)
    # is set; state_e elsewhere
    if not callable(rule):
        raise TypeError(f"{who}: rule must be a function rule(edge, pre, post, params), got {type(rule).__name__}")
    n_pre, n_post = check_shape(shape, who, dims=("n_pre", "n_post"))
    leaves = jax.tree_util.tree_leaves(edge_state)
    if not leaves:
        raise ValueError(f"{who}: edge_state has no arrays; pass the per-synapse state, e.g. the weights (nnz,)")
    nnz = canonical(leaves[0]).shape[0] if canonical(leaves[0]).ndim else -1
    edge_state = _leading(edge_state, nnz, "edge_state", who)
    indices = check_index_vector(indices, "indices", nnz, who)
    indptr = check_index_vector(indptr, "indptr", n_pre + 1, who)
    spike_name = "pre_spike" if on_pre else "post_spike"
    spikes = _check_line_vector(spikes, spike_name, n_pre if on_pre else n_post, who, events=True)
    rows = _line_of_entries(indptr.astype(jnp.result_type(indptr.dtype, indices.dtype)), nnz)
    active = (spikes != 0)[rows if on_pre else indices]
    pre = None if pre_vals is None else jax.tree_util.tree_map(
        lambda v: v[rows], _leading(pre_vals, n_pre, "pre_vals", who))
    post = None if post_vals is None else jax.tree_util.tree_map(
        lambda v: v[indices], _leading(post_vals, n_post, "post_vals", who))
    per_synapse = _masked_inputs((edge_state, pre, post, _per_synapse_params(params, nnz)), active)
    new = jax.vmap(rule)(*per_synapse)
    _check_result(new, edge_state, who)

    def select(n, old):
        return jnp.where(active.reshape(active.shape + (1,) * (old.ndim - 1)), n, old)
    return jax.tree_util.tree_map(select, new, edge_state)


def csr_apply_on_pre(rule: Callable[[Any, Any, Any, Any], Any], edge_state, indices, indptr, pre_spike, *,
                     pre_vals=None, post_vals=None, params=None, shape) -> Any:
    """A per-synapse rule applied to the synapses of the presynaptic neurons that fired.

    For each stored synapse ``e = (i, j)`` with ``pre_spike[i] != 0``:
    ``new[e] = rule(edge_state[e], pre_vals[i], post_vals[j], params)``; every
    other synapse keeps ``edge_state[e]`` bit for bit.  The rule sees one
    synapse's values (leading dimension removed) and runs vectorized over all
    synapses, so a call costs ``O(nnz)``; for the additive rule ``w +=
    post_trace`` use the event-driven :func:`update_csr_on_binary_pre`.
    Differentiable (``jvp``, ``grad``) in ``edge_state``, ``pre_vals``,
    ``post_vals`` and ``params`` through the rule; a synapse that did not
    fire contributes nothing to any gradient, whatever the rule's derivative
    there.

    Args:
        rule: ``rule(edge, pre, post, params) -> new_edge``, on one synapse;
            returns ``edge_state``'s structure and dtypes.
        edge_state: pytree of per-synapse arrays in CSR order, each of leading
            dimension ``nnz`` (e.g. ``{"w": w, "elig": elig}``).
        indices: ``(nnz,)`` column (postsynaptic) index of each synapse.
        indptr: ``(n_pre + 1,)`` row pointers.
        pre_spike: ``(n_pre,)`` bool, or numbers where nonzero is a spike.
        pre_vals: pytree of per-presynaptic-neuron arrays (leading ``n_pre``),
            or None (the rule gets None).
        post_vals: pytree of per-postsynaptic-neuron arrays (leading
            ``n_post``), or None.
        params: pytree passed to the rule as is, or None.
        shape: ``(n_pre, n_post)``.

    Returns:
        The new edge state: ``edge_state``'s structure, shapes and dtypes.

    Raises:
        TypeError: ``rule`` is not callable, or returns another structure or dtype.
        ValueError: a leaf with the wrong leading dimension, or spikes or
            pointers that do not match ``shape``.

    Example:
        >>> def rule(edge, pre, post, p):
        ...     return {"w": edge["w"] + p["lr"] * post, "elig": 0.9 * edge["elig"] + post}
        >>> new = evjax.csr_apply_on_pre(rule, {"w": W.data, "elig": elig}, W.indices, W.indptr, spikes,
        ...                              post_vals=post_trace, params={"lr": 0.01}, shape=W.shape)
    """
    return _apply(rule, edge_state, indices, indptr, pre_spike, pre_vals, post_vals, params, shape, True,
                  "csr_apply_on_pre")


def csr_apply_on_post(rule: Callable[[Any, Any, Any, Any], Any], edge_state, indices, indptr, post_spike, *,
                      pre_vals=None, post_vals=None, params=None, shape) -> Any:
    """A per-synapse rule applied to the synapses of the postsynaptic neurons that fired.

    As :func:`csr_apply_on_pre`, with the synapses ``e = (i, j)`` whose
    ``post_spike[j] != 0`` updated; ``indices, indptr`` are still the CSR
    (row) structure, and ``edge_state`` is in CSR order.

    Args:
        rule: ``rule(edge, pre, post, params) -> new_edge``, on one synapse.
        edge_state: pytree of per-synapse arrays in CSR order (leading ``nnz``).
        indices: ``(nnz,)`` column (postsynaptic) index of each synapse.
        indptr: ``(n_pre + 1,)`` row pointers.
        post_spike: ``(n_post,)`` bool, or numbers where nonzero is a spike.
        pre_vals: pytree of per-presynaptic-neuron arrays, or None.
        post_vals: pytree of per-postsynaptic-neuron arrays, or None.
        params: pytree passed to the rule as is, or None.
        shape: ``(n_pre, n_post)``.

    Returns:
        The new edge state: ``edge_state``'s structure, shapes and dtypes.

    Raises:
        TypeError, ValueError: as :func:`csr_apply_on_pre`.

    Example:
        >>> new_w = evjax.csr_apply_on_post(lambda w, pre, post, p: w + p * pre, W.data, W.indices, W.indptr,
        ...                                 post_spikes, pre_vals=pre_trace, params=0.01, shape=W.shape)
    """
    return _apply(rule, edge_state, indices, indptr, post_spike, pre_vals, post_vals, params, shape, False,
                  "csr_apply_on_post")

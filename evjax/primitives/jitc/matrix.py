"""JITC data types: ``JITCScalarR/C``, ``JITCNormalR/C``, ``JITCUniformR/C`` (pytrees).

A JITC matrix stores its weight parameters, ``prob``, ``seed`` and ``shape``,
never its synapses.  ``corder=True`` generates it row by row (each row's
synapses are a stream keyed by ``(seed, row)``), ``corder=False`` column by
column; the expected fan-out of a generated row (column) is ``prob`` times the
number of columns (rows).  ``M @ x`` is an event-driven scatter with
``corder=False`` (each nonzero ``x[j]`` generates column ``j``) and ``x @ M``
with ``corder=True`` (each nonzero ``x[i]`` generates row ``i``); the other
product regenerates the stream of every output index (a gather, whose cost is
all the synapses, whatever ``x`` holds).  ``R`` and ``C`` with the same
arguments are the same matrix computed by the same kernels: the two names
follow brainevent, where ``C`` maps ``@`` onto the transposed op (as here).  ``M.T`` is the same matrix
transposed (same seed, same draws): ``M.T.todense() == M.todense().T``.

The weight parameters and the seed are pytree children (differentiable and
traced: a new seed or weight does not retrace), ``shape``, ``prob``,
``corder`` and ``backend`` static.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ... import units
from ...data_representation import DataRepresentation
from ..._validation import as_seed, check_shape
from ..._event_values import EventValues, event_operand
from ...errors import UnsupportedOperationError
from .functions import check_prob
from .ops import LAWS, host_structure

__all__ = ["JITCMatrix", "JITCScalarMatrix", "JITCScalarR", "JITCScalarC", "JITCNormalR", "JITCNormalC", "JITCUniformR", "JITCUniformC",
           "JITCHomoR", "JITCHomoC"]


def _ops(law: str):
    from . import functions as f  # the public functions of this law, by (rank, event)

    letter = {"scalar": "s", "normal": "n", "uniform": "u"}[law]
    return {(rank, event): getattr(f, f"{'binary_' if event else ''}jit{letter}m{'v' if rank == 1 else 'm'}")
            for rank in (1, 2) for event in (False, True)}, getattr(f, f"jit{letter}")


class JITCMatrix(DataRepresentation):
    """Base of the JITC matrices: a law, its parameters, ``prob``, ``seed``, ``shape`` and ``corder``.

    Build one of its subclasses (``JITCScalarR/C``, ``JITCNormalR/C``,
    ``JITCUniformR/C``); the base is there to ask whether an object is a JITC
    matrix (brainevent's ``JITCMatrix``).

    Args:
        params: the law's weight parameters (or ``(params..., prob, seed)`` as one tuple).
        prob: connection probability in ``[0, 1]`` (static).
        seed: an integer; ``None`` draws one.
        shape: ``(n_rows, n_cols)``.
        corder: ``True`` generates row by row, ``False`` column by column.
        backend: the backend of its products.

    Example:
        >>> W = evjax.JITCNormalR(0.5, 0.1, prob=0.1, seed=1, shape=(100, 100))
        >>> isinstance(W, evjax.JITCMatrix)
        True
    """

    __array_ufunc__ = None  # numpy defers ``ndarray @ M`` to __rmatmul__
    takes_events = True  # ``BinaryArray @ M`` runs the event ops
    law = "scalar"
    column_major = False  # C classes: stored as the transposed op (see _op_call)
    _param_names: tuple = ("weight",)

    def __init__(self, *params, prob=None, seed=None, shape, corder: bool = False, backend: str | None = None):
        n = LAWS[self.law]
        params = list(params)
        if len(params) == 1 and isinstance(params[0], tuple) and len(params[0]) in (n, n + 2):
            params = list(params[0])  # brainevent also takes (params..., prob, seed) as one tuple
        if len(params) == n + 2:
            params, prob, seed = params[:n], params[n], params[n + 1]
        elif len(params) == n + 1:
            params, prob = params[:n], params[n]
        if len(params) != n:
            raise TypeError(f"{type(self).__name__}: expected {', '.join(self._param_names)}, prob, seed; got "
                            f"{len(params)} parameters")
        who = type(self).__name__
        self.prob = check_prob(prob, who)
        self.shape = check_shape(shape, who)
        self.corder = bool(corder)
        self.backend = backend
        self.params = tuple(p if units.is_quantity(p) else jnp.asarray(p) for p in params)  # brainunit: kept
        self.seed = as_seed(seed, who)

    # ----------------------------------------------------------------- pytree
    def tree_flatten(self):
        return self.params + (self.seed,), (self.shape, self.prob, self.corder, self.backend)

    @classmethod
    def tree_unflatten(cls, aux, children):
        obj = object.__new__(cls)
        obj.shape, obj.prob, obj.corder, obj.backend = aux
        obj.params, obj.seed = tuple(children[:-1]), children[-1]
        return obj

    def _replace(self, cls, shape, corder):
        obj = object.__new__(cls)
        obj.shape, obj.prob, obj.corder, obj.backend = shape, self.prob, corder, self.backend
        obj.params, obj.seed = self.params, self.seed
        return obj

    # ----------------------------------------------------------------- properties
    @property
    def dtype(self):
        return jnp.result_type(*self.params)

    @property
    def ndim(self) -> int:
        return 2

    @property
    def T(self) -> "JITCMatrix":
        """The same matrix transposed: the partner class, shape reversed, ``corder`` flipped."""
        return self._replace(_PARTNER[type(self)], self.shape[::-1], not self.corder)

    def _op_shape(self) -> tuple:
        return self.shape[::-1] if self.column_major else self.shape

    def _orientation(self, left: bool) -> tuple[bool, bool]:
        """``(transpose, corder)`` of the op for ``M @ x`` (left) or ``M.T @ x``."""
        if left:
            return self.column_major, self.corder
        return not self.column_major, not self.corder

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in zip(self._param_names, self.params))
        return f"{type(self).__name__}({params}, prob={self.prob}, seed={self.seed!r}, shape={self.shape}, " \
               f"corder={self.corder})"

    # ----------------------------------------------------------------- inspection
    def todense(self) -> jax.Array:
        """The dense matrix (``O(n_rows * n_cols)`` memory: for tests and inspection)."""
        _, dense = _ops(self.law)
        transpose, corder = self._orientation(True)
        return dense(*self.params, self.prob, self.seed, shape=self._op_shape(), transpose=transpose, corder=corder,
                     backend=self.backend)

    def toarray(self) -> jax.Array:
        return self.todense()

    def tocsr(self):
        """The same synapses as an :class:`evjax.CSR` (concrete parameters and seed; generated on the host
        with the Numba kernels' code, so identical to what the kernels use)."""
        from ..csr import CSR  # noqa: PLC0415

        row_outer = self.corder  # M is generated row-outer iff corder (see ops.row_outer)
        n_outer, n_inner = self.shape if row_outer else self.shape[::-1]
        params = [np.asarray(p, np.float64).reshape(()) for p in self.params]
        dtype = np.dtype(self.dtype) if jnp.issubdtype(self.dtype, jnp.floating) else np.dtype(np.float32)
        data, indices, indptr = host_structure("numba")(self.law, params, int(np.asarray(self.seed)[0]), self.prob,
                                                    n_outer, n_inner, dtype)
        g = CSR(data, indices, indptr, shape=(n_outer, n_inner))
        return g if row_outer else g.T.tocsr()

    # ----------------------------------------------------------------- products
    def _product(self, x, left: bool):
        ops, _ = _ops(self.law)
        event = isinstance(x, EventValues)
        x, weighted = event_operand(x)
        if not event:
            x = x if isinstance(x, jax.Array) or units.is_quantity(x) else jnp.asarray(x)
            event = x.dtype == jnp.bool_
        if x.ndim not in (1, 2):
            raise ValueError(f"matmul: the dense side must be a vector or a matrix, got shape {x.shape}")
        n_in = self.shape[1] if left else self.shape[0]
        x_dim = x.shape[0] if (left or x.ndim == 1) else x.shape[1]
        if x_dim != n_in:
            sides = (self.shape, x.shape) if left else (x.shape, self.shape)
            raise ValueError(f"matmul: shapes {sides[0]} and {sides[1]} are not aligned ({x_dim} != {n_in})")
        if not left and x.ndim == 2:
            x = x.T  # x @ M = (M.T @ x.T).T
        transpose, corder = self._orientation(left)
        extra = {"weighted": weighted} if event else {}
        y = ops[(x.ndim, event)](*self.params, self.prob, x, self.seed, shape=self._op_shape(), transpose=transpose,
                                 corder=corder, backend=self.backend, **extra)
        return y.T if (not left and x.ndim == 2) else y

    def __matmul__(self, other):
        if isinstance(other, JITCMatrix):
            raise UnsupportedOperationError("JITC @ JITC is not supported; convert one side with .todense()")
        return self._product(other, left=True)

    def __rmatmul__(self, other):
        return self._product(other, left=False)

    def with_data(self, *params) -> "JITCMatrix":
        """The same structure (prob, seed, shape, corder) with new weight parameters."""
        if len(params) != LAWS[self.law]:
            raise TypeError(f"{type(self).__name__}.with_data: expected {', '.join(self._param_names)}")
        obj = self._replace(type(self), self.shape, self.corder)
        obj.params = tuple(jnp.asarray(p) for p in params)
        return obj


def _register(cls):
    jax.tree_util.register_pytree_node(cls, cls.tree_flatten, cls.tree_unflatten)
    return cls


class JITCScalarMatrix(JITCMatrix):
    """The base of :class:`JITCScalarR` and :class:`JITCScalarC`: one weight for every synapse.

    brainevent's name for the homogeneous-weight JITC matrices; build one of
    the two subclasses (``R`` and ``C`` are the same matrix, see
    :mod:`evjax.primitives.jitc.matrix`).

    Args:
        params: the weight (or ``(weight, prob, seed)`` as one tuple); ``prob``, ``seed``,
            ``shape``, ``corder`` and ``backend`` as in :class:`JITCMatrix`.

    Example:
        >>> W = evjax.JITCScalarR(0.5, prob=0.1, seed=42, shape=(100, 100))
        >>> isinstance(W, evjax.JITCScalarMatrix) and isinstance(W.T, evjax.JITCScalarMatrix)
        True
    """

    law = "scalar"
    _param_names = ("weight",)

    def __init__(self, *params, prob=None, seed=None, shape, corder: bool = False, backend: str | None = None):
        if type(self) is JITCScalarMatrix:
            raise TypeError("JITCScalarMatrix is the base class: build a JITCScalarR or a JITCScalarC")
        JITCMatrix.__init__(self, *params, prob=prob, seed=seed, shape=shape, corder=corder, backend=backend)


def _law_class(name: str, law: str, names: tuple, column_major: bool, doc: str):
    def __init__(self, *params, prob=None, seed=None, shape, corder: bool = False, backend: str | None = None):
        JITCMatrix.__init__(self, *params, prob=prob, seed=seed, shape=shape, corder=corder, backend=backend)

    props = {n: property(lambda self, i=i: self.params[i]) for i, n in enumerate(names)}
    base = JITCScalarMatrix if law == "scalar" else JITCMatrix
    cls = type(name, (base,), {"law": law, "column_major": column_major, "_param_names": names,
                                     "__init__": __init__, "__doc__": doc, **props})
    return _register(cls)


_DOC = """{what}, generated just in time from ``(prob, seed)``: ``{sig}``.

    Args:
        {args}
        prob: connection probability in ``[0, 1]`` (static).
        seed: an integer (traced: a new seed does not retrace); ``None`` draws one.
        shape: ``(n_rows, n_cols)``.
        corder: ``True`` generates row by row, ``False`` (default) column by column.
        backend: the backend of its products (default: see :mod:`evjax.config`).

    Example:
        >>> W = evjax.{name}({example}, prob=0.1, seed=42, shape=(1000, 1000), corder=True)
        >>> current = spikes @ W   # event-driven: corder=True generates the rows of active neurons
"""


def _make(name, law, names, column_major, what, example):
    args = "\n        ".join(f"{n}: {t}" for n, t in zip(names, {
        "scalar": ["the weight of every synapse (traced, differentiable)."],
        "normal": ["mean of the weights (traced, differentiable).", "standard deviation (traced, differentiable)."],
        "uniform": ["lower bound of the weights (traced, differentiable).",
                    "upper bound (traced, differentiable)."]}[law]))
    doc = _DOC.format(what=what, sig=f"{name}({', '.join(names)}, prob, seed, *, shape, corder=False)", args=args,
                      name=name, example=example)
    return _law_class(name, law, names, column_major, doc)


JITCScalarR = _make("JITCScalarR", "scalar", ("weight",), False, "A homogeneous-weight matrix", "0.5")
JITCScalarC = _make("JITCScalarC", "scalar", ("weight",), True, "A homogeneous-weight matrix", "0.5")
JITCNormalR = _make("JITCNormalR", "normal", ("loc", "scale"), False, "A matrix of N(loc, scale) weights", "0.5, 0.1")
JITCNormalC = _make("JITCNormalC", "normal", ("loc", "scale"), True, "A matrix of N(loc, scale) weights", "0.5, 0.1")
JITCUniformR = _make("JITCUniformR", "uniform", ("low", "high"), False, "A matrix of U[low, high) weights", "0.0, 1.0")
JITCUniformC = _make("JITCUniformC", "uniform", ("low", "high"), True, "A matrix of U[low, high) weights", "0.0, 1.0")
# brainevent's older (deprecated there) names for the homogeneous-weight classes, so code written for them runs
JITCHomoR = JITCScalarR
JITCHomoC = JITCScalarC
_PARTNER = {JITCScalarR: JITCScalarC, JITCScalarC: JITCScalarR, JITCNormalR: JITCNormalC, JITCNormalC: JITCNormalR,
            JITCUniformR: JITCUniformC, JITCUniformC: JITCUniformR}

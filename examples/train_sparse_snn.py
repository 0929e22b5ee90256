"""Train a sparse recurrent spiking network end to end with evjax.

The task is a spike-train classification problem generated here, "Randman"
(random manifolds, after Zenke and Vogels, 2021): each class is a smooth random
map from a low-dimensional latent space to the firing times of the input units;
a trial draws a latent point of one class and emits one spike per input unit.
``--dataset digits`` uses scikit-learn's bundled handwritten digits instead
(1797 8x8 images, 10 classes, no download), latency-coded: each of the 64
pixels is an input unit that fires once, earlier the brighter it is (blank
pixels never fire).

The model, for one trial::

    I_t   = exp_trace(I_{t-1}, x_t @ W_in + s_{t-1} @ W_rec, syn_decay)   # CSR, event-driven
    v_t, s_t = lif_step(v_{t-1}, I_t, ...)                                 # surrogate gradient
    y_t   = out_decay * y_{t-1} + s_t @ W_out                              # leaky readout
    logits = max_t y_t

``W_in`` (inputs x hidden) and ``W_rec`` (hidden x hidden) are sparse CSR
matrices with per-synapse weights, trained by backpropagation through time
(``lax.scan``) with gradients taken w.r.t. their ``data`` through the
event-driven CSR ops.  The batch is ``jax.vmap`` over the single-trial model.
``--dense`` runs the same model (same connectivity, as a masked dense matrix)
with dense ``jax.numpy`` matmuls, for comparison.

Run::

    python examples/train_sparse_snn.py              # default: 2000 hidden, p_rec = 0.01
    python examples/train_sparse_snn.py --dense      # same model, dense weights
    python examples/train_sparse_snn.py --epochs 2 --hidden 300 --n-train 256   # quick look
    python examples/train_sparse_snn.py --dataset digits          # scikit-learn's digits, latency-coded
    python examples/train_sparse_snn.py --sparse-backward         # gradients only near threshold
    python examples/train_sparse_snn.py --sparse-backward --band 0.5   # a wider band
    python examples/train_sparse_snn.py --surrogate triangle --alpha 2 --memory carry

The results (markdown) and the figure go to ``examples/out/``, named after the
variant: ``train_sparse_snn_sparse.md`` for the default run,
``train_sparse_snn_sparse_digits_sb.md`` for ``--dataset digits
--sparse-backward``, and so on.

Needs the ``examples`` extra (``pip install evjax[examples]``: optax, matplotlib,
tqdm, and scikit-learn for ``--dataset digits``).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import evjax


# ---------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Config:
    """Sizes and hyper-parameters; the defaults are the README's run."""

    n_in: int = 100  # input units
    n_hidden: int = 2000  # recurrent LIF neurons
    n_classes: int = 10
    n_steps: int = 50  # time steps per trial
    p_in: float = 0.1  # input -> hidden connection probability
    p_rec: float = 0.01  # hidden -> hidden connection probability (20 recurrent synapses per neuron)
    manifold_dim: int = 2
    manifold_alpha: float = 1.0  # smoothness of the manifolds (higher: smoother, easier)
    jitter: float = 4.0  # spike-time noise (time steps, std)
    n_train: int = 2000
    n_test: int = 500
    batch: int = 16
    epochs: int = 10
    lr: float = 2e-3
    tau_mem: float = 10.0
    tau_syn: float = 5.0
    tau_out: float = 10.0
    rate_reg: float = 1.0  # penalty on the hidden rate above rate_target
    rate_target: float = 0.05
    seed: int = 0
    surrogate: str = "fast_sigmoid"  # the spike's surrogate derivative (see evjax.surrogate)
    alpha: float = 10.0  # its sharpness
    band: float | None = None  # half-width of a compact surrogate's band (None: its default, 3 / alpha)
    sparse_backward: bool = False  # gradients only through neurons in the band (needs a compact surrogate)
    memory: str = "full"  # what BPTT keeps: "full", "carry" or "segments" (evjax.bptt_scan; see make_trial)
    dataset: str = "randman"  # "randman" (generated here) or "digits" (scikit-learn's, n_in becomes 64)

    def spike_surrogate(self) -> evjax.Surrogate:
        """The surrogate the LIF neurons (and the sparse-backward gate) use."""
        return evjax.Surrogate(self.surrogate, self.alpha, self.band)


def sparse_backward_config(cfg: Config) -> Config:
    """The ``--sparse-backward`` variant of a configuration: the same surrogate clipped to its band
    (``clipped_fast_sigmoid`` for the default ``fast_sigmoid``), gradients gated to the band."""
    compact = cfg.surrogate if cfg.surrogate in evjax.surrogate.COMPACT else "clipped_fast_sigmoid"
    return dataclasses.replace(cfg, surrogate=compact, sparse_backward=True)


def training_label(cfg: Config) -> str:
    """The gradient settings in words, e.g. ``"surrogate fast_sigmoid (alpha 10), full BPTT"``."""
    name, alpha, width = evjax.surrogate.resolve_surrogate(cfg.spike_surrogate())
    band = f", band {width:g}" if width is not None and name == "clipped_fast_sigmoid" else ""
    mode = "sparse backward, " if cfg.sparse_backward else ""
    return f"{mode}surrogate {name} (alpha {alpha:g}{band}), {cfg.memory} BPTT"


def variant_name(cfg: Config, dense: bool = False) -> str:
    """The stem of a run's output files: ``sparse`` or ``dense``, then what differs from the defaults
    (``_digits``, ``_sb`` for sparse backward, the surrogate, ``_a<alpha>``, ``_band<width>``,
    ``_carry``, ``_seed<n>``), e.g. ``sparse_digits_sb``."""
    defaults = Config()
    parts = ["dense" if dense else "sparse"]
    if cfg.dataset != defaults.dataset:
        parts.append(cfg.dataset)
    if cfg.sparse_backward:
        parts.append("sb")
    default_surrogate = sparse_backward_config(defaults).surrogate if cfg.sparse_backward else defaults.surrogate
    if cfg.surrogate != default_surrogate:
        parts.append(cfg.surrogate)
    if cfg.alpha != defaults.alpha:
        parts.append(f"a{cfg.alpha:g}")
    if cfg.band is not None:
        parts.append(f"band{cfg.band:g}")
    if cfg.memory != defaults.memory:
        parts.append(cfg.memory)
    if cfg.seed != defaults.seed:
        parts.append(f"seed{cfg.seed}")
    return "_".join(parts)


# ---------------------------------------------------------------------------
# data: random manifolds ("Randman")
# ---------------------------------------------------------------------------
def make_randman(cfg: Config, n_samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Spike trains and labels of a Randman task.

    Each class ``c`` owns a smooth map ``f_c: [0, 1]^dim -> [0, 1]^n_in`` (a sum
    of random sinusoids with amplitudes decaying as ``k^-alpha``); a trial
    draws ``z`` uniformly and input unit ``j`` fires once, at step
    ``f_c(z)_j * (n_steps - 1)`` plus Gaussian jitter.  The manifolds depend on
    ``cfg.seed`` only, so train and test sets (other ``seed``) share them.

    Returns:
        ``(spikes, labels)``: bool ``(n_samples, n_steps, n_in)`` and int32 ``(n_samples,)``.
    """
    k_max = 4
    mrng = np.random.default_rng(cfg.seed + 12345)
    freq = mrng.uniform(0.5, 1.5, (cfg.n_classes, cfg.manifold_dim, k_max, cfg.n_in)) * np.arange(1, k_max + 1)[
        None, None, :, None]
    phase = mrng.uniform(0, 2 * np.pi, freq.shape)
    amp = mrng.uniform(0, 1, freq.shape) / np.arange(1, k_max + 1)[None, None, :, None] ** cfg.manifold_alpha
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, cfg.n_classes, n_samples).astype(np.int32)
    z = rng.uniform(0, 1, (n_samples, cfg.manifold_dim))
    # f[n, j] = sum_{d,k} amp * sin(2 pi freq z_d + phase), for the trial's class
    arg = 2 * np.pi * freq[labels] * z[:, :, None, None] + phase[labels]
    f = np.sum(amp[labels] * np.sin(arg), axis=(1, 2))
    lo = -np.sum(amp, axis=(1, 2))[labels]
    f = (f - lo) / (-2 * lo)  # into [0, 1]
    times = f * (cfg.n_steps - 1) + cfg.jitter * rng.standard_normal(f.shape)
    times = np.clip(np.round(times), 0, cfg.n_steps - 1).astype(np.int64)
    spikes = np.zeros((n_samples, cfg.n_steps, cfg.n_in), bool)
    spikes[np.arange(n_samples)[:, None], times, np.arange(cfg.n_in)[None, :]] = True
    return spikes, labels


# ---------------------------------------------------------------------------
# data: scikit-learn's handwritten digits, latency-coded
# ---------------------------------------------------------------------------
DATASETS = ("randman", "digits")
DIGITS_N_TEST = 297  # held out of the 1797 images (the other 1500 are the training pool)
DIGITS_MIN_PIXEL = 1.0  # pixels (0..16) at or below this are blank: no spike


def _load_digits():
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:
        raise ImportError("--dataset digits needs scikit-learn: pip install evjax[examples] "
                          "(or pip install 'scikit-learn>=1.3,<2')") from err
    return load_digits()


def latency_code(images: np.ndarray, n_steps: int, max_value: float = 16.0,
                 min_value: float = DIGITS_MIN_PIXEL) -> np.ndarray:
    """Time-to-first-spike code: pixel ``x`` fires once, at step ``round((1 - x / max_value) * (n_steps - 1))``
    (the brightest at step 0), and not at all when ``x <= min_value``.

    Returns:
        bool ``(n_images, n_steps, n_pixels)``.
    """
    images = np.asarray(images, np.float64)
    n, n_pix = images.shape
    times = np.round((1.0 - np.clip(images, 0.0, max_value) / max_value) * (n_steps - 1)).astype(np.int64)
    sample, pixel = np.nonzero(images > min_value)
    spikes = np.zeros((n, n_steps, n_pix), bool)
    spikes[sample, times[sample, pixel], pixel] = True
    return spikes


def make_digits(cfg: Config, seed: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's digits, latency-coded (:func:`latency_code`) over ``cfg.n_steps`` steps.

    The 1797 images are shuffled with ``seed`` (default ``cfg.seed``); the last
    :data:`DIGITS_N_TEST` (297) are the test set, of which the first
    ``cfg.n_test`` are used, and the first ``cfg.n_train`` of the other 1500
    are the training set (both capped to what is there).

    Returns:
        ``(x_train, y_train, x_test, y_test)``: bool ``(n, n_steps, 64)`` spikes and int32 labels.

    Raises:
        ImportError: scikit-learn is not installed (it names ``pip install evjax[examples]``).
    """
    digits = _load_digits()
    order = np.random.default_rng(cfg.seed if seed is None else seed).permutation(len(digits.target))
    pool, held_out = order[:-DIGITS_N_TEST], order[-DIGITS_N_TEST:]
    train_idx, test_idx = pool[:cfg.n_train], held_out[:cfg.n_test]
    spikes = latency_code(digits.data, cfg.n_steps, max_value=16.0)
    labels = digits.target.astype(np.int32)
    return spikes[train_idx], labels[train_idx], spikes[test_idx], labels[test_idx]


def load_dataset(cfg: Config) -> tuple[Config, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The data set ``cfg.dataset`` and the configuration the model needs for it.

    Returns:
        ``(cfg, x_train, y_train, x_test, y_test)``: ``cfg`` with ``n_in``,
        ``n_classes``, ``n_train`` and ``n_test`` set to the data's (for
        Randman the same ``cfg``); spikes bool ``(n, n_steps, n_in)``, labels int32.
    """
    if cfg.dataset == "randman":
        x_train, y_train = make_randman(cfg, cfg.n_train, seed=cfg.seed + 1)
        x_test, y_test = make_randman(cfg, cfg.n_test, seed=cfg.seed + 2)
        return cfg, x_train, y_train, x_test, y_test
    if cfg.dataset == "digits":
        x_train, y_train, x_test, y_test = make_digits(cfg)
        cfg = dataclasses.replace(cfg, n_in=x_train.shape[-1], n_classes=10, n_train=len(x_train),
                                  n_test=len(x_test))
        return cfg, x_train, y_train, x_test, y_test
    raise ValueError(f"unknown dataset {cfg.dataset!r}; choose one of {DATASETS}")


# ---------------------------------------------------------------------------
# connectivity and parameters
# ---------------------------------------------------------------------------
class Structure(NamedTuple):
    """A fixed CSR sparsity pattern (rows = presynaptic, columns = postsynaptic)."""

    indices: np.ndarray
    indptr: np.ndarray
    shape: tuple[int, int]

    @property
    def nnz(self) -> int:
        return int(self.indices.size)

    def row_lengths(self) -> np.ndarray:
        return np.diff(self.indptr)

    def mask(self) -> np.ndarray:
        m = np.zeros(self.shape, np.float32)
        rows = np.repeat(np.arange(self.shape[0]), self.row_lengths())
        m[rows, self.indices] = 1.0
        return m

    def to_dense(self, data) -> jax.Array:
        rows = np.repeat(np.arange(self.shape[0]), self.row_lengths())
        return jnp.zeros(self.shape, jnp.asarray(data).dtype).at[rows, self.indices].set(data)


def random_structure(rng: np.random.Generator, n_pre: int, n_post: int, p: float,
                     no_self: bool = False) -> Structure:
    """Each pre neuron connects to ``~Binomial(n_post, p)`` distinct random post neurons."""
    indptr = [0]
    indices = []
    for i in range(n_pre):
        row = np.flatnonzero(rng.random(n_post) < p)
        if no_self:
            row = row[row != i]
        indices.append(row)
        indptr.append(indptr[-1] + row.size)
    return Structure(np.concatenate(indices).astype(np.int32), np.asarray(indptr, np.int32), (n_pre, n_post))


def init_params(cfg: Config, seed: int | None = None) -> tuple[dict, Structure, Structure]:
    """Random structures and initial weights.

    Returns:
        ``(params, s_in, s_rec)`` where ``params`` holds the CSR weights
        ``w_in`` and ``w_rec`` (one value per synapse) and the dense readout.
    """
    rng = np.random.default_rng(cfg.seed if seed is None else seed)
    s_in = random_structure(rng, cfg.n_in, cfg.n_hidden, cfg.p_in)
    s_rec = random_structure(rng, cfg.n_hidden, cfg.n_hidden, cfg.p_rec, no_self=True)
    fan_in = max(1.0, cfg.n_in * cfg.p_in)
    fan_rec = max(1.0, cfg.n_hidden * cfg.p_rec)
    params = {
        "w_in": (rng.standard_normal(s_in.nnz) * 0.9 / math.sqrt(fan_in) + 0.5 / fan_in).astype(np.float32),
        "w_rec": (rng.standard_normal(s_rec.nnz) * 0.2 / math.sqrt(fan_rec)).astype(np.float32),
        "w_out": (rng.standard_normal((cfg.n_hidden, cfg.n_classes)) / math.sqrt(cfg.n_hidden)).astype(np.float32),
    }
    return jax.tree_util.tree_map(jnp.asarray, params), s_in, s_rec


# ---------------------------------------------------------------------------
# the model: one trial; the batch is jax.vmap over it
# ---------------------------------------------------------------------------
def make_synapses(s_in: Structure, s_rec: Structure, dense: bool, sparse_backward: bool = False) -> Callable:
    """``synapses(params) -> (input_current_fn, recurrent_current_fn)`` for one trial.

    Sparse: ``spikes @ evjax.CSR(...)``, event-driven (only the rows of neurons
    that spiked are visited).  Dense: the same weights scattered into a masked
    matrix and a ``jnp`` matmul.  ``sparse_backward``: the sparse layers are
    :func:`evjax.sparse_backward_matmul`, the same forward, with a backward
    pass that visits only the nonzero entries of the cotangent.
    """
    if dense:
        mask_in, mask_rec = jnp.asarray(s_in.mask()), jnp.asarray(s_rec.mask())

        def synapses(params):
            w_in = s_in.to_dense(params["w_in"]) if params["w_in"].ndim == 1 else params["w_in"] * mask_in
            w_rec = s_rec.to_dense(params["w_rec"]) if params["w_rec"].ndim == 1 else params["w_rec"] * mask_rec
            return (lambda x: x.astype(w_in.dtype) @ w_in), (lambda s: s @ w_rec)

        return synapses

    idx_in, ptr_in = jnp.asarray(s_in.indices), jnp.asarray(s_in.indptr)
    idx_rec, ptr_rec = jnp.asarray(s_rec.indices), jnp.asarray(s_rec.indptr)

    def synapses(params):
        w_in = evjax.CSR((params["w_in"], idx_in, ptr_in), shape=s_in.shape)
        w_rec = evjax.CSR((params["w_rec"], idx_rec, ptr_rec), shape=s_rec.shape)
        if sparse_backward:  # the column views are computed once per trace (the structures are constants)
            return (lambda x: evjax.sparse_backward_matmul(x, w_in)), (lambda s: evjax.sparse_backward_matmul(s, w_rec))
        # both layers are event ops on bool events (the input's bools as they are, lif_step's float spikes
        # read as s != 0), so they share one compiled scatter kernel and one weight-gradient kernel: fewer
        # first-run compiles.  The float spikes keep their surrogate gradient (straight-through the event op)
        return (lambda x: x @ w_in), (lambda s: evjax.BinaryArray(s) @ w_rec)

    return synapses


def make_trial(cfg: Config, synapses: Callable, record: bool = False) -> Callable:
    """``trial(params, x) -> (logits, counts)`` for one trial ``x`` (bool, (n_steps, n_in)).

    ``counts`` are the hidden neurons' spike counts over the trial, float ``(n_hidden,)``;
    ``record=True`` gives ``(logits, spikes)`` instead, the spike train ``(n_steps, n_hidden)``.

    The leaky readout ``y_t = out_decay * y_{t-1} + s_t @ W_out`` (``logits = max_t y_t``) is computed
    in one of two ways, the same values to float rounding:

    * ``cfg.memory == "full"``: after the time loop, from the stacked spike trains, as one matrix
      product for all steps (faster on CPU than a small product per step);
    * ``"carry"`` or ``"segments"``: carried through the loop with the spike counts, so the loop
      returns no per-step arrays and its backward pass keeps only what the memory mode says
      (``evjax.bptt_scan``), not the spike trains and their cotangents.
    """
    syn_decay = math.exp(-1.0 / cfg.tau_syn)
    out_decay = math.exp(-1.0 / cfg.tau_out)
    t = np.arange(cfg.n_steps)
    # the readout y_t = out_decay * y_{t-1} + h_t as one matrix: y = leak @ h
    leak = np.where(t[:, None] >= t[None, :], out_decay ** (t[:, None] - t[None, :]), 0.0)
    leak = jnp.asarray(leak, jnp.float32)
    surrogate = cfg.spike_surrogate()
    carried = cfg.memory != "full"

    def trial(params, x):
        input_current, recurrent_current = synapses(params)
        # zeros_like(x): under shard_map the state then varies over devices like x does
        zeros = jnp.zeros_like(x, jnp.float32, shape=(cfg.n_hidden,))

        def neurons(v, i_syn, s, x_t):
            i_syn = evjax.exp_trace(i_syn, input_current(x_t) + recurrent_current(s), syn_decay)
            v, s = evjax.lif_step(v, i_syn, tau=cfg.tau_mem, dt=1.0, v_th=1.0, v_reset=0.0,
                                  surrogate=surrogate, detach_reset=True)
            if cfg.sparse_backward:  # the state passes gradient to earlier steps only within the band
                v, i_syn = evjax.sparse_backward_gate((v, i_syn), v, s, v_th=1.0, surrogate=surrogate)
            return v, i_syn, s

        if not carried:
            def step(carry, x_t):
                state = neurons(*carry, x_t)
                return state, state[2]

            _, spikes = evjax.bptt_scan(step, (zeros, zeros, zeros), x, memory=cfg.memory)
            logits = jnp.max(leak @ (spikes @ params["w_out"]), axis=0)
            return logits, (spikes if record else jnp.sum(spikes, axis=0))

        def step(carry, x_t):
            v, i_syn, s, y, y_max, counts = carry
            v, i_syn, s = neurons(v, i_syn, s, x_t)
            y = out_decay * y + s @ params["w_out"]
            return (v, i_syn, s, y, jnp.maximum(y_max, y), counts + s), (s if record else None)

        readout = jnp.zeros_like(x, jnp.float32, shape=(cfg.n_classes,))
        init = (zeros, zeros, zeros, readout, readout - jnp.inf, zeros)
        (*_, logits, counts), spikes = evjax.bptt_scan(step, init, x, memory=cfg.memory)
        return logits, (spikes if record else counts)

    return trial


def make_loss(cfg: Config, trial: Callable) -> Callable:
    """``loss(params, x_batch, labels) -> (loss, (accuracy, counts))``, the batch by ``jax.vmap``;
    ``counts``: spike counts per trial and hidden neuron, ``(batch, n_hidden)``."""

    def loss(params, x, labels):
        logits, counts = jax.vmap(trial, in_axes=(None, 0))(params, x)
        log_p = jax.nn.log_softmax(logits)
        ce = -jnp.mean(jnp.take_along_axis(log_p, labels[:, None], axis=1))
        rate = counts / x.shape[1]  # per trial and neuron: the loss is a mean over trials
        reg = cfg.rate_reg * jnp.mean(jnp.square(jax.nn.relu(rate - cfg.rate_target)))
        acc = jnp.mean(jnp.argmax(logits, axis=1) == labels)
        return ce + reg, (acc, counts)

    return loss


def make_train_step(loss: Callable, optimizer) -> Callable:
    """A jitted Adam step: ``(params, opt_state, x, labels) -> (params, opt_state, loss, acc, counts)``."""
    import optax

    @jax.jit
    def train_step(params, opt_state, x, labels):
        (value, (acc, counts)), grads = jax.value_and_grad(loss, has_aux=True)(params, x, labels)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value, acc, counts

    return train_step


def synaptic_events(counts: np.ndarray, x: np.ndarray, s_in: Structure, s_rec: Structure) -> int:
    """Synaptic events of a batch's forward pass: each spike times its neuron's fan-out (``counts``: the
    hidden neurons' spike counts per trial, ``x``: the input spikes)."""
    in_events = np.tensordot(np.asarray(x, np.float64), s_in.row_lengths(), axes=([-1], [0])).sum()
    rec_events = np.tensordot(np.asarray(counts, np.float64), s_rec.row_lengths(), axes=([-1], [0])).sum()
    return int(in_events + rec_events)


# ---------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------
@dataclasses.dataclass
class Result:
    """What a run measured."""

    history: list = dataclasses.field(default_factory=list)  # per epoch dicts
    step_time: float = float("nan")  # median seconds per training step
    events_per_s: float = float("nan")
    test_acc: float = float("nan")
    final_params: Any = None
    raster: Any = None  # (hidden spikes, input spikes) of one test trial
    config: Any = None  # the configuration trained (n_in etc. as the data set set them)


def make_predict(trial: Callable) -> Callable:
    """A jitted ``predict(params, x_batch) -> class indices``, the batch by ``jax.vmap``."""
    return jax.jit(lambda p, xb: jnp.argmax(jax.vmap(trial, in_axes=(None, 0))(p, xb)[0], axis=1))


def evaluate(predict: Callable, params, x: np.ndarray, labels: np.ndarray, batch: int) -> float:
    """Accuracy over a data set, in batches of ``batch`` (the last one padded)."""
    correct = 0
    for start in range(0, len(x), batch):
        xb = x[start:start + batch]
        pad = batch - len(xb)
        if pad:
            xb = np.concatenate([xb, np.zeros((pad,) + xb.shape[1:], xb.dtype)])
        pred = np.asarray(predict(params, xb))[:batch - pad]
        correct += int(np.sum(pred == labels[start:start + batch]))
    return correct / len(x)


def to_dense_params(params: dict, s_in: Structure, s_rec: Structure) -> dict:
    """The same weights as masked dense matrices (the ``--dense`` parameterisation)."""
    return {"w_in": s_in.to_dense(params["w_in"]), "w_rec": s_rec.to_dense(params["w_rec"]),
            "w_out": params["w_out"]}


def batch_progress(n_batches: int, label: str):
    """``range(n_batches)`` with a progress bar on a terminal: tqdm's if installed, else one
    line rewritten in place (nothing when stderr is not a terminal, e.g. in tests)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        tqdm = None
    if tqdm is not None:
        yield from tqdm(range(n_batches), desc=label, unit="batch", leave=False, disable=None)
        return
    show = sys.stderr.isatty()
    start = time.perf_counter()
    for b in range(n_batches):
        if show:
            print(f"\r{label}: batch {b + 1}/{n_batches} ({time.perf_counter() - start:.0f} s)", end="",
                  file=sys.stderr, flush=True)
        yield b
    if show:
        print("\r" + " " * (len(label) + 40) + "\r", end="", file=sys.stderr, flush=True)


def train(cfg: Config, dense: bool = False, log: Callable[[str], None] = print) -> Result:
    """Generate the data, build the model and train it; returns the measurements."""
    import optax

    cfg, x_train, y_train, x_test, y_test = load_dataset(cfg)
    params, s_in, s_rec = init_params(cfg)
    if dense:
        params = to_dense_params(params, s_in, s_rec)
    synapses = make_synapses(s_in, s_rec, dense, cfg.sparse_backward)
    trial = make_trial(cfg, synapses)
    optimizer = optax.adam(cfg.lr)
    opt_state = optimizer.init(params)
    train_step = make_train_step(make_loss(cfg, trial), optimizer)
    predict = make_predict(trial)
    log(f"{'dense' if dense else 'sparse (evjax CSR)'} model, {cfg.dataset} data ({len(x_train)} train, "
        f"{len(x_test)} test): {cfg.n_in} inputs, {cfg.n_hidden} LIF neurons, "
        f"{s_in.nnz + s_rec.nnz:,} synapses (p_rec = {cfg.p_rec}), {cfg.n_classes} classes, "
        f"{cfg.n_steps} steps/trial, batch {cfg.batch}"
        + (f"; {training_label(cfg)}" if training_label(cfg) != training_label(Config()) else ""))
    rng = np.random.default_rng(cfg.seed)
    result = Result(config=cfg)
    step_times, events, event_time = [], 0, 0.0
    n_batches = cfg.n_train // cfg.batch
    for epoch in range(1, cfg.epochs + 1):
        order = rng.permutation(cfg.n_train)
        losses, accs, epoch_times = [], [], []
        for b in batch_progress(n_batches, f"epoch {epoch}/{cfg.epochs}"):
            idx = order[b * cfg.batch:(b + 1) * cfg.batch]
            xb, yb = x_train[idx], y_train[idx]
            t0 = time.perf_counter()
            params, opt_state, value, acc, counts = train_step(params, opt_state, xb, yb)
            value = float(value)  # waits for the step
            elapsed = time.perf_counter() - t0
            if epoch > 1 or b > 0:  # the first call compiles
                epoch_times.append(elapsed)
                events += synaptic_events(np.asarray(counts), xb, s_in, s_rec)
                event_time += elapsed
            losses.append(value)
            accs.append(float(acc))
        test_acc = evaluate(predict, params, x_test, y_test, cfg.batch)
        step_times += epoch_times
        record = dict(epoch=epoch, loss=float(np.mean(losses)), train_acc=float(np.mean(accs)), test_acc=test_acc,
                      step_ms=1e3 * float(np.median(epoch_times)) if epoch_times else float("nan"),
                      events_per_s=events / event_time if event_time else float("nan"))
        result.history.append(record)
        log(f"epoch {epoch:3d}  loss {record['loss']:.4f}  train acc {record['train_acc']:.3f}  "
            f"test acc {test_acc:.3f}  step {record['step_ms']:.1f} ms  "
            f"synaptic events/s {record['events_per_s']:.3g}")
    result.step_time = float(np.median(step_times)) if step_times else float("nan")
    result.events_per_s = events / event_time if event_time else float("nan")
    result.test_acc = result.history[-1]["test_acc"] if result.history else float("nan")
    result.final_params = params
    # one test trial, through the batched model (a batch of 1): the kernels training compiled serve it, where a
    # single-trial call would compile the vector kernels, and the process would wait for them at exit
    recorder = make_trial(cfg, synapses, record=True)
    _, hidden = jax.jit(jax.vmap(recorder, in_axes=(None, 0)))(params, x_test[:1])
    result.raster = (np.asarray(hidden[0]), x_test[0], int(y_test[0]))
    return result


def compare_step_times(cfg: Config, repeats: int = 5) -> dict:
    """Sparse-event against dense training steps, same batch and weights, timed alternately.

    Alternating the two (rather than timing one, then the other) keeps a change
    in machine load from biasing the ratio.

    Returns:
        ``{"sparse_s", "dense_s", "speedup"}``: median seconds per step and the
        median of the per-pair ratios dense / sparse.
    """
    import optax

    if cfg.dataset == "randman":
        x, y = make_randman(cfg, cfg.batch, seed=cfg.seed + 3)
    else:  # one batch of the training set (the model's n_in is the data's)
        cfg, x, y, _, _ = load_dataset(dataclasses.replace(cfg, n_train=cfg.batch))
    params, s_in, s_rec = init_params(cfg)
    optimizer = optax.adam(cfg.lr)
    runs = {}
    for dense in (False, True):
        p = to_dense_params(params, s_in, s_rec) if dense else params
        step = make_train_step(make_loss(cfg, make_trial(cfg, make_synapses(s_in, s_rec, dense, cfg.sparse_backward))),
                               optimizer)
        args = (p, optimizer.init(p), x, y)
        jax.block_until_ready(step(*args))  # compile
        runs[dense] = (step, args)
    times = {False: [], True: []}
    for _ in range(repeats):
        for dense in (False, True):
            step, args = runs[dense]
            t0 = time.perf_counter()
            jax.block_until_ready(step(*args))
            times[dense].append(time.perf_counter() - t0)
    ratios = np.asarray(times[True]) / np.asarray(times[False])
    return {"sparse_s": float(np.median(times[False])), "dense_s": float(np.median(times[True])),
            "speedup": float(np.median(ratios))}


def plot(result: Result, path: str, title: str) -> None:
    """Save loss/accuracy curves and a spike raster of one test trial."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [r["epoch"] for r in result.history]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    axes[0].plot(epochs, [r["loss"] for r in result.history], "o-")
    axes[0].set(xlabel="epoch", ylabel="training loss", title="loss")
    axes[1].plot(epochs, [r["train_acc"] for r in result.history], "o-", label="train")
    axes[1].plot(epochs, [r["test_acc"] for r in result.history], "s-", label="test")
    axes[1].set(xlabel="epoch", ylabel="accuracy", ylim=(0, 1), title="accuracy")
    axes[1].legend()
    hidden, inputs, label = result.raster
    t_in, j_in = np.nonzero(inputs)
    t_h, j_h = np.nonzero(hidden[:, :500])
    axes[2].scatter(t_h, j_h + inputs.shape[1] + 10, s=1, c="k", label="hidden (first 500)")
    axes[2].scatter(t_in, j_in, s=2, c="tab:red", label="input")
    axes[2].set(xlabel="time step", ylabel="neuron", title=f"spike raster, one test trial (class {label})")
    axes[2].legend(loc="upper right", fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_results(path: str, lines: list[str], argv: list[str] | None) -> None:
    """The summary as markdown, first line ``<!-- run DATE on MACHINE: command -->`` (the README quotes it)."""
    import datetime
    import platform

    command = " ".join(["python examples/train_sparse_snn.py", *(sys.argv[1:] if argv is None else argv)])
    machine = f"{os.cpu_count()} CPU cores, {platform.machine()}, jax {jax.__version__}, {jax.devices()[0].platform}"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(f"<!-- run {datetime.date.today()} on {machine}: {command} -->\n# Main example\n\n")
        f.writelines(f"- {line}\n" for line in lines)


def main(argv: list[str] | None = None) -> Result:
    """Command-line entry point (see ``--help``)."""
    defaults = Config()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dense", action="store_true", help="dense jnp weights instead of evjax CSR")
    parser.add_argument("--dataset", choices=DATASETS, default=defaults.dataset,
                        help="randman (generated) or digits (scikit-learn's 8x8 digits, latency-coded, 64 inputs)")
    parser.add_argument("--sparse-backward", action="store_true",
                        help="gradients only through neurons near threshold: the surrogate clipped to its band "
                             "(clipped_fast_sigmoid unless --surrogate names a compact one), evjax.sparse_backward_gate "
                             "and evjax.sparse_backward_matmul")
    parser.add_argument("--surrogate", default=defaults.surrogate, choices=evjax.surrogate.SURROGATES,
                        help=f"the spike's surrogate derivative (default {defaults.surrogate})")
    parser.add_argument("--alpha", type=float, default=defaults.alpha,
                        help=f"the surrogate's sharpness (default {defaults.alpha:g})")
    parser.add_argument("--band", type=float, default=defaults.band,
                        help="half-width of a compact surrogate's band (default: its own, 3 / alpha for "
                             "clipped_fast_sigmoid)")
    parser.add_argument("--memory", choices=evjax.bptt.MEMORY_MODES, default=defaults.memory,
                        help="what BPTT keeps (evjax.bptt_scan; carry, segments: recompute steps backward)")
    parser.add_argument("--epochs", type=int, default=defaults.epochs)
    parser.add_argument("--hidden", type=int, default=defaults.n_hidden)
    parser.add_argument("--p-rec", type=float, default=defaults.p_rec)
    parser.add_argument("--batch", type=int, default=defaults.batch)
    parser.add_argument("--steps", type=int, default=defaults.n_steps, help="time steps per trial")
    parser.add_argument("--n-train", type=int, default=defaults.n_train)
    parser.add_argument("--n-test", type=int, default=defaults.n_test)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"),
                        help="folder for the figure and the results")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--results", default=None,
                        help="markdown file for the summary (default: <out>/train_sparse_snn_<variant>.md, "
                             "<variant> as sparse, dense, sparse_digits_sb, ...)")
    parser.add_argument("--compare-steps", type=int, default=5,
                        help="steps of each variant timed alternately for the speedup (0: skip it)")
    args = parser.parse_args(argv)
    if not 0 < args.p_rec <= 1:
        parser.error("--p-rec must be in (0, 1]")
    cfg = dataclasses.replace(defaults, epochs=args.epochs, n_hidden=args.hidden, p_rec=args.p_rec, batch=args.batch,
                              n_steps=args.steps, n_train=args.n_train, n_test=args.n_test, lr=args.lr,
                              seed=args.seed, dataset=args.dataset, surrogate=args.surrogate, alpha=args.alpha,
                              band=args.band, memory=args.memory)
    if args.sparse_backward:
        if cfg.surrogate not in evjax.surrogate.COMPACT and cfg.surrogate != defaults.surrogate:
            parser.error(f"--sparse-backward needs a surrogate with a band ({', '.join(evjax.surrogate.COMPACT)}), "
                         f"or the default {defaults.surrogate} (clipped to its band); got --surrogate {cfg.surrogate}")
        cfg = sparse_backward_config(cfg)
    try:
        evjax.surrogate.resolve_surrogate(cfg.spike_surrogate())
    except (TypeError, ValueError) as err:
        parser.error(f"--surrogate/--alpha/--band: {err}")
    kind = "dense" if args.dense else "sparse"
    variant = variant_name(cfg, args.dense)
    print(f"evjax {evjax.__version__}, jax {jax.__version__}, devices {jax.devices()}")
    t0 = time.perf_counter()
    result = train(cfg, dense=args.dense)
    total = time.perf_counter() - t0
    cfg = result.config  # n_in, n_train, ... as the data set has them
    print("\nsummary")
    print(f"  model            {kind}, {cfg.n_hidden} hidden, p_rec {cfg.p_rec}, batch {cfg.batch}")
    print(f"  data             {cfg.dataset}, {cfg.n_in} inputs, {cfg.n_train} train / {cfg.n_test} test trials")
    print(f"  gradients        {training_label(cfg)}")
    print(f"  test accuracy    {result.test_acc:.3f} (chance {1 / cfg.n_classes:.3f})")
    print(f"  time per step    {1e3 * result.step_time:.1f} ms (median)")
    print(f"  synaptic events  {result.events_per_s:.3g} per second of training")
    print(f"  wall time        {total:.0f} s")
    summary = [f"model: {kind}, {cfg.n_hidden} hidden LIF neurons, p_rec {cfg.p_rec}, batch {cfg.batch}, "
               f"{cfg.epochs} epochs",
               f"test accuracy: {result.test_acc:.3f} (chance {1 / cfg.n_classes:.3f})",
               f"time per training step: {1e3 * result.step_time:.1f} ms (median)",
               f"wall time of training: {total:.0f} s"]
    summary[1:1] = [f"data: {cfg.dataset}, {cfg.n_in} inputs, {cfg.n_train} train / {cfg.n_test} test trials",
                    f"gradients: {training_label(cfg)}, seed {cfg.seed}"]
    if args.compare_steps > 0:
        timing = compare_step_times(cfg, repeats=args.compare_steps)
        print(f"  sparse vs dense  training step {1e3 * timing['sparse_s']:.1f} ms (sparse-event) vs "
              f"{1e3 * timing['dense_s']:.1f} ms (dense), timed alternately: speedup {timing['speedup']:.1f}x")
        summary.append(f"sparse vs dense training step: {1e3 * timing['sparse_s']:.1f} ms vs "
                       f"{1e3 * timing['dense_s']:.1f} ms, speedup {timing['speedup']:.1f}x")
    results = args.results or os.path.join(args.out, f"train_sparse_snn_{variant}.md")
    write_results(results, summary, argv)
    print(f"  results          {results}")
    if not args.no_plot:
        path = os.path.join(args.out, f"train_sparse_snn_{variant}.png")
        plot(result, path, f"{kind} SNN, {cfg.n_hidden} LIF neurons, {cfg.dataset}, {training_label(cfg)}, "
                           f"test accuracy {result.test_acc:.2f}")
        print(f"  figure           {path}")
    return result


if __name__ == "__main__":
    main()

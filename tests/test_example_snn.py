"""The main example, examples/train_sparse_snn.py, at tiny sizes."""
from __future__ import annotations

import importlib.util
import pathlib
import sys

import jax
import numpy as np
import pytest

pytest.importorskip("optax")
ROOT = pathlib.Path(__file__).resolve().parent.parent


def _load_example():
    spec = importlib.util.spec_from_file_location("train_sparse_snn", ROOT / "examples" / "train_sparse_snn.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up
    spec.loader.exec_module(module)
    return module


snn = _load_example()
TINY = snn.Config(n_in=40, n_hidden=120, n_classes=3, n_steps=20, p_in=0.3, p_rec=0.1, n_train=192, n_test=96,
                  batch=32, epochs=4, lr=5e-3, manifold_dim=1, manifold_alpha=2.0, jitter=1.0)


def test_randman_data():
    x, y = snn.make_randman(TINY, 64, seed=1)
    assert x.shape == (64, TINY.n_steps, TINY.n_in) and x.dtype == bool
    np.testing.assert_array_equal(x.sum(axis=1), 1)  # one spike per input unit and trial
    assert set(np.unique(y)) == set(range(TINY.n_classes))
    x2, y2 = snn.make_randman(TINY, 64, seed=1)
    np.testing.assert_array_equal(x, x2)
    # the class is in the data: leave-one-out nearest neighbour (spike-time distance) beats chance
    t = np.argmax(x, axis=1).astype(float)
    d = np.abs(t[:, None, :] - t[None, :, :]).mean(-1)
    np.fill_diagonal(d, np.inf)
    nn_acc = np.mean(y[np.argmin(d, axis=1)] == y)
    assert nn_acc > 2.0 / TINY.n_classes, nn_acc


def test_structure_and_dense_view():
    rng = np.random.default_rng(0)
    s = snn.random_structure(rng, 30, 50, 0.1, no_self=False)
    assert s.indptr[-1] == s.nnz and s.indices.max() < 50
    data = rng.standard_normal(s.nnz).astype(np.float32)
    dense = np.asarray(s.to_dense(data))
    assert np.count_nonzero(dense) == s.nnz
    np.testing.assert_array_equal(dense != 0, s.mask() != 0)


def test_sparse_and_dense_models_agree():
    """Same weights, same loss and gradients: the CSR path differentiates correctly end to end."""
    params, s_in, s_rec = snn.init_params(TINY)
    x, y = snn.make_randman(TINY, 8, seed=3)
    results = {}
    for dense in (False, True):
        p = snn.to_dense_params(params, s_in, s_rec) if dense else params
        loss = snn.make_loss(TINY, snn.make_trial(TINY, snn.make_synapses(s_in, s_rec, dense)))
        (value, (_, counts)), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(p, x, y)
        results[dense] = (value, counts, grads)
    (v_s, spk_s, g_s), (v_d, spk_d, g_d) = results[False], results[True]
    assert float(spk_s.mean()) / TINY.n_steps > 0.01  # the network is active, so the test is not vacuous
    np.testing.assert_array_equal(spk_s, spk_d)  # the same spike count per trial and neuron
    np.testing.assert_allclose(v_s, v_d, rtol=1e-5)
    for name, s in (("w_in", s_in), ("w_rec", s_rec)):
        rows = np.repeat(np.arange(s.shape[0]), s.row_lengths())
        dense_at_synapses = np.asarray(g_d[name])[rows, s.indices]
        assert np.abs(g_s[name]).max() > 0
        np.testing.assert_allclose(g_s[name], dense_at_synapses, rtol=1e-4, atol=1e-6 * np.abs(dense_at_synapses).max())
    np.testing.assert_allclose(g_s["w_out"], g_d["w_out"], rtol=1e-4, atol=1e-7)


def _eqns(jaxpr, depth=0):
    """(primitive name, depth of scan/while nesting) of every equation, recursively."""
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        yield name, depth
        inner = depth + (name in ("scan", "while"))
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                sub = getattr(sub, "jaxpr", sub)
                if hasattr(sub, "eqns"):
                    yield from _eqns(sub, inner)


def test_vmapped_event_ops_are_native_batched_kernels():
    """vmap over the single-trial model lowers to the mm event ops, with no loop over the batch."""
    params, s_in, s_rec = snn.init_params(TINY)
    x, y = snn.make_randman(TINY, 8, seed=3)
    loss = snn.make_loss(TINY, snn.make_trial(TINY, snn.make_synapses(s_in, s_rec, dense=False)))
    jaxpr = jax.make_jaxpr(jax.value_and_grad(loss, has_aux=True))(params, x, y).jaxpr
    eqns = list(_eqns(jaxpr))
    names = {n for n, _ in eqns}
    event_ops = {n for n in names if n.startswith("evjax_") and "csr" in n}
    # forward: input events (bool) and recurrent spikes, both batched matmuls; backward: weight gradients
    assert "evjax_binary_csrmm" in event_ops and "evjax_csrmm" in event_ops and "evjax_csr_sddmm" in event_ops
    assert not {"evjax_csrmv", "evjax_binary_csrmv"} & event_ops, event_ops
    # the only loops are the time loops (forward and backward scans), never one inside another
    loops = [(n, d) for n, d in eqns if n in ("scan", "while")]
    assert loops and all(d == 0 for _, d in loops), loops
    assert all(d == 1 for n, d in eqns if n in event_ops)  # in the time loop, one batched call per step
    # the neuron update is pure JAX (it fuses with the arithmetic around it): no neuron primitive at all
    assert not {n for n in names if n.startswith("evjax_") and ("lif" in n or "spike" in n)}, names


def test_training_learns_tiny(tmp_path):
    lines = []
    result = snn.train(TINY, log=lines.append)
    assert len(result.history) == TINY.epochs and len(lines) == TINY.epochs + 1
    first, last = result.history[0], result.history[-1]
    assert last["loss"] < 0.8 * first["loss"]
    assert result.test_acc > 1.6 / TINY.n_classes  # chance is 1/3
    assert result.events_per_s > 0 and result.step_time > 0
    assert "synaptic events/s" in lines[-1]
    snn.plot(result, str(tmp_path / "fig.png"), "tiny")
    assert (tmp_path / "fig.png").stat().st_size > 10_000


def test_cli_runs_and_reports_speedup(tmp_path, capsys):
    snn.main(["--epochs", "1", "--hidden", "64", "--steps", "10", "--n-train", "64", "--n-test", "32", "--batch",
              "16", "--compare-steps", "1", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    for expected in ("test accuracy", "time per step", "synaptic events", "speedup", "figure"):
        assert expected in out
    assert (tmp_path / "train_sparse_snn_sparse.png").exists()
    results = (tmp_path / "train_sparse_snn_sparse.md").read_text().splitlines()
    assert results[0].startswith("<!-- run ") and results[0].endswith("-->")
    assert any(line.startswith("- test accuracy: ") for line in results)
    assert any("speedup" in line for line in results)
    result = snn.main(["--dense", "--epochs", "1", "--hidden", "64", "--steps", "10", "--n-train", "32", "--n-test",
                       "16", "--batch", "16", "--compare-steps", "0", "--no-plot", "--out", str(tmp_path)])
    assert "dense, 64 hidden" in capsys.readouterr().out
    assert result.final_params["w_rec"].shape == (64, 64)  # the dense parameterisation was trained
    with pytest.raises(SystemExit):
        snn.main(["--p-rec", "1.5"])


def test_benchmark_script_runs(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("snn_training_bench", ROOT / "benchmarks" / "snn_training.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    rows = bench.main(["--sizes", "48", "--steps", "6", "--batch", "4", "--repeats", "2", "--out", str(tmp_path)])
    (row,) = rows
    assert row["n_hidden"] == 48 and row["sparse_ms"] > 0 and row["dense_ms"] > 0
    assert 0 < row["speedup_min"] <= row["speedup"] <= row["speedup_max"]
    out = capsys.readouterr().out
    assert "| 48 |" in out and "dense / sparse" in out
    assert (tmp_path / "snn_training.png").exists() and (tmp_path / "snn_training.json").exists()


# ---------------------------------------------------------------------------
# --dataset digits (scikit-learn's, latency-coded) and --sparse-backward
# ---------------------------------------------------------------------------
DIGITS_TINY = snn.Config(dataset="digits", n_hidden=100, n_steps=16, p_in=0.3, p_rec=0.1, n_train=320, n_test=96,
                         batch=32, epochs=1, lr=1e-2)


def test_digits_data():
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    cfg, x_train, y_train, x_test, y_test = snn.load_dataset(DIGITS_TINY)
    assert (cfg.n_in, cfg.n_classes, cfg.n_train, cfg.n_test) == (64, 10, 320, 96)
    assert x_train.shape == (320, 16, 64) and x_test.shape == (96, 16, 64) and x_train.dtype == bool
    assert y_train.dtype == np.int32 and set(np.unique(y_train)) == set(range(10))
    assert x_train.sum(axis=1).max() == 1  # at most one spike per pixel and trial
    # latency code: brighter pixels fire earlier, blank ones never
    images = sklearn_datasets.load_digits().data
    x = snn.latency_code(images, 16)
    fired = x.any(axis=1)
    np.testing.assert_array_equal(fired, images > snn.DIGITS_MIN_PIXEL)
    t = np.argmax(x, axis=1)
    np.testing.assert_array_equal(t[fired], np.round((1 - images[fired] / 16) * 15))
    assert t[images == 16].max() == 0
    # deterministic in the seed, capped to what is there, the test set apart from the training set
    again = snn.make_digits(DIGITS_TINY)
    np.testing.assert_array_equal(again[0], x_train)
    np.testing.assert_array_equal(again[3], y_test)
    other = snn.make_digits(snn.dataclasses.replace(DIGITS_TINY, seed=1))
    assert not np.array_equal(other[0], x_train)
    full = snn.make_digits(snn.dataclasses.replace(DIGITS_TINY, n_train=10_000, n_test=10_000))
    assert (len(full[0]), len(full[2])) == (1500, 297)
    train_codes = {row.tobytes() for row in full[0].reshape(1500, -1)}
    x_all = snn.latency_code(images, 16).reshape(len(images), -1)
    assert len(train_codes | {row.tobytes() for row in full[2].reshape(297, -1)}) == len(
        {row.tobytes() for row in x_all})  # the two splits together are the whole set


def test_digits_without_sklearn_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)  # import sklearn then raises ImportError
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(ImportError, match=r"pip install evjax\[examples\]"):
        snn.load_dataset(DIGITS_TINY)
    with pytest.raises(ImportError, match=r"pip install evjax\[examples\]"):
        snn.main(["--dataset", "digits", "--epochs", "1", "--hidden", "16", "--no-plot", "--compare-steps", "0"])


def test_digits_trains_tiny_through_the_cli(tmp_path, capsys):
    """--dataset digits --sparse-backward: one epoch trains, reports an accuracy, names its files by the variant."""
    pytest.importorskip("sklearn")
    result = snn.main(["--dataset", "digits", "--sparse-backward", "--band", "0.5", "--epochs", "2", "--hidden", "100",
                       "--steps", "16", "--n-train", "320", "--n-test", "96", "--batch", "32", "--lr", "1e-2",
                       "--compare-steps", "0", "--no-plot", "--out", str(tmp_path)])
    cfg = result.config
    assert (cfg.dataset, cfg.n_in, cfg.n_classes, cfg.surrogate, cfg.band) == ("digits", 64, 10,
                                                                                "clipped_fast_sigmoid", 0.5)
    assert cfg.sparse_backward and len(result.history) == 2
    assert all(np.isfinite(r["loss"]) for r in result.history)
    assert result.history[-1]["loss"] < result.history[0]["loss"]
    assert result.test_acc > 0.2  # chance is 0.1
    out = capsys.readouterr().out
    assert "digits, 64 inputs" in out and "sparse backward, surrogate clipped_fast_sigmoid" in out
    results = (tmp_path / "train_sparse_snn_sparse_digits_sb_band0.5.md").read_text().splitlines()
    assert results[0].startswith("<!-- run ") and "--sparse-backward" in results[0]
    assert any(line.startswith("- test accuracy: ") for line in results)
    assert "- gradients: sparse backward, surrogate clipped_fast_sigmoid (alpha 10, band 0.5), full BPTT, seed 0" \
        in results


def test_variant_names_and_flag_checks():
    assert snn.variant_name(snn.Config()) == "sparse"  # the default run's files keep their names
    assert snn.variant_name(snn.Config(), dense=True) == "dense"
    sb = snn.sparse_backward_config(snn.Config(dataset="digits"))
    assert snn.variant_name(sb) == "sparse_digits_sb"
    assert snn.variant_name(snn.dataclasses.replace(sb, surrogate="triangle", alpha=2.0, memory="carry", seed=2)) \
        == "sparse_digits_sb_triangle_a2_carry_seed2"
    assert snn.variant_name(snn.Config(surrogate="arctan", alpha=2.0)) == "sparse_arctan_a2"
    for bad in (["--band", "0.3"],  # fast_sigmoid has no band
                ["--sparse-backward", "--surrogate", "sigmoid"],  # nor has sigmoid
                ["--alpha", "-1"], ["--memory", "half"], ["--dataset", "mnist"]):
        with pytest.raises(SystemExit):
            snn.main(bad)


def _loss_and_grads(cfg, params, s_in, s_rec, x, y):
    loss = snn.make_loss(cfg, snn.make_trial(cfg, snn.make_synapses(s_in, s_rec, False, cfg.sparse_backward)))
    (value, (_, counts)), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params, x, y)
    return value, counts, grads


def test_sparse_backward_gradients():
    """--sparse-backward: finite loss and gradients, and with a band that holds every neuron the gate and the
    sparse-backward matmuls change nothing: the gradients of the plain model with the same surrogate."""
    params, s_in, s_rec = snn.init_params(TINY)
    x, y = snn.make_randman(TINY, 8, seed=3)
    sb = snn.sparse_backward_config(TINY)
    assert (sb.surrogate, sb.sparse_backward) == ("clipped_fast_sigmoid", True)
    value, counts, grads = _loss_and_grads(sb, params, s_in, s_rec, x, y)
    assert np.isfinite(float(value)) and float(counts.mean()) / TINY.n_steps > 0.01
    for name, g in grads.items():
        assert np.all(np.isfinite(g)) and np.abs(g).max() > 0, name
    # the band (3 / alpha = 0.3) leaves some recurrent synapses without gradient: the backward is sparse
    assert np.mean(np.asarray(grads["w_rec"]) == 0) > 0.01
    wide = snn.dataclasses.replace(sb, band=1e6)
    v_sb, spk_sb, g_sb = _loss_and_grads(wide, params, s_in, s_rec, x, y)
    v_pl, spk_pl, g_pl = _loss_and_grads(snn.dataclasses.replace(wide, sparse_backward=False), params, s_in, s_rec,
                                         x, y)
    np.testing.assert_array_equal(spk_sb, spk_pl)
    np.testing.assert_allclose(v_sb, v_pl, rtol=1e-6)
    for name in g_pl:
        scale = np.abs(g_pl[name]).max()
        assert scale > 0
        np.testing.assert_allclose(g_sb[name], g_pl[name], rtol=1e-4, atol=1e-6 * scale, err_msg=name)


def test_readout_after_and_in_the_loop_agree():
    """The trial's two readouts: after the loop from the stacked spike trains (memory='full'), and carried
    through the loop with the spike counts (memory='carry', 'segments').  The same spikes, counts equal to
    the recorded trains' sums, logits ``max_t y_t`` with ``y_t = sum_{u <= t} d^(t-u) s_u @ W_out``."""
    params, s_in, s_rec = snn.init_params(TINY)
    x, _ = snn.make_randman(TINY, 4, seed=5)
    synapses = snn.make_synapses(s_in, s_rec, dense=False)
    batched = lambda cfg, record=False: jax.jit(jax.vmap(snn.make_trial(cfg, synapses, record), in_axes=(None, 0)))
    logits_r, spikes = batched(TINY, record=True)(params, x)
    spikes = np.asarray(spikes, np.float64)
    assert spikes.shape == (4, TINY.n_steps, TINY.n_hidden) and spikes.mean() > 0.01
    t = np.arange(TINY.n_steps)
    decay = np.exp(-1.0 / TINY.tau_out)
    leak = np.where(t[:, None] >= t[None, :], decay ** (t[:, None] - t[None, :]), 0.0)
    expected = (leak @ (spikes @ np.asarray(params["w_out"], np.float64))).max(axis=1)
    for memory in ("full", "carry", "segments"):
        cfg = snn.dataclasses.replace(TINY, memory=memory)
        logits, counts = batched(cfg)(params, x)
        np.testing.assert_array_equal(counts, spikes.sum(axis=1))
        np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-6)
        if memory == "full":
            np.testing.assert_array_equal(logits, logits_r)
        _, carried_spikes = batched(cfg, record=True)(params, x)
        np.testing.assert_array_equal(carried_spikes, spikes)


def test_memory_modes_shrink_the_gradient():
    """With 'segments' the readout is carried and the time loop returns no per-step arrays, so the gradient
    keeps well under half of what 'full' keeps (XLA's own accounting of the compiled gradient); a readout
    after the loop would keep the spike trains and their cotangents in every mode (0.66x)."""
    cfg = snn.dataclasses.replace(TINY, n_steps=64)
    params, s_in, s_rec = snn.init_params(cfg)
    x, y = snn.make_randman(cfg, 4, seed=5)
    peaks = {}
    for memory in ("full", "segments"):
        c = snn.dataclasses.replace(cfg, memory=memory)
        loss = snn.make_loss(c, snn.make_trial(c, snn.make_synapses(s_in, s_rec, dense=False)))
        gradient = jax.jit(jax.grad(lambda p: loss(p, x, y)[0]))
        peaks[memory] = gradient.lower(params).compile().memory_analysis().temp_size_in_bytes
    assert peaks["segments"] < 0.5 * peaks["full"], peaks

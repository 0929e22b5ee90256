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
        (value, (_, spikes)), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(p, x, y)
        results[dense] = (value, spikes, grads)
    (v_s, spk_s, g_s), (v_d, spk_d, g_d) = results[False], results[True]
    assert float(spk_s.mean()) > 0.01  # the network is active, so the test is not vacuous
    np.testing.assert_array_equal(spk_s, spk_d)
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

"""examples/stdp.py and examples/delays.py in their --small modes: STDP makes the outputs selective to the
hidden pattern; delays make each detector fire for its own spike sequence only."""
from __future__ import annotations

import importlib.util
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_stdp_small_learns_the_pattern(tmp_path, capsys):
    stdp = _load("stdp")
    before, after = stdp.main(["--small", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    # before learning the outputs barely tell the pattern's windows from the noise; after, they fire in them
    assert before[0] / before[1] < 1.5, out
    assert after[0] / after[1] > 3.0, out
    assert after[0] > 2.0, out  # they do fire (not a silent network's 0/0)
    assert "selective" in out
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (tmp_path / "stdp_weights.png").stat().st_size > 0
    assert (tmp_path / "stdp_raster.png").stat().st_size > 0


def test_delays_small_detects_the_preferred_sequences_only(tmp_path, capsys):
    delays = _load("delays")
    preferred, control = delays.main(["--small", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert preferred >= 0.9, out  # its own order: all 20 spikes arrive together
    assert control <= 0.1, out  # the same spikes shuffled among the inputs: they arrive spread out
    assert "other detectors firing: 0.0" in out.split("preferred order:")[1].splitlines()[0]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (tmp_path / "delays.png").stat().st_size > 0

"""The neuron operator family: spike, LIF step, exponential trace, spike detection.

* :mod:`.ops`: the ops, their reference, rules and registration;
* :mod:`.numba`, :mod:`.warp`, :mod:`.numba_cuda`: the backends, each imported
  by the ops the first time it is needed.
"""
from .ops import (
    OPS,
    detect_spikes,
    detect_spikes_p,
    exp_trace,
    exp_trace_p,
    lif_step,
    lif_step_p,
    make_generator,
    spike,
    spike_p,
)

__all__ = ["OPS", "spike", "lif_step", "exp_trace", "detect_spikes", "spike_p", "lif_step_p", "exp_trace_p",
           "detect_spikes_p", "make_generator"]

"""The neuron operator family: spike, LIF step, exponential trace, spike detection.

* :mod:`.ops`: the ops, in pure JAX with custom (surrogate) JVPs, so XLA fuses
  them with the code around them; no backend modules.
"""
from .ops import detect_spikes, exp_trace, lif_step, spike

__all__ = ["spike", "lif_step", "exp_trace", "detect_spikes"]

"""Operator families: one module per family (CSR synaptic ops, neuron dynamics)."""

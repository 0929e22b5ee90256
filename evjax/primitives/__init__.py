"""Operator families, one package each: ``csr`` (event-driven sparse propagation) and
``neuron`` (neuron dynamics).  See ``docs/architecture.md`` for the layout of a family."""

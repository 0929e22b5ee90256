"""Op-agnostic helpers for writing JVP, transpose and batching rules."""
from . import ad, batching

__all__ = ["ad", "batching"]

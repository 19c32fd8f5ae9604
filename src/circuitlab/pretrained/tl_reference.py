"""Moved: the TransformerLens bridge is public as circuitlab.pretrained.to_transformer_lens (bridges.py).
This name stays so imports written before the move keep working."""
from circuitlab.pretrained.bridges import to_transformer_lens

__all__ = ["to_transformer_lens"]

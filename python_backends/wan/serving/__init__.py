"""Triton adapters of the Wan stages (`protocol` lists their tensors)."""

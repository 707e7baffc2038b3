"""Triton models of the Stable Audio pipeline (see protocol)."""

"""Tessera stage (see README architecture)."""

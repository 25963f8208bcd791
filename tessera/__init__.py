"""Tessera: kernel-granularity disaggregation over heterogeneous GPU pools (arXiv 2604.10180)."""

__version__ = "0.1.0"

"""Catalog of GPU types and links as data, each figure with its source."""

from tessera.hardware.catalog import GpuSpec, LinkSpec, gpu, gpu_names, link, link_names

__all__ = ["GpuSpec", "LinkSpec", "gpu", "gpu_names", "link", "link_names"]

"""Catalog of GPU types and links as data, each figure with its source."""

from tessera.hardware.catalog import (
    Catalog,
    GpuSpec,
    LinkSpec,
    gpu,
    gpu_names,
    link,
    link_names,
    load_catalog,
    resolve_gpu,
    use_catalog,
)

__all__ = ["Catalog", "GpuSpec", "LinkSpec", "gpu", "gpu_names", "link", "link_names", "load_catalog",
           "resolve_gpu", "use_catalog"]

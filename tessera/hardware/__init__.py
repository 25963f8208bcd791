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
from tessera.hardware.links import (
    AUTO,
    IN_SERVER,
    best_link,
    buildable,
    cell_link,
    check_link_name,
    link_named,
    why_not,
)

__all__ = ["AUTO", "IN_SERVER", "Catalog", "GpuSpec", "LinkSpec", "best_link", "buildable", "cell_link",
           "check_link_name", "gpu", "gpu_names", "link", "link_named", "link_names", "load_catalog",
           "resolve_gpu", "use_catalog", "why_not"]

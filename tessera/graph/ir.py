"""The kernel-graph IR, defined in ``tessera.contracts.ir`` (the contracts between stages); this module
keeps the names where its readers import them."""

from tessera.contracts.ir import (
    DEPS_FROM,
    IR_VERSION,
    RESIDENT_ROLES,
    Buffer,
    Edge,
    EdgeKind,
    Kernel,
    KernelGraph,
    KernelKind,
    Role,
    build_graph,
)

__all__ = ["DEPS_FROM", "IR_VERSION", "RESIDENT_ROLES", "Buffer", "Edge", "EdgeKind", "Kernel", "KernelGraph",
           "KernelKind", "Role", "build_graph"]

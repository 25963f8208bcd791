"""The IR: kernels, buffers and the RAW/WAR/WAW dependencies between them."""

from tessera.graph.ir import (
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

__all__ = [
    "IR_VERSION", "RESIDENT_ROLES", "Buffer", "Edge", "EdgeKind", "Kernel", "KernelGraph", "KernelKind",
    "Role", "build_graph",
]

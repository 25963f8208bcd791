"""Which links a cell of GPUs can be built with, and the best of them (docs/hardware.md, "Links a cell can
have"). Decided from the catalog's fields alone:

  NVLink (a link of kind ``nvlink``, generation n): every GPU of the cell is of one type whose
      ``nvlink_gen`` is n, and the cell holds at most that type's ``nvlink_domain_gpus`` (one NVLink domain:
      an HGX board, an NVL72 rack, a bridged pair of PCIe cards; a domain holds GPUs of one type);
  PCIe (kind ``pcie``, generation g): g is at most every card's ``pcie_gen`` (a link runs at the lower
      generation of its two ends); the host CPU (``pcie_gen`` 0) limits nothing;
  network (kind ``network``): any cell (its GPUs sit in different servers).

The best link, ``auto``, keeps the cell inside one server: the fastest buildable NVLink, else the fastest
buildable PCIe (fastest: bytes per second a large transfer reaches); a network link only where a user
catalog leaves a cell no other.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from tessera.errors import UserError, choices_error
from tessera.hardware.catalog import GpuSpec, LinkSpec, current

AUTO = "auto"  # the best link the cell can have
IN_SERVER = ("nvlink", "pcie")  # the kinds ``auto`` prefers, in this order


def cell_name(gpus: Sequence[GpuSpec]) -> str:
    """'H100-SXM + L40S', '4xH100-PCIe'."""
    counts = Counter(g.name for g in gpus)
    return " + ".join(f"{n}x{name}" if n > 1 else name for name, n in counts.items())


def why_not(link: LinkSpec, gpus: Sequence[GpuSpec]) -> str | None:
    """Why ``link`` cannot join ``gpus`` (one clause), or None where it can."""
    if link.kind == "nvlink":
        types = sorted({g.name for g in gpus})
        if len(types) > 1:
            return f"NVLink joins GPUs of one type only ({', '.join(types)})"
        g = gpus[0]
        if g.nvlink_gen != link.generation:
            return f"{g.name} has {f'NVLink {g.nvlink_gen}' if g.nvlink_gen else 'no NVLink'}"
        if len(gpus) > g.nvlink_domain_gpus:
            return f"one NVLink domain joins at most {g.nvlink_domain_gpus} {g.name}"
        return None
    if link.kind == "pcie":
        slow = [g for g in gpus if 0 < g.pcie_gen < link.generation]
        if slow:
            return f"{slow[0].name} is a PCIe Gen{slow[0].pcie_gen} card"
    return None


def buildable(gpus: Sequence[GpuSpec]) -> list[LinkSpec]:
    """Every catalog link that can join ``gpus``, fastest first."""
    if not gpus:
        raise UserError("a cell needs at least one GPU")
    links = [lk for lk in current().links.values() if why_not(lk, gpus) is None]
    return sorted(links, key=lambda lk: (-lk.effective_bytes_per_s, lk.latency_s, lk.name))


def best_link(gpus: Sequence[GpuSpec]) -> LinkSpec:
    """The ``auto`` link of module doc: fastest buildable NVLink, else PCIe, else any buildable link."""
    links = buildable(gpus)
    for kind in IN_SERVER:
        of_kind = [lk for lk in links if lk.kind == kind]
        if of_kind:
            return of_kind[0]
    if not links:
        raise UserError(f"no catalog link can join {cell_name(gpus)}")
    return links[0]


def link_named(name: str) -> LinkSpec:
    """A catalog link by name, case-insensitive; an unknown name lists the choices (``auto`` among them)."""
    links = current().links
    exact = [n for n in links if n.lower() == name.strip().lower()]
    if not exact:
        raise choices_error("link", name, [AUTO, *links])
    return links[exact[0]]


def check_link_name(name: str) -> None:
    """``name`` is ``auto`` or a catalog link (an unknown one is a UserError listing the choices)."""
    if name.strip().lower() != AUTO:
        link_named(name)


def choices(gpus: Sequence[GpuSpec]) -> str:
    """The buildable choices for ``gpus``, in words: 'auto (pcie4), pcie4, ib400, ...'."""
    return f"{AUTO} ({best_link(gpus).name}), " + ", ".join(lk.name for lk in buildable(gpus))


def cell_link(gpus: Sequence[GpuSpec], name: str = AUTO) -> LinkSpec:
    """The link joining the cell ``gpus``: its best for ``auto``, else the named link where it can be built;
    one that cannot is a UserError naming why and the buildable choices."""
    if name.strip().lower() == AUTO:
        return best_link(gpus)
    lk = link_named(name)
    why = why_not(lk, gpus)
    if why is not None:
        raise UserError(f"link {lk.name} cannot join {cell_name(gpus)}: {why}; buildable: {choices(gpus)}")
    return lk

"""Which links a cell of GPUs can be built with (tessera.hardware.links). Expected links are read off the
datasheet figures the catalog cites: the L40S, L4 and A100 are PCIe Gen4 cards, the H100 and H20 Gen5; an HGX
board joins 8 SXM GPUs of one type over NVLink, a bridge joins 2 PCIe cards."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.errors import UserError
from tessera.hardware import AUTO, best_link, buildable, catalog, cell_link, gpu
from tessera.hardware.catalog import GpuSpec, LinkSpec


def _cell(*names: str) -> tuple[GpuSpec, ...]:
    return tuple(gpu(n) for n in names)


def _names(*names: str) -> set[str]:
    return {lk.name for lk in buildable(_cell(*names))}


@pytest.mark.parametrize(("cell", "best"), [
    (("H100-SXM", "L40S"), "pcie4"),  # the L40S is a Gen4 card; different types share no NVLink
    (("A100-80GB-SXM", "L40S"), "pcie4"),
    (("H100-SXM", "H20"), "pcie5"),  # both Gen5 and both NVLink 4, but on different HGX boards
    (("H100-SXM", "H100-SXM"), "nvlink4"),
    (("H100-SXM",) * 8, "nvlink4"),  # one HGX board
    (("H100-SXM",) * 9, "pcie5"),  # more than one board holds
    (("H100-PCIe", "H100-PCIe"), "nvlink4"),  # a bridged pair
    (("H100-PCIe",) * 4, "pcie5"),  # a bridge joins two cards only
    (("A40", "A40"), "nvlink3"),
    (("V100",) * 8, "pcie3"),  # NVLink 2 within a DGX-1 quad only; the V100 is a Gen3 card
    (("MI300X", "MI300X"), "pcie5"),  # Infinity Fabric is no catalog link
    (("cpu", "cpu"), "pcie5"),  # the host limits no PCIe generation
])
def test_best_link_is_what_every_card_has(cell: tuple[str, ...], best: str) -> None:
    assert best_link(_cell(*cell)).name == best
    assert cell_link(_cell(*cell), AUTO).name == best


def test_buildable_sets_by_hand() -> None:
    network = {"ib200", "ib400", "eth100"}  # two servers: any cell
    assert _names("H100-SXM", "L40S") == {"pcie3", "pcie4"} | network
    assert _names("H100-SXM", "H100-SXM") == {"nvlink4", "pcie3", "pcie4", "pcie5"} | network
    # no pcie6 in the catalog: the B200's Gen6 reaches Gen5 at most here
    assert _names("B200", "B200") == {"nvlink5", "pcie3", "pcie4", "pcie5"} | network


def test_unbuildable_link_is_refused_naming_the_choices() -> None:
    with pytest.raises(UserError, match=r"^link nvlink4 cannot join H100-SXM \+ L40S: NVLink joins GPUs of "
                                        r"one type only \(H100-SXM, L40S\); buildable: auto \(pcie4\), "):
        cell_link(_cell("H100-SXM", "L40S"), "nvlink4")
    with pytest.raises(UserError, match="link pcie5 cannot join H100-SXM \\+ L40S: L40S is a PCIe Gen4 card"):
        cell_link(_cell("H100-SXM", "L40S"), "pcie5")
    with pytest.raises(UserError, match=r"at most 2 H100-PCIe; buildable: auto \(pcie5\)"):
        cell_link(_cell(*("H100-PCIe",) * 4), "nvlink4")
    with pytest.raises(UserError, match="unknown link 'smoke'; valid: auto, "):
        cell_link(_cell("H100-SXM"), "smoke")
    assert cell_link(_cell("H100-SXM", "L40S"), "PCIe4").name == "pcie4"  # names are case-insensitive
    assert cell_link(_cell("H100-SXM", "L40S"), "eth100").name == "eth100"


def test_catalog_link_and_nvlink_fields_are_validated() -> None:
    with pytest.raises(ValueError, match="kind='wifi'"):
        LinkSpec(name="x", bytes_per_s=1e9, latency_s=1e-6, kind="wifi")
    with pytest.raises(ValueError, match="needs its generation >= 1"):
        LinkSpec(name="x", bytes_per_s=1e9, latency_s=1e-6, kind="pcie")
    h100 = gpu("H100-SXM")
    with pytest.raises(ValueError, match="nvlink_gen=4 needs nvlink_domain_gpus >= 2"):
        GpuSpec(**{**{f: getattr(h100, f) for f in h100.__dataclass_fields__}, "nvlink_domain_gpus": 0})


def test_user_link_without_kind_is_a_network_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a user's link with no kind joins any cell (two servers) and is never the best a cell can have
    f = tmp_path / "mine.toml"
    f.write_text("[link.roce800]\nbytes_per_s = 100e9\nlatency_s = 5e-6\n")
    monkeypatch.setenv(catalog.ENV_VAR, str(f))
    assert "roce800" in {lk.name for lk in buildable(_cell("H100-SXM", "L40S"))}
    assert best_link(_cell("H100-SXM", "L40S")).name == "pcie4"


def test_cli_refuses_an_unbuildable_link_in_one_line() -> None:
    cmd = [sys.executable, "-m", "tessera", "plan", "llama-tiny", "--gpus", "H100,L40S", "--link", "nvlink4"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ})
    assert r.returncode == 2
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, lines
    assert "link nvlink4 cannot join H100-SXM + L40S" in lines[0] and "buildable: auto (pcie4)" in lines[0]

from pathlib import Path

import pytest

from tessera.errors import UserError
from tessera.hardware import catalog
from tessera.hardware.catalog import LinkSpec, load_catalog

REQUIRED = ["H100-SXM", "H100-PCIe", "H200", "H20", "H800", "A100-80GB-SXM", "A100-40GB", "L40S", "L40", "L20",
            "L4", "A10G", "A40", "RTX-4090", "V100", "MI300X", "B200"]


def test_catalog_has_required_gpus_with_sources() -> None:
    cat = load_catalog()
    assert set(REQUIRED) <= set(cat.gpus)
    for name in REQUIRED:
        g = cat.gpus[name]
        assert g.source and g.price_source and g.price_date, name
        assert g.usd_per_hour > 0 and g.sms > 0 and g.l2_bytes > 0 and g.power_w > 0
        assert "fp32" in g.peak_flops_per_s
    assert cat.gpus["cpu"].measured and not cat.gpus["H100-SXM"].measured
    assert {"nvlink4", "pcie4", "pcie5", "ib200", "ib400", "eth100"} <= set(cat.links)


def test_peak_fallbacks() -> None:
    assert catalog.gpu("V100").peak("bfloat16") == 125e12  # no bf16 hardware: fp16 tensor rate
    assert catalog.gpu("H100-SXM").peak("float8_e4m3fn") == 1978.9e12
    assert catalog.gpu("cpu").peak("bfloat16") == catalog.gpu("cpu").peak("float32")


def test_user_file_overrides_price_and_adds_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "mine.toml"
    f.write_text('[gpu.L4]\nusd_per_hour = 0.5\n\n[gpu.MyCard]\nvendor = "nvidia"\n'
                 'peak_flops_per_s = { fp32 = 1e13, bf16 = 1e14 }\nmem_bw_bytes_per_s = 1e12\n'
                 'mem_bytes = 16_000_000_000\nsms = 40\nl2_bytes = 4_000_000\npower_w = 200\n'
                 'nvlink_bytes_per_s = 0\npcie_gen = 4\nusd_per_hour = 0.3\n\n[alias]\nmine = "MyCard"\n')
    cat = load_catalog(f)
    assert cat.gpus["L4"].usd_per_hour == 0.5
    assert cat.gpus["L4"].mem_bw_bytes_per_s == 300e9  # untouched fields keep the shipped value
    assert cat.gpus["MyCard"].peak("bfloat16") == 1e14
    monkeypatch.setenv(catalog.ENV_VAR, str(f))
    assert catalog.gpu("L4").usd_per_hour == 0.5
    assert catalog.resolve_gpu("mine") == "MyCard"
    monkeypatch.delenv(catalog.ENV_VAR)
    assert catalog.gpu("L4").usd_per_hour == 0.71


def test_user_file_errors_name_the_problem(tmp_path: Path) -> None:
    f = tmp_path / "bad.toml"
    f.write_text("[gpu.L4]\nprice = 0.5\n")
    with pytest.raises(UserError, match="unknown key.*price.*valid:.*usd_per_hour"):
        load_catalog(f)
    f.write_text('[gpu.New]\nvendor = "x"\n')
    with pytest.raises(UserError, match="New"):
        load_catalog(f)
    with pytest.raises(UserError, match="cannot read catalog"):
        load_catalog(tmp_path / "missing.toml")


def test_unknown_names_list_choices() -> None:
    with pytest.raises(UserError, match="unknown GPU 'X100'; valid: .*H100-SXM"):
        catalog.gpu("X100")
    with pytest.raises(UserError, match="valid: .*nvlink4"):
        catalog.link("carrier-pigeon")
    assert catalog.resolve_gpu("a100") == "A100-80GB-SXM"
    assert catalog.resolve_gpu("h100-sxm") == "H100-SXM"


def test_link_validation() -> None:
    with pytest.raises(ValueError, match="efficiency=1.5"):
        LinkSpec(name="x", bytes_per_s=1e9, latency_s=1e-6, efficiency=1.5)


def test_every_measured_database_gpu_is_in_the_catalog_with_sources() -> None:
    from tessera.cost.tables import SHIPPED_AIC

    systems = sorted(p.name for p in SHIPPED_AIC.iterdir() if p.is_dir())
    assert len(systems) == 10
    for system in systems:
        g = catalog.gpu(catalog.resolve_gpu(system))
        assert g.source and g.price_source and g.price_date and g.memory_type, system

"""The catalog figures the report prints (price table, dtypes, kernel-cost source) checked against facts known
independently of the catalog: which tensor-core dtypes each GPU generation has, a few datasheet peaks, and
that every price carries a date and a source."""

from __future__ import annotations

import re

import pytest

from tessera.cli import main
from tessera.hardware import catalog

# Tensor-core dtypes by architecture (NVIDIA architecture whitepapers): Volta has fp16 only; Ampere adds
# bf16 and tf32; Ada, Hopper and Blackwell add fp8.
NO_BF16 = {"V100"}
AMPERE = {"A100-40GB", "A100-80GB-SXM", "A10G", "A40"}
FP8 = {"H100-SXM", "H100-PCIe", "H200", "H20", "H800", "L4", "L40", "L40S", "L20", "RTX-4090", "B200", "B300",
       "GB200", "GB300", "RTX-PRO-6000"}
# Dense bf16 (fp16 for V100) TFLOP/s from the vendor datasheets (the sparse figure halved where only it is given)
DATASHEET_TFLOPS = {("V100", "fp16"): 125, ("A100-80GB-SXM", "bf16"): 312, ("H100-SXM", "bf16"): 989.4,
                    ("L40S", "bf16"): 362.05, ("A40", "bf16"): 149.7, ("L4", "bf16"): 121}


def gpus() -> list[catalog.GpuSpec]:
    return [catalog.gpu(n) for n in catalog.gpu_names() if n != "cpu"]


def test_dtype_support_per_generation() -> None:
    names = {g.name for g in gpus()}
    assert NO_BF16 | AMPERE | FP8 <= names, sorted((NO_BF16 | AMPERE | FP8) - names)
    for g in gpus():
        keys = set(g.peak_flops_per_s)
        if g.name in NO_BF16:
            assert not keys & {"bf16", "tf32", "fp8"}, (g.name, keys)
        elif g.name in AMPERE:
            assert {"bf16", "tf32"} <= keys and "fp8" not in keys, (g.name, keys)
        elif g.name in FP8:
            assert {"bf16", "fp8"} <= keys, (g.name, keys)


@pytest.mark.parametrize(("name", "dtype"), sorted(DATASHEET_TFLOPS))
def test_datasheet_peaks(name: str, dtype: str) -> None:
    assert catalog.gpu(name).peak_flops_per_s[dtype] / 1e12 == pytest.approx(DATASHEET_TFLOPS[(name, dtype)], rel=5e-3)


def test_every_price_is_dated_and_sourced() -> None:
    for g in gpus():
        assert g.usd_per_hour > 0, g.name
        assert re.fullmatch(r"20\d\d-(0[1-9]|1[0-2])", g.price_date), (g.name, g.price_date)
        assert len(g.price_source) > 10 and len(g.source) > 10, g.name


def test_gpus_lists_no_bf16_rate_for_v100(capsys) -> None:
    import json

    with pytest.raises(SystemExit) as e:
        main(["gpus", "--json"])
    assert e.value.code == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["V100"]["bf16_tflops"] is None and "bf16" not in rows["V100"]["dtypes"]
    assert rows["H100-SXM"]["bf16_tflops"] == pytest.approx(989.4)

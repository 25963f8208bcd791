"""The labelled corpus: every entry of every module, for sm_80, sm_90 and Triton, classified exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.ptx.analysis import Access, analyze_ptx

CORPUS = Path(__file__).parent / "corpus"
LABELS = {k: v for k, v in json.loads((CORPUS / "labels.json").read_text()).items() if k != "_doc"}
TARGETS = ("sm_80", "sm_90", "triton")


def _results(target: str) -> dict[str, object]:
    out = {}
    for f in sorted((CORPUS / target).glob("*.ptx")):
        out.update(analyze_ptx(f.read_text(), str(f)))
    return out


@pytest.mark.parametrize("target", TARGETS)
def test_corpus_classification_exact(target: str) -> None:
    results = _results(target)
    assert results, f"no PTX under {target}"
    wrong = []
    for name, e in results.items():
        label = LABELS[name]
        want = label.get(target, label["params"])
        got = [str(p.access) for p in e.params]  # type: ignore[attr-defined]
        if got != want or e.indirect != label.get("indirect", False):  # type: ignore[attr-defined]
            wrong.append((name, got, want))
        for g, acc in label.get("globals", {}).items():
            assert str(e.globals.get(g)) == acc, (name, g)  # type: ignore[attr-defined]
    assert not wrong


@pytest.mark.parametrize("target", TARGETS)
def test_corpus_no_missed_access(target: str) -> None:
    """The report covers the true access of every parameter: a missed write is the one unacceptable error."""
    for name, e in _results(target).items():
        label = LABELS[name]
        truth = label.get("truth", label.get(target, label["params"]))
        for p, t in zip(e.params, truth, strict=True):  # type: ignore[attr-defined]
            assert not (Access(t).writes and not p.access.writes), (name, p.name)
            assert not (Access(t).reads and not p.access.reads), (name, p.name)


def test_corpus_size_and_coverage() -> None:
    cuda = _results("sm_80")
    assert len(cuda) >= 30
    assert len(_results("sm_90")) == len(cuda)
    classes = {str(p.access) for e in cuda.values() for p in e.params}  # type: ignore[attr-defined]
    assert classes == {a.value for a in Access}
    assert sum(e.indirect for e in cuda.values()) == 3  # type: ignore[attr-defined]
    assert set(LABELS) == set(cuda) | set(_results("triton"))


def test_indirect_reasons_name_the_line() -> None:
    e = _results("sm_90")["ptr_array_gather"]
    assert e.indirect and e.reasons[0].startswith("line ")  # type: ignore[attr-defined]
    assert "loaded from memory" in e.reasons[0]  # type: ignore[attr-defined]

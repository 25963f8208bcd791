"""Where a file's figures come from: every JSON file Tessera writes carries a ``provenance`` object naming the
model, the plan the figures belong to (a fingerprint of that plan's content), the traffic, the SLO, the
offered rate and the seed, so that a reader (``tessera report``) can refuse a file that does not belong
beside another instead of presenting it as if it did."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol

from tessera import __version__

FINGERPRINT_HEX = 16  # 64 bits of sha256: two different plans sharing one is not a practical concern


class Serializable(Protocol):
    """A plan or pool plan as far as its fingerprint goes: its one serializer."""

    def to_dict(self) -> dict[str, Any]: ...


def fingerprint(plan: Serializable) -> str:
    """The plan's identity: sha256 of its canonical JSON (keys sorted), first 16 hex digits. A plan and the
    file it was saved to and read back from have the same one; a pool plan's is its cells' (count, plan)
    list, whatever else the file holds beside them (a fleet plan's summary)."""
    text = json.dumps(plan.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:FINGERPRINT_HEX]


@dataclass(frozen=True, kw_only=True)
class Provenance:
    """What a file's figures were made from. ``plan`` is the fingerprint of the plan (or pool plan) they
    belong to, None where the file holds no single plan's figures (a compare matrix's header, an advice
    that found nothing). Traffic as given: ``prompt``/``output`` tokens per request ("1024", "4-16", a
    trace name), ``output_per_request`` its mean (what a rate in requests/s is multiplied by for output
    tokens/s; an image plan's: 1 image). SLO targets in seconds, ``slo_target`` the share of requests that
    must meet them. ``workload`` offline | poisson | bursty with ``rate_per_s`` offered requests/s (None:
    offline, or a planner's file, which simulates nothing) and the simulation's ``seed``."""

    model: str
    plan: str | None = None
    prompt: str | None = None
    output: str | None = None
    output_per_request: float | None = None
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    slo_e2e_s: float | None = None
    slo_target: float | None = None
    workload: str | None = None
    rate_per_s: float | None = None
    seed: int | None = None
    tessera: str = __version__  # the version that wrote the file

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"provenance model={self.model!r} must be a model name")
        if self.plan is not None and (len(self.plan) != FINGERPRINT_HEX or
                                      any(c not in "0123456789abcdef" for c in self.plan)):
            raise ValueError(f"provenance plan={self.plan!r} must be a {FINGERPRINT_HEX}-digit hex fingerprint")
        for k in ("output_per_request", "slo_ttft_s", "slo_tpot_s", "slo_e2e_s", "slo_target", "rate_per_s"):
            v = getattr(self, k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v) or v < 0):
                raise ValueError(f"provenance {k}={v!r} must be a number >= 0")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"provenance seed={self.seed!r} must be an integer")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> Provenance:
        """The object ``to_dict`` wrote; unknown keys (a newer writer's) are ignored."""
        if not isinstance(d, dict):
            raise ValueError(f"provenance must be a JSON object, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def traffic_text(self) -> str:
        """'prompt 1024, output 256 tokens' as the file records it."""
        if self.prompt is None and self.output is None:
            return "traffic not recorded"
        return f"prompt {self.prompt}, output {self.output} tokens"


def of_file(d: Any, where: str) -> Provenance | None:
    """The ``provenance`` object of a JSON file Tessera wrote (None for a file written before it had one);
    a malformed one is a ValueError naming ``where``."""
    if not isinstance(d, dict) or d.get("provenance") is None:
        return None
    try:
        return Provenance.from_dict(d["provenance"])
    except (ValueError, TypeError) as e:
        raise ValueError(f"{where}: {e}") from None


__all__ = ["FINGERPRINT_HEX", "Provenance", "Serializable", "fingerprint", "of_file"]

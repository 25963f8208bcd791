"""The pool file: how many GPUs of each catalog type a fleet has, and the link inside one cell.

```toml
link = "pcie5"          # between the GPUs of one cell (catalog link name)
[[gpu]]
type = "H100-SXM"       # catalog name or alias (H100, A100)
count = 4
```
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from tessera.errors import UserError
from tessera.plan.pool import resolve_gpu, resolve_link


@dataclass(frozen=True, kw_only=True)
class FleetSpec:
    """GPU type (catalog name) -> count, in file order; ``link`` joins the GPUs of one cell."""

    gpus: tuple[tuple[str, int], ...]
    link: str = "pcie5"

    def __post_init__(self) -> None:
        if not self.gpus:
            raise UserError("the pool has no GPUs; add [[gpu]] tables with type and count")
        names = []
        for name, count in self.gpus:
            canon = resolve_gpu(name).name  # unknown type: one line listing the valid names
            if canon != name:
                raise UserError(f"pool GPU {name!r} is not a catalog name; use {canon!r}")
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise UserError(f"pool GPU {name}: count={count!r} must be an integer >= 1")
            names.append(name)
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise UserError(f"pool lists {', '.join(dup)} more than once; give one [[gpu]] table per type")
        resolve_link(self.link)

    @classmethod
    def from_counts(cls, counts: dict[str, int], link: str = "pcie5") -> FleetSpec:
        """Aliases resolved: {"H100": 4, "L4": 2}."""
        merged: dict[str, int] = {}
        for name, n in counts.items():
            canon = resolve_gpu(name).name
            merged[canon] = merged.get(canon, 0) + n
        return cls(gpus=tuple(merged.items()), link=link)

    @classmethod
    def parse(cls, text: str, where: str = "pool file") -> FleetSpec:
        try:
            d = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise UserError(f"{where} is not TOML: {e}") from None
        unknown = sorted(set(d) - {"link", "gpu"})
        if unknown:
            raise UserError(f"{where}: unknown key(s) {', '.join(unknown)}; valid: gpu, link")
        rows = d.get("gpu")
        if not isinstance(rows, list) or not rows:
            raise UserError(f"{where} needs [[gpu]] tables with type and count")
        counts: dict[str, int] = {}
        for i, r in enumerate(rows):
            if not isinstance(r, dict) or set(r) != {"type", "count"}:
                raise UserError(f"{where}: [[gpu]] #{i + 1} must have exactly the keys type and count, got "
                                f"{sorted(r) if isinstance(r, dict) else r!r}")
            if isinstance(r["count"], bool) or not isinstance(r["count"], int) or r["count"] < 1:
                raise UserError(f"{where}: [[gpu]] #{i + 1} ({r['type']}): count={r['count']!r} must be an "
                                f"integer >= 1")
            canon = resolve_gpu(str(r["type"])).name
            if canon in counts:
                raise UserError(f"{where}: {canon} is listed twice; give one [[gpu]] table per type")
            counts[canon] = r["count"]
        link = d.get("link", "pcie5")
        if not isinstance(link, str):
            raise UserError(f"{where}: link must be a string (catalog link name), got {link!r}")
        return cls(gpus=tuple(counts.items()), link=resolve_link(link).name)

    @classmethod
    def load(cls, path: str | Path) -> FleetSpec:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise UserError(f"cannot read pool file {path}: {e.strerror or e}") from None
        return cls.parse(text, f"pool file {path}")

    def to_toml(self) -> str:
        body = "".join(f'\n[[gpu]]\ntype = "{n}"\ncount = {c}\n' for n, c in self.gpus)
        return f'link = "{self.link}"\n{body}'

    @property
    def counts(self) -> dict[str, int]:
        return dict(self.gpus)

    @property
    def total(self) -> int:
        return sum(c for _, c in self.gpus)

    def without(self, gpu_type: str, n: int = 1) -> FleetSpec:
        """The pool after losing ``n`` GPUs of ``gpu_type`` (types that reach zero disappear)."""
        canon = resolve_gpu(gpu_type).name
        have = self.counts.get(canon, 0)
        if have < n:
            raise UserError(f"the pool has {have} {canon}, cannot lose {n}; types: "
                            f"{', '.join(f'{c}x{t}' for t, c in self.gpus)}")
        rest = tuple((t, c - n if t == canon else c) for t, c in self.gpus)
        return FleetSpec(gpus=tuple((t, c) for t, c in rest if c > 0), link=self.link)

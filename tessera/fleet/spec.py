"""The pool file: how many GPUs of each catalog type a fleet has, and the link inside one cell.

```toml
link = "auto"           # between the GPUs of one cell: auto (each cell's best) or a catalog link
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
from tessera.hardware import AUTO, buildable, check_link_name, link_named, why_not
from tessera.plan import resolve_gpu


@dataclass(frozen=True, kw_only=True)
class FleetSpec:
    """GPU type (catalog name) -> count, in file order; ``link`` joins the GPUs of one cell: ``auto`` gives
    each cell its best link, a catalog link name joins every cell and so must be one every pair of the pool
    can have (tessera.hardware.links)."""

    gpus: tuple[tuple[str, int], ...]
    link: str = AUTO

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
        check_link_name(self.link)
        if self.link != AUTO:
            self._check_link()

    def _check_link(self) -> None:
        """The named link joins every cell, so every pair the pool can form must be able to have it."""
        lk = link_named(self.link)
        pairs = [tuple(resolve_gpu(g) for g in p) for p in self.pairs()]
        for pair in pairs:
            why = why_not(lk, pair)
            if why is not None:
                common = [x.name for x in buildable(pair) if all(why_not(x, p) is None for p in pairs)]
                every = ", ".join([f"{AUTO} (each cell its best)", *common])
                raise UserError(f"link {lk.name} cannot join {' + '.join(g.name for g in pair)}: {why}; "
                                f"every pair of this pool can have: {every}")

    def pairs(self) -> list[tuple[str, str]]:
        """Every pair of GPUs a cell of this pool can hold: two types, or one type with at least two GPUs."""
        names = [n for n, _ in self.gpus]
        return [(a, b) for i, a in enumerate(names) for b in names[i:] if a != b or self.counts[a] >= 2]

    @classmethod
    def from_counts(cls, counts: dict[str, int], link: str = AUTO) -> FleetSpec:
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
        link = d.get("link", AUTO)
        if not isinstance(link, str):
            raise UserError(f"{where}: link must be a string (auto or a catalog link name), got {link!r}")
        try:
            name = AUTO if link.strip().lower() == AUTO else link_named(link).name
            return cls(gpus=tuple(counts.items()), link=name)
        except UserError as e:
            raise UserError(f"{where}: {e}") from None

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

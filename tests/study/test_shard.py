"""`tessera evaluate --shard K/N`: N processes resume one matrix side by side."""

from __future__ import annotations

import pytest

from tessera.errors import UserError
from tessera.study.evaluate import Shard, matrix, run_evaluate


def test_shards_partition_the_cells() -> None:
    cells = matrix(quick=True)  # 8 cells: shards 1/3, 2/3, 3/3 take 3, 3 and 2 of them, each once
    parts = [cells[Shard.parse(f"{k}/3").index::3] for k in (1, 2, 3)]
    assert [len(p) for p in parts] == [3, 3, 2]
    assert sorted(map(str, sum(parts, []))) == sorted(map(str, cells))


@pytest.mark.parametrize("text", ["0/2", "3/2", "1", "a/b", "1/0"])
def test_bad_shards_are_refused(text: str) -> None:
    with pytest.raises(UserError):
        Shard.parse(text)


def test_fresh_is_refused_with_shards(tmp_path) -> None:
    with pytest.raises(UserError, match="--fresh with --shard"):
        run_evaluate(out_dir=tmp_path, quick=True, fresh=True, shard=Shard(index=0, count=2))
    assert not list(tmp_path.iterdir())  # nothing written, nothing deleted

"""`tessera ptx analyze` reads its module through the stage: the same analysis as of the text, and a file
that cannot be read is one UserError naming it."""

from pathlib import Path

import pytest

from tessera.errors import UserError
from tessera.ptx.analysis import analyze_ptx, analyze_ptx_file

PTX = Path(__file__).parent / "corpus" / "sm_80" / "elementwise.ptx"


def test_the_file_analyses_as_its_text() -> None:
    assert analyze_ptx_file(PTX) == analyze_ptx(PTX.read_text(), str(PTX))


def test_a_missing_file_is_one_user_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=f"cannot read PTX module {tmp_path / 'none.ptx'}"):
        analyze_ptx_file(tmp_path / "none.ptx")

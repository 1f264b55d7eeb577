"""`planner demo --store PATH`: a new file in a writable folder, checked before anything starts."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest

from app.config import ConfigError
from app.sim.demo.plan import check_new_store


class StoreCase(NamedTuple):
    name: str
    path: str  # under the test's folder
    message: str | None
    why: str


STORE_CASES = [
    StoreCase("new_file", "demo.db", None, "the demo creates it"),
    StoreCase(
        "exists", "old.db", "exists; the demo writes a new database", "two runs' ticks would interleave"
    ),
    StoreCase("no_folder", "missing/demo.db", "the folder", "SQLite would fail later, after the start-up"),
]


@pytest.mark.parametrize("case", STORE_CASES, ids=lambda c: c.name)
def test_the_demo_store_is_a_new_file(tmp_path: Path, case: StoreCase) -> None:
    (tmp_path / "old.db").write_bytes(b"")
    path = tmp_path / case.path
    if case.message is None:
        check_new_store(path)
        assert not path.exists()  # checked, not created
        return
    with pytest.raises(ConfigError, match=case.message):
        check_new_store(path)

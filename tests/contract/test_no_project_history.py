"""The product speaks of the product: no file of the code, tests, benchmarks, docs or README
refers to the rounds of work that made it ("session N", "issue N", "turn N"). A reader cannot
know what they were; what changed when belongs in CHANGELOG.md and the commit messages. A
project's own numbered issue is written `issue N`; an outside tracker's keeps its own form
(`Dynamo issue #4420`) and is not matched."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCOPE = ("app", "tests", "bench", "docs", "README.md")
# "session N", "Issue N", "turns N" with N a number, also broken over a line.
HISTORY = re.compile(r"\b(session|issue|turn)s?\s+\d+", re.IGNORECASE)


def _files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", *SCOPE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [ROOT / name for name in listed if (ROOT / name).is_file()]


def _mentions(text: str) -> list[str]:
    return [text[max(0, m.start() - 40) : m.end()].replace("\n", " ") for m in HISTORY.finditer(text)]


def test_the_pattern_finds_what_it_is_for_and_nothing_else() -> None:
    n = 17  # written apart, so that this file does not match itself
    cases = [  # (text, found, why)
        (f"measured in session {n} of the work", True, "a round of work by number"),
        (f"(issue {n}, 2026-12-01)", True, "the project's own issue"),
        (f"until session\n   {n} it read", True, "broken over a line"),
        ("return 0", False, "`turn` inside a word is not a turn"),
        ("Dynamo issue #4420 has the same", False, "an outside tracker's reference"),
        ("the session's cookie", False, "the word alone"),
    ]
    for text, found, why in cases:
        assert bool(_mentions(text)) is found, why


def test_no_file_in_scope_refers_to_the_projects_own_history() -> None:
    found = []
    for path in _files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary data
        found += [f"{path.relative_to(ROOT)}: ...{m}" for m in _mentions(text)]
    assert not found, "\n".join(found)

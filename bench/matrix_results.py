"""The decision-quality matrix's saved results: where `python -m bench.replay_quality` writes them
by default, and how the scripts that print from a saved matrix (bench/miss_causes.py,
bench/fixed_frontier.py) read them back. Its own module, below all three, so that none of them
imports another only for this."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RESULTS = ROOT / "bench" / "results" / "replay_quality.json"


def saved_rows(argv: Sequence[str]) -> tuple[Path, list[dict] | None, int]:
    """A saved matrix's rows (the path in `argv`, else DEFAULT_RESULTS), or None with the exit
    status to end on: 0 when there is none yet, 2 when the file is not one (both said in one
    line)."""
    path = Path(argv[0]) if argv else DEFAULT_RESULTS
    if not path.exists():
        print(f"no matrix results at {path}: run python -m bench.replay_quality first")
        return path, None, 0
    try:
        return path, json.loads(path.read_text())["rows"], 0
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"{path}: not a bench/replay_quality.py result ({exc})", file=sys.stderr)
        return path, None, 2

"""The README's replay example runs and prints the figures the README shows (its wall times aside:
they are the machine's)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The summary line up to its wall times: "planner: N requests, ... scaling actions"
SUMMARY = re.compile(r"^(planner: \d+ requests, SLO attainment .*? scaling actions);", re.M)


def _example() -> tuple[list[str], str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Replay: judge a policy on a real trace", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    command = re.search(r"^(\.venv/bin/planner replay .*?)(?:\n#|\Z)", block, re.S | re.M).group(1)
    documented = re.search(r"^# (planner: .*)$", block, re.M).group(1)
    return shlex.split(command.replace("\\\n", " ")), documented


@pytest.mark.timeout(600)
def test_the_readme_replay_example_prints_the_documented_figures(tmp_path: Path) -> None:
    argv, documented = _example()
    assert argv[:2] == [".venv/bin/planner", "replay"], argv
    out = argv.index("--out")
    argv[out + 1] = str(tmp_path / "replay")
    run = subprocess.run(
        [sys.executable, "-m", "app.cli", *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr
    printed = SUMMARY.search(run.stdout + run.stderr)
    expected = SUMMARY.search(documented)
    assert printed is not None, run.stdout + run.stderr
    assert expected is not None, documented
    assert printed.group(1) == expected.group(1)

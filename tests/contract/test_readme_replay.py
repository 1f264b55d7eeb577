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


# --- the replay of a deployment's own traffic ------------------------------------------------------

FROM_STORE_SECTION = "### Replay a deployment's own traffic"


def _from_store_example() -> tuple[list[list[str]], list[str]]:
    """The section's commands (each `.venv/bin/planner ...` line) and its documented output lines."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split(FROM_STORE_SECTION, 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    commands = [shlex.split(line) for line in block.splitlines() if line.startswith(".venv/bin/planner ")]
    documented = [line[2:] for line in block.splitlines() if line.startswith("# ")]
    return commands, documented


def _shape(line: str) -> re.Pattern[str]:
    """A documented line as a pattern: its words kept, its figures any figures (the demo runs on the
    wall clock, so they differ from run to run), an elided `...` anything."""
    parts = re.split(r"(\d+(?:\.\d+)?%?|\.\.\.)", line)
    pattern = "".join(
        r".+" if p == "..." else r"\d+(?:\.\d+)?%?" if re.fullmatch(r"\d+(?:\.\d+)?%?", p) else re.escape(p)
        for p in parts
    )
    return re.compile(f"^{pattern}$", re.M)


@pytest.mark.timeout(900)
def test_the_readme_from_store_example_runs_and_prints_the_documented_lines(tmp_path: Path) -> None:
    from tests.support import free_port

    commands, documented = _from_store_example()
    assert [c[:2] for c in commands] == [[".venv/bin/planner", "demo"], [".venv/bin/planner", "replay"]]
    demo, replay = commands
    store = Path(demo[demo.index("--store") + 1])
    assert replay[replay.index("--from-store") + 1] == f"sqlite:///{store}", (
        "the replay reads the demo's store"
    )
    local = tmp_path / store.name
    demo[demo.index("--store") + 1] = str(local)
    replay[replay.index("--from-store") + 1] = f"sqlite:///{local}"
    replay[replay.index("--out") + 1] = str(tmp_path / "out")
    # The README's port may be taken on a shared machine; everything else is as documented.
    demo += ["--port", str(free_port())]
    for argv in (demo, replay):
        run = subprocess.run(
            [sys.executable, "-m", "app.cli", *argv[1:]],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert run.returncode == 0, run.stderr[-3000:]
    assert len(documented) == 6
    for line in documented:
        assert _shape(line).search(run.stdout), (line, run.stdout)

"""docs/embedding.md's example runs and prints what the page says it prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_embedding_example_prints_the_documented_output() -> None:
    page = (ROOT / "docs" / "embedding.md").read_text()
    code = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    documented = re.search(r"```text\n(.*?)```", page, re.S).group(1)
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout == documented

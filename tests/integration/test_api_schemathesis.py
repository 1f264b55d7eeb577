"""Property-based API testing: schemathesis generates requests for every operation of the
committed openapi/openapi.json, valid and invalid, and sends them over real HTTP to a
`planner serve` process. Every response must be documented: no 5xx, a status code the operation
lists, the content type and headers it lists, a body that matches its schema; invalid requests
are refused, auth is enforced, a 405 lists the allowed methods.

Bounded and repeatable: a fixed seed, a fixed number of examples per operation and no shrinking,
so a run sends the same requests every time and takes well under a minute. Held long-polls wait
0.2 s at most (schemathesis_hooks.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import REPO_ROOT, TOKENS, planner_starter

OPENAPI_JSON = REPO_ROOT / "openapi" / "openapi.json"
SEED = 17
MAX_EXAMPLES = 15  # per operation in the fuzzing phase; the coverage phase adds its boundary cases
# Every check but positive_data_acceptance, which expects a 2xx for any request the schema allows:
# some rules span fields and live in the routes (exactly one of profile or deployment, until after
# since, a pin names every role of the deployment), and answer 422 naming the field, as they should.
EXCLUDED_CHECKS = ["positive_data_acceptance"]


def test_every_response_is_documented(db_url: str, tmp_path: Path) -> None:
    operator = next(e.split(":", 1)[1] for e in TOKENS.split(",") if e.startswith("operator:"))
    with planner_starter(db_url, tmp_path) as start:
        proc = start()
        env = {
            **os.environ,
            "SCHEMATHESIS_HOOKS": "tests.integration.schemathesis_hooks",
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "schemathesis.cli",
                "run",
                str(OPENAPI_JSON),
                "--url",
                proc.base_url,
                # The operator, the highest role, reaches every operation; 401 and 403 have their
                # own tests (tests/api/test_auth.py).
                "--header",
                f"Authorization: Bearer {operator}",
                "--checks",
                "all",
                "--exclude-checks",
                ",".join(EXCLUDED_CHECKS),
                "--phases",
                "examples,coverage,fuzzing",
                "--mode",
                "all",
                "--max-examples",
                str(MAX_EXAMPLES),
                "--seed",
                str(SEED),
                "--no-shrink",
                "--workers",
                "1",
                "--request-timeout",
                "30",
                "--report-dir",
                str(tmp_path / "report"),
            ],
            cwd=tmp_path,  # keeps the run's cache and reports out of the checkout
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    log = Path(proc.log_path or "").read_text(errors="replace")
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n--- planner log ---\n{log[-4000:]}"

"""The committed openapi/openapi.json is the app's schema, with stable operation ids."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
OPENAPI_JSON = REPO_ROOT / "openapi" / "openapi.json"

EXPECTED_OPERATION_IDS = {
    "healthz",
    "readyz",
    "metrics",
    "list_deployments",
    "get_deployment",
    "get_shadow_report",
    "get_settings",
    "change_settings",
    "list_decisions",
    "wait_for_decision",
    "get_decision",
    "complete_decision",
    "report_progress",
    "list_diagnostics",
    "diagnostics_report",
    "diagnostics_cost",
    "create_override",
    "list_overrides",
    "delete_override",
    "list_audit",
    "plan",
    "get_fleet",
}


def openapi_cli(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLANNER_")}
    env.update(
        {
            "PLANNER_DATABASE_URL": f"sqlite:///{tmp_path / 'unused.db'}",
            "PLANNER_CONFIG": str(REPO_ROOT / "examples" / "planner.yaml"),
            "PLANNER_HOST": "127.0.0.1",
            "PLANNER_PORT": "8080",
            "PLANNER_API_TOKENS": "",
            "PLANNER_LOG_LEVEL": "INFO",
        }
    )
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "openapi", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_committed_schema_matches_the_app(tmp_path: Path) -> None:
    result = openapi_cli("--check", tmp_path=tmp_path)
    assert result.returncode == 0, f"run `planner openapi` and commit openapi/openapi.json:\n{result.stderr}"
    assert result.stdout == f"{OPENAPI_JSON} matches the app\n"


def test_check_fails_on_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "openapi.json"
    stale.write_text(OPENAPI_JSON.read_text().replace('"healthz"', '"healthz_old"'))
    before = stale.read_text()
    result = openapi_cli("--check", "--output", str(stale), tmp_path=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"planner: error: {stale} is out of date with the app; run `planner openapi` and commit it"
    )
    assert stale.read_text() == before, "--check must not rewrite the file"


def test_check_fails_on_a_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "absent.json"
    result = openapi_cli("--check", "--output", str(missing), tmp_path=tmp_path)
    assert result.returncode == 1
    assert "out of date" in result.stderr
    assert not missing.exists()


def test_write_then_check(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "openapi.json"
    written = openapi_cli("--output", str(out), tmp_path=tmp_path)
    assert written.returncode == 0, written.stderr
    assert out.read_text() == OPENAPI_JSON.read_text()
    assert openapi_cli("--check", "--output", str(out), tmp_path=tmp_path).returncode == 0


def test_operation_ids() -> None:
    document = json.loads(OPENAPI_JSON.read_text())
    ids = [op["operationId"] for path in document["paths"].values() for op in path.values()]
    assert sorted(ids) == sorted(EXPECTED_OPERATION_IDS), "operation ids are part of the contract"


# Readiness is a report, not an error document: its 503 carries the same body as its 200.
_NOT_PROBLEMS = {("/readyz", "get", "503")}


def test_every_error_is_documented_as_a_problem_document() -> None:
    document = json.loads(OPENAPI_JSON.read_text())
    wrong = []
    for path, operations in document["paths"].items():
        for method, op in operations.items():
            for status, response in op["responses"].items():
                if int(status) < 400 or (path, method, status) in _NOT_PROBLEMS:
                    continue
                content = response.get("content", {})
                if list(content) != ["application/problem+json"] or content["application/problem+json"][
                    "schema"
                ] != {"$ref": "#/components/schemas/Problem"}:
                    wrong.append(f"{method.upper()} {path} {status}: {sorted(content)}")
    assert wrong == []


def test_the_statuses_the_server_can_send_are_documented() -> None:
    document = json.loads(OPENAPI_JSON.read_text())
    for path, operations in document["paths"].items():
        for method, op in operations.items():
            statuses = set(op["responses"])
            if "requestBody" in op:
                # An unparseable body, one over PLANNER_MAX_BODY_BYTES.
                assert {"400", "413", "422"} <= statuses, (method, path)
            if op.get("security"):
                assert {"401", "403"} <= statuses, (method, path)
    wait = document["paths"]["/decisions/wait"]["get"]["responses"]
    assert {"204", "429", "503"} <= set(wait)
    assert "Retry-After" in wait["429"]["headers"] and "Retry-After" in wait["503"]["headers"]


def test_diagnostics_times_may_be_unix_times() -> None:
    document = json.loads(OPENAPI_JSON.read_text())
    for path in ("/diagnostics", "/diagnostics/report"):
        for param in document["paths"][path]["get"]["parameters"]:
            if param["name"] in ("since", "until"):
                assert {"type": "number"} in param["schema"]["anyOf"], (path, param)
                assert "Unix time" in param["description"], (path, param)

"""The shipped example orchestrator works against a real planner process, as the README says."""

from __future__ import annotations

import subprocess
import sys

import httpx

from tests.support import REPO_ROOT, PlannerProcess, demo_config, write_config


def _run_orchestrator(planner: PlannerProcess, command: str, after: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "examples" / "orchestrator.py"),
            "--url",
            planner.base_url,
            "--deployment",
            "demo",
            "--after",
            str(after),
            "--command",
            command,
            "--once",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_example_orchestrator_applies_and_acknowledges(db_url, tmp_path):
    config = write_config(tmp_path / "planner.yaml", demo_config())
    planner = PlannerProcess(db_url, config, log_path=tmp_path / "planner.log").start()
    try:
        with httpx.Client(base_url=planner.base_url, timeout=10) as client:
            pin = {
                "deployment": "demo",
                "action": "pin",
                "num_prefill": 3,
                "num_decode": 5,
                "reason": "readme",
            }
            assert client.post("/override", json=pin).status_code == 201

            done = _run_orchestrator(planner, "test {prefill} -eq 3", after=0)
            assert done.returncode == 0, done.stderr
            assert done.stdout.startswith("decision 1: succeeded")
            first = client.get("/decisions/1").json()
            assert (first["status"], first["observed"]) == ("succeeded", {"prefill": 3, "decode": 5})

            assert client.post("/override", json={**pin, "num_prefill": 4}).status_code == 201
            done = _run_orchestrator(planner, "test {prefill} -eq 3", after=1)
            assert done.returncode == 0, done.stderr
            second = client.get("/decisions/2").json()
            assert (second["status"], second["observed"]) == ("failed", None)
    finally:
        planner.stop()

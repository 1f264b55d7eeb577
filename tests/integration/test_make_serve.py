"""What `make serve` shows: `planner serve` on examples/serve.yaml decides by SLA scaling on the
traffic of the stand-in frontend started beside it, over real HTTP (both as real processes)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import yaml

from tests.support import REPO_ROOT, PlannerProcess, expect, free_port, poll, start_or_fail, write_config

SERVE_YAML = REPO_ROOT / "examples" / "serve.yaml"


def test_the_makefile_points_the_service_at_the_stand_in_it_starts() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text()
    recipe = makefile[makefile.index("\nserve:") :].split("\n\n")[0]
    port = re.search(r"app\.sim\.demo\.standin --port (\d+)", recipe)
    assert port is not None, recipe
    assert "SERVE_CONFIG ?= examples/serve.yaml" in makefile
    frontend = yaml.safe_load(SERVE_YAML.read_text())["deployments"][0]["sources"]["frontend_url"]
    assert frontend == f"http://127.0.0.1:{port.group(1)}"


def test_serve_decides_by_sla_scaling_on_the_stand_in_traffic(tmp_path: Path) -> None:
    port = free_port()
    standin = subprocess.Popen(
        [sys.executable, "-m", "app.sim.demo.standin", "--port", str(port)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    raw = yaml.safe_load(SERVE_YAML.read_text())
    deployment = raw["deployments"][0]
    deployment["sources"]["frontend_url"] = f"http://127.0.0.1:{port}"
    deployment["profile"] = str((SERVE_YAML.parent / deployment["profile"]).resolve())
    proc = PlannerProcess(
        f"sqlite:///{tmp_path / 'planner.db'}",
        write_config(tmp_path / "serve.yaml", raw),
        log_path=tmp_path / "planner.log",
    )
    try:
        # The stand-in says what it serves before it serves: its first line is the readiness signal.
        assert standin.stdout is not None
        assert "stand-in frontend" in standin.stdout.readline().decode()
        start_or_fail(proc)
        client = httpx.Client(base_url=proc.base_url, timeout=10)

        def records() -> list[dict]:
            ticks = expect(client.get("/diagnostics", params={"deployment": "demo", "limit": 50}), 200, proc)
            return [t["record"] for t in ticks["items"] if t["record"]["traffic"]["observed"]]

        def sized_for_traffic() -> bool:
            return any(r["sla"] and (r["sla"].get("demand") or {}).get("request_rate_s") for r in records())

        poll(sized_for_traffic, "an SLA tick sized for the stand-in's requests", proc, steps=2400)
        decisions = expect(client.get("/decisions", params={"deployment": "demo"}), 200, proc)["items"]
        assert decisions and all(d["source"] == "sla" for d in decisions)
        observed = [r["traffic"]["observed"] for r in records()]
        # No engines behind the stand-in: latencies are unknown, never read as 0.
        assert all(o["ttft_ms"] is None and o["itl_ms"] is None for o in observed)
    finally:
        proc.stop()
        standin.terminate()
        standin.wait(timeout=10)

"""Settings changed live over real HTTP: `planner serve` runs the change from its next tick, and
a restarted process on the same database runs it too (the file is the default, the store the
override)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.support import (
    OPER,
    TOKENS,
    VIEWER,
    PlannerProcess,
    demo_config,
    expect,
    poll,
    start_or_fail,
    write_config,
)


def ticks(client: httpx.Client) -> list[dict[str, Any]]:
    return client.get("/diagnostics", headers=VIEWER, params={"deployment": "demo"}).json()["items"]


def ticked_under(client: httpx.Client, revision: int, max_prefill: int) -> bool:
    """Whether a tick ran under this revision of the settings, with its prefill maximum."""
    return any(
        t["record"]["settings_revision"] == revision
        and t["record"]["bounds"]["prefill"]["max"] == max_prefill
        for t in ticks(client)
    )


def test_a_change_runs_at_the_next_tick_and_after_a_restart(db_url: str, tmp_path: Path) -> None:
    # A tick a second (throughput scaling with no traffic source: it holds, and records its bounds).
    config = write_config(tmp_path / "planner.yaml", demo_config(throughput={"interval_s": 1}))

    def start(n: int) -> PlannerProcess:
        return start_or_fail(
            PlannerProcess(db_url, config, tokens=TOKENS, log_path=tmp_path / f"planner-{n}.log")
        )

    first = start(0)
    try:
        with httpx.Client(base_url=first.base_url, timeout=30) as client:
            poll(lambda: ticked_under(client, 0, 8), "a tick under the file's settings", first)
            r = client.patch(
                "/deployments/demo/settings",
                headers={**VIEWER, "If-Match": '"0"'},
                json={"prefill": {"max_replicas": 3}},
            )
            assert r.status_code == 403, r.text
            r = client.patch(
                "/deployments/demo/settings",
                headers={**OPER, "If-Match": '"0"'},
                json={"prefill": {"max_replicas": 3}},
            )
            changed = expect(r, 200, first)
            assert (r.headers["etag"], changed["settings"]["prefill"]["max_replicas"]) == ('"1"', 3)
            poll(lambda: ticked_under(client, 1, 3), "a tick under revision 1", first)
    finally:
        first.stop()

    second = start(1)
    try:
        with httpx.Client(base_url=second.base_url, timeout=30) as client:
            stored = expect(client.get("/deployments/demo/settings", headers=VIEWER), 200, second)
            assert (stored["revision"], stored["sources"]["prefill.max_replicas"]) == (1, "store")
            assert stored["settings"]["prefill"]["max_replicas"] == 3
            before = ticks(client)[-1]["id"]
            poll(lambda: ticks(client)[-1]["id"] > before, "a tick of the restarted process", second)
            newest = ticks(client)[-1]["record"]
            assert (newest["settings_revision"], newest["bounds"]["prefill"]["max"]) == (1, 3)
    finally:
        second.stop()

"""The virtual connector's other side in the demo, over HTTP: long-poll `GET /decisions/wait`,
order the engines (`ClusterControl`: the simulator thread of app/sim/demo/realtime.py), report
what runs as it changes (`POST /decisions/{id}/progress`), and once the engines are up,
`POST /decisions/{id}/complete`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from app.sim.world.cluster import ROLES

log = logging.getLogger(__name__)


class ClusterControl(Protocol):
    """What the orchestrator needs of the simulated cluster, from another thread."""

    def order(self, targets: Mapping[str, int]) -> int:
        """Ask for `targets` engines; the order's number."""
        ...

    def ready_counts(self) -> tuple[int, dict[str, int]]:
        """(number of the last order applied, ready engines per role)."""
        ...


@dataclass
class AppliedDecision:
    id: int
    targets: dict[str, int]
    applied_at_s: float  # simulated
    order: int = 0  # the cluster order that carries it
    status: str = "applying"  # applying → succeeded | superseded (409) | replaced (a newer one came)
    acked_at_s: float | None = None


@dataclass
class OrchestratorState:
    applied: list[AppliedDecision] = field(default_factory=list)
    acks: int = 0
    last_acked: AppliedDecision | None = None
    errors: int = 0
    # The engines last reported ready (progress or acknowledgement), and every report: (simulated
    # seconds, ready engines per role).
    reported: dict[str, int] = field(default_factory=dict)
    ready_log: list[tuple[float, dict[str, int]]] = field(default_factory=list)

    @property
    def latest(self) -> AppliedDecision | None:
        return self.applied[-1] if self.applied else None

    @property
    def in_flight(self) -> AppliedDecision | None:
        latest = self.latest
        return latest if latest is not None and latest.status == "applying" else None


class Orchestrator:
    """Applies the planner's decisions to the simulated cluster, over the real HTTP protocol.

    It keeps one long-poll open at all times: while the engines of a decision are starting, a
    newer decision (an operator pin supersedes a pending one) is applied at once instead of
    waiting for engines that are no longer wanted."""

    def __init__(
        self,
        *,
        base_url: str,
        deployment: str,
        cluster: ClusterControl,
        sim_now: Callable[[], float],
        poll_s: float = 0.02,
        wait_timeout_s: float = 5.0,
    ) -> None:
        self.base_url = base_url
        self.deployment = deployment
        self.cluster = cluster
        self.sim_now = sim_now
        self.poll_s = poll_s
        # Wall seconds the planner may hold a long-poll. Short on purpose: on SIGTERM the service
        # (uvicorn) waits for in-flight requests, a held long-poll included, before it stops.
        self.wait_timeout_s = wait_timeout_s
        self.state = OrchestratorState()

    async def run(self) -> None:
        timeout = httpx.Timeout(10.0, read=self.wait_timeout_s + 30.0)
        async with httpx.AsyncClient(base_url=self.base_url, timeout=timeout) as client:
            after = 0
            next_decision: asyncio.Task[dict[str, Any]] | None = None
            try:
                while True:
                    if next_decision is None:
                        next_decision = asyncio.create_task(self._next(client, after))
                    decision = await next_decision
                    next_decision = None
                    while decision is not None:
                        after = decision["id"]
                        applied = self._apply(decision)
                        next_decision = asyncio.create_task(self._next(client, after))
                        decision = await self._settle(client, applied, next_decision)
                        if decision is not None:
                            next_decision = None
            finally:
                if next_decision is not None:
                    next_decision.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await next_decision

    async def _next(self, client: httpx.AsyncClient, after: int) -> dict[str, Any]:
        """The next decision after `after`, however long that takes (204s are retried)."""
        while True:
            try:
                resp = await client.get(
                    "/decisions/wait",
                    params={"deployment": self.deployment, "after": after, "timeout_s": self.wait_timeout_s},
                )
            except httpx.TransportError as exc:
                self.state.errors += 1
                log.warning("orchestrator: planner unreachable (%s); retrying in 1 s", exc)
                await asyncio.sleep(1.0)
                continue
            if resp.status_code == 204:
                continue
            if resp.status_code != 200:
                self.state.errors += 1
                log.warning("orchestrator: wait answered %d: %s", resp.status_code, resp.text[:300])
                await asyncio.sleep(1.0)
                continue
            return resp.json()

    def _apply(self, decision: dict[str, Any]) -> AppliedDecision:
        targets = {role: decision[f"num_{role}"] for role in ROLES if decision.get(f"num_{role}") is not None}
        previous = self.state.in_flight
        if previous is not None:
            previous.status = "replaced"
        order = self.cluster.order(targets)
        applied = AppliedDecision(decision["id"], targets, applied_at_s=self.sim_now(), order=order)
        self.state.applied.append(applied)
        log.info(
            "orchestrator: decision %d (%s): %s",
            applied.id,
            decision.get("source"),
            ", ".join(f"{count} {role}" for role, count in targets.items()),
        )
        return applied

    async def _settle(
        self,
        client: httpx.AsyncClient,
        applied: AppliedDecision,
        next_decision: asyncio.Task[dict[str, Any]],
    ) -> dict[str, Any] | None:
        """Wait until the decision's engines are up and acknowledge it; None when acknowledged,
        or the newer decision that arrived first."""
        while not self._reached(applied):
            if next_decision.done():
                return next_decision.result()
            await self._report_progress(client, applied)
            await asyncio.sleep(self.poll_s)
        await self._acknowledge(client, applied)
        return None

    async def _report_progress(self, client: httpx.AsyncClient, applied: AppliedDecision) -> None:
        """Tell the planner what runs whenever it changed (an engine became ready or left), so
        that its next tick counts them, also while decisions are superseded before they are
        reached. A failed report is sent again at the next poll."""
        ready = {role: n for role, n in self.cluster.ready_counts()[1].items() if role in applied.targets}
        if ready == self.state.reported:
            return
        try:
            resp = await client.post(
                f"/decisions/{applied.id}/progress",
                params={"deployment": self.deployment},
                json={"observed": ready},
            )
        except httpx.TransportError as exc:
            log.warning("orchestrator: progress report failed (%s); sent again at the next poll", exc)
            return
        if resp.status_code != 200:
            self.state.errors += 1
            log.warning("orchestrator: progress report answered %d: %s", resp.status_code, resp.text[:300])
            return
        self.state.reported = ready
        self.state.ready_log.append((round(self.sim_now(), 3), ready))

    def _reached(self, applied: AppliedDecision) -> bool:
        """The decision's order is applied and its engines are all ready."""
        done, ready = self.cluster.ready_counts()
        return done >= applied.order and all(ready[role] == n for role, n in applied.targets.items())

    async def _acknowledge(self, client: httpx.AsyncClient, applied: AppliedDecision) -> None:
        observed = {
            role: count for role, count in self.cluster.ready_counts()[1].items() if role in applied.targets
        }
        took_s = self.sim_now() - applied.applied_at_s
        body = {
            "status": "succeeded",
            "observed": observed,
            "message": f"planner demo: {observed} engines ready {took_s:.0f} s (simulated) after the order",
        }
        while True:
            try:
                resp = await client.post(
                    f"/decisions/{applied.id}/complete", params={"deployment": self.deployment}, json=body
                )
                break
            except httpx.TransportError as exc:
                self.state.errors += 1
                log.warning("orchestrator: acknowledgement failed (%s); retrying in 1 s", exc)
                await asyncio.sleep(1.0)
        applied.acked_at_s = self.sim_now()
        self.state.reported = observed
        self.state.ready_log.append((round(applied.acked_at_s, 3), observed))
        if resp.status_code == 200:
            applied.status = "succeeded"
            self.state.acks += 1
            self.state.last_acked = applied
            log.info("orchestrator: decision %d acknowledged: %s", applied.id, observed)
        elif resp.status_code == 409:
            # The planner moved on (an operator pin, or the ack timeout passed); the next
            # decision comes through the long-poll.
            applied.status = "superseded"
            log.info("orchestrator: decision %d no longer pending: %s", applied.id, resp.text[:300])
        else:
            applied.status = f"ack failed ({resp.status_code})"
            self.state.errors += 1
            log.warning(
                "orchestrator: acknowledging %d answered %d: %s", applied.id, resp.status_code, resp.text
            )

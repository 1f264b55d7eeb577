"""The traffic retention of `planner serve`: every PRUNE_EVERY_S of its clock, the traffic
observations of ticks older than `PLANNER_TRAFFIC_RETENTION_DAYS` are cleared from their records
(`app/store/history.py` `prune_traffic`), in batches of short transactions. The rest of a tick
record stays: the diagnostics report and the cost account read it. What is kept is what
`planner replay --from-store` replays.

Every process prunes: clearing an observation twice changes nothing, so no lease is needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from app.store.history import PRUNE_BATCH, prune_traffic
from app.workers.clock import Clock

log = logging.getLogger(__name__)

# An hour: a day's ticks take minutes to pass the retention's edge, not seconds.
PRUNE_EVERY_S = 3600.0


class TrafficPruner:
    def __init__(
        self, *, session_factory: sessionmaker[Session], clock: Clock, retention_days: float
    ) -> None:
        self._sf = session_factory
        self._clock = clock
        self.retention = timedelta(days=retention_days)
        self.last_error: str | None = None
        self.pruned = 0  # observations cleared since the start
        self._task: asyncio.Task[None] | None = None

    def prune(self, now: datetime) -> int:
        """Clear every observation older than the retention, a batch per transaction; how many."""
        before = now - self.retention
        cleared = 0
        while True:
            with self._sf() as session, session.begin():
                batch = prune_traffic(session, before)
            cleared += batch
            if batch < PRUNE_BATCH:
                break
        self.pruned += cleared
        if cleared:
            log.info("retention: cleared the traffic of %d tick(s) before %s", cleared, before.isoformat())
        return cleared

    async def run(self) -> None:
        while True:
            now = self._clock.now()
            try:
                await asyncio.to_thread(self.prune, now)
                self.last_error = None
            except Exception as exc:  # keep the service up; try again at the next round
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("retention: pruning the traffic observations failed")
            await self._clock.sleep_until(now + timedelta(seconds=PRUNE_EVERY_S))

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="traffic-retention")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

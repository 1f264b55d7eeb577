"""How a deployment worker hands a pending decision to its connector: once per decision, in the
background, and only while it holds the lease. The connector's outcome is the decision's
acknowledgement (succeeded with the replicas set, or failed with the connector's error); a
cluster that is not ready leaves it pending for the next tick to hand over again. Virtual and
`none` deployments have no connector object: the orchestrator acknowledges over HTTP, or nobody.

`ActuateMixin` is this part of `DeploymentWorker` (loop.py), which sets the attributes it names.
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy.orm import Session, sessionmaker

from app.config import DeploymentConfig
from app.connectors.base import Connector
from app.core.errors import ConnectorError, ConnectorNotReadyError
from app.core.types import DecisionStatus
from app.store import decisions as decision_store
from app.store.models import Decision
from app.workers.clock import Clock

# The worker's logger, whichever of its modules logs (loop.py says why).
log = logging.getLogger("app.workers.loop")


class ActuateMixin:
    """Handing pending decisions to the connector."""

    config: DeploymentConfig
    connector: Connector | None
    is_leader: bool
    # Decision ids handed to the connector and not yet settled, and the tasks handing them over.
    _actuating: set[int]
    _actuations: set[asyncio.Task[None]]
    _sf: sessionmaker[Session]
    _clock: Clock

    def actuate(self, decision: Decision) -> None:
        """Hand a pending decision to the connector in the background, once; virtual and none
        deployments have no connector (the orchestrator, or nobody, acknowledges); in shadow mode
        nothing is handed over."""
        if self.connector is None or not self.is_leader or decision.decision_id in self._actuating:
            return
        if self.config.shadow:
            return  # shadow mode writes nothing (its decisions are never pending, besides)
        self._actuating.add(decision.decision_id)
        task = asyncio.create_task(self._actuate(decision))
        self._actuations.add(task)
        task.add_done_callback(self._actuations.discard)

    async def on_decision_stored(self, decision_id: int) -> None:
        """A decision was stored outside the tick (an operator pin): actuate it now, not at
        the next tick."""
        if self.connector is None or not self.is_leader or self.config.shadow:
            return

        def load() -> Decision:
            with self._sf() as session:
                return decision_store.get_decision_or_raise(session, self.config.name, decision_id)

        decision = await asyncio.to_thread(load)
        if decision.status == DecisionStatus.PENDING:
            self.actuate(decision)

    async def _actuate(self, decision: Decision) -> None:
        """Hand a decision to the cluster; its outcome is the decision's acknowledgement."""
        replicas = decision_store.replicas_of(decision)
        try:
            await self.connector.set_replicas(replicas, decision.remove)  # type: ignore[union-attr]
            status, message = (
                DecisionStatus.SUCCEEDED,
                f"{self.config.connector.type}: replicas set to {replicas}",
            )
        except ConnectorNotReadyError as exc:
            # Stays pending; the next tick hands it over again.
            log.info(
                "[%s] decision %d waits: %s",
                self.config.name,
                decision.decision_id,
                exc,
                extra={"deployment": self.config.name, "decision_id": decision.decision_id},
            )
            self._actuating.discard(decision.decision_id)
            return
        except ConnectorError as exc:
            status, message = DecisionStatus.FAILED, f"{self.config.connector.type}: {exc}"
        log.info(
            "[%s] decision %d %s: %s",
            self.config.name,
            decision.decision_id,
            status,
            message,
            extra={"deployment": self.config.name, "decision_id": decision.decision_id},
        )
        now = self._clock.now()

        def record() -> None:
            with self._sf() as session, session.begin():
                decision_store.complete_decision(
                    session,
                    deployment=self.config.name,
                    decision_id=decision.decision_id,
                    status=status,
                    observed=replicas if status == DecisionStatus.SUCCEEDED else None,
                    message=message,
                    actor_role="connector",
                    now=now,
                )

        await asyncio.to_thread(record)
        self._actuating.discard(decision.decision_id)

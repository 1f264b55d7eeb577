"""The port every connector implements. Adapters translate their infrastructure's errors into
`ConnectorError` with context (which deployment, which service, what the API said)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from app.core.types import Replicas, Role


class Connector(Protocol):
    async def validate(self) -> None:
        """Check that the deployment exists and has a service per role; raise ConnectorError."""

    async def gpus_per_engine(self) -> dict[Role, int] | None:
        """GPUs per engine of each role as the cluster declares them; None if it cannot say."""

    async def ready_counts(self) -> Replicas | None:
        """Replicas ready per role, or None when the cluster cannot say (e.g. not Ready yet)."""

    async def set_replicas(
        self, targets: Replicas, remove: Mapping[Role, Sequence[str]] | None = None
    ) -> None:
        """Ask the cluster for these replica counts; returns once the request is accepted.
        `remove`: per role going down, the ready engines (worker ids) to remove first, in order;
        a hint the connector passes on as far as its cluster lets it."""

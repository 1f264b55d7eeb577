"""What the FPM subscriber counts and knows: per publisher, the state its thread keeps
(`EndpointState`) and what one drain of its socket saw (`DrainTally`); at one instant
(`FpmSnapshot`), each live engine's latest record and the counters per publisher, and the JSON
view of it that the tick record keeps (`as_json`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from app.core.perf.fpm import ForwardPassMetrics

EngineKey = tuple[str, int]  # (worker_id, dp_rank)


@dataclass(frozen=True)
class EngineFpm:
    """One engine's latest record in the inventory."""

    record: ForwardPassMetrics
    endpoint: str  # the publisher it came from
    age_s: float  # since it arrived, at snapshot time
    trainable: bool  # False for an idle heartbeat: liveness and queues, not a regression sample


@dataclass(frozen=True)
class EndpointCounters:
    """Per publisher; `received` counts every message read, malformed ones included."""

    endpoint: str
    received: int = 0
    malformed: int = 0
    dropped: int = 0  # missing sequence numbers
    heartbeats: int = 0
    restarts: int = 0  # the sequence went back: the engine restarted
    last_sequence: int | None = None
    last_error: str | None = None


@dataclass(frozen=True)
class FpmSnapshot:
    engines: Mapping[EngineKey, EngineFpm]  # live engines only
    endpoints: Mapping[str, EndpointCounters]
    received: int
    malformed: int
    dropped: int
    heartbeats: int
    restarts: int
    expired: int  # engines that left the inventory after `engine_timeout_s` of silence
    trainable_overflow: int  # trainable records dropped because nobody collected them in time
    last_error: str | None  # the most recent malformed message's reason, from any endpoint
    running: bool
    failure: str | None  # why the ingestion thread stopped on its own, if it did
    removed: int = 0  # engines that left with their publisher (it left discovery)
    discovery_error: str | None = None  # the last failed `discover()` call's reason, until one works

    def records(self, endpoints: Collection[str] | None = None) -> dict[EngineKey, ForwardPassMetrics]:
        """The latest record per engine (of the given endpoints only, e.g. one role's)."""
        return {
            key: engine.record
            for key, engine in self.engines.items()
            if endpoints is None or engine.endpoint in endpoints
        }

    def dp_ranks(self) -> dict[str, int]:
        """Live dp ranks per worker_id: what reconciling with the ready count needs (§4.3 step 4)."""
        ranks: dict[str, int] = {}
        for worker_id, _ in self.engines:
            ranks[worker_id] = ranks.get(worker_id, 0) + 1
        return ranks


class EndpointState:
    """Per-endpoint state, changed by the thread under the lock (`_publish`)."""

    __slots__ = (
        "endpoint",
        "next_seq",
        "received",
        "malformed",
        "dropped",
        "heartbeats",
        "restarts",
        "error",
    )

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.next_seq: int | None = None
        self.received = 0
        self.malformed = 0
        self.dropped = 0
        self.heartbeats = 0
        self.restarts = 0
        self.error: str | None = None

    def values(self) -> tuple[str, int, int, int, int, int, int | None, str | None]:
        """The fields of `EndpointCounters`, in order (cheap enough to take under the lock)."""
        return (
            self.endpoint,
            self.received,
            self.malformed,
            self.dropped,
            self.heartbeats,
            self.restarts,
            None if self.next_seq is None else self.next_seq - 1,
            self.error,
        )


@dataclass(frozen=True, slots=True)
class DrainTally:
    """What one drain of one socket saw, applied to the shared counters under the lock."""

    state: EndpointState
    received: int
    malformed: int
    dropped: int
    heartbeats: int
    restarts: int
    error: str | None
    next_seq: int | None


def as_json(snapshot: FpmSnapshot) -> dict[str, Any]:
    """The snapshot for diagnostics: counters and per-engine summaries, no raw records."""
    return {
        "received": snapshot.received,
        "malformed": snapshot.malformed,
        "dropped": snapshot.dropped,
        "heartbeats": snapshot.heartbeats,
        "restarts": snapshot.restarts,
        "expired": snapshot.expired,
        "trainable_overflow": snapshot.trainable_overflow,
        "last_error": snapshot.last_error,
        "running": snapshot.running,
        "failure": snapshot.failure,
        "removed": snapshot.removed,
        "discovery_error": snapshot.discovery_error,
        "publishers": sorted(snapshot.endpoints),
        "engines": [
            {
                "worker_id": worker_id,
                "dp_rank": dp_rank,
                "endpoint": engine.endpoint,
                "age_s": round(engine.age_s, 3),
                "trainable": engine.trainable,
            }
            for (worker_id, dp_rank), engine in sorted(snapshot.engines.items())
        ],
    }

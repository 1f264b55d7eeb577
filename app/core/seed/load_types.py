"""Load scaling's plain data: settings, reasons, the pending target, the input and the result."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from app.core.perf.fpm import ForwardPassMetrics
from app.core.types import EngineKey, Mode, Replicas, Role, RoleBounds, roles_for_mode

DEFAULT_PENDING_EXPIRY_S = 900.0  # 5 x the reference's default throughput interval of 180 s


_NO_MAXIMUM = 2**31 - 1


class LoadReason(StrEnum):
    """The reference's load decision states (§5.3), so dashboards read the same."""

    UNSET = "unset"
    DISABLED = "disabled"
    NO_FPM_DATA = "no_fpm_data"
    SCALING_IN_PROGRESS = "scaling_in_progress"
    WORKER_COUNT_MISMATCH = "worker_count_mismatch"
    INSUFFICIENT_DATA = "insufficient_data"
    NO_CHANGE = "no_change"
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    SCALE_DOWN_CAPPED_BY_THROUGHPUT = "scale_down_capped_by_throughput"
    SCALE_DOWN_REFUSED_CONSOLIDATION = "scale_down_refused_consolidation"


class PendingState(StrEnum):
    """What became of the last issued target; the caller clears it on `reached` or `expired`."""

    NONE = "none"
    WAITING = "waiting"
    REACHED = "reached"
    EXPIRED = "expired"


@dataclass(frozen=True)
class LoadSettings:
    mode: Mode
    ttft_target_ms: float
    itl_target_ms: float
    sensitivity: float = 0.8  # scale down only with this fraction of the target to spare
    # Missing roles: at least 1, no maximum.
    bounds: Mapping[Role, RoleBounds] = field(default_factory=dict)
    max_num_batched_tokens: int | None = None  # prefill (or aggregated) engines' chunk size
    max_kv_tokens: int | None = None  # decode (or aggregated) engines' KV cache capacity
    pending_expiry_s: float = DEFAULT_PENDING_EXPIRY_S
    enabled: bool = True

    def __post_init__(self) -> None:
        roles_for_mode(self.mode)  # KeyError for an unknown mode
        if not self.ttft_target_ms > 0 or not self.itl_target_ms > 0:
            raise ValueError("ttft_target_ms and itl_target_ms must be > 0")
        if not 0 < self.sensitivity <= 1:
            raise ValueError(f"sensitivity must be in (0, 1], got {self.sensitivity}")
        if not self.pending_expiry_s > 0:
            raise ValueError("pending_expiry_s must be > 0")

    def role_bounds(self, role: Role) -> RoleBounds:
        """The role's bounds; a role without any: at least 1, no maximum."""
        return self.bounds.get(role) or RoleBounds(1, _NO_MAXIMUM)

    def min_replicas(self, role: Role) -> int:
        return self.bounds[role].min_replicas if role in self.bounds else 1

    def max_replicas(self, role: Role) -> int | None:
        return self.bounds[role].max_replicas if role in self.bounds else None


@dataclass(frozen=True)
class PendingTarget:
    """The last target sent to the cluster, and when (seconds, the tick's clock)."""

    replicas: Replicas
    issued_s: float


@dataclass(frozen=True)
class LoadInput:
    # role -> {(worker_id, dp_rank): latest FPM}; heartbeats are fine (they carry the queue state).
    fpm: Mapping[Role, Mapping[EngineKey, ForwardPassMetrics]]
    ready: Mapping[Role, int]  # ready workers per role, from the inventory
    now_s: float
    pending: PendingTarget | None = None
    throughput_floor: Mapping[Role, int] | None = None  # when throughput scaling also runs
    kv_hit_rate: float | None = None  # the sticky prefix-cache hit rate, discounts prefill work


@dataclass(frozen=True)
class LoadResult:
    replicas: Replicas | None  # every role of the mode when something changes; None otherwise
    reason: LoadReason
    reasons: dict[Role, LoadReason]
    detail: str
    pending: PendingState
    diagnostics: dict[str, Any] = field(default_factory=dict)

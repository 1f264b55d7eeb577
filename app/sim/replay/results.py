"""What one replay produced: the raw material of summary.json, the CSVs and the HTML report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.sim.world.cluster import ReplicaSample
from app.sim.world.engines import SimRequest


@dataclass(frozen=True)
class DecisionEvent:
    """A policy's output at one tick: the target it asked for (None: no change) and why."""

    at_s: float
    target: dict[str, int] | None
    reason: str


@dataclass(frozen=True)
class OracleStep:
    """From `at_s` on, the oracle keeps `billed` engines per role (ordered or serving)."""

    at_s: float
    billed: dict[str, int]


@dataclass
class ReplayResult:
    policy: str
    trace: str  # the trace file's name
    ttft_target_ms: float
    itl_target_ms: float
    startup_delay_s: float
    truth_scale: float
    gpus_per_engine: dict[str, int]
    requests: list[SimRequest]
    timeline: list[ReplicaSample]  # the cluster's replica changes, in time order
    decisions: list[DecisionEvent]
    gpu_hours: float
    oracle_gpu_hours: float
    oracle_timeline: list[OracleStep]  # the oracle's billed engines over time
    end_s: float  # simulated time when the last request finished
    wall_s: float  # how long the replay took
    settings: dict[str, Any] = field(default_factory=dict)  # the run's parameters, as given
    # The deployment may scale to zero: summary.json then reports its zero periods and wake-ups.
    scale_to_zero: bool = False
    # Requests an engine still held when its removal's grace period ended (never finished).
    cut_off: int = 0
    # The deployment's price of a GPU-hour: summary.json's cost (app/sim/replay/cost.py).
    cost_per_gpu_hour: float = 1.0

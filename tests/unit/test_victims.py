"""Which engines a scale-down names for removal (app/core/victims.py), on named cases."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from app.core.perf.fpm import ForwardPassMetrics, QueuedRequestMetrics, ScheduledRequestMetrics
from app.core.planner import Planner, PlannerSettings, TickInput
from app.core.types import ActiveOverrides, DecisionSource, DecisionStatus, DecisionView, RoleBounds
from app.core.victims import choose_removals


def engine(
    worker: str, *, running: int = 0, queued: int = 0, kv: int = 0, rank: int = 0
) -> ForwardPassMetrics:
    """A decode engine's latest pass: `running` requests holding `kv` tokens, `queued` waiting."""
    return ForwardPassMetrics(
        worker_id=worker,
        dp_rank=rank,
        wall_time_s=0.02 if running else 0.0,
        scheduled=ScheduledRequestMetrics(num_decode_requests=running, sum_decode_kv_tokens=kv),
        queued=QueuedRequestMetrics(num_decode_requests=queued),
    )


def engines(*records: ForwardPassMetrics) -> dict:
    return {"decode": {r.key: r for r in records}}


@dataclass(frozen=True)
class Case:
    name: str
    previous: dict
    target: dict
    fpm: dict
    expected: dict
    why: str


CASES = [
    Case(
        "idle first, then the least work",
        {"decode": 4},
        {"decode": 2},
        engines(
            engine("d1", running=8, kv=9000),
            engine("d2", running=2, kv=1500),
            engine("d3"),
            engine("d4", running=8, kv=8000),
        ),
        {"decode": ["d3", "d2"]},
        "an idle engine loses nothing; of the busy ones, the one with two requests cuts off fewest",
    ),
    Case(
        "queued requests count as work",
        {"decode": 2},
        {"decode": 1},
        engines(engine("d1", running=1, kv=500), engine("d2", queued=3)),
        {"decode": ["d1"]},
        "an engine with nothing running but three requests waiting holds more requests than one running one",
    ),
    Case(
        "same requests: less KV goes first",
        {"decode": 2},
        {"decode": 1},
        engines(engine("d1", running=4, kv=20_000), engine("d2", running=4, kv=2_000)),
        {"decode": ["d2"]},
        "with as many requests, the engine with less context is nearer to done",
    ),
    Case(
        "data-parallel ranks are one engine",
        {"decode": 2},
        {"decode": 1},
        engines(
            engine("d1", running=1, kv=100, rank=0),
            engine("d1", running=1, kv=100, rank=1),
            engine("d2", running=3, kv=300),
        ),
        {"decode": ["d1"]},
        "d1's two ranks hold two requests in all, fewer than d2's three; a worker is removed whole",
    ),
    Case(
        "starting engines go first and are not named",
        {"decode": 5},
        {"decode": 3},
        engines(engine("d1", running=2), engine("d2"), engine("d3", running=1)),
        {},
        "of 5 ordered, 2 are not ready yet (3 publish): the cluster removes those two, no ready one",
    ),
    Case(
        "starting engines cover part of the cut",
        {"decode": 4},
        {"decode": 1},
        engines(engine("d1", running=2), engine("d2"), engine("d3", running=1)),
        {"decode": ["d2", "d3"]},
        "one of 4 is still starting and goes first; two of the three ready ones must go too",
    ),
    Case(
        "a role going up or holding names nothing",
        {"prefill": 2, "decode": 3},
        {"prefill": 3, "decode": 3},
        engines(engine("d1"), engine("d2"), engine("d3")),
        {},
        "only a lowered count removes engines",
    ),
    Case(
        "no engine publishing names nothing",
        {"decode": 3},
        {"decode": 1},
        {},
        {},
        "without forward passes the planner cannot tell the engines apart, and says nothing",
    ),
    Case(
        "ties go to the worker id",
        {"decode": 3},
        {"decode": 1},
        engines(engine("d9"), engine("d10"), engine("d2")),
        {"decode": ["d10", "d2"]},
        "three idle engines: the same snapshot always names the same two",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_choose_removals(case: Case) -> None:
    assert choose_removals(previous=case.previous, target=case.target, fpm=case.fpm) == case.expected, (
        case.why
    )


def test_a_tick_that_lowers_a_count_names_its_victims_in_the_record() -> None:
    """The planner's tick: a pin from 3 to 1 decode engine, the decision before it asked for 3,
    and the engines' forward passes say which two hold least."""
    settings = PlannerSettings(
        deployment="demo",
        roles=("prefill", "decode"),
        bounds={"prefill": RoleBounds(1, 8), "decode": RoleBounds(1, 8)},
        gpus_per_engine={"prefill": 1, "decode": 1},
        tick_interval_s=60.0,
    )
    planner = Planner(settings, model=None)
    latest = DecisionView(
        id=1,
        replicas={"prefill": 1, "decode": 3},
        source=DecisionSource.OVERRIDE,
        status=DecisionStatus.SUCCEEDED,
        created_s=0.0,
    )
    effects = planner.on_tick(
        TickInput(
            now_s=60.0,
            overrides=ActiveOverrides(pin_id=2, pin={"prefill": 1, "decode": 1}),
            latest_decision=latest,
            fpm=engines(engine("d1", running=5, kv=5000), engine("d2"), engine("d3", running=1, kv=900)),
            ready={"prefill": 1, "decode": 3},
        )
    )
    assert effects.target == {"prefill": 1, "decode": 1}
    assert effects.remove == {"decode": ["d2", "d3"]}
    assert effects.diagnostics.remove == {"decode": ["d2", "d3"]}

"""Scale to zero (`scaling.scale_to_zero`): the SLA step's sleep and wake, tick by tick, the
deployment file's rules for it, and the frontend gauges that wake it, read by both sources.

Ticks are 5 s; the cluster follows every order at once (expected and ready become the target),
as in tests/unit/test_sla_scaling.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml

from app.config import ConfigError, load_deployments
from app.core.perf.interpolation import PerfModel
from app.core.sla.settings import ScaleToZero, SlaSettings
from app.core.sla.state import SlaState
from app.core.sla.step import sla_step
from app.core.sla.types import SlaInput, SlaReason, SlaResult, TrafficSample
from app.core.types import Role, RoleBounds
from app.sources.frontend_scrape import FrontendScrapeSource, gauge_values, parse_metrics
from app.sources.profile_files import load_profile
from app.sources.prometheus import PrometheusSource, frontend_queries
from tests.support import demo_config

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8"
DYNAMO_METRICS = ROOT / "tests" / "data" / "dynamo-1.6.1" / "frontend_metrics.txt"
TICK_S = 5.0
ROLES: tuple[Role, ...] = ("prefill", "decode")
QUIET_S = 60.0


@pytest.fixture(scope="module")
def h200() -> PerfModel:
    return PerfModel.from_profile(load_profile(H200))


def settings(model: PerfModel, *, enabled: bool = True, minimum: int = 0, **overrides: object) -> SlaSettings:
    base = SlaSettings(
        ttft_target_ms=500.0,
        itl_target_ms=20.0,
        bounds={role: RoleBounds(minimum, 32) for role in ROLES},
        chunk_tokens=8192,
        max_kv_tokens=model.decode.max_kv_tokens,
        trend=False,
        startup_estimate_s=120.0,  # the scenarios' lead until measured (the default reads 300)
        scale_to_zero=ScaleToZero(enabled=enabled, quiet_s=QUIET_S),
    )
    return base.model_copy(update=overrides)


@dataclass
class Run:
    model: PerfModel
    settings: SlaSettings
    expected: dict[Role, int] = field(default_factory=lambda: {"prefill": 2, "decode": 2})
    state: SlaState = field(default_factory=SlaState)
    now_s: float = 0.0
    results: list[SlaResult] = field(default_factory=list)

    def tick(
        self,
        num_req: float,
        *,
        queued: float | None = None,
        inflight: float | None = None,
        lengths_known: bool = True,
        unknown: bool = False,
    ) -> SlaResult:
        self.now_s += TICK_S
        known = bool(num_req) and lengths_known
        traffic: TrafficSample | None = TrafficSample(
            self.now_s,
            TICK_S,
            num_req,
            2000.0 if known else None,
            150.0 if known else None,
            queued_requests=queued,
            inflight_requests=inflight,
        )
        if unknown:
            traffic = None  # the source is down: nothing is known about the traffic
        result = sla_step(
            self.model,
            self.state,
            SlaInput(self.now_s, traffic, {}, dict(self.expected), dict(self.expected)),
            self.settings,
        )
        if result.replicas is not None:
            self.expected = dict(result.replicas)
        self.results.append(result)
        return result

    def quiet(self, seconds: float) -> list[SlaResult]:
        return [self.tick(0) for _ in range(round(seconds / TICK_S))]

    @property
    def at_zero(self) -> bool:
        return all(v == 0 for v in self.expected.values())


def test_zero_only_after_the_quiet_period_counted_from_the_last_request(h200: PerfModel) -> None:
    run = Run(h200, settings(h200))
    for _ in range(12):
        run.tick(20)
    last_request_s = run.now_s
    # A request 30 s into the silence restarts the count: the quiet period is since the last one.
    run.quiet(30)
    run.tick(1)
    last_request_s = run.now_s
    while not run.at_zero:
        result = run.tick(0)
        assert result.reason != SlaReason.SCALED_TO_ZERO or run.now_s - last_request_s >= QUIET_S
        assert run.now_s - last_request_s <= QUIET_S, "not zero when the quiet period had passed"
    assert run.now_s - last_request_s == QUIET_S
    assert result.reason == SlaReason.SCALED_TO_ZERO
    assert result.replicas == {"prefill": 0, "decode": 0}
    assert result.diagnostics["zero"]["event"] == "scaled_to_zero"
    # Staying at zero is the same reason, without the event.
    assert run.tick(0).replicas == {"prefill": 0, "decode": 0}
    assert run.results[-1].diagnostics["zero"]["event"] is None


def test_nothing_queued_or_in_flight_is_part_of_quiet(h200: PerfModel) -> None:
    # A long request still being served (in flight) or one waiting for an engine (queued) is
    # not quiet, though none arrived: no zero until both gauges read 0 for the quiet period.
    run = Run(h200, settings(h200))
    run.tick(5)
    for _ in range(round(2 * QUIET_S / TICK_S)):
        assert run.tick(0, inflight=1, queued=0).reason != SlaReason.SCALED_TO_ZERO
    done_s = run.now_s
    while not run.at_zero:
        run.tick(0, inflight=0, queued=0)
    assert run.now_s - done_s == QUIET_S


def test_unknown_traffic_is_never_quiet_while_awake_and_no_demand_while_asleep(h200: PerfModel) -> None:
    run = Run(h200, settings(h200))
    run.tick(10)
    for _ in range(round(3 * QUIET_S / TICK_S)):
        assert run.tick(0, unknown=True).reason != SlaReason.SCALED_TO_ZERO
    run.quiet(QUIET_S)
    assert run.at_zero
    for _ in range(round(3 * QUIET_S / TICK_S)):
        run.tick(0, unknown=True)
        assert run.at_zero


def test_a_queued_request_wakes_the_deployment_on_the_very_next_tick(h200: PerfModel) -> None:
    run = Run(h200, settings(h200))
    run.tick(10)
    run.quiet(QUIET_S + 20)
    assert run.at_zero
    # No arrival counted yet (the frontend counts it later), but the queued gauge shows it.
    result = run.tick(0, queued=1)
    assert result.reason == SlaReason.WAKE_UP
    assert result.replicas is not None and all(result.replicas[r] >= 1 for r in ROLES)
    assert result.diagnostics["zero"]["event"] == "wake_up"
    assert result.diagnostics["zero"]["queued_requests"] == 1
    # Then it stays awake with at least one engine of each role, for a whole quiet period more.
    for _ in range(round(QUIET_S / TICK_S) - 1):
        assert all(v >= 1 for v in run.tick(0).replicas.values())  # type: ignore[union-attr]


def test_requests_whose_lengths_are_unknown_yet_wake_it_with_one_engine_each(h200: PerfModel) -> None:
    # At zero no request completes, so the frontend has no mean ISL or OSL to size with: the
    # wake must not wait for one (the request would wait as long). A deployment that never saw
    # a length gets one engine of each role.
    run = Run(h200, settings(h200))
    run.quiet(QUIET_S + 20)
    assert run.at_zero
    result = run.tick(3, queued=3, lengths_known=False)
    assert result.reason == SlaReason.WAKE_UP
    assert result.replicas == {"prefill": 1, "decode": 1}


def test_a_deployment_that_starts_at_zero_wakes_on_its_first_request(h200: PerfModel) -> None:
    # Minimums of 0 may start a deployment with no engine (the fleet replay does): its first
    # requests cannot complete either, and must not wait for the trend window to empty.
    run = Run(h200, settings(h200), expected={"prefill": 0, "decode": 0})
    result = run.tick(20, queued=20, lengths_known=False)
    assert result.reason == SlaReason.WAKE_UP
    assert result.replicas == {"prefill": 1, "decode": 1}


def test_a_burst_at_zero_is_sized_with_the_lengths_last_seen(h200: PerfModel) -> None:
    # A burst queued at zero: sized at once from the burst's count and the lengths seen before
    # the quiet period, not one engine now and the rest a start-up later.
    run = Run(h200, settings(h200))
    run.tick(10)
    run.quiet(QUIET_S + 20)
    assert run.at_zero
    burst = run.tick(500, queued=500, lengths_known=False)
    assert burst.reason == SlaReason.WAKE_UP
    assert burst.replicas is not None and burst.replicas["prefill"] > 1
    assert burst.diagnostics["demand"]["isl_mean"] == 2000.0


def test_an_arrival_wakes_it_too_and_the_wake_skips_the_scale_down_hold(h200: PerfModel) -> None:
    # trend on: nothing goes down until the headroom is learned, yet the quiet period takes it to
    # zero, and a request brings it back at once.
    run = Run(h200, settings(h200, trend=True))
    run.tick(10)
    run.quiet(QUIET_S)
    assert run.at_zero and run.results[-1].reason == SlaReason.SCALED_TO_ZERO
    result = run.tick(1)
    assert result.reason == SlaReason.WAKE_UP and not run.at_zero


def test_off_the_wish_is_never_zero(h200: PerfModel) -> None:
    run = Run(h200, settings(h200, enabled=False, minimum=1))
    run.tick(10)
    for result in run.quiet(10 * QUIET_S):
        assert result.replicas is None or all(v >= 1 for v in result.replicas.values())
        assert result.reason not in (SlaReason.SCALED_TO_ZERO, SlaReason.WAKE_UP)
        assert "zero" not in result.diagnostics


@pytest.mark.parametrize(
    ("every_s", "sleeps"),
    [(QUIET_S - TICK_S, False), (QUIET_S + 4 * TICK_S, True)],
    ids=["a-request-within-each-quiet-period", "a-request-after-each-quiet-period"],
)
def test_no_flapping_with_one_request_per_quiet_period(h200: PerfModel, every_s: float, sleeps: bool) -> None:
    run = Run(h200, settings(h200))
    run.tick(10)
    transitions = []
    for _ in range(10):
        run.quiet(every_s - TICK_S)
        run.tick(1)
        transitions += [r.reason for r in run.results if r.reason in (SlaReason.WAKE_UP,)]
    events = [r.diagnostics["zero"]["event"] for r in run.results if r.diagnostics["zero"]["event"]]
    if not sleeps:
        assert events == [], "a request inside every quiet period must keep it awake"
    else:
        # One sleep and one wake per request, in turn, never two of a kind.
        assert events == ["scaled_to_zero", "wake_up"] * 10


@pytest.mark.parametrize("respect", [False, True], ids=["quiet-s-alone", "respecting-the-return-forecast"])
def test_the_return_forecast_keeps_it_awake_through_the_usual_gaps(h200: PerfModel, respect: bool) -> None:
    # Bursts every 3 minutes with 100 s gaps: a return within a lead (the 120 s start-up
    # estimate) is the rule. quiet_s alone sleeps in every gap; with the forecast respected it
    # never does, and a silence longer than every learned gap still ends at zero.
    zero = ScaleToZero(enabled=True, quiet_s=30.0, respect_return_forecast=respect)
    run = Run(h200, settings(h200, scale_to_zero=zero))
    for _ in range(6):
        for _ in range(16):
            run.tick(40)
        run.quiet(100)
    events = [r.diagnostics["zero"]["event"] for r in run.results if r.diagnostics.get("zero")]
    sleeps = events.count("scaled_to_zero")
    assert sleeps == (0 if respect else 6)
    run.quiet(900)
    assert run.at_zero


# --- the deployments file -----------------------------------------------------------------------


def _load(tmp_path: Path, **overrides: object):
    path = tmp_path / "deployments.yaml"
    path.write_text(yaml.safe_dump(demo_config(**overrides)))
    return load_deployments(path)


ZERO_MIN = {
    "prefill": {"min_replicas": 0, "max_replicas": 8},
    "decode": {"min_replicas": 0, "max_replicas": 8},
}


def test_the_file_enables_it_per_deployment(tmp_path: Path) -> None:
    config = _load(
        tmp_path, scaling={"algorithm": "sla", "scale_to_zero": {"enabled": True, "quiet_s": 300}}, **ZERO_MIN
    )
    zero = config.deployments[0].scaling.scale_to_zero
    assert (zero.enabled, zero.quiet_s) == (True, 300)
    assert _load(tmp_path).deployments[0].scaling.scale_to_zero.enabled is False


@pytest.mark.parametrize(
    ("scaling", "roles", "field_named"),
    [
        ({"algorithm": "sla", "scale_to_zero": {"enabled": True}}, {}, "prefill.min_replicas"),
        (
            {"algorithm": "sla", "scale_to_zero": {"enabled": True}},
            {"prefill": {"min_replicas": 0}, "decode": {"min_replicas": 1}},
            "decode.min_replicas",
        ),
        (
            {"algorithm": "seed", "scale_to_zero": {"enabled": True}},
            ZERO_MIN,
            "scaling.scale_to_zero.enabled",
        ),
        ({"algorithm": "sla", "scale_to_zero": {"enabled": True, "quiet_s": 0}}, ZERO_MIN, "quiet_s"),
    ],
    ids=["min-replicas-1", "decode-min-1", "seed-algorithm", "quiet-s-0"],
)
def test_the_file_refuses_what_cannot_scale_to_zero(
    tmp_path: Path, scaling: dict, roles: dict, field_named: str
) -> None:
    with pytest.raises(ConfigError, match=field_named.replace(".", r"\.")):
        _load(tmp_path, scaling=scaling, **roles)


# --- the sources: Dynamo 1.6.1's queued and in-flight gauges --------------------------------------


def _dynamo_text(queued: int, inflight: int) -> str:
    text = DYNAMO_METRICS.read_text()
    assert 'dynamo_frontend_queued_requests{model="tiny"} 0' in text  # the recorded sample has it
    return text.replace(
        'dynamo_frontend_queued_requests{model="tiny"} 0',
        f'dynamo_frontend_queued_requests{{model="tiny"}} {queued}',
    ).replace(
        'dynamo_frontend_inflight_requests{model="tiny"} 0',
        f'dynamo_frontend_inflight_requests{{model="tiny"}} {inflight}',
    )


def test_the_scrape_reads_the_gauges_of_the_recorded_dynamo_frontend() -> None:
    samples = parse_metrics(DYNAMO_METRICS.read_text())
    assert gauge_values(samples, "tiny") == {"queued_requests": 0.0, "inflight_requests": 0.0}
    assert gauge_values(samples, "other") == {"queued_requests": None, "inflight_requests": None}
    assert gauge_values(parse_metrics(_dynamo_text(3, 5)), "tiny") == {
        "queued_requests": 3.0,
        "inflight_requests": 5.0,
    }


@pytest.mark.anyio
async def test_a_scrape_observation_carries_the_current_gauge() -> None:
    bodies = iter([_dynamo_text(0, 0), _dynamo_text(2, 2)])

    def serve(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=next(bodies), headers={"content-type": "text/plain"})

    clock = iter([0.0, 5.0])
    source = FrontendScrapeSource(
        "http://frontend.test:8000",
        model_name="tiny",
        client=httpx.AsyncClient(transport=httpx.MockTransport(serve)),
        monotonic=lambda: next(clock),
    )
    await source.check()
    obs = await source.observe(5.0)
    # An idle window by the counters, with requests waiting: the gauge is what wakes a deployment.
    assert obs.num_req == 0
    assert (obs.queued_requests, obs.inflight_requests) == (2.0, 2.0)


@pytest.mark.anyio
async def test_prometheus_reads_the_gauges_latest_value() -> None:
    queries = frontend_queries(30, {})
    answers = {
        queries.gauges["queued_requests"]: [({"model": "tiny"}, "4"), ({"model": "other"}, "9")],
        queries.gauges["inflight_requests"]: [({"model": "tiny"}, "6")],
    }
    assert (
        queries.gauges["queued_requests"]
        == "sum by (model, dynamo_namespace) (dynamo_frontend_queued_requests)"
    )

    def serve(request: httpx.Request) -> httpx.Response:
        result = [
            {"metric": labels, "value": [0, value]}
            for labels, value in answers.get(request.url.params["query"], [])
        ]
        return httpx.Response(
            200, json={"status": "success", "data": {"resultType": "vector", "result": result}}
        )

    source = PrometheusSource(
        "http://prometheus.test:9090",
        model_name="tiny",
        client=httpx.AsyncClient(transport=httpx.MockTransport(serve)),
    )
    obs = await source.observe(30)
    assert (obs.queued_requests, obs.inflight_requests) == (4.0, 6.0)
    assert not math.isnan(obs.duration_s)


# --- through the planner core, as `planner serve` and every embedder call it ---------------------


def test_the_queued_gauge_reaches_the_step_through_the_planner(tmp_path: Path) -> None:
    from app.embedding import EmbeddedPlanner, TickInput, TrafficWindow

    scaling = {"algorithm": "sla", "scale_to_zero": {"enabled": True, "quiet_s": QUIET_S}}
    deployment = _load(tmp_path, scaling=scaling, profile=str(H200), **ZERO_MIN).deployments[0]
    planner = EmbeddedPlanner.from_config(deployment, base_dir=tmp_path)
    engines = {"prefill": 1, "decode": 1}
    now, reasons = 0.0, []

    def tick(num_req: float, queued: float = 0.0) -> dict[str, int] | None:
        nonlocal now, engines
        now += TICK_S
        known = 2000.0 if num_req else None
        window = TrafficWindow(TICK_S, num_req, known, known and 150.0, queued_requests=queued)
        out = planner.on_tick(TickInput(now_s=now, traffic=window, ready=engines, expected=engines))
        reasons.append(out.diagnostics["sla"]["reason"])
        if out.target is not None:
            engines = dict(out.target)
        return out.target

    tick(10)
    while engines != {"prefill": 0, "decode": 0}:
        tick(0)
        assert now <= 2 * QUIET_S
    assert reasons[-1] == "scaled_to_zero"
    # No arrival counted, one request waiting for an engine: the next tick orders engines.
    target = tick(0, queued=1)
    assert reasons[-1] == "wake_up" and target is not None and min(target.values()) >= 1

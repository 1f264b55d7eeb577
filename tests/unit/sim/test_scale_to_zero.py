"""A wake-up from zero in the simulated cluster, under the planner itself (SLA scaling, as
`planner replay --scale-to-zero` runs it): a trace with a long gap takes the engines to zero, the
first request after the gap waits at the router (the frontend's queued gauge counts it) until an
engine has started, and summary.json reports that wake-up and its TTFT."""

from __future__ import annotations

import contextlib
import random

import pytest

from app.core.traces import TraceRequest
from app.sim.replay.config import DEFAULT_REPLAY_CONFIG, load_replay_config, with_overrides
from app.sim.replay.outputs import summarize
from app.sim.replay.run import build_world, make_policy, run_policy
from app.sim.world.cluster import Cluster
from app.sim.world.frontend import FrontendCounters

STARTUP_S = 30.0
QUIET_S = 60.0
GAP_START_S, GAP_END_S = 120.0, 600.0


def _poisson(rate_rps: float, start_s: float, end_s: float, seed: int) -> list[TraceRequest]:
    rng = random.Random(seed)
    t, out = start_s, []
    while True:
        t += rng.expovariate(rate_rps)
        if t >= end_s:
            return out
        out.append(TraceRequest(t, 1000, 100))


def _gap_trace() -> list[TraceRequest]:
    """Two minutes of light traffic, eight minutes of silence, then two more minutes."""
    return _poisson(5, 0, GAP_START_S, 1) + _poisson(5, GAP_END_S, GAP_END_S + 120, 2)


@pytest.fixture(scope="module")
def runs():
    base = with_overrides(load_replay_config(DEFAULT_REPLAY_CONFIG), startup_delay_s=STARTUP_S)
    zero = with_overrides(base, scale_to_zero_quiet_s=QUIET_S)
    out = {}
    for name, config in (("off", base), ("zero", zero)):
        world = build_world(config, _gap_trace())
        result = run_policy(world, make_policy("planner", world), trace_name="gap")
        out[name] = (world, result, summarize(result, truth=world.truth))
    return out


def test_a_wake_up_from_zero(runs) -> None:
    world, result, summary = runs["zero"]
    zero = summary["scale_to_zero"]
    assert zero["wake_ups"] == 1
    (wake,) = zero["wake_up_events"]
    # To zero once the quiet period after the last request (and its completion) had passed.
    last_before_gap = max(r.arrival_s for r in result.requests if r.arrival_s < GAP_START_S)
    assert last_before_gap + QUIET_S <= wake["zero_since_s"] <= last_before_gap + QUIET_S + 15
    # Woken by the first request after the gap, on the next 5 s tick.
    first = min((r for r in result.requests if r.arrival_s >= GAP_END_S), key=lambda r: r.arrival_s)
    assert wake["first_request_arrival_s"] == first.arrival_s
    assert first.arrival_s <= wake["at_s"] <= first.arrival_s + 5.0
    assert wake["requests_waited"] >= 1
    # Its TTFT: the wait for the tick, the start-up delay, then its own prefill.
    prefill_ms = world.truth.prefill_request_s(first.isl) * 1000.0
    ttft_ms = wake["first_request_ttft_ms"]
    assert ttft_ms == pytest.approx((first.first_token_s - first.arrival_s) * 1000.0)
    assert STARTUP_S * 1000 + prefill_ms <= ttft_ms <= (STARTUP_S + 5.0) * 1000 + prefill_ms + 1000
    assert zero["wake_up_ttft_ms"]["max"] == ttft_ms
    # Every request was served, and the silence cost nothing.
    assert summary["unfinished"] == 0
    assert zero["zero_s"] == pytest.approx(wake["at_s"] - wake["zero_since_s"])
    assert zero["gpu_hours_saved_at_zero"] == pytest.approx(zero["zero_s"] * 2 / 3600)


def test_at_zero_no_engine_is_billed_and_it_costs_less_than_off(runs) -> None:
    _, off, off_summary = runs["off"]
    _, zero, zero_summary = runs["zero"]
    assert "scale_to_zero" not in off_summary  # off: summary.json as it always was
    assert min(s.billed for s in off.timeline) >= 1
    (wake,) = zero_summary["scale_to_zero"]["wake_up_events"]
    during = [s for s in zero.timeline if wake["zero_since_s"] <= s.at_s < wake["at_s"]]
    assert during and all(s.billed == 0 for s in during)
    assert zero.gpu_hours < off.gpu_hours


def test_the_frontend_queues_requests_while_no_engine_serves() -> None:
    # The simulated frontend's gauge, which the planner wakes on: requests at the router.
    config = with_overrides(load_replay_config(DEFAULT_REPLAY_CONFIG), startup_delay_s=STARTUP_S)
    world = build_world(config, _poisson(5, 0, 10, 3))
    cluster = Cluster(
        world.truth, world.requests, initial={"prefill": 0, "decode": 0}, startup_delay_s=STARTUP_S
    )
    cluster.run_until(10.0)
    arrived = sum(1 for r in world.requests if r.arrival_s <= 10.0)
    window = FrontendCounters.window(FrontendCounters().snapshot(0.0), cluster.frontend.snapshot(10.0))
    assert window.queued_requests == arrived > 0
    assert window.inflight_requests == arrived
    cluster.set_target("prefill", 1)
    cluster.set_target("decode", 1)
    cluster.run_until(10.0 + STARTUP_S + 0.001)
    assert cluster.frontend.queued == 0


def test_the_fleet_replay_reports_the_wake_ups_of_a_deployment_that_may_scale_to_zero(
    tmp_path, capsys
) -> None:
    import json

    from app.cli import main as planner_main
    from app.config import REPO_ROOT

    profile = REPO_ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8"

    def deployment(name: str, scaling: str = "", minimum: int = 1) -> str:
        return (
            f"{{name: {name}, connector: {{type: virtual}}, sla: {{ttft_ms: 1000, itl_ms: 30}}, "
            f"profile: {profile}, prefill: {{min_replicas: {minimum}}}, decode: {{min_replicas: {minimum}}}, "
            f"scaling: {{algorithm: sla{scaling}}}}}"
        )

    (tmp_path / "fleet.yaml").write_text(
        "deployments:\n"
        f"  - {deployment('chat')}\n"
        f"  - {deployment('code', ', scale_to_zero: {enabled: true, quiet_s: 20}', minimum=0)}\n"
        "fleet:\n"
        "  budget_gpus: {h200: 6}\n"
        "  deployments: {chat: {priority: 1, guaranteed_gpus: 2}}\n"
        "simulation:\n"
        f"  startup_delay_s: {STARTUP_S:g}\n"
        "  traces:\n"
        "    chat: {workload: diurnal, rate_scale: 0.02, duration_s: 400}\n"
        "    code: {workload: bursty-gaps, rate_scale: 0.01, duration_s: 400}\n"
    )
    out = tmp_path / "out"
    code = planner_main(["replay", "--config", str(tmp_path / "fleet.yaml"), "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert "scale_to_zero" not in summary["deployments"]["chat"]
    zero = summary["deployments"]["code"]["scale_to_zero"]
    assert zero["wake_ups"] >= 1 and zero["zero_s"] > 0
    for wake in zero["wake_up_events"]:
        # The first request after a gap waits for the start-up (and one fleet step for a grant).
        assert wake["first_request_ttft_ms"] >= STARTUP_S * 1000
        assert wake["requests_waited"] >= 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "static", "--scale-to-zero", "60"], "--scale-to-zero: SLA scaling's"),
        (["--zero-return-forecast"], "--zero-return-forecast: with --scale-to-zero"),
        (["--scale-to-zero", "0"], "--scale-to-zero"),
    ],
    ids=["not-the-planner", "forecast-alone", "quiet-s-0"],
)
def test_the_replay_flags_refuse_what_cannot_scale_to_zero(tmp_path, capsys, args, message) -> None:
    from app.cli import main as planner_main

    out = tmp_path / "out"
    # argparse refuses a bad number itself (exit 2); the rest is one ConfigError line.
    with pytest.raises(SystemExit) if args[-1] == "0" else contextlib.nullcontext():
        code = planner_main(["replay", "--workload", "bursty-gaps", "--out", str(out), "--quiet", *args])
        assert code != 0
    assert message in capsys.readouterr().err

"""The simulated worlds (`--truth`, app/sim/world/truth.py): each world's latencies against the profile's
own figures, the engines and the oracle honouring them, `max_num_seqs`, unservable requests, the
configuration's errors, and a small replay per world.

Figures come from data/profiles/h200-llama3.1-8b-fp8 (the replay's default profile); a premise
taken from it is asserted first, so a changed profile shows up as a broken premise.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import numpy as np
import pytest
import yaml

from app.cli import main
from app.config import ConfigError
from app.core.perf.interpolation import PerfModel
from app.core.traces import TraceRequest
from app.sim.replay.config import DEFAULT_REPLAY_CONFIG, load_replay_config, with_overrides
from app.sim.replay.oracle import decode_capacity
from app.sim.replay.outputs import summarize, unservable_mask, unservable_requests
from app.sim.replay.run import build_world, load_models, make_policy, run_policy
from app.sim.world.engines import DecodeEngine, PrefillEngine, SimRequest
from app.sim.world.truth import PLATEAU_TOLERANCE, PREFIX_COST_MS_PER_TOKEN2, WORLDS, TruthModel
from app.sources.profile_files import load_profile

REPO_ROOT = Path(__file__).resolve().parents[2]
H200 = REPO_ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8"
MAX_KV = 945_029  # the profile's max_kv_tokens


@pytest.fixture(scope="module")
def model() -> PerfModel:
    return PerfModel.from_profile(load_profile(H200))


def _prefill_iterations(engine: PrefillEngine, requests: list[SimRequest]) -> list[tuple[int, int, float]]:
    """Run the engine dry on `requests` queued at 0: (requests, tokens, wall ms) per iteration."""
    for request in requests:
        engine.enqueue(request)
    now, out = 0.0, []
    while (end := engine.start(now)) is not None:
        last = engine.last
        assert last is not None
        out.append((last.prefill_requests, last.prefill_tokens, last.wall_time_s * 1000.0))
        engine.finish(end)
        now = end
    return out


def _decode_batches(engine: DecodeEngine, requests: list[SimRequest]) -> list[int]:
    """Run the engine dry on `requests` added at 0: the batch size of every segment."""
    for request in requests:
        engine.add(request)
    sizes = []
    end = engine.start(0.0)
    while end is not None:
        sizes.append(engine.batch_size)
        _, end = engine.finish(end)
    return sizes


# --- profile: today's truth, bit for bit ----------------------------------------------------------


def test_the_profile_world_is_the_old_truth_bit_for_bit(model: PerfModel) -> None:
    truth = TruthModel(model, scale=1.2, world="profile")
    assert truth.world == ("profile",)
    assert truth.max_num_seqs is None and not truth.one_prompt and truth.prefix_cost_s_per_token2 == 0.0
    # The old tables, as the old TruthModel built them.
    old_prefill = (model.prefill.ttft_ms_many(np.arange(8193)) * 1.2 / 1000.0).tolist()
    old_grid = (model.decode.itl_grid_ms * 1.2 / 1000.0).tolist()
    step = float(model.decode.context_axis[1] - model.decode.context_axis[0])
    assert [truth.prefill_iteration_s(n, 1e9) for n in range(8193)] == old_prefill  # prefix ignored
    assert truth.prefill_request_s(85_000) == 10 * old_prefill[8192] + old_prefill[3080]
    rng = random.Random(0)
    for _ in range(2000):
        n = rng.randint(1, 3000)
        total = n * rng.uniform(50, 20_000)
        ix, iy = int(total / MAX_KV * 99 + 0.5), int(total / n / step + 0.5)
        assert truth.decode_iteration_s(total, n) == old_grid[min(iy, 99)][min(ix, 99)]


def _trace() -> list[TraceRequest]:
    """400 requests over ~270 s: short and medium prompts, four of 40,000 tokens (servable in
    the profile, not with the prefix cost) and four of 60,000 (servable nowhere at 1 s TTFT)."""
    rng = random.Random(7)
    t, out = 0.0, []
    for i in range(400):
        t += rng.expovariate(1.5)
        if i % 100 == 50:
            isl = 60_000
        elif i % 100 == 25:
            isl = 40_000
        else:
            isl = rng.choice((300, 1000, 3000, 9000))
        out.append(TraceRequest(t, isl, rng.randint(20, 300)))
    return out


def _world(truth: str):
    config = with_overrides(load_replay_config(DEFAULT_REPLAY_CONFIG), startup_delay_s=30, truth=truth)
    return build_world(config, _trace())


def test_the_profile_world_replays_exactly_as_before() -> None:
    # Figures of the commit before the worlds existed (same trace, same configuration).
    world = _world("profile")
    assert world.oracle.demand == {"prefill": [1, 2, 2, 2, 1], "decode": [1, 1, 1, 1, 1]}
    assert world.oracle.gpu_hours == 0.22499999999999998
    result = run_policy(world, make_policy("oracle", world), trace_name="t")
    assert sum(r.first_token_s for r in result.requests) == 49442.17140683815
    assert sum(r.finish_s for r in result.requests) == 49746.091092224524
    assert result.gpu_hours == 0.1950370478698357
    assert result.end_s == 246.06668616570425


# --- smooth --------------------------------------------------------------------------------------


def test_smooth_is_the_least_squares_fit_of_the_measured_points(model: PerfModel) -> None:
    truth = TruthModel(model, world="smooth")
    p = model.prefill.data
    n = p.isl_tokens
    # Every coefficient comes out positive, so the non-negative fit is the plain least squares.
    expected = np.linalg.lstsq(np.column_stack([np.ones_like(n), n, n * n]), p.ttft_ms, rcond=None)[0]
    assert truth.smooth_prefill_ms == pytest.approx(expected, rel=1e-6)
    a, b, c = truth.smooth_prefill_ms
    assert truth.prefill_iteration_s(8192) * 1000 == pytest.approx(a + b * 8192 + c * 8192**2)
    assert truth.prefill_iteration_s(8192) * 1000 == pytest.approx(169.2, abs=0.1)  # the profile: 170.0

    d = model.decode.data
    kv = d.kv_usage * d.max_kv_tokens
    batch = kv / d.context_tokens
    expected = np.linalg.lstsq(np.column_stack([np.ones_like(kv), batch, kv]), d.itl_ms, rcond=None)[0]
    assert truth.smooth_decode_ms == pytest.approx(expected, rel=1e-6)
    a, b, c = truth.smooth_decode_ms
    assert truth.decode_iteration_s(1000 * 350, 1000) * 1000 == pytest.approx(a + b * 1000 + c * 350_000)


def test_smooth_decode_keeps_rising_where_the_profile_levels_off(model: PerfModel) -> None:
    profile, smooth = TruthModel(model), TruthModel(model, world="smooth")
    # Context 350: the profile's ITL tops out at 46.0 ms near 1,000 requests and is 42.6 ms from
    # 1,600 on (its grid is filled flat past the measured points).
    assert profile.decode_iteration_s(1600 * 350, 1600) * 1000 == pytest.approx(42.58, abs=0.01)
    assert profile.decode_iteration_s(2600 * 350, 2600) == profile.decode_iteration_s(1600 * 350, 1600)
    assert smooth.decode_iteration_s(1600 * 350, 1600) * 1000 == pytest.approx(55.04, abs=0.01)
    assert smooth.decode_iteration_s(2600 * 350, 2600) * 1000 == pytest.approx(85.64, abs=0.01)


# --- one-prompt ----------------------------------------------------------------------------------


def test_one_prompt_computes_two_queued_prompts_in_two_iterations(model: PerfModel) -> None:
    ttft_1000_ms = model.prefill.ttft_ms(1000)
    ttft_2000_ms = model.prefill.ttft_ms(2000)
    one = _prefill_iterations(
        PrefillEngine("p", TruthModel(model, world="one-prompt")),
        [SimRequest(i, 0.0, 1000, 10) for i in range(2)],
    )
    assert one == [(1, 1000, pytest.approx(ttft_1000_ms)), (1, 1000, pytest.approx(ttft_1000_ms))]
    packed = _prefill_iterations(
        PrefillEngine("p", TruthModel(model)), [SimRequest(i, 0.0, 1000, 10) for i in range(2)]
    )
    assert packed == [(2, 2000, pytest.approx(ttft_2000_ms))]


def test_one_prompt_still_chunks_a_long_prompt_and_packs_nothing_behind_it(model: PerfModel) -> None:
    requests = [SimRequest(0, 0.0, 20_000, 10), SimRequest(1, 0.0, 500, 10)]
    one = _prefill_iterations(PrefillEngine("p", TruthModel(model, world="one-prompt")), requests)
    assert [(n, tokens) for n, tokens, _ in one] == [(1, 8192), (1, 8192), (1, 3616), (1, 500)]
    requests = [SimRequest(0, 0.0, 20_000, 10), SimRequest(1, 0.0, 500, 10)]
    packed = _prefill_iterations(PrefillEngine("p", TruthModel(model)), requests)
    assert [(n, tokens) for n, tokens, _ in packed] == [(1, 8192), (1, 8192), (2, 4116)]


# --- prefix-cost ---------------------------------------------------------------------------------


def test_prefix_cost_makes_the_last_chunk_of_an_85k_prompt_take_717_ms(model: PerfModel) -> None:
    assert model.prefill.ttft_ms(8192) == pytest.approx(169.99, abs=0.01)  # the premise
    k_ms = PREFIX_COST_MS_PER_TOKEN2
    assert k_ms == pytest.approx(8.580e-7, rel=1e-4)
    fpm = []
    engine = PrefillEngine("p", TruthModel(model, world="prefix-cost"), on_fpm=fpm.append)
    chunks = _prefill_iterations(engine, [SimRequest(0, 0.0, 85_000, 10)])
    assert [tokens for _, tokens, _ in chunks] == [8192] * 10 + [3080]
    # The 10th chunk follows a prefix of 73,728 tokens: 169.99 + k × 8,192 × (73,728 + 4,096).
    assert chunks[9][2] == pytest.approx(717.0, abs=0.05)
    # The first has no prefix, only its own tokens' k × 8,192²/2 (28.8 ms on 170.0).
    assert chunks[0][2] == pytest.approx(model.prefill.ttft_ms(8192) + k_ms * 8192 * 4096)
    assert chunks[0][2] == pytest.approx(198.78, abs=0.01)
    assert chunks[10][2] == pytest.approx(model.prefill.ttft_ms(3080) + k_ms * 3080 * (81_920 + 1540))
    # The records still report the prefix computed before each chunk.
    assert [r.scheduled.sum_prefill_kv_tokens for r in fpm] == [8192 * i for i in range(11)]
    # Alone on an idle engine: the chunks' sum, which is the profile's plus k × ISL² / 2.
    truth = engine.truth
    assert truth.prefill_request_s(85_000) * 1000 == pytest.approx(sum(ms for _, _, ms in chunks), rel=1e-12)
    assert truth.prefill_request_s(85_000) * 1000 == pytest.approx(
        TruthModel(model).prefill_request_s(85_000) * 1000 + k_ms * 85_000**2 / 2
    )


def test_prefix_cost_barely_touches_a_short_first_chunk(model: PerfModel) -> None:
    chunks = _prefill_iterations(
        PrefillEngine("p", TruthModel(model, world="prefix-cost")), [SimRequest(0, 0.0, 1000, 10)]
    )
    assert chunks == [(1, 1000, pytest.approx(model.prefill.ttft_ms(1000) + 0.429, abs=0.001))]


def test_prefix_cost_is_charged_per_request_of_a_packed_chunk(model: PerfModel) -> None:
    # 9,000 then 1,000 tokens: chunk 2 holds the first's last 808 (after 8,192) and the second's 1,000.
    truth = TruthModel(model, world="prefix-cost", scale=2.0)
    chunks = _prefill_iterations(
        PrefillEngine("p", truth), [SimRequest(0, 0.0, 9000, 10), SimRequest(1, 0.0, 1000, 10)]
    )
    k2 = PREFIX_COST_MS_PER_TOKEN2 * 2.0  # the truth scale multiplies the prefix cost too
    expected = 2.0 * model.prefill.ttft_ms(1808) + k2 * (808 * (8192 + 404) + 1000 * 500)
    assert chunks[1] == (2, 1808, pytest.approx(expected))


# --- rising-decode and max_num_seqs --------------------------------------------------------------


def test_rising_decode_keeps_rising_past_the_profiles_plateau(model: PerfModel) -> None:
    profile, rising = TruthModel(model), TruthModel(model, world="rising-decode")
    itl_ms = [rising.decode_iteration_s(n * 350, n) * 1000 for n in range(1600, 2700, 100)]
    assert all(b > a for a, b in zip(itl_ms, itl_ms[1:], strict=False))
    assert itl_ms[0] > 42.6 and itl_ms[-1] > 100
    # Below the knee the surface is the profile's.
    assert rising.decode_iteration_s(256 * 350, 256) == profile.decode_iteration_s(256 * 350, 256)
    # The documented construction on the grid's row of context 412 (2,300 requests of ~410
    # tokens fill the KV): its knee is the first cell within 0.1% of the row's maximum (46.0 ms
    # at cell 37), then the mean slope below it, (46.0 - 4.4) / 37 ms a cell, on to cell 99.
    assert model.decode.context_axis[3] == pytest.approx(411.67, abs=0.01)
    row = model.decode.itl_grid_ms[3]
    knee = int(np.argmax(row >= row.max() * (1 - PLATEAU_TOLERANCE)))
    assert (knee, round(float(row[knee]), 1), round(float(row[0]), 1)) == (37, 46.0, 4.4)
    expected_ms = row[knee] + (row[knee] - row[0]) / knee * (99 - knee)
    assert rising.decode_iteration_s(MAX_KV * 0.999, 2300) * 1000 == pytest.approx(expected_ms)
    assert expected_ms == pytest.approx(115.87, abs=0.01)
    assert profile.decode_iteration_s(MAX_KV * 0.999, 2300) * 1000 == pytest.approx(42.58, abs=0.01)


def test_rising_decode_keeps_rising_past_the_profiles_capacity(model: PerfModel) -> None:
    # Engines with twice the profile's KV: past usage 1 of the profile's grid the line goes on.
    rising = TruthModel(model, world="rising-decode", max_kv_tokens=2 * MAX_KV)
    assert rising.decode_iteration_s(1.5 * MAX_KV, 4000) > rising.decode_iteration_s(1.0 * MAX_KV, 4000)


def test_rising_decode_engines_schedule_at_most_256(model: PerfModel) -> None:
    truth = TruthModel(model, world="rising-decode")
    assert truth.max_num_seqs == 256
    sizes = _decode_batches(
        DecodeEngine("d", truth), [SimRequest(i, 0.0, 100, 10 + i % 7) for i in range(300)]
    )
    assert max(sizes) == 256
    assert sizes[0] == 256
    # The deployment's own cap wins.
    assert TruthModel(model, world="rising-decode", max_num_seqs=512).max_num_seqs == 512


def test_a_deployments_max_num_seqs_caps_the_batch_in_the_profile_world(model: PerfModel) -> None:
    truth = TruthModel(model, max_num_seqs=8)
    sizes = _decode_batches(DecodeEngine("d", truth), [SimRequest(i, 0.0, 1000, 20 + i) for i in range(20)])
    assert sizes[0] == 8 and max(sizes) == 8
    uncapped = DecodeEngine("d", TruthModel(model))
    assert max(_decode_batches(uncapped, [SimRequest(i, 0.0, 1000, 20 + i) for i in range(20)])) == 20


def test_a_request_joining_a_full_batch_waits_without_splitting_the_segment(model: PerfModel) -> None:
    engine = DecodeEngine("d", TruthModel(model, max_num_seqs=2))
    for i in range(2):
        engine.add(SimRequest(i, 0.0, 1000, 50))
    end = engine.start(0.0)
    version = engine.version
    late = SimRequest(2, 0.0, 1000, 50)
    engine.add(late)
    assert engine.join(end / 2) is None  # the segment runs on to its planned end
    assert engine.version == version and engine.batch_size == 2
    done, following = engine.finish(end)
    assert [r.id for r in done] == [0, 1]
    assert late.decode_start_s == end and engine.batch_size == 1 and following is not None


def test_the_oracles_decode_capacity_respects_max_num_seqs(model: PerfModel) -> None:
    # ISL 200, OSL 100 at 30 ms: the profile's batch meeting the target is 553 requests.
    assert decode_capacity(TruthModel(model), 200, 100, 30) == 553
    assert decode_capacity(TruthModel(model, max_num_seqs=100), 200, 100, 30) == 100
    assert decode_capacity(TruthModel(model, world="rising-decode"), 200, 100, 30) == 256
    # A cap above what the ITL allows changes nothing.
    assert decode_capacity(TruthModel(model, max_num_seqs=1000), 200, 100, 30) == 553


def test_load_models_takes_the_deployments_max_num_seqs() -> None:
    config = load_replay_config(DEFAULT_REPLAY_CONFIG)
    assert load_models(config)[1].max_num_seqs is None
    d = config.deployment
    capped = dataclasses.replace(
        config, deployment=d.model_copy(update={"decode": d.decode.model_copy(update={"max_num_seqs": 64})})
    )
    truth = load_models(with_overrides(capped, truth="rising-decode"))[1]
    assert (truth.world, truth.max_num_seqs) == (("rising-decode",), 64)


# --- unservable requests -------------------------------------------------------------------------


def test_unservable_requests_are_those_too_slow_even_alone(model: PerfModel) -> None:
    requests = [
        SimRequest(0, 0.0, 1000, 100),
        SimRequest(1, 0.0, 40_000, 100),  # 824 ms alone in the profile, 1,510 ms with the prefix cost
        SimRequest(2, 0.0, 60_000, 1),  # 1,245 ms alone: too slow everywhere (and no decode)
        SimRequest(3, 0.0, 1000, 100),
    ]
    profile, prefix = TruthModel(model), TruthModel(model, world="prefix-cost")
    assert profile.prefill_request_s(40_000) * 1000 == pytest.approx(823.6, abs=0.1)
    assert prefix.prefill_request_s(40_000) * 1000 == pytest.approx(1510.0, abs=0.1)
    assert profile.prefill_request_s(60_000) * 1000 == pytest.approx(1245.4, abs=0.1)
    assert unservable_requests(requests, profile, ttft_target_ms=1000, itl_target_ms=30) == 1
    assert unservable_requests(requests, prefix, ttft_target_ms=1000, itl_target_ms=30) == 2
    # Decode alone: batch 1 at ISL 1,000 takes 4.4 ms a token, above a 4 ms target.
    assert profile.decode_iteration_s(1000 + 1 + 99 / 2, 1) * 1000 == pytest.approx(4.4, abs=0.05)
    assert unservable_requests(requests, profile, ttft_target_ms=2000, itl_target_ms=4.0) == 3
    # Per request, in order: the 40k prompt only where its prefix costs.
    masks = [
        unservable_mask(requests, t, ttft_target_ms=1000, itl_target_ms=30).tolist()
        for t in (profile, prefix)
    ]
    assert masks == [[False, False, True, False], [False, True, True, False]]


# --- configuration -------------------------------------------------------------------------------


def test_an_unknown_world_in_the_file_is_one_line_naming_the_field(tmp_path: Path) -> None:
    raw = yaml.safe_load(DEFAULT_REPLAY_CONFIG.read_text())
    raw["simulation"]["truth"] = "one-prompt,bogus"
    path = tmp_path / "replay.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as caught:
        load_replay_config(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: simulation.truth: ")
    assert "unknown world 'bogus'" in message


def test_worlds_combine_with_commas_in_the_file_and_on_the_command_line(tmp_path: Path) -> None:
    raw = yaml.safe_load(DEFAULT_REPLAY_CONFIG.read_text())
    raw["simulation"]["truth"] = " one-prompt, prefix-cost"
    path = tmp_path / "replay.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert load_replay_config(path).simulation.truth == "one-prompt,prefix-cost"
    config = load_replay_config(DEFAULT_REPLAY_CONFIG)
    assert config.simulation.truth == "profile"
    assert with_overrides(config, truth="smooth,rising-decode").simulation.truth == "smooth,rising-decode"
    with pytest.raises(ConfigError, match=r"^--truth: unknown world 'flat' \(choose from profile, smooth"):
        with_overrides(config, truth="flat")
    assert set(WORLDS) == {"profile", "smooth", "one-prompt", "prefix-cost", "rising-decode"}


def _mooncake(path: Path, isls: list[int]) -> Path:
    path.write_text(
        "".join(
            json.dumps({"timestamp": 400 * i, "input_length": isl, "output_length": 50}) + "\n"
            for i, isl in enumerate(isls)
        )
    )
    return path


def test_the_replay_command_takes_truth_and_reports_unservable_requests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _mooncake(tmp_path / "t.jsonl", [1000] * 30 + [40_000] * 2)
    code = main(["replay", "--trace", str(trace), "--out", str(tmp_path / "bad"), "--truth", "bogus"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert err.startswith("planner: error: --truth: unknown world 'bogus'")

    out = tmp_path / "out"
    flags = ["--policy", "oracle", "--truth", "prefix-cost"]
    assert main(["replay", "--trace", str(trace), "--out", str(out), *flags]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["truth"], summary["unservable_requests"]) == ("prefix-cost", 2)
    assert "<th>Unservable requests</th><td>2</td>" in (out / "report.html").read_text()


# --- a small replay per world --------------------------------------------------------------------


@pytest.mark.parametrize("truth", [*WORLDS, "one-prompt,prefix-cost"])
def test_a_small_replay_completes_in_every_world(truth: str) -> None:
    world = _world(truth)
    assert world.truth.world == tuple(truth.split(","))
    demand = world.oracle.demand
    assert len(demand["prefill"]) == len(demand["decode"]) == 5  # the last arrival is at 268 s
    assert world.oracle.gpu_hours == pytest.approx(sum(s.gpu_hours for s in world.oracle.schedule.values()))
    for policy in ("planner", "oracle"):
        result = run_policy(world, make_policy(policy, world), trace_name="t")
        summary = summarize(result, truth=world.truth)
        assert summary["completed"] == 400
        assert summary["oracle_gpu_hours"] == world.oracle.gpu_hours
        assert summary["truth"] == truth
        # The four 60,000-token prompts are too slow alone everywhere; the 40,000-token ones
        # only with the prefix cost.
        assert summary["unservable_requests"] == (8 if "prefix-cost" in truth else 4)


def test_the_oracle_needs_more_prefill_with_the_prefix_cost() -> None:
    profile, prefix = _world("profile"), _world("prefix-cost")
    assert prefix.oracle.demand["prefill"] == [3, 2, 2, 3, 1]
    assert profile.oracle.demand["prefill"] == [1, 2, 2, 2, 1]
    assert prefix.oracle.gpu_hours > profile.oracle.gpu_hours

"""Hardware variants (app/core/fleet/variants.py) in the fleet step: the cheapest per unit of
SLA-meeting capacity grown first, the next variant when its GPU type's budget is used up, the
dearest shrunk first, a cut naming the GPU type; capacities read by the SLA core's formulas; the
configuration's errors. Expectations are computed by hand in each test's comment."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config import ConfigError, validate_deployments
from app.core.fleet.step import FleetMember, FleetSettings, FleetState, GrantReason, fleet_step
from app.core.fleet.variants import Variant, engine_capacity, split_wish, variant_key
from app.core.perf.interpolation import PerfModel
from app.core.sla.capacity import LengthMix, decode_batch_limit, prefill_engines
from app.core.sla.latency import prior_models
from app.core.sla.settings import SlaModel
from app.fleet_hardware import load_variants, scaled_profile
from app.sources.profile_files import load_profile

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8"

# The primary ("own", type a): 1 GPU per engine, 10,000 prompt tokens/s and 40 decode requests
# per engine, at 4 per GPU-hour: 4e-4 per token/s of prefill, 0.1 per decode request.
OWN = Variant("own", "a", {"prefill": 1, "decode": 1}, {"prefill": 10_000.0, "decode": 40.0}, 4.0)
# The cheap one ("big", type b): 2 GPUs per engine, 25,000 tokens/s and 100 requests, at 1.5:
# 1.5 × 2 / 25,000 = 1.2e-4 per token/s, 3 / 100 = 0.03 per request: cheaper on both roles.
BIG = Variant("big", "b", {"prefill": 2, "decode": 2}, {"prefill": 25_000.0, "decode": 100.0}, 1.5)


def deployment(name="x", wish=None, *, priority=0, guaranteed=0, max_gpus=None, variants=(OWN, BIG)):
    wish = wish or {"prefill": 3, "decode": 2}
    return FleetMember(
        name=name,
        gpu_type=variants[0].gpu_type if variants else "a",
        priority=priority,
        guaranteed_gpus=guaranteed,
        max_gpus=max_gpus,
        gpus_per_engine={"prefill": 1, "decode": 1},
        wish=wish,
        variants=tuple(variants),
    )


def engines(decision, name, variant):
    return dict(decision.grants[variant_key(name, variant)].engines)


def test_cost_per_unit_is_price_times_gpus_over_capacity():
    assert OWN.cost_per_unit("prefill") == pytest.approx(4.0 / 10_000)
    assert BIG.cost_per_unit("prefill") == pytest.approx(1.5 * 2 / 25_000)
    assert BIG.cost_per_unit("decode") == pytest.approx(0.03)


def test_the_cheapest_variant_grown_first():
    # Wish 3 prefill + 2 decode engines of `own` = 30,000 tokens/s and 80 requests. `big` is
    # cheaper per unit: ceil(30,000 / 25,000) = 2 prefill and ceil(80 / 100) = 1 decode engines
    # of big (6 GPUs of b), none of own.
    d = fleet_step([deployment()], FleetSettings({"a": 10, "b": 10}), FleetState(), 0.0)
    assert engines(d, "x", "big") == {"prefill": 2, "decode": 1}
    assert engines(d, "x", "own") == {"prefill": 0, "decode": 0}
    assert d.free_gpus == {"a": 10, "b": 4}
    grant = d.grants["x@big"]
    assert (grant.deployment, grant.variant, grant.gpu_type) == ("x", "big", "b")
    assert grant.as_dict()["variant"] == "big"
    assert set(d.of_deployment("x")) == {"own", "big"}


def test_the_next_variant_when_the_cheap_type_is_used_up():
    # b holds 2 GPUs: one prefill engine of big (25,000 tokens/s); the 5,000 left need
    # ceil(5,000 / 10,000) = 1 own engine; decode finds no room in b: ceil(80 / 40) = 2 own.
    d = fleet_step([deployment()], FleetSettings({"a": 10, "b": 2}), FleetState(), 0.0)
    assert engines(d, "x", "big") == {"prefill": 1, "decode": 0}
    assert engines(d, "x", "own") == {"prefill": 1, "decode": 2}
    assert all(r.reason == GrantReason.WISH_MET for g in d.grants.values() for r in g.roles.values())


def test_a_higher_priority_holding_the_cheap_type_sends_a_lower_one_to_the_next():
    # `hog` (priority 5, type b, no variants) wishes 4 of b's 6 GPUs: x may expect 2 of b, so
    # 1 big prefill engine, the rest on own: 1 prefill, 2 decode (as above).
    hog = FleetMember("hog", "b", 5, 0, None, {"decode": 1}, {"decode": 4})
    d = fleet_step([hog, deployment()], FleetSettings({"a": 10, "b": 6}), FleetState(), 0.0)
    assert dict(d.grants["hog"].engines) == {"decode": 4}
    assert engines(d, "x", "big") == {"prefill": 1, "decode": 0}
    assert engines(d, "x", "own") == {"prefill": 1, "decode": 2}


def test_an_equal_priority_keeps_what_it_holds_a_lower_one_only_its_guarantee():
    # b has 10 GPUs. `peer` (equal priority) holds 8 and wishes 8: moves between equals need the
    # value rule and the hold, so x expects 10 - 8 = 2 GPUs of b: 1 big prefill engine, the rest
    # on own (1 prefill, 2 decode), as when b has 2 GPUs.
    peer = FleetMember("peer", "b", 0, 0, None, {"decode": 1}, {"decode": 8})
    held = FleetState(grants={"peer": {"decode": 8}}, changed_s={"peer": {"decode": 0.0}})
    d = fleet_step([peer, deployment()], FleetSettings({"a": 10, "b": 10}), held, 500.0)
    assert engines(d, "x", "big") == {"prefill": 1, "decode": 0}
    assert engines(d, "x", "own") == {"prefill": 1, "decode": 2}
    assert dict(d.grants["peer"].engines) == {"decode": 8}
    # `low` (priority -1, guarantee 2) holds the same 8: x may take all but its guarantee at once,
    # 10 - 2 = 8 >= the 6 GPUs of 2 big prefill + 1 big decode; low keeps 10 - 6 = 4.
    low = FleetMember("low", "b", -1, 2, None, {"decode": 1}, {"decode": 8})
    held = FleetState(grants={"low": {"decode": 8}}, changed_s={"low": {"decode": 0.0}})
    d = fleet_step([low, deployment()], FleetSettings({"a": 10, "b": 10}), held, 500.0)
    assert engines(d, "x", "big") == {"prefill": 2, "decode": 1}
    assert engines(d, "x", "own") == {"prefill": 0, "decode": 0}
    assert dict(d.grants["low"].engines) == {"decode": 4}


def test_shrinking_removes_the_dearest_first():
    # Held: big 2 prefill + 1 decode, own 1 prefill + 2 decode (60,000 tokens/s, 180 requests).
    # The wish falls to 3 prefill (30,000) and 1 decode (40). Prefill: own's engine goes first
    # (50,000 left >= 30,000), then big's second would leave 25,000 < 30,000: it stays. Decode:
    # both own engines go (100 left), big's would leave 0 < 40: it stays.
    previous = FleetState(
        grants={"x@big": {"prefill": 2, "decode": 1}, "x@own": {"prefill": 1, "decode": 2}},
        changed_s={"x@big": {"prefill": 0.0, "decode": 0.0}, "x@own": {"prefill": 0.0, "decode": 0.0}},
    )
    member = deployment(wish={"prefill": 3, "decode": 1})
    d = fleet_step([member], FleetSettings({"a": 10, "b": 10}), previous, 500.0)
    assert engines(d, "x", "own") == {"prefill": 0, "decode": 0}
    assert engines(d, "x", "big") == {"prefill": 2, "decode": 1}
    assert d.grants["x@own"].changed and not d.grants["x@big"].changed


def test_kept_dear_engines_are_not_swapped_for_cheap_ones():
    # Held: own 3 prefill (30,000 tokens/s) for a wish of 3: covered, nothing moves even though
    # b has room (a swap would restart engines to save money; the dear ones go at the next shrink).
    previous = FleetState(grants={"x@own": {"prefill": 3}, "x@big": {"prefill": 0}})
    member = deployment(wish={"prefill": 3})
    d = fleet_step([member], FleetSettings({"a": 10, "b": 10}), previous, 500.0)
    assert engines(d, "x", "own") == {"prefill": 3}
    assert engines(d, "x", "big") == {"prefill": 0}


def test_a_cut_names_the_variants_gpu_type():
    # Both types are held by higher priorities (b: 4 of 4, a: 10 of 10): no variant has room, so
    # the cheapest (big) asks for all of it, 2 prefill + 1 decode, and is cut by b's budget.
    hog_b = FleetMember("hog-b", "b", 5, 0, None, {"decode": 1}, {"decode": 4})
    hog_a = FleetMember("hog-a", "a", 5, 0, None, {"decode": 1}, {"decode": 10})
    d = fleet_step([hog_b, hog_a, deployment()], FleetSettings({"a": 10, "b": 4}), FleetState(), 0.0)
    cut = d.grants["x@big"]
    assert cut.engines == {"prefill": 0, "decode": 0}
    assert cut.roles["prefill"].reason == GrantReason.CUT_BUDGET
    assert "the b budget is held" in cut.roles["prefill"].detail
    assert [c.by for c in cut.cut_by] == ["hog-b"]
    assert engines(d, "x", "own") == {"prefill": 0, "decode": 0}


def test_the_max_share_bounds_all_variants_together():
    # max_gpus 4: the split gives big its 2 prefill engines (4 GPUs); decode fits nowhere within
    # the share, so big (the cheapest) asks for ceil(80 / 100) = 1 more and big wishes 2 + 1
    # engines, 6 GPUs. The fleet step then fills big within 4 GPUs, the role with the lowest
    # share of its wish first: prefill (0/2, listed first), decode (0/1), then prefill would be
    # 6 GPUs: 1 + 1, prefill cut by the max share.
    d = fleet_step([deployment(max_gpus=4)], FleetSettings({"a": 10, "b": 10}), FleetState(), 0.0)
    assert engines(d, "x", "big") == {"prefill": 1, "decode": 1}
    assert d.grants["x@big"].roles["prefill"].reason == GrantReason.CUT_MAX_SHARE
    assert engines(d, "x", "own") == {"prefill": 0, "decode": 0}


def test_the_guarantee_belongs_to_the_primary():
    d = fleet_step([deployment(guaranteed=2)], FleetSettings({"a": 10, "b": 10}), FleetState(), 0.0)
    assert d.grants["x@own"].guaranteed_gpus == 0  # own wishes nothing: the split put it on big
    assert d.grants["x@big"].guaranteed_gpus == 0


def test_members_without_variants_are_unchanged_by_a_member_with_them():
    plain = FleetMember("plain", "a", 1, 0, None, {"decode": 1}, {"decode": 3})
    alone = fleet_step([plain], FleetSettings({"a": 10, "b": 10}), FleetState(), 0.0)
    mixed = fleet_step([plain, deployment()], FleetSettings({"a": 10, "b": 10}), FleetState(), 0.0)
    assert alone.grants["plain"].as_dict() == mixed.grants["plain"].as_dict()
    assert "variant" not in alone.grants["plain"].as_dict()


def test_split_wish_covers_the_need_with_whole_engines():
    # Exactly 25,000 tokens/s (2.5 own engines... the wish is whole: 5 own = 50,000) on big:
    # 50,000 / 25,000 = 2 engines, not 3 (no rounding up of an exact fit).
    out = split_wish((OWN, BIG), {"prefill": 5}, {}, {"a": 10, "b": 10})
    assert out == {"own": {"prefill": 0}, "big": {"prefill": 2}}


# --- capacity from a profile, by the SLA core's formulas -------------------------------------------


@pytest.fixture(scope="module")
def model():
    return PerfModel.from_profile(load_profile(PROFILE))


def _cost(m, chunk=8192):
    t = SlaModel()
    return prior_models(
        m,
        chunk_tokens=chunk,
        prior_records=t.latency_prior_records,
        half_life_s=t.latency_half_life_s,
    )


def test_prefill_capacity_is_the_most_one_engine_serves_on_time(model):
    capacity = engine_capacity(
        model, ttft_target_ms=1000, itl_target_ms=30, isl_tokens=3000, osl_tokens=150, chunk_tokens=8192
    )
    cost = _cost(model).prefill

    def one(rate):
        return prefill_engines(
            cost, token_rate_s=rate, mix=LengthMix.uniform(3000), ttft_target_ms=1000, max_engines=1
        )

    assert one(capacity["prefill"]).engines == 1 and one(capacity["prefill"]).meets_target
    assert not one(capacity["prefill"] * 1.01).meets_target or one(capacity["prefill"] * 1.01).engines > 1
    batch = decode_batch_limit(
        _cost(model).decode,
        isl_tokens=3000,
        osl_tokens=150,
        itl_target_ms=30,
        max_kv_tokens=model.decode.data.max_kv_tokens,
    )
    assert capacity["decode"] == batch


def test_a_slower_profile_has_less_capacity(model):
    kw = dict(ttft_target_ms=1000, itl_target_ms=30, isl_tokens=3000, osl_tokens=150, chunk_tokens=8192)
    fast = engine_capacity(model, **kw)
    slow = engine_capacity(PerfModel.from_profile(scaled_profile(load_profile(PROFILE), 1.6)), **kw)
    assert slow["prefill"] < fast["prefill"] and slow["decode"] < fast["decode"]


# --- configuration ------------------------------------------------------------------------------


def fleet_file(variants, *, budget=None, gpu_type="h200", profile=str(PROFILE)):
    return {
        "deployments": [
            {
                "name": "chat",
                "connector": {"type": "virtual"},
                "sla": {"ttft_ms": 1000, "itl_ms": 30},
                "profile": profile,
                "prefill": {"gpus_per_engine": 1},
                "decode": {"gpus_per_engine": 1},
            }
        ],
        "fleet": {
            "budget_gpus": budget or {"h200": 8, "h100": 8},
            "deployments": {"chat": {"gpu_type": gpu_type, "variants": variants}},
        },
    }


OWN_CFG = {"name": "h200-tp1", "gpu_type": "h200", "price_per_gpu_hour": 3.5}
SLOW_CFG = {"name": "h100-tp1", "gpu_type": "h100", "latency_scale": 1.6, "price_per_gpu_hour": 2.0}


@pytest.mark.parametrize(
    ("variants", "message"),
    [
        (
            [OWN_CFG, {**SLOW_CFG, "gpu_type": "a100"}],
            "fleet.deployments.chat.variants.1.gpu_type: 'a100' has no budget",
        ),
        (
            [{**OWN_CFG, "gpu_type": "h100"}, SLOW_CFG],
            "variants.0.gpu_type: 'h100', but the deployment's gpu_type is 'h200'",
        ),
        ([{**OWN_CFG, "gpus_per_engine": {"decode": 2}}], "variants.0.gpus_per_engine"),
        (
            [OWN_CFG, {**SLOW_CFG, "gpus_per_engine": {"workers": 2}}],
            "variants.1.gpus_per_engine: workers is not a role",
        ),
        ([OWN_CFG, {**SLOW_CFG, "name": "h200-tp1"}], "variants.1.name: 'h200-tp1' appears twice"),
        ([OWN_CFG, {k: v for k, v in SLOW_CFG.items() if k != "price_per_gpu_hour"}], "price_per_gpu_hour"),
        ([OWN_CFG, {**SLOW_CFG, "price_per_gpu_hour": 0}], "price_per_gpu_hour"),
        ([{**OWN_CFG, "latency_scale": 2}], "variants.0.latency_scale"),
        ([OWN_CFG, {**SLOW_CFG, "speed": 2}], "speed"),
    ],
    ids=[
        "unknown-gpu-type",
        "primary-type",
        "primary-gpus",
        "unknown-role",
        "twice",
        "no-price",
        "zero-price",
        "primary-scaled",
        "unknown-key",
    ],
)
def test_config_errors_name_the_field(variants, message):
    with pytest.raises(ConfigError, match=None) as info:
        validate_deployments(fleet_file(variants), "fleet.yaml")
    assert message in str(info.value)


def test_a_missing_profile_directory_is_named(tmp_path):
    file = validate_deployments(fleet_file([OWN_CFG, {**SLOW_CFG, "profile": "nowhere"}]), "fleet.yaml")
    with pytest.raises(
        ConfigError, match=r"fleet.deployments.chat.variants.1.profile: 'nowhere' is not a directory"
    ):
        load_variants(file.deployments[0], file.fleet.member("chat"), tmp_path)


def test_variants_load_with_capacities_and_gpus():
    file = validate_deployments(
        fleet_file([OWN_CFG, {**SLOW_CFG, "gpus_per_engine": {"prefill": 2}}]), "fleet.yaml"
    )
    own, slow = load_variants(file.deployments[0], file.fleet.member("chat"), ROOT)
    assert (own.name, own.gpu_type, own.gpus_per_engine) == ("h200-tp1", "h200", {"prefill": 1, "decode": 1})
    assert (slow.name, slow.gpu_type, slow.gpus_per_engine) == (
        "h100-tp1",
        "h100",
        {"prefill": 2, "decode": 1},
    )
    assert slow.capacity["prefill"] < own.capacity["prefill"]
    assert slow.price_per_gpu_hour == 2.0


# --- the replay: variant engines on their own profile's latencies ------------------------------


def test_a_variant_cluster_runs_each_variant_on_its_own_truth():
    from app.sim.fleet.variant_cluster import VariantCluster
    from app.sim.world.truth import TruthModel

    fast = TruthModel(PerfModel.from_profile(load_profile(PROFILE)))
    slow = TruthModel(PerfModel.from_profile(scaled_profile(load_profile(PROFILE), 2.0)))
    # own: 10,000 tokens/s and 40 requests per engine; big: 25,000 and 100 (2.5 own engines).
    cluster = VariantCluster(
        (OWN, BIG), {"own": fast, "big": slow}, [], initial={"prefill": 1, "decode": 1}, startup_delay_s=0.0
    )
    assert cluster.ready_counts() == {"prefill": 1, "decode": 1}
    # The grant: 1 own + 2 big prefill = 1 + 5 = 6 own-equivalents; decode 1 big = 2 (2.5 floored).
    caps = cluster.set_grant({"prefill": {"own": 1, "big": 2}, "decode": {"own": 0, "big": 1}})
    assert caps == {"prefill": 6, "decode": 2}
    cluster.set_target("prefill", 6)
    cluster.set_target("decode", 2)
    engines = {
        (e.role, e.truth is slow)
        for e in cluster.serving_engines("prefill") + cluster.serving_engines("decode")
    }
    assert engines == {("prefill", False), ("prefill", True), ("decode", True)}
    assert cluster.ready_counts() == {"prefill": 6, "decode": 2}
    assert cluster.billed_gpus() == {"a": 1, "b": 6}  # big: 2 GPUs per engine, 3 engines
    # The planner lowers prefill to 5 own-equivalents: the dearest (own) engine goes first,
    # 2 big still cover 5.
    cluster.set_target("prefill", 5)
    assert cluster._count("prefill") == {"own": 0, "big": 2}


def test_planner_replay_runs_a_fleet_with_variants(tmp_path, capsys):
    import csv
    import json

    import yaml

    from app.cli import main as planner_main

    raw = fleet_file([OWN_CFG, {**SLOW_CFG, "price_per_gpu_hour": 1.5}], budget={"h200": 2, "h100": 4})
    raw["deployments"][0]["scaling"] = {"algorithm": "sla"}
    raw["simulation"] = {
        "startup_delay_s": 30,
        "oracle": {"interval_s": 30},
        "traces": {"chat": {"workload": "flash-crowd", "rate_scale": 0.2, "duration_s": 120}},
    }
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    code = planner_main(["replay", "--config", str(tmp_path / "fleet.yaml"), "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    chat = summary["deployments"]["chat"]
    assert set(chat["gpu_hours_by_variant"]) == {"h200-tp1", "h100-tp1"}
    assert chat["gpu_hours"] == pytest.approx(sum(chat["gpu_hours_by_variant"].values()))
    hours = chat["gpu_hours_by_variant"]
    assert chat["cost"] == pytest.approx(hours["h200-tp1"] * 3.5 + hours["h100-tp1"] * 1.5)
    with (out / "grants.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["deployment"] for r in rows} <= {"chat@h200-tp1", "chat@h100-tp1"}
    # h100 at 1.5 is the cheaper per unit (docs/fleet.md): it is granted engines.
    assert any(r["deployment"] == "chat@h100-tp1" and int(r["grant"]) > 0 for r in rows)
    assert summary["peak_billed_gpus"]["h100"] <= 4 + 2  # the budget, plus draining engines
    capsys.readouterr()
    args = ["replay", "--config", str(tmp_path / "fleet.yaml"), "--out", str(out), "--fleet-policy", "equal"]
    assert planner_main(args) != 0
    assert "hardware variants are replayed with the fleet policy only" in capsys.readouterr().err


def test_planner_serve_refuses_variants_it_does_not_run(tmp_path):
    """The service grants a deployment's own hardware only; a file with a second variant is
    refused at start-up, naming the field, rather than silently run on the first variant."""
    from app.config import Settings
    from app.main import create_app

    settings = Settings(database_url=f"sqlite:///{tmp_path / 'p.db'}")
    with pytest.raises(ConfigError, match=r"fleet\.deployments\.chat\.variants: .* not run by planner serve"):
        create_app(settings, deployments=validate_deployments(fleet_file([OWN_CFG, SLOW_CFG]), "fleet.yaml"))
    # Its own hardware alone is what the service runs anyway.
    create_app(
        settings, deployments=validate_deployments(fleet_file([OWN_CFG]), "fleet.yaml"), run_workers=False
    )

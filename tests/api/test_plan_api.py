"""POST /plan: the what-if calculation over the API (both database backends, in-process)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

import app.api.routes.plan as plan_route
from tests.api.helpers import OPER, TOKENS, VIEWER, assert_problem, bearer
from tests.support import demo_config

pytestmark = pytest.mark.anyio

REPO_ROOT = Path(__file__).resolve().parents[2]
H200 = str(REPO_ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8")
LOAD = {"isl": 3000, "osl": 150}
TARGETS = {"ttft_ms": 500, "itl_ms": 50}
PREFILL_THPT = 49481.093527696125
DECODE_THPT = 6794.772011902521


def with_profiles() -> dict[str, Any]:
    """demo (no profile) plus `h200` (the copied profile, 2-GPU prefill engines, ITL SLA 50 ms)."""
    config = demo_config()
    h200 = {
        **config["deployments"][0],
        "name": "h200",
        "profile": H200,
        "sla": {"ttft_ms": 50, "itl_ms": 50},
        "prefill": {"min_replicas": 1, "max_replicas": 8, "gpus_per_engine": 2},
    }
    config["deployments"].append(h200)
    return config


async def post_plan(api, body: dict[str, Any], token: str | None = None):  # type: ignore[no-untyped-def]
    return await api.client.post("/plan", json=body, headers=bearer(token))


@dataclass(frozen=True)
class Ok:
    name: str
    why: str
    body: dict[str, Any]
    num_prefill: int
    num_decode: int
    echoed: dict[str, Any]  # input fields of the answer


OK_CASES = [
    Ok(
        "profile-10-rps",
        "product sanity figure: 1 prefill + 1 decode",
        {"profile": H200, "rps": 10, **LOAD, **TARGETS},
        1,
        1,
        {"profile": H200, "deployment": None, "prefill_gpus": 1, "decode_gpus": 1, "ttft_ms": 500},
    ),
    Ok(
        "profile-20-rps",
        "product sanity figure: 2 prefill + 1 decode",
        {"profile": H200, "rps": 20, **LOAD, **TARGETS},
        2,
        1,
        {"profile": H200, "deployment": None, "prefill_gpus": 1, "decode_gpus": 1, "min_replicas": 1},
    ),
    Ok(
        "profile-min-replicas",
        "the minimum applies to both roles",
        {"profile": H200, "rps": 10, **LOAD, **TARGETS, "min_replicas": 3},
        3,
        3,
        {"min_replicas": 3},
    ),
    Ok(
        "deployment-defaults",
        "its profile, SLA and 2-GPU prefill engines: ceil(60000/49481/2) = 1",
        {"deployment": "h200", "rps": 20, **LOAD},
        1,
        1,
        {
            "profile": H200,
            "deployment": "h200",
            "prefill_gpus": 2,
            "decode_gpus": 1,
            "ttft_ms": 50,
            "itl_ms": 50,
        },
    ),
    Ok(
        "deployment-overridden",
        "body values win over the deployment's",
        {"deployment": "h200", "rps": 20, **LOAD, "prefill_gpus": 1, "ttft_ms": 100},
        2,
        1,
        {"prefill_gpus": 1, "ttft_ms": 100, "itl_ms": 50},
    ),
]


@pytest.mark.parametrize("case", OK_CASES, ids=lambda c: c.name)
async def test_plan(make_api, case: Ok) -> None:
    api = await make_api(with_profiles())
    r = await post_plan(api, case.body)
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["num_prefill"], body["num_decode"]) == (case.num_prefill, case.num_decode), case.why
    assert {k: body[k] for k in case.echoed} == case.echoed
    assert body["prefill_thpt_per_gpu"] == pytest.approx(PREFILL_THPT, rel=1e-9)
    assert body["decode_thpt_per_gpu"] == pytest.approx(DECODE_THPT, rel=1e-9)
    assert body["expected_ttft_ms"] == pytest.approx(60.45866867507649, rel=1e-9)
    assert body["expected_itl_ms"] == pytest.approx(41.70781893771626, rel=1e-9)
    assert (body["decode_kv_usage"], body["decode_context_tokens"]) == (1.0, 3075.0)
    assert body["ttft_met"] is (60.45866867507649 <= body["ttft_ms"])
    assert body["itl_met"] is True


async def test_plan_reasons(make_api) -> None:
    api = await make_api(with_profiles())
    r = await post_plan(api, {"profile": H200, "rps": 20, **LOAD, **TARGETS})
    body = r.json()
    assert body["prefill_reason"] == "60000 tok/s / 49481 tok/s/GPU / 1 GPU -> 2"
    assert body["decode_reason"] == (
        "3000 tok/s / 6795 tok/s/GPU / 1 GPU -> 1; ITL 50 ms met at 41.7 ms (kv 100%, context 3075)"
    )


# --- bad input: a 4xx problem document naming the field -----------------------------------------------


def _broken_profile(tmp: Path) -> str:
    root = tmp / "broken"
    shutil.copytree(H200, root)
    target = root / "selected_prefill_interpolation" / "raw_data.npz"
    with np.load(target, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["prefill_ttft"] = -arrays["prefill_ttft"]
    np.savez(target, **arrays)
    return str(root)


@dataclass(frozen=True)
class Bad:
    name: str
    why: str
    body: Any  # "{tmp}" in a profile is replaced by tmp_path
    status: int
    field: str
    detail: str | None = None  # exact, when the route (not pydantic) words it


PROFILE = {"profile": H200, "rps": 10, **LOAD, **TARGETS}
BAD_CASES = [
    Bad(
        "both",
        "a profile and a deployment contradict each other",
        {**PROFILE, "deployment": "h200"},
        422,
        "body.profile",
        "body.profile: give exactly one of profile or deployment (both given)",
    ),
    Bad(
        "neither",
        "nothing to plan with",
        {"rps": 10, **LOAD, **TARGETS},
        422,
        "body.profile",
        "body.profile: give exactly one of profile or deployment (neither given)",
    ),
    Bad(
        "unknown-deployment",
        "as everywhere else, an unknown deployment is 404",
        {"deployment": "nope", "rps": 10, **LOAD},
        404,
        "body.deployment",
        "body.deployment: deployment 'nope' is not configured (known: demo, h200)",
    ),
    Bad(
        "deployment-without-profile",
        "demo has no profile configured",
        {"deployment": "demo", "rps": 10, **LOAD},
        422,
        "body.deployment",
        "body.deployment: deployment 'demo' has no profile configured",
    ),
    Bad(
        "profile-without-ttft",
        "only a deployment supplies a default SLA",
        {"profile": H200, "rps": 10, **LOAD, "itl_ms": 50},
        422,
        "body.ttft_ms",
        "body.ttft_ms: required when planning for a profile (a deployment supplies its SLA)",
    ),
    Bad(
        "profile-without-itl",
        "only a deployment supplies a default SLA",
        {"profile": H200, "rps": 10, **LOAD, "ttft_ms": 500},
        422,
        "body.itl_ms",
        "body.itl_ms: required when planning for a profile (a deployment supplies its SLA)",
    ),
    Bad(
        "profile-missing",
        "names the path",
        {**PROFILE, "profile": "{tmp}/nope"},
        422,
        "body.profile",
        "body.profile: {tmp}/nope: no such file or directory",
    ),
    Bad(
        "profile-broken",
        "names the file and the key",
        {**PROFILE, "profile": "{tmp}/broken"},
        422,
        "body.profile",
        "body.profile: {tmp}/broken/selected_prefill_interpolation/raw_data.npz: prefill_ttft: "
        "value -19.5252 at index 0 is not > 0 ms",
    ),
    Bad("profile-empty", "an empty path", {**PROFILE, "profile": ""}, 422, "body.profile"),
    Bad(
        "profile-outside-roots",
        "a viewer cannot make the planner read any folder it names",
        {**PROFILE, "profile": "/etc"},
        422,
        "body.profile",
        "body.profile: /etc is outside the allowed profile folders (PLANNER_PROFILE_ROOTS)",
    ),
    Bad("profile-nul", "NUL cannot be in a path", {**PROFILE, "profile": "a\x00b"}, 422, "body.profile"),
    Bad("rps-negative", "a rate", {**PROFILE, "rps": -1}, 422, "body.rps"),
    Bad("rps-string", "a number", {**PROFILE, "rps": "ten"}, 422, "body.rps"),
    Bad("rps-missing", "required", {k: v for k, v in PROFILE.items() if k != "rps"}, 422, "body.rps"),
    Bad("isl-zero", "an empty prompt", {**PROFILE, "isl": 0}, 422, "body.isl"),
    Bad("osl-huge", "beyond any context", {**PROFILE, "osl": 1e12}, 422, "body.osl"),
    Bad("itl-zero", "a latency target", {**PROFILE, "itl_ms": 0}, 422, "body.itl_ms"),
    Bad("prefill-gpus-zero", "an engine has a GPU", {**PROFILE, "prefill_gpus": 0}, 422, "body.prefill_gpus"),
    Bad("decode-gpus-fraction", "GPUs come whole", {**PROFILE, "decode_gpus": 1.5}, 422, "body.decode_gpus"),
    Bad("min-replicas-negative", "a count", {**PROFILE, "min_replicas": -1}, 422, "body.min_replicas"),
    Bad("unknown-field", "a misspelt field is not ignored", {**PROFILE, "rsp": 10}, 422, "body.rsp"),
    Bad("list-body", "an object is expected", [PROFILE], 422, "body"),
]


@pytest.mark.parametrize("case", BAD_CASES, ids=lambda c: c.name)
async def test_bad_input(make_api, tmp_path: Path, case: Bad) -> None:
    _broken_profile(tmp_path)
    api = await make_api(with_profiles())
    api.app.state.profile_roots.append(tmp_path.resolve())  # the broken and missing profiles live here
    body = case.body
    if isinstance(body, dict) and isinstance(body.get("profile"), str):
        body = {**body, "profile": body["profile"].replace("{tmp}", str(tmp_path))}
    r = await post_plan(api, body)
    problem = assert_problem(r, case.status, case.field)
    if case.detail is not None:
        assert problem["detail"] == case.detail.replace("{tmp}", str(tmp_path)), case.why


@pytest.mark.parametrize("value", [b"NaN", b"Infinity"])
async def test_non_finite_numbers_are_refused(make_api, value: bytes) -> None:
    # Python's JSON parser accepts NaN and Infinity; the body model must not.
    api = await make_api(with_profiles())
    content = b'{"profile": "%s", "rps": %s, "isl": 3000, "osl": 150, "ttft_ms": 500, "itl_ms": 50}' % (
        H200.encode(),
        value,
    )
    r = await api.client.post("/plan", content=content, headers={"Content-Type": "application/json"})
    assert_problem(r, 422, "body.rps")


# --- auth, caching, no side effects -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "status"), [(None, 401), ("not-a-token", 401), (VIEWER, 200), (OPER, 200)], ids=str
)
async def test_viewer_role(make_api, token: str | None, status: int) -> None:
    api = await make_api(with_profiles(), tokens=TOKENS)
    r = await post_plan(api, PROFILE, token)
    assert r.status_code == status, r.text


async def test_profile_is_loaded_once_per_path(make_api, monkeypatch: pytest.MonkeyPatch) -> None:
    api = await make_api(with_profiles())
    loads: list[str] = []
    real = plan_route.load_profile

    def counting(path, **kwargs):  # type: ignore[no-untyped-def]
        loads.append(str(path))
        return real(path, **kwargs)

    monkeypatch.setattr(plan_route, "load_profile", counting)
    first = await post_plan(api, PROFILE)
    model = api.app.state.plan_models[H200]
    # Another spelling of the same directory shares the entry.
    second = await post_plan(api, {**PROFILE, "rps": 20, "profile": H200 + "/../h200-llama3.1-8b-fp8"})
    assert (first.status_code, second.status_code) == (200, 200)
    assert (first.json()["num_prefill"], second.json()["num_prefill"]) == (1, 2)
    assert loads == [H200]
    assert list(api.app.state.plan_models) == [H200]
    assert api.app.state.plan_models[H200] is model


async def test_a_broken_profile_is_not_cached(make_api, tmp_path: Path) -> None:
    api = await make_api(with_profiles())
    api.app.state.profile_roots.append(tmp_path.resolve())
    broken = _broken_profile(tmp_path)
    assert (await post_plan(api, {**PROFILE, "profile": broken})).status_code == 422
    assert broken not in getattr(api.app.state, "plan_models", {})
    # Fixed on disk: the next call loads it.
    shutil.rmtree(broken)
    shutil.copytree(H200, broken)
    assert (await post_plan(api, {**PROFILE, "profile": broken})).status_code == 200


async def test_plan_creates_nothing(make_api) -> None:
    api = await make_api(with_profiles())
    tables = ("decisions", "decision_acks", "overrides", "audit_log", "ticks")

    def counts() -> dict[str, int]:
        with api.app.state.session_factory() as session:
            return {t: session.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in tables}

    before = counts()
    for body in (PROFILE, {"deployment": "h200", "rps": 500, **LOAD}):
        r = await post_plan(api, body)
        assert r.status_code == 200, r.text
    assert counts() == before == {t: 0 for t in tables}

"""GET /diagnostics/report: the stored ticks of one deployment as one self-contained HTML page.

Ticks are stored as the worker stores them: by the worker's own tick, or through the tick store
with records whose `load` section comes from the real `load_step` (via JSON, as stored) and whose
`throughput` section has `throughput_step`'s shape. The renderer's gap rules are checked on the
figure itself at the end."""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timedelta
from typing import Any

import httpx
import numpy as np
import pytest

from app.api.routes import diagnostics as route
from app.reports.diagnostics.page import _build_figure, render_diagnostics_report
from app.reports.diagnostics.read import _changes, _gapped, _read
from app.store.ticks import add_tick
from tests.api.helpers import TOKENS, VIEWER, assert_problem, bearer, pin, tick, two_deployments
from tests.conftest import T0, Api
from tests.support import REPO_ROOT
from tests.unit.test_metrics_load import disagg_tick, load_record

pytestmark = pytest.mark.anyio

SLA = (500.0, 50.0)  # demo_config's


def throughput_section(rps: float, *, reason: str = "set_lower_bound") -> dict[str, Any]:
    """`throughput_step`'s diagnostics for a 180 s interval (as app.core.seed.throughput builds them)."""
    return {
        "reason": reason,
        "detail": "prefill: 2 engines; decode: 3 engines",
        "observed": {
            "duration_s": 180.0,
            "num_req": rps * 180.0,
            "isl": 3000.0,
            "osl": 150.0,
            "ttft_ms": 120.0,
            "itl_ms": 20.0,
            "request_duration_s": 4.0,
        },
        "observation_error": None,
        "correction": {"prefill": 1.1, "decode": 0.9, "notes": []},
        "predicted": {"num_req": rps * 1.1 * 180.0, "isl": 3100.0, "osl": 160.0, "notes": []},
        "raw_replicas": {"prefill": 2, "decode": 3},
    }


def record(
    *,
    prefill: dict[str, int],
    decode: dict[str, int],
    throughput: dict[str, Any] | None = None,
    decision_id: int | None = None,
) -> dict[str, Any]:
    load = load_record(disagg_tick(prefill, decode))
    return {
        "deployment": "demo",
        "target": load.get("final"),
        "throughput": throughput,
        "load": load,
        "decision_id": decision_id,
        "verdict": "hold: no target",
    }


def store(api: Api, rows: list[tuple[datetime, dict[str, Any]]], deployment: str = "demo") -> None:
    with api.app.state.session_factory() as session, session.begin():
        for at, rec in rows:
            add_tick(session, deployment=deployment, at=at, record=rec)


def five_ticks() -> list[tuple[datetime, dict[str, Any]]]:
    """Five load ticks 5 s apart; throughput on the first; p1 missing from the fourth."""
    rows = []
    for i in range(5):
        prefill = {"p0": 1000 * i, "p1": 500} if i != 3 else {"p0": 3000}
        rows.append(
            (
                T0 + timedelta(seconds=5 * i),
                record(
                    prefill=prefill,
                    decode={"d0": 8000 + 1000 * i, "d1": 3000},
                    throughput=throughput_section(10.0) if i == 0 else None,
                    decision_id=1 if i == 2 else None,
                ),
            )
        )
    return rows


async def report(api: Api, token: str | None = None, **params: Any) -> httpx.Response:
    return await api.client.get("/diagnostics/report", params=params, headers=bearer(token))


def header(page: str, name: str) -> str:
    match = re.search(rf"<tr><th>{re.escape(name)}</th><td>(.*?)</td></tr>", page)
    assert match, name
    return match.group(1)


def trace_names(page: str) -> set[str]:
    return set(re.findall(r'"name":"([^"]*)"', page))


# --- the page ------------------------------------------------------------------------------------


async def test_report_of_stored_ticks(make_api):
    api = await make_api()
    store(api, five_ticks())
    r = await report(api, deployment="demo")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "text/html; charset=utf-8"
    page = r.text
    assert "<title>Planner diagnostics: demo</title>" in page
    assert header(page, "Deployment") == "demo"
    assert header(page, "Ticks") == "5"
    assert header(page, "Ticks shown") == "2026-11-29 12:00:00 UTC to 2026-11-29 12:00:20 UTC"
    assert header(page, "Decisions") == "1"
    assert header(page, "Throughput steps") == "1"
    assert header(page, "SLA targets (TTFT / ITL)") == "500 ms / 50 ms"
    # self-contained: plotly.js inline once, no external script
    assert page.count('class="plotly-graph-div"') == 1
    assert page.count("* plotly.js v") == 1
    assert not re.search(r"<script[^>]*\bsrc=", page)
    names = trace_names(page)
    assert {
        "prefill p0:dp0",
        "prefill p1:dp0",
        "decode d0:dp0",
        "decode d1:dp0",
        "prefill ready",
        "decode ready",
        "prefill decision",
        "observed",
        "predicted",
        "observed TTFT",
        "estimated TTFT",
        "estimated ITL",
        "TTFT target 500 ms",
        "ITL target 50 ms",
        "prefill samples",
        "observed ISL",
        "predicted OSL",
        "set_lower_bound",
    } <= names
    load_reasons = {rec["load"]["reason"] for _, rec in five_ticks()}
    assert load_reasons <= names


async def test_ticks_of_the_worker_loop(make_api):
    """Records without load or throughput sections (no policy): a replicas panel and gaps."""
    api = await make_api()
    await pin(api, 3, 5)
    for _ in range(3):
        api.clock.advance(5)
        await tick(api)
    r = await report(api)  # one deployment: the name may be left out
    assert r.status_code == 200, r.text
    assert header(r.text, "Ticks") == "3"
    assert {"prefill target", "decode target"} <= trace_names(r.text)
    assert "prefill p0:dp0" not in r.text


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        pytest.param({}, "5", id="all"),
        pytest.param({"since": "2026-11-29T12:00:10Z"}, "3", id="since-inclusive"),
        pytest.param({"until": "2026-11-29T12:00:10Z"}, "2", id="until-exclusive"),
        pytest.param(
            {"since": "2026-11-29T13:00:05+01:00", "until": "2026-11-29T12:00:15Z"}, "2", id="offsets"
        ),
    ],
)
async def test_range(make_api, params, expected):
    api = await make_api()
    store(api, five_ticks())
    r = await report(api, deployment="demo", **params)
    assert r.status_code == 200, r.text
    assert header(r.text, "Ticks") == expected


async def test_empty_range_is_a_page_saying_so(make_api):
    api = await make_api()
    store(api, five_ticks())
    r = await report(api, deployment="demo", since="2026-11-30T00:00:00Z")
    assert r.status_code == 200, r.text
    assert "No ticks in this range." in r.text
    assert header(r.text, "Requested range") == "2026-11-30 00:00:00 UTC to the latest tick"
    assert "plotly-graph-div" not in r.text


async def test_only_the_deployments_own_ticks(make_api):
    api = await make_api(two_deployments())
    store(api, five_ticks())
    store(api, five_ticks()[:2], deployment="other")
    assert header((await report(api, deployment="demo")).text, "Ticks") == "5"
    assert header((await report(api, deployment="other")).text, "Ticks") == "2"


async def test_the_latest_ticks_when_the_range_holds_too_many(make_api, monkeypatch):
    monkeypatch.setattr(route, "MAX_REPORT_TICKS", 3)
    api = await make_api()
    store(api, five_ticks())
    page = (await report(api, deployment="demo")).text
    assert header(page, "Ticks") == "3 (the latest of 5 in the range)"
    assert header(page, "Ticks shown") == "2026-11-29 12:00:10 UTC to 2026-11-29 12:00:20 UTC"
    assert "The range holds 5 ticks; this page shows the latest 3." in page


async def test_text_from_engines_is_escaped(make_api):
    api = await make_api()
    evil = '<img src=x onerror="alert(1)">'
    rec = record(prefill={evil: 100}, decode={"d0": 1000})
    rec["load"]["detail"] = "</script><script>alert(2)</script>"
    store(api, [(T0, rec), (T0 + timedelta(seconds=5), rec)])
    page = (await report(api, deployment="demo")).text
    assert "<img" not in page
    assert "alert(2)</script>" not in page
    assert "prefill &lt;img src=x onerror=&quot;alert(1)&quot;&gt;:dp0" in json.loads(
        f'"{_names_json(page)}"'
    )


def _names_json(page: str) -> str:
    # Plotly's JSON escapes "<", ">" and "/" as \\u escapes; read the names back through JSON.
    return "|".join(re.findall(r'"name":"((?:[^"\\]|\\.)*)"', page))


async def test_load_gauges_are_served_on_metrics(make_api):
    """The worker exports each tick's load record; /metrics serves the app's registry."""
    api = await make_api()
    _, rec = five_ticks()[0]
    api.app.state.metrics.observe_load("demo", rec["load"])
    text = (await api.client.get("/metrics")).text
    assert (
        'dynamo_planner_engine_queued_prefill_tokens{deployment="demo",dp_rank="0",role="prefill",worker_id="p1"}'
        " 500.0" in text
    )
    reason = rec["load"]["reason"]
    enum = "dynamo_planner_load_scaling_decision"
    assert f'{enum}{{deployment="demo",{enum}="{reason}"}} 1.0' in text


# --- errors and auth ----------------------------------------------------------------------------


async def test_deployment_errors(make_api):
    api = await make_api(two_deployments())
    assert_problem(await report(api), 422, "deployment")
    assert_problem(await report(api, deployment="nope"), 404, "deployment")


@pytest.mark.parametrize(
    ("params", "field"),
    [
        pytest.param({"since": "yesterday"}, "since", id="since-not-a-time"),
        pytest.param({"since": "2026-11-29T12:00:00"}, "since", id="since-naive"),
        pytest.param({"until": "2026-11-29T12:00:00"}, "until", id="until-naive"),
        pytest.param({"since": "2026-11-29T12:00:00Z", "until": "2026-11-29T12:00:00Z"}, "until", id="empty"),
        pytest.param({"deployment": "d" * 64}, "deployment", id="deployment-too-long"),
    ],
)
async def test_bad_range(make_api, params, field):
    api = await make_api()
    assert_problem(await report(api, **params), 422, field)


@pytest.mark.parametrize(
    ("token", "status"),
    [
        pytest.param(None, 401, id="no-token"),
        pytest.param("not-a-configured-token", 401, id="unknown-token"),
        pytest.param(VIEWER, 200, id="viewer"),
    ],
)
async def test_roles(make_api, token, status):
    api = await make_api(tokens=TOKENS)
    r = await report(api, token)
    if status == 200:
        assert r.status_code == 200, r.text
    else:
        assert_problem(r, status)
        assert r.headers["www-authenticate"] == "Bearer"


async def test_without_tokens_only_loopback(make_api):
    api = await make_api()
    remote = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api.app, client=("203.0.113.7", 40000)), base_url="http://planner"
    )
    async with remote:
        assert_problem(await remote.get("/diagnostics/report"), 403)


# --- the renderer's series ----------------------------------------------------------------------


def test_gaps_before_long_pauses_and_missing_positions():
    x, y = _gapped([0.0, 5.0, 10.0, 60.0, 65.0], [1.0, None, 3.0, 4.0, 5.0])
    assert x.tolist() == [0.0, 5.0, 10.0, 60.0, 60.0, 65.0]
    assert np.isnan(y[[1, 3]]).all() and y[[0, 2, 4, 5]].tolist() == [1.0, 3.0, 4.0, 5.0]
    x, y = _gapped([0.0, 5.0, 15.0], [1.0, 2.0, 3.0], positions=[0, 1, 3], spacing_ms=5.0)
    assert x.tolist() == [0.0, 5.0, 15.0, 15.0] and np.isnan(y[2])


def test_step_lines_keep_only_changes_and_gap_edges():
    x = np.arange(8, dtype=float)
    y = np.array([2, 2, 2, 3, 3, np.nan, 3, 3], dtype=np.float32)
    kx, ky = _changes(x, y)
    assert kx.tolist() == [0.0, 3.0, 4.0, 5.0, 6.0, 7.0]


def test_a_departed_engine_leaves_a_gap():
    rows = [_read(at, rec) for at, rec in five_ticks()]
    fig, notes = _build_figure(rows, SLA)
    assert notes == []
    p1 = next(t for t in fig.data if t.name == "prefill p1:dp0")
    # p1 reported at ticks 0, 1, 2 and 4: a break before tick 4
    assert np.isnan(p1.y).tolist() == [False, False, False, True, False]
    p0 = next(t for t in fig.data if t.name == "prefill p0:dp0")
    assert p0.y.tolist() == [0.0, 1000.0, 2000.0, 3000.0, 4000.0]


def test_a_day_of_flapping_ticks():
    """17 280 ticks at 5 s whose load reason and engines change every tick (the worst case for
    the page's size): hover details only for the scaling actions, and the page says so."""
    base = [rec for _, rec in five_ticks()]
    ticks = [(T0 + timedelta(seconds=5 * i), base[i % 5]) for i in range(17_280)]
    assert len({rec["load"]["reason"] for rec in base}) > 1
    page = render_diagnostics_report("demo", ticks, sla=SLA)
    assert header(page, "Ticks") == "17280"
    assert "The load reason changed more than 1000 times" in page
    assert "The throughput reason" not in page
    assert len(page) < 12_000_000


def test_odd_records_render():
    odd: list[Any] = [
        {},
        {"throughput": "x", "load": 3, "target": [1]},
        {"load": {"roles": {"prefill": {"engines": [None, {"engine": 5}, {"engine": "w:dp0"}]}}}},
        {"throughput": {"reason": "a_new_reason", "observed": {"num_req": 5, "duration_s": 0}}},
        {"load": {"reason": None, "estimated_ttft_ms": math.nan, "models": {"prefill": None}}},
    ]
    page = render_diagnostics_report(
        "demo", [(T0 + timedelta(seconds=i), r) for i, r in enumerate(odd)], sla=SLA
    )
    assert header(page, "Ticks") == "5"
    assert "a_new_reason" in trace_names(page)


async def test_more_ticks_than_one_fetch(make_api):
    """The route streams the rows in batches of 1000; 2500 ticks cross two batch boundaries."""
    api = await make_api()
    rows = five_ticks()
    store(api, [(T0 + timedelta(seconds=5 * i), rows[i % 5][1]) for i in range(2500)])
    page = (await report(api, deployment="demo")).text
    assert header(page, "Ticks") == "2500"
    assert header(page, "Ticks shown") == "2026-11-29 12:00:00 UTC to 2026-11-29 15:28:15 UTC"


# --- SLA scaling ticks ------------------------------------------------------------------------------

SLA_TICKS = REPO_ROOT / "tests" / "data" / "sla_ticks.json"
# What SLA ticks cannot fill, and the reason the page gives for each.
SLA_EMPTY = {
    "Estimated ITL, worst engine (ms)": "SLA scaling estimates no ITL",
    "Decode engines: queued + in-flight KV tokens": "SLA ticks record the requests decode holds",
    "Load scaling decisions": "load scaling did not run in these ticks",
    "Throughput scaling decisions": "throughput scaling did not run in these ticks",
}


def sla_ticks() -> list[tuple[datetime, dict[str, Any]]]:
    rows = json.loads(SLA_TICKS.read_text())["ticks"]
    return [(datetime.fromisoformat(r["at"].replace("Z", "+00:00")), r["record"]) for r in rows]


def panel_data(fig: Any) -> dict[str, int]:
    """Finite points per panel title (target lines and placeholders are not data)."""
    titles = [
        a.text for a in fig.layout.annotations if a.xref == "paper" and not a.text.startswith("no data")
    ]
    points = dict.fromkeys(titles, 0)
    for trace in fig.data:
        if trace.meta == "reference" or trace.y is None:
            continue
        panel = int((trace.yaxis or "y")[1:] or 1)
        values = [v for v in trace.y if v is not None and not (isinstance(v, float) and math.isnan(v))]
        points[titles[panel - 1]] += len(values)
    return points


async def test_report_of_sla_ticks_fills_its_panels(make_api):
    """Ticks of SLA scaling (the default algorithm), as the demo stored them: every panel the SLA
    section can fill has data, the SLA panels are there, and the four it cannot fill say why."""
    api = await make_api()
    store(api, sla_ticks())
    page = (await report(api, deployment="demo")).text
    assert header(page, "Ticks") == "12"
    assert header(page, "Decisions") == "3"
    assert header(page, "SLA steps") == "12 (1 up, 2 down)"
    names = trace_names(page)
    assert {
        "observed",
        "SLA demand (sized for)",
        "observed TTFT",
        "observed ITL",
        "SLA model: prefill wait + service at the wish",
        "all prefill engines (SLA tick)",
        "prefill latency model: forward passes",
        "observed ISL",
        "SLA OSL (trend window)",
        "prefill ready",
        "decode target",
        "prefill wish",
        "decode need",
        "prompt tokens",
        "decode requests in flight",
        "prefill scale",
        "prefill capacity correction",
        "lead",
        "measured",
        "scale_up",
        "scale_down",
        "hold",
        "no_change",
    } <= names, names
    for title, why in SLA_EMPTY.items():
        assert f"no data: {why}" in page, title

    fig, notes = _build_figure([_read(at, rec) for at, rec in sla_ticks()], SLA)
    assert notes == []
    points = panel_data(fig)
    assert {title for title, n in points.items() if n == 0} == set(SLA_EMPTY), points
    empty_notes = [a.text for a in fig.layout.annotations if a.text.startswith("no data")]
    assert len(empty_notes) == len(SLA_EMPTY)


def test_seed_ticks_get_no_sla_panels_and_empty_panels_say_why():
    rows = [_read(at, rec) for at, rec in five_ticks()]
    fig, _ = _build_figure(rows, SLA)
    points = panel_data(fig)
    assert not any(title.startswith("SLA scaling") for title in points)
    # The load step ran and throughput once: only the panels nothing filled say so.
    assert {title for title, n in points.items() if n == 0} == set(), points
    assert not [a.text for a in fig.layout.annotations if a.text.startswith("no data")]
    # A range of worker ticks with no policy at all: every panel but the replicas says so.
    bare = [_read(T0 + timedelta(seconds=5 * i), {"target": {"prefill": 1, "decode": 1}}) for i in range(3)]
    fig, _ = _build_figure(bare, SLA)
    empty = [a.text for a in fig.layout.annotations if a.text.startswith("no data")]
    assert len(empty) == 11, empty
    assert "no data: load scaling did not run in these ticks" in empty


def test_log_axes_label_decades_only():
    # A label per decade, the digits between as unlabelled minor ticks: Plotly's default labels
    # read "1000, 5, 2, 100, 5".
    fig, _ = _build_figure([_read(at, rec) for at, rec in sla_ticks()], SLA)
    log_axes = [axis for name, axis in fig.layout.to_plotly_json().items() if name.startswith("yaxis")]
    log_axes = [a for a in log_axes if a.get("type") == "log"]
    assert len(log_axes) == 4
    assert all(a["dtick"] == 1 and a["minor"]["dtick"] == "D1" for a in log_axes), log_axes

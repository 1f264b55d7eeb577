"""How the simulated cluster removes engines when removal has a grace period (a pod's termination
grace period): which engines go, and which requests are cut off with them.

Two decode engines, each given one request by the router: decode-1 the 300-token answer, decode-2
the 100-token one (the router sends the second to the engine holding less). Times and counts come
from the trace and the test's own `set_target` calls.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.perf.interpolation import PerfModel
from app.core.traces import TraceRequest
from app.sim.world.cluster import Cluster
from app.sim.world.frontend import FrontendCounters
from app.sim.world.truth import TruthModel
from app.sources.profile_files import load_profile

PROFILE = Path(__file__).resolve().parents[3] / "data" / "profiles" / "h200-llama3.1-8b-fp8"
LONG, SHORT = 0, 1  # request indices: the 300-token answer (on decode-1), the 100-token one (decode-2)


@pytest.fixture(scope="module")
def truth() -> TruthModel:
    return TruthModel(PerfModel.from_profile(load_profile(PROFILE)), scale=1.0, max_num_batched_tokens=8192)


def two_decoders(truth: TruthModel, grace_s: float | None) -> Cluster:
    """decode-1 from t = 0, decode-2 ordered at 0.01 s (younger), each decoding one request at 0.3 s."""
    trace = [TraceRequest(0.05, 1000, 300), TraceRequest(0.05, 1000, 100)]
    cluster = Cluster(
        truth, trace, initial={"prefill": 1, "decode": 1}, startup_delay_s=0.0, removal_grace_s=grace_s
    )
    cluster.run_until(0.01)
    cluster.set_target("decode", 2)
    cluster.run_until(0.3)
    assert [r.decode_engine for r in cluster.requests] == ["decode-1", "decode-2"]
    return cluster


def finish(cluster: Cluster) -> None:
    while not cluster.done:
        assert cluster.now < 1000, "the simulation did not end its requests"
        cluster.run_until(cluster.now + 10.0)


CASES = [
    # (name, grace_s, hint, cut off, why)
    (
        "the hint is honoured",
        0.0,
        ["decode-1"],
        [LONG],
        "the named engine goes, and the request it holds is cut off at once",
    ),
    (
        "without a hint the youngest goes",
        0.0,
        [],
        [SHORT],
        "as Kubernetes' ReplicaSet controller does: the most recently ready engine first",
    ),
    (
        "a hint naming an unknown engine falls back",
        0.0,
        ["decode-9"],
        [SHORT],
        "a name that matches no serving engine is skipped; the youngest goes",
    ),
    (
        "a grace period long enough cuts nothing",
        60.0,
        ["decode-1"],
        [],
        "300 tokens take well under a minute: the engine empties and stops before its grace ends",
    ),
    (
        "drain until empty ignores the hint and cuts nothing",
        None,
        ["decode-1"],
        [],
        "without a grace period the least loaded engine (decode-2) drains; nothing is ever cut",
    ),
]


@pytest.mark.parametrize(("name", "grace_s", "hint", "cut", "why"), CASES, ids=[c[0] for c in CASES])
def test_which_requests_a_removal_cuts_off(
    truth: TruthModel, name: str, grace_s: float | None, hint: list[str], cut: list[int], why: str
) -> None:
    cluster = two_decoders(truth, grace_s)
    cluster.set_target("decode", 1, hint)
    finish(cluster)
    unfinished = [i for i, r in enumerate(cluster.requests) if r.finish_s is None]
    assert unfinished == cut, why
    assert cluster.cut_off == len(cut), why
    assert cluster.counts("decode") == (1, 1, 0, 0), why


def test_a_cut_off_engine_stops_billing_and_leaves_the_in_flight_gauge(truth: TruthModel) -> None:
    """decode-1 removed at 0.3 s with a 0.5 s grace period: its 300-token answer (which would end
    near 1.4 s) is cut off at 0.8 s, when its billing stops; decode-2's 100-token answer (ending
    near 0.56 s) finishes."""
    undisturbed = two_decoders(truth, grace_s=None)
    finish(undisturbed)
    long_end_s = undisturbed.requests[LONG].finish_s
    assert long_end_s is not None and long_end_s > 0.8
    cluster = two_decoders(truth, grace_s=0.5)
    before = cluster.frontend.snapshot(cluster.now)
    cluster.set_target("decode", 1, ["decode-1"])
    cluster.run_until(0.8)
    assert cluster.cut_off == 1 and cluster.requests[LONG].finish_s is None
    assert cluster.requests[SHORT].finish_s is not None
    window = FrontendCounters.window(before, cluster.frontend.snapshot(cluster.now))
    assert window.inflight_requests == 0.0  # one finished, one cut off: none in flight
    cluster.run_until(2.0)
    assert cluster.done and cluster.completed == 1
    # prefill-1 and decode-2 (ordered at 0.01 s) to 2 s; decode-1 from 0 to its cut at 0.8 s.
    assert cluster.gpu_seconds() == pytest.approx(2.0 + (2.0 - 0.01) + 0.8, rel=1e-12)


def test_a_removed_prefill_engine_cuts_off_its_queue(truth: TruthModel) -> None:
    """prefill-1 holds two long prompts (one running, one queued); removed with no grace, both are
    cut off, and the end of the iteration it was running does not bring them back."""
    trace = [TraceRequest(0.0, 8000, 10) for _ in range(3)] + [TraceRequest(0.0, 100, 10)]
    cluster = Cluster(
        truth, trace, initial={"prefill": 2, "decode": 1}, startup_delay_s=0.0, removal_grace_s=0.0
    )
    cluster.run_until(0.001)
    # Fewest pending tokens first: 8000 each, then the third 8000 behind the first, the 100 last.
    assert [r.prefill_engine for r in cluster.requests] == [
        "prefill-1",
        "prefill-2",
        "prefill-1",
        "prefill-2",
    ]
    cluster.set_target("prefill", 1, ["prefill-1"])
    finish(cluster)
    cut = [r.id for r in cluster.requests if r.finish_s is None]
    assert [cluster.requests[i].prefill_engine for i in cut] == ["prefill-1", "prefill-1"]
    assert all(cluster.requests[i].first_token_s is None for i in cut)
    assert cluster.cut_off == 2 and cluster.completed == 2

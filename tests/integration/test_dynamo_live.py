"""The planner steering real NVIDIA Dynamo 1.6.1: a step up and back down in load.

The stack is deploy/dynamo-local/ (the real `dynamo.frontend` and `dynamo.mocker` prefill and
decode workers, file discovery, TCP request plane, ZMQ event plane, all on loopback); the
planner is a real `planner serve` reading the frontend's `/metrics` and the workers'
ForwardPassMetrics from Dynamo's event plane (publishers found in discovery); the orchestrator
(deploy/dynamo-local/orchestrator.py) starts and drains mocker processes on each decision and
acknowledges once discovery shows them. The load is load.py's step profile.

Asserted: prefill and decode are both scaled up during the step and back down after it, through
acknowledged decisions; every acknowledgement observed what discovery showed; the frontend
answered every request; the engines the planner saw in FPM are the workers discovery shows.

Skipped only when Dynamo's venv (.venv-dynamo, `bash bench/install_dynamo.sh`) is absent.
Wall time about 4 minutes; 2 to 5 small processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support import REPO_ROOT, free_port

LOCAL = REPO_ROOT / "deploy" / "dynamo-local"
sys.path.insert(0, str(LOCAL))
import load as loadgen  # noqa: E402
from run import DEPLOYMENT, LiveRun  # noqa: E402
from stack import dynamo_available  # noqa: E402

pytestmark = pytest.mark.skipif(
    not dynamo_available(), reason="Dynamo's venv is absent: bash bench/install_dynamo.sh (or DYNAMO_PYTHON)"
)

# (requests/s, seconds): low, a step that needs more engines of both roles, low again. The tail
# stays above SLA scaling's quiet threshold (10% of the busy level): at 0.5 requests/s it is
# "quiet", and the quiet-period rule orders the busy period's engines back (docs/dynamo-live.md).
STEP = [(0.5, 30.0), (5.0, 80.0), (1.0, 80.0)]
ISL, OSL = 1500, 60
RECORD = os.environ.get("DYNAMO_LIVE_RECORD")  # a folder: keep the run's timeline there


def peak(samples: list, role: str, start_s: float, end_s: float) -> int:
    return max((getattr(s, role) for s in samples if start_s <= s.t_s <= end_s), default=0)


@pytest.mark.timeout(420)
def test_a_load_step_scales_prefill_and_decode_up_and_back_down(tmp_path: Path) -> None:
    run = LiveRun(workdir=tmp_path / "run", frontend_port=free_port(), planner_port=free_port())
    try:
        run.start()
        load_t0 = time.time() - run.t0
        schedule = loadgen.step_schedule(STEP, ISL, OSL, seed=1)
        results = asyncio.run(loadgen.run_load(run.stack.url, schedule))  # type: ignore[union-attr]
        # After the load: the quiet tail is part of STEP; allow the last drains to finish.
        run.orchestrator.join_drains(60)  # type: ignore[union-attr]
        decisions = run.decisions()
        diagnostics = httpx.get(
            f"{run.planner_url}/diagnostics", params={"deployment": DEPLOYMENT, "limit": 1000}, timeout=10
        ).json()
    finally:
        run.stop()
    events = run.orchestrator.events  # type: ignore[union-attr]
    if RECORD:
        run.record(
            Path(RECORD),
            decisions,
            step=STEP,
            isl=ISL,
            osl=OSL,
            load_started_s=load_t0,
            requests=len(results),
            ok=sum(r.status == 200 for r in results),
        )
    logs = f"\nevents: {json.dumps(events)[-3000:]}\nplanner log: {run.workdir / 'planner.log'}"

    assert all(r.status == 200 for r in results), [r.error for r in results if r.status != 200][:5]
    assert not [e for e in events if e["event"] == "failure"], logs
    acks = [e for e in events if e["event"] == "ack"]
    assert acks and all(a["status"] == "succeeded" for a in acks), logs

    step_start = load_t0 + STEP[0][1]
    step_end = step_start + STEP[1][1]
    samples = run.samples
    for role in ("prefill", "decode"):
        before = peak(samples, role, 0, step_start)
        during = peak(samples, role, step_start, step_end + 10)
        after = [getattr(s, role) for s in samples if s.t_s > step_end][-1]
        assert before == 1 and during >= 2, f"{role}: {before} before, {during} during the step{logs}"
        assert after < during, f"{role}: {during} during the step, {after} at the end{logs}"

    # Decisions reached the cluster through the virtual connector: ups and downs, acknowledged.
    applied = [d for d in decisions if d["status"] == "succeeded"]
    assert any(d["num_prefill"] >= 2 for d in applied) and any(d["num_decode"] >= 2 for d in applied)
    # The frontend measured the step: TTFT rose while prefill was short, and was served.
    ttfts = [s.ttft_ms for s in samples if s.ttft_ms is not None]
    assert ttfts and max(ttfts) > 0

    # The FPM the planner read came from the real workers, found in discovery (no endpoint listed).
    records = diagnostics["items"] if isinstance(diagnostics, dict) else diagnostics
    fpm = [r["record"].get("fpm") or {} for r in records]
    seen = {
        role: max((len(f.get(role, {}).get("engines", [])) for f in fpm), default=0)
        for role in ("prefill", "decode")
    }
    assert seen["prefill"] >= 2 and seen["decode"] >= 2, seen
    assert all(f.get(role, {}).get("malformed", 0) == 0 for f in fpm for role in f)

"""Which engines a scale-down should remove, in order of preference.

Lowering a replica count lets the cluster pick the victims, and a busy engine removed with
requests in flight cuts them off. The planner knows from the engines' forward passes which ready
engines are idle and how much work the others hold, so a decision that lowers a role names the
ready engines it would rather lose:

1. engines still starting (ordered, not ready) go first; they hold no work. They publish no
   forward passes, so the planner cannot name them: every cluster removes them first by itself
   (Kubernetes ranks a not-ready pod before any deletion cost), and they are counted, not named;
2. then idle engines (no request queued or running, no KV in use);
3. then the engines with the least work: fewest requests queued or running, then least KV.

Ties go to the worker id, so the same snapshot always names the same engines. How many are named:
of the `previous` engines the cluster was asked for, `previous - ready` are still starting and go
first; the remaining `ready - target` (at most) come from the ready engines.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from app.core.perf.fpm import ForwardPassMetrics
from app.core.types import EngineKey, Role


@dataclass(frozen=True, order=True)
class EngineWork:
    """One engine's work in flight, summed over its data-parallel ranks; orders least work first."""

    busy: bool
    requests: int  # queued or running
    kv_tokens: int  # in use by running requests, and waiting to be computed
    worker_id: str


def engine_work(records: Iterable[ForwardPassMetrics]) -> dict[str, EngineWork]:
    """The work of each engine (worker id) from the latest forward pass of each of its ranks."""
    requests: dict[str, int] = {}
    kv: dict[str, int] = {}
    for r in records:
        s, q = r.scheduled, r.queued
        n = s.num_prefill_requests + s.num_decode_requests + q.num_prefill_requests + q.num_decode_requests
        tokens = s.sum_decode_kv_tokens + s.sum_prefill_kv_tokens + s.sum_prefill_tokens
        tokens += q.sum_prefill_tokens + q.sum_decode_kv_tokens
        requests[r.worker_id] = requests.get(r.worker_id, 0) + n
        kv[r.worker_id] = kv.get(r.worker_id, 0) + tokens
    return {
        w: EngineWork(busy=bool(requests[w] or kv[w]), requests=requests[w], kv_tokens=kv[w], worker_id=w)
        for w in requests
    }


def choose_removals(
    *,
    previous: Mapping[Role, int],
    target: Mapping[Role, int],
    fpm: Mapping[Role, Mapping[EngineKey, ForwardPassMetrics]],
) -> dict[Role, list[str]]:
    """Per role that goes down from `previous` to `target`, the ready engines to remove, first
    choice first; a role that does not go down, or has no engine publishing, is left out."""
    chosen: dict[Role, list[str]] = {}
    for role, count in target.items():
        before = previous.get(role)
        if before is None or count >= before:
            continue
        work = engine_work(fpm.get(role, {}).values())
        ready = len(work)
        # Starting engines (before - ready, when positive) go first and are not named.
        named = min(before, ready) - count
        if named > 0:
            chosen[role] = [w.worker_id for w in sorted(work.values())[:named]]
    return chosen

"""What a prefill queue asks of the engines (docs/scaling.md, "The backlog a lead adds").

The router sends each request on arrival to an engine that is running, and a prompt then waits on
that engine: no engine added later takes it over. So engines ordered now are sized for the part
of a queue they can help with, not for all of it.
"""

from __future__ import annotations

from collections.abc import Iterable

from app.core.sla.settings import SlaSettings
from app.core.sla.state import SlaState
from app.core.sla.types import Demand, SlaInput


def drainable_tokens(queues: Iterable[float], capacity_tokens_s: float, drain_s: float) -> float:
    """The queued prompt tokens that count as load to drain within `drain_s`: each engine's queue
    up to what that engine clears itself in that time. The rest waits on its engine whatever the
    count (a flash crowd's queue on the two engines it found drains at their pace for half an
    hour), so ordering engines for it only buys engines that stand idle."""
    own_tokens = capacity_tokens_s * drain_s
    return sum(min(q, own_tokens) for q in queues)


def backlog_growth(
    demand: Demand,
    inp: SlaInput,
    state: SlaState,
    settings: SlaSettings,
    lead_s: float,
    queued_tokens: float,
    capacity_tokens_s: float,
) -> float:
    """The prompt tokens the queue will still gain before engines ordered now can serve: arrivals
    beyond the ready engines' saturated capacity until the open order is due, beyond the ordered
    count's after that. Engines ordered on the queue seen now arrive a lead later to a queue that
    grew all that lead, and requests are routed on arrival, so every later request waits behind
    it (a flash crowd on the two engines it found). Only while the engines' own queue shows they
    are behind (over a TTFT target's work per ready engine): a model that underrates the engines
    must not order for a queue that does not exist."""
    ready = inp.ready.get("prefill", 0)
    behind_tokens = max(ready, 1) * capacity_tokens_s * settings.ttft_target_ms / 1000
    if capacity_tokens_s <= 0 or queued_tokens <= behind_tokens:
        return 0.0
    arriving = demand.request_rate_s * demand.isl
    expected = max(inp.expected.get("prefill", ready), ready)
    order = state.orders.get("prefill")
    due_s = min(lead_s, max(0.0, order.ordered_s + lead_s - inp.now_s)) if order is not None else 0.0
    before = max(0.0, arriving - ready * capacity_tokens_s) * due_s
    after = max(0.0, arriving - expected * capacity_tokens_s) * (lead_s - due_s)
    return before + after

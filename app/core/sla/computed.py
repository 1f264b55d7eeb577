"""The share of the prompt tokens that prefill computes (docs/scaling.md, "Computed share").

Behind Dynamo's KV-aware router a prompt's prefix found in an engine's cache is read, not
computed: a deployment whose prompts share system prompts or conversation history computes a
fraction of the prompt tokens its frontend counts. Charged every prompt token, prefill is sized
for work nobody does. With every prefill forward pass of the interval (`fpm_complete`), a tick
measures the tokens computed: Σ `sum_prefill_tokens` (which leaves the prefix hits out), plus what
each engine's queue grew by. Prompts that arrived and wait are not a cache hit: without the
queue's growth, engines too few for a rise would read as a cache and be sized fewer still. The
queue counts raw prompt tokens (a queued prompt's hit is not known yet), and the queue of an
engine that went away is not subtracted: both err high.

The share is Σ computed ÷ Σ prompt tokens (the frontend's requests × mean ISL) over the samples'
lookback (`lookback_s`): minutes, not a tick, since a tick's passes lag its arrivals by the prompts
in progress. It lies in [MIN_SHARE, 1], and is 1 (every prompt token charged, as before anything
is known) until its points span the trend window (`trend_window_s`) and hold MIN_PROMPT_CHUNKS
chunks of prompt tokens. Without a cache (the simulator's conversation and long-prompt traces)
the passes read 0.98-1.0; read from the first tick, one long prompt still being computed read 0.84.

The router's KV hit rate (`dynamo_component_router_kv_hit_rate`) is not used: it is a mean over
admitted requests, not over tokens, and short prompts hit more than long ones. The Mooncake arXiv
trace's prefixes, all kept, hit 0.54 of a request's blocks on average but 0.39 of the prompt
tokens; sized by one minus the router's rate, prefill in Dynamo's replay of it met 97.2-97.6% of
the SLO where charging every token met 99.3%.
"""

from __future__ import annotations

from typing import Any

from app.core.sla.settings import SlaSettings
from app.core.sla.state import SharePoint, SlaState
from app.core.sla.types import SlaInput

# A prompt is never all cached (its last block at least is computed); Dynamo's planner caps the
# hit rate it discounts by at 0.95 too.
MIN_SHARE = 0.05
# The prompt tokens a reading needs, in prefill chunks: a few prompts say little about a cache.
MIN_PROMPT_CHUNKS = 8


def update_computed_share(state: SlaState, inp: SlaInput, settings: SlaSettings) -> dict[str, Any]:
    """Add the tick's point (module docstring), drop those beyond the lookback and set
    `state.computed_share`; the diagnostics say whether the tick measured one."""
    prefill = inp.fpm.get("prefill", {})
    queues = {key: float(r.queued.sum_prefill_tokens) for key, r in prefill.items()} if prefill else None
    measured = bool(inp.fpm_complete.get("prefill")) and queues is not None
    # The first tick with every pass has no earlier queue to measure the growth from.
    if measured and queues is not None and state.prefill_queues is not None:
        traffic = inp.traffic
        prompt = traffic.num_req * traffic.isl if traffic is not None and traffic.isl is not None else 0.0
        computed = sum(r.scheduled.sum_prefill_tokens for r in inp.fpm_new.get("prefill", ()))
        # Per engine: a new one's queue is all growth; one gone took its queue with it (restarted,
        # expired, removed), which is no computed token and no cache hit either.
        grown = sum(q - state.prefill_queues.get(key, 0.0) for key, q in queues.items())
        state.shares.append(SharePoint(inp.now_s, prompt, computed + grown))
    state.prefill_queues = queues
    while state.shares and state.shares[0].t_s <= inp.now_s - settings.lookback_s:
        state.shares.popleft()
    prompt_sum = sum(p.prompt_tokens for p in state.shares)
    spanned = bool(state.shares) and inp.now_s - state.shares[0].t_s >= settings.trend_window_s
    if spanned and prompt_sum >= MIN_PROMPT_CHUNKS * settings.chunk_tokens:
        computed_sum = sum(p.computed_tokens for p in state.shares)
        state.computed_share = min(1.0, max(MIN_SHARE, computed_sum / prompt_sum))
    else:
        state.computed_share = 1.0
    return {"computed_share": round(state.computed_share, 4), "computed_share_measured": measured}

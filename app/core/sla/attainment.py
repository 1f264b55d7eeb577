"""The share of requests a count serves within target, per demand scenario, and its expected value
over a forecast's scenarios: the explanation attainment sizing (app/core/sla/decide.py) reports
for the count it chose and for one fewer.

- **Prefill** (`PrefillQueue`): the M/G/c queue of app/core/sla/capacity.py at one length mix,
  asked per count and per demand: of the servable prompts, the share whose wait plus their own
  prefill meets the TTFT target. Prompts no count serves (prefill alone above the target) are
  counted apart and judged against no count.
- **Decode** (`decode_met`): the requests in decode are an M^X/G/∞ count with mean `m` and
  variance `m × dispersion`; the engines meet the ITL target while that count is within
  `engines × batch limit`, so the share met is the normal probability of that.
- **Expected attainment** (`expected`): `A(n) = Σ_i d_i · a(n, d_i) / Σ_i d_i` over equally likely
  scenarios `d_i`, each weighted by the requests it brings.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import special, stats

from app.core.sla.capacity import LengthMix, mix_times
from app.core.sla.latency import PrefillCost


def erlang_c_many(servers: np.ndarray, offered: np.ndarray) -> np.ndarray:
    """Erlang C (the share of arrivals finding every server busy) elementwise, for counts that need
    not be whole; 1 at or beyond saturation, 0 with nothing offered."""
    servers = np.asarray(servers, float)
    offered = np.asarray(offered, float)
    out = np.ones(np.broadcast(servers, offered).shape)
    ok = (offered > 0) & (offered < servers)
    s, a = np.broadcast_to(servers, out.shape)[ok], np.broadcast_to(offered, out.shape)[ok]
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        log_b = s * np.log(a) - a - special.gammaln(s + 1) - np.log(special.gammaincc(s + 1, a))
        blocked = np.exp(log_b)
        out[ok] = np.clip(s * blocked / (s - a * (1 - blocked)), 0.0, 1.0)
    out[np.broadcast_to(offered, out.shape) <= 0] = 0.0
    return out


@dataclass(frozen=True)
class PrefillQueue:
    """Prefill at one length mix: what each servable prompt length may wait, and the engine time
    the mix takes (first and second moments), for `met`."""

    mean_tokens: float
    mean_s: float  # engine time per prompt
    second_s2: float  # its second moment, times the arrivals' dispersion
    budgets_s: np.ndarray  # per servable length: the target less its own prefill
    weights: np.ndarray  # their shares of the servable prompts
    dispersion: float
    unservable_share: float
    longest_servable_tokens: int
    capacity_tokens_s: float  # one engine's, saturated
    max_utilisation: float = 1.0  # the busiest an engine may be planned to run

    @classmethod
    def build(
        cls,
        cost: PrefillCost,
        mix: LengthMix,
        *,
        ttft_target_ms: float,
        dispersion: float,
        correction: float = 1.0,
        max_utilisation: float = 1.0,
    ) -> PrefillQueue:
        target_s = ttft_target_ms / 1000.0
        longest = cost.longest_within_s(target_s * correction, computed_share=mix.computed_share)
        lengths, weights, alone, busy = mix_times(cost, mix, correction)
        servable = lengths <= longest
        mean_tokens = float(weights @ lengths)
        mean_s = float(weights @ busy)
        sw = weights[servable] / weights[servable].sum() if servable.any() else weights[servable]
        return cls(
            mean_tokens=mean_tokens,
            mean_s=mean_s,
            second_s2=float(weights @ busy**2) * max(dispersion, 1.0),
            budgets_s=target_s - alone[servable],
            weights=sw,
            dispersion=max(dispersion, 1.0),
            unservable_share=float(weights[~servable].sum()),
            longest_servable_tokens=longest,
            capacity_tokens_s=mean_tokens / mean_s if mean_s > 0 else 0.0,
            max_utilisation=max_utilisation,
        )

    def met(self, engines: int, token_rates_s: np.ndarray) -> np.ndarray:
        """Per demand (prompt tokens/s), the share of servable prompts meeting the TTFT target on
        `engines` engines (1 where nothing arrives, 0 where no prompt is servable)."""
        rates = np.asarray(token_rates_s, float)
        out = np.ones_like(rates)
        if not len(self.weights):
            return np.where(rates > 0, 0.0, 1.0)
        if engines <= 0 or self.mean_tokens <= 0:
            return np.where(rates > 0, 0.0, 1.0)
        request_rate = rates / self.mean_tokens
        rho = request_rate * self.mean_s / engines
        busy = rates > 0
        # Near saturation the queue's wait hangs on what the model cannot see (the arrivals within
        # a tick, the engines' own spread): beyond `max_utilisation` a count is taken to miss.
        saturated = busy & (rho > min(self.max_utilisation, 1.0 - 1e-9))
        out[saturated] = 0.0
        live = busy & ~saturated
        if live.any():
            # Allen-Cunneen as in capacity.py: bursts of `dispersion` take that many engines at
            # once (c ÷ D servers, at least one); the pooled M^X/G/1 wait scales the tail.
            servers = max(engines / self.dispersion, 1.0)
            r, p = request_rate[live], rho[live]
            waits = erlang_c_many(np.full_like(p, servers), p * servers)
            mean_wait = r * (self.second_s2 / engines**2) / (2 * (1 - p)) * waits / p
            budgets = self.budgets_s[None, :]
            with np.errstate(divide="ignore", invalid="ignore"):
                tail = np.where(
                    budgets < 0,
                    1.0,
                    waits[:, None] * np.exp(-np.maximum(budgets, 0.0) * (waits / mean_wait)[:, None]),
                )
            tail = np.where((mean_wait <= 0)[:, None], np.where(budgets < 0, 1.0, 0.0), tail)
            out[live] = 1.0 - np.clip(tail @ self.weights, 0.0, 1.0)
        return out


def decode_met(engines: int, batch: int, flight: np.ndarray, dispersion: float) -> np.ndarray:
    """Per demand (mean requests in decode at the target), the share of time the count stays within
    `engines × batch` (the M^X/G/∞ count's normal approximation)."""
    flight = np.asarray(flight, float)
    room = engines * batch
    sd = np.sqrt(np.maximum(flight, 0.0) * max(dispersion, 1.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(sd > 0, (room - flight) / sd, np.where(flight <= room, np.inf, -np.inf))
    return stats.norm.cdf(z)


def expected(met: np.ndarray, demand: np.ndarray) -> float:
    """The request-weighted mean of `met` over the scenarios (1 when none brings a request)."""
    total = float(demand.sum())
    return float(met @ demand) / total if total > 0 else 1.0

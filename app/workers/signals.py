"""The health of each signal a deployment worker reads: the traffic source, each role's
forward passes (FPM), the connector's inventory. A signal missing for `SIGNAL_MISSES` ticks in a
row is unavailable until it is read again: exported (`dynamo_planner_signal_unavailable`,
`dynamo_planner_degraded_signals_total`), named by `/readyz`, logged once each way, and given to
the planner, which then lowers no count (app/core/signals.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# Three ticks, as Dynamo's planner counts missing observations: one failed scrape or a publisher
# that skipped a beat is noise; three in a row (15 s at SLA scaling's 5 s tick) is an outage.
SIGNAL_MISSES = 3


@dataclass
class SignalHealth:
    """Consecutive misses per signal, and the signals unavailable now."""

    misses: dict[str, int] = field(default_factory=dict)
    unavailable: set[str] = field(default_factory=set)

    def observe(self, fresh: Mapping[str, bool]) -> tuple[set[str], set[str]]:
        """Count one tick's reads (signal -> read or not); the signals that became unavailable
        and those that recovered. A signal not read this tick (not asked for) keeps its count."""
        became: set[str] = set()
        recovered: set[str] = set()
        for signal, read in fresh.items():
            if read:
                self.misses[signal] = 0
                if signal in self.unavailable:
                    self.unavailable.discard(signal)
                    recovered.add(signal)
                continue
            self.misses[signal] = self.misses.get(signal, 0) + 1
            if self.misses[signal] >= SIGNAL_MISSES and signal not in self.unavailable:
                self.unavailable.add(signal)
                became.add(signal)
        return became, recovered

"""A simulated cluster whose engines of one role come in several hardware variants, each engine
running on its own variant's truth model (its profile's latencies) and billed at its variant's
GPUs per engine (docs/fleet.md, "Hardware variants").

The deployment's planner knows only its primary variant: it reads and sets engine counts in
*primary-equivalents* (an engine of variant v counts `capacity_v / capacity_primary`, from
app/core/fleet/variants.py). So `targets` and `ready_counts()` are primary-equivalents, and
`set_target(role, n)` runs the fleet's granted mix (`set_grant`) shrunk, dearest variant first,
to the fewest engines whose capacity covers n primary engines. Requests are routed as in
`Cluster` (to the least-loaded engine, whatever its kind): a router that ignores speed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from app.core.fleet.variants import Variant, split_wish
from app.core.traces import TraceRequest
from app.sim.world.cluster import ROLES, Cluster, _Slot
from app.sim.world.truth import TruthModel

_EPS = 1e-9


class VariantCluster(Cluster):
    def __init__(
        self,
        variants: Sequence[Variant],
        truths: Mapping[str, TruthModel],
        requests: Sequence[TraceRequest],
        *,
        initial: dict[str, int],  # primary engines
        startup_delay_s: float,
        model_name: str = "model",
        record_roles: Sequence[str] = (),
    ) -> None:
        self.variants = tuple(variants)
        self.truths = dict(truths)
        self._kind = {v.name: v for v in variants}
        self._variant_of: dict[int, str] = {}  # id(engine) -> variant
        self._ordering = variants[0].name
        self._stopped_variant_gpu_s = {v.name: 0.0 for v in variants}
        primary = variants[0]
        # Until the first grant the mix is the primary alone (the planner's own engines).
        self.mix: dict[str, dict[str, int]] = {role: {v.name: 0 for v in variants} for role in ROLES}
        super().__init__(
            truths[primary.name],
            requests,
            initial={role: 0 for role in ROLES},
            startup_delay_s=startup_delay_s,
            gpus_per_engine=dict(primary.gpus_per_engine),
            model_name=model_name,
            record_roles=record_roles,
        )
        for role in ROLES:
            self.mix[role][primary.name] = int(initial.get(role, 0))
            self._apply(role, {primary.name: int(initial.get(role, 0))}, ready_s=0.0)
            self.targets[role] = int(initial.get(role, 0))
        self._record_all()

    # --- what the planner sees: primary-equivalents ---

    def equivalents(self, role: str, engines: Mapping[str, int]) -> int:
        primary = self.variants[0].capacity.get(role, 0.0)
        if primary <= 0:
            return sum(engines.values())
        have = sum(n * self._kind[v].capacity.get(role, 0.0) for v, n in engines.items())
        return int(math.floor(have / primary + _EPS))

    def ready_counts(self) -> dict[str, int]:
        return {role: self.equivalents(role, self._count(role, ready_only=True)) for role in ROLES}

    def set_grant(self, mix: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
        """The fleet's grant per variant and role; returns it in primary-equivalents (the cap the
        planner gets). The engines running follow at once, within the planner's target."""
        self.mix = {
            role: {v.name: int(mix.get(role, {}).get(v.name, 0)) for v in self.variants} for role in ROLES
        }
        caps = {role: self.equivalents(role, self.mix[role]) for role in ROLES}
        for role in ROLES:
            self.set_target(role, min(self.targets[role], caps[role]))
        return caps

    def set_target(self, role: str, count: int) -> None:
        if count < 0:
            raise ValueError(f"replica count must be >= 0, got {count}")
        granted = {v: {role: n} for v, n in self.mix[role].items()}
        # The grant's engines, dearest first removed while the rest cover `count` primary ones;
        # never beyond the grant (the fleet replay caps the target at it right after anyway).
        covered = min(count, self.equivalents(role, self.mix[role]))
        wanted = split_wish(self.variants, {role: covered}, granted, room_gpus={})
        self._apply(role, {v: wanted[v][role] for v in wanted}, ready_s=self.now + self.startup_delay_s)
        self.targets[role] = count
        self._record(role)

    # --- engines per variant ---

    def _count(self, role: str, *, ready_only: bool = False) -> dict[str, int]:
        slots = (
            self._serving[role]
            if ready_only
            else [s for s in self._slots[role] if s.stopped_s is None and not s.draining]
        )
        out = {v.name: 0 for v in self.variants}
        for s in slots:
            out[self._variant_of[id(s.engine)]] += 1
        return out

    def _apply(self, role: str, engines: Mapping[str, int], *, ready_s: float) -> None:
        """Order or remove engines so that each variant has `engines[v]` billed, not draining
        (as `Cluster.set_target` does for one kind)."""
        for name, count in engines.items():
            live = [
                s
                for s in self._slots[role]
                if s.stopped_s is None and not s.draining and self._variant_of[id(s.engine)] == name
            ]
            if count > len(live):
                self._ordering = name
                for _ in range(count - len(live)):
                    self._order(role, ready_s=ready_s)
                self._ordering = self.variants[0].name
            elif count < len(live):
                excess = len(live) - count
                starting = sorted((s for s in live if s.ready_s > self.now), key=lambda s: -s.ordered_s)
                for slot in starting[:excess]:
                    self._stop(slot)
                excess -= min(excess, len(starting))
                mine = [s for s in self._serving[role] if self._variant_of[id(s.engine)] == name]
                for slot in sorted(mine, key=lambda s: s.engine.load)[:excess]:
                    slot.draining = True
                    self._serving[role].remove(slot)
                    self._maybe_stop(slot.engine)

    def _order(self, role: str, ready_s: float) -> None:
        # The engine runs on its variant's truth: Cluster._order builds it from `self.truth`.
        saved, self.truth = self.truth, self.truths[self._ordering]
        try:
            super()._order(role, ready_s)
        finally:
            self.truth = saved
        self._variant_of[id(self._slots[role][-1].engine)] = self._ordering

    def _gpus(self, slot: _Slot) -> int:
        return self._kind[self._variant_of[id(slot.engine)]].gpus_per_engine.get(slot.engine.role, 1)

    def _stop(self, slot: _Slot) -> None:
        variant = self._variant_of[id(slot.engine)]
        self._stopped_variant_gpu_s[variant] += (self.now - slot.ordered_s) * self._gpus(slot)
        super()._stop(slot)
        # Cluster._stop billed it at the primary's GPUs per engine: variant_gpu_seconds is the truth.

    def variant_gpu_seconds(self, at_s: float | None = None) -> dict[str, float]:
        end = self.now if at_s is None else at_s
        out = dict(self._stopped_variant_gpu_s)
        for role in ROLES:
            for s in self._slots[role]:
                out[self._variant_of[id(s.engine)]] += (end - s.ordered_s) * self._gpus(s)
        return out

    def gpu_seconds(self, at_s: float | None = None) -> float:
        return sum(self.variant_gpu_seconds(at_s).values())

    def cost(self, at_s: float | None = None) -> float:
        """What the engines cost: each variant's GPU-hours at its price."""
        seconds = self.variant_gpu_seconds(at_s)
        return sum(seconds[v.name] / 3600.0 * v.price_per_gpu_hour for v in self.variants)

    def billed_gpus(self) -> dict[str, int]:
        """GPUs billed now, per GPU type (starting, serving and draining engines)."""
        out: dict[str, int] = {}
        for role in ROLES:
            for s in self._slots[role]:
                kind = self._kind[self._variant_of[id(s.engine)]]
                out[kind.gpu_type] = out.get(kind.gpu_type, 0) + self._gpus(s)
        return out

"""A deployment's hardware variants as the fleet step reads them: each `fleet.deployments.*.variants`
entry of the deployments file, with its profile read and its SLA-meeting capacity per engine
computed (app/core/fleet/variants.py). Wiring, so it reads files; the rules stay in app/core."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from app.config import ConfigError, DeploymentConfig, FleetMemberConfig
from app.core.errors import ProfileError
from app.core.fleet.variants import Variant, engine_capacity
from app.core.perf.interpolation import PerfModel
from app.core.perf.profile import Profile
from app.planner_setup import DEFAULT_MAX_NUM_BATCHED_TOKENS
from app.sources.profile_files import load_profile


def scaled_profile(profile: Profile, latency_scale: float) -> Profile:
    """The profile of a GPU `latency_scale` times slower (above 1) or faster: every latency
    multiplied, every throughput divided. A stand-in where no profile of that GPU is shipped."""
    if latency_scale == 1.0:
        return profile
    p, d = profile.prefill, profile.decode
    return Profile(
        prefill=replace(p, ttft_ms=p.ttft_ms * latency_scale, thpt_per_gpu=p.thpt_per_gpu / latency_scale),
        decode=replace(d, itl_ms=d.itl_ms * latency_scale, thpt_per_gpu=d.thpt_per_gpu / latency_scale),
        source=f"{profile.source} (latencies x{latency_scale:g})",
    )


def variant_models(
    deployment: DeploymentConfig, entry: FleetMemberConfig, base_dir: Path
) -> list[tuple[str, PerfModel]]:
    """Each variant's name and perf model, in the listed order; a missing or bad profile is one
    ConfigError naming the field."""
    out = []
    for i, v in enumerate(entry.variants):
        where = f"fleet.deployments.{deployment.name}.variants.{i}.profile"
        relative = v.profile or deployment.profile
        if relative is None:
            raise ConfigError(f"{where}: required (the deployment has no profile)")
        path = Path(relative).expanduser()
        path = path if path.is_absolute() else base_dir / path
        if not path.is_dir():
            raise ConfigError(f"{where}: {relative!r} is not a directory ({path})")
        try:
            profile = load_profile(path)
        except ProfileError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        out.append((v.label, PerfModel.from_profile(scaled_profile(profile, v.latency_scale))))
    return out


def load_variants(
    deployment: DeploymentConfig, entry: FleetMemberConfig, base_dir: Path
) -> tuple[Variant, ...]:
    """The deployment's variants with their capacity per engine at its SLA targets (empty when
    it lists none: the fleet step then treats it as one kind of engine, as before variants)."""
    if not entry.variants:
        return ()
    own = {r: deployment.role(r).gpus_per_engine for r in deployment.roles}
    variants = []
    for v, (label, model) in zip(entry.variants, variant_models(deployment, entry, base_dir), strict=True):
        capacity = engine_capacity(
            model,
            ttft_target_ms=deployment.sla.ttft_ms,
            itl_target_ms=deployment.sla.itl_ms,
            isl_tokens=entry.capacity_at.isl_tokens,
            osl_tokens=entry.capacity_at.osl_tokens,
            chunk_tokens=deployment.prefill.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS,
            max_kv_tokens=deployment.decode.max_kv_tokens,
            max_num_seqs=deployment.decode.max_num_seqs,
            attainment_target=deployment.sla.attainment_target,
        )
        variants.append(
            Variant(
                name=label,
                gpu_type=v.gpu_type,
                gpus_per_engine={**own, **(v.gpus_per_engine or {})},
                capacity={r: capacity[r] for r in deployment.roles if r in capacity},
                price_per_gpu_hour=v.price_per_gpu_hour,
            )
        )
    return tuple(variants)

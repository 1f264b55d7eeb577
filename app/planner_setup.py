"""From the deployments file to a core `Planner`: the one mapping of a deployment's fields to the
core's settings, and the files it needs read (profile, warm-up trace). `planner serve`,
`planner replay` and every embedder build their planners here, so all three run the same
settings from the same file.

Profiles and warm-up traces are read when the planner is built, so a broken file stops start-up
with one line naming the deployment, the file and the key.
"""

from __future__ import annotations

import logging
from pathlib import Path

from app.config import ConfigError, DeploymentConfig
from app.core.errors import ProfileError
from app.core.perf.interpolation import PerfModel
from app.core.planner import Planner, PlannerSettings
from app.core.seed.load_models import LoadModels
from app.core.seed.load_types import LoadSettings
from app.core.seed.predictors import TrafficPredictor
from app.core.seed.throughput import ThroughputSettings
from app.core.sla.settings import SlaModel, SlaSettings, SlaTuning
from app.core.traces import bucket_requests
from app.sources.profile_files import load_profile
from app.sources.traces import load_trace

log = logging.getLogger(__name__)

# vLLM's default chunk size for chunked prefill, when a deployment does not declare its engines'.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192


def sla_settings(deployment: DeploymentConfig, model: PerfModel | None) -> SlaSettings:
    """SLA scaling's settings: the `scaling:` tunables as they are, the model's parameters for the
    deployment's tick interval, targets and capacities."""
    decode = deployment.decode
    max_kv = decode.max_kv_tokens or (model.decode.max_kv_tokens if model is not None else 1)
    return SlaSettings(
        **deployment.scaling.model_dump(include=set(SlaTuning.model_fields)),
        **SlaModel.for_interval(deployment.scaling.interval_s).model_dump(),
        ttft_target_ms=deployment.sla.ttft_ms,
        itl_target_ms=deployment.sla.itl_ms,
        attainment_target=deployment.sla.attainment_target,
        gpus_per_engine={role: deployment.role(role).gpus_per_engine for role in deployment.bounds()},
        bounds=deployment.bounds(),
        chunk_tokens=deployment.prefill.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS,
        max_kv_tokens=int(max_kv),
        max_num_seqs=decode.max_num_seqs,
    )


def load_settings(deployment: DeploymentConfig, model: PerfModel | None) -> LoadSettings:
    """Targets, bounds and engine capabilities for load scaling. A pending target expires after
    five throughput intervals, as in the reference (§4.7), so a lost scaling request cannot
    freeze load scaling."""
    engines = deployment.workers if deployment.mode == "agg" else deployment.prefill
    kv_role = deployment.workers if deployment.mode == "agg" else deployment.decode
    return LoadSettings(
        mode=deployment.mode,
        ttft_target_ms=deployment.sla.ttft_ms,
        itl_target_ms=deployment.sla.itl_ms,
        sensitivity=deployment.load.sensitivity,
        bounds=deployment.bounds(),
        max_num_batched_tokens=engines.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS,
        max_kv_tokens=kv_role.max_kv_tokens or (model.decode.max_kv_tokens if model is not None else None),
        pending_expiry_s=5 * deployment.throughput.interval_s,
    )


def planner_settings(deployment: DeploymentConfig, model: PerfModel | None) -> PlannerSettings:
    """The deployment's core settings. With `scaling.algorithm: sla`, SLA scaling decides alone
    (the seed's two modes proposing in turn would undo its targets); otherwise the seed's modes
    that are enabled."""
    gpus = {r: deployment.role(r).gpus_per_engine for r in deployment.roles}
    sla = deployment.scaling.algorithm == "sla"
    throughput = deployment.throughput
    return PlannerSettings(
        deployment=deployment.name,
        roles=deployment.roles,
        bounds=deployment.bounds(),
        gpus_per_engine=gpus,
        tick_interval_s=deployment.tick_interval_s,
        budget_gpus=deployment.gpu_budget,
        sla=sla_settings(deployment, model) if sla else None,
        throughput=(
            ThroughputSettings(
                interval_s=throughput.interval_s,
                itl_target_ms=deployment.sla.itl_ms,
                correction=throughput.correction,
                gpus_per_engine=gpus,
            )
            if throughput.enabled and not sla
            else None
        ),
        load=load_settings(deployment, model) if deployment.load.enabled and not sla else None,
        load_interval_s=deployment.load.interval_s if deployment.load.enabled and not sla else None,
    )


def _resolve(path: str, base_dir: Path) -> Path:
    candidate = Path(path)
    return candidate if candidate.is_absolute() else base_dir / candidate


def build_planner(deployment: DeploymentConfig, *, base_dir: Path, start_s: float | None = None) -> Planner:
    """The deployment's planner: its profile loaded, its predictors warmed, its regressions
    bootstrapped from the profile. Relative paths are relative to `base_dir` (the deployments
    file's folder). Raises ConfigError naming the deployment and the file."""
    where = f"deployment {deployment.name!r}"
    model, model_error = None, "no profile configured (set `profile:` to a profiling-results folder)"
    profile = None
    if deployment.profile:
        try:
            profile = load_profile(_resolve(deployment.profile, base_dir))
            model = PerfModel.from_profile(profile)
            model_error = None
        except ProfileError as exc:
            raise ConfigError(f"{where}: profile: {exc}") from None
    settings = planner_settings(deployment, model)

    predictor = None
    throughput = deployment.throughput
    if settings.throughput is not None:
        try:
            params = dict(throughput.predictor.params)
            if throughput.predictor.type == "prophet":
                params.setdefault("step_s", throughput.interval_s)  # its time axis is the tick interval
            predictor = TrafficPredictor(throughput.predictor.type, params)
        except ValueError as exc:
            raise ConfigError(f"{where}: throughput.predictor: {exc}") from None
        if throughput.warmup_trace:
            path = _resolve(throughput.warmup_trace, base_dir)
            try:
                requests = load_trace(path)
            except (OSError, ValueError) as exc:
                raise ConfigError(f"{where}: throughput.warmup_trace: {exc}") from None
            warmed = predictor.warm(bucket_requests(requests, throughput.interval_s))
            log.info("[%s] predictors warmed with %d intervals from %s", deployment.name, warmed, path)
    load_models = None
    if settings.load is not None:
        load = deployment.load
        load_models = LoadModels(
            deployment.mode, max_samples=load.window, min_observations=load.min_observations
        )
        if profile is not None:
            used = load_models.bootstrap(profile)
            log.info("[%s] load regressions bootstrapped from the profile: %s", deployment.name, used)
    return Planner(
        settings,
        model=model,
        model_error=model_error,
        predictor=predictor,
        load_models=load_models,
        start_s=start_s,
        fingerprint=deployment.model_dump_json(),
    )

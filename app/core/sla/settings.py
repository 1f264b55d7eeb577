"""SLA scaling's settings: the few a deployment's `scaling:` section may set (`SlaTuning`, declared
once here with their descriptions; `app/config/deployment.py`'s `ScalingConfig` extends it), the model's
parameters (`SlaModel`: fixed, documented, varied only by tests and the ablation bench), and what
the deployment adds (targets, bounds, engine capacities).

pydantic, not a dataclass: the deployments file, the replay and any embedder validate the same
fields with the same messages, and the descriptions live next to the defaults they describe.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from app.core.types import Role, RoleBounds


class ScaleToZero(BaseModel):
    """Let a deployment run no engine at all once it has been quiet long enough (docs/scaling.md,
    "Scale to zero"). Off by default: an idle deployment keeps its `min_replicas`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(default=False, description="release every engine after quiet_s without a request")
    quiet_s: float = Field(
        default=600.0,
        gt=0,
        description="how long no request may arrive, queue or be in flight before every engine goes",
    )
    respect_return_forecast: bool = Field(
        default=False,
        description="also stay awake while the learned quiet periods say a return within a lead is "
        "likely (quiet_keep_probability)",
    )


class SlaTuning(BaseModel):
    """What a deployment's `scaling:` section may say about SLA scaling (docs/scaling.md). The
    targets (`sla.ttft_ms`, `sla.itl_ms`, `sla.attainment_target`) are the `sla:` section's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sizing: Literal["headroom", "attainment"] = Field(
        default="headroom",
        description="how counts are chosen: `attainment`, per role the fewest engines whose expected "
        "share of requests within target, over demand scenarios learned from the traffic's own past, "
        "meets sla.attainment_target; `headroom`, the quantile sizing at the forecast's headroom, "
        "ramp and surge",
    )
    trend: bool = Field(default=True, description="forecast one lead ahead (off: size for the level now)")
    startup_estimate_s: float = Field(
        default=300.0,
        ge=0,
        description="how long ordered engines take to serve, until it is measured (read long: a first "
        "ramp read short is lost, one read long costs headroom until the first order serves)",
    )
    scale_down_window_s: float = Field(
        default=60.0,
        ge=0,
        description="headroom sizing: a wish keeps its engines this long",
    )
    forecast_cap: float = Field(
        default=2.0,
        ge=1,
        description="attainment sizing: no demand scenario exceeds this multiple of the history's own peak",
    )
    scale_to_zero: ScaleToZero = Field(
        default_factory=ScaleToZero,
        description="zero engines after a quiet period; the first request wakes the deployment",
    )


# The windows count ticks: the frontend's counts arrive once a tick, so a window holds the same
# number of them whatever the interval (at the default 5 s: 10 s bursts, a 20 s level, a 60 s
# trend). Two counts are the shortest burst whose rate is not one scrape's; the level is the
# busiest of the last two such bursts; the trend smooths a minute of them.
BURST_TICKS = 2
LEVEL_TICKS = 4
TREND_TICKS = 12


class SlaModel(BaseModel):
    """The model's parameters: how SLA scaling reads the traffic, learns the engines and sizes
    them. Not the deployment's to set (the deployments file has no place for them): each is
    justified in docs/scaling.md, and the tests and the ablation bench vary them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prefill_max_utilisation: float = Field(
        default=0.9, gt=0, le=1, description="the busiest a prefill engine may be planned to run"
    )
    decode_itl_margin: float = Field(
        default=1.0, gt=0, le=1, description="decode batches are sized for this share of the ITL target"
    )
    level_window_s: float = Field(
        default=20.0, gt=0, description="the recent window whose busiest burst sets the level"
    )
    burst_window_s: float = Field(
        default=10.0, gt=0, description="the burst length the level is measured over"
    )
    trend_window_s: float = Field(
        default=60.0, gt=0, description="the smoother level the forecast raises; also the lengths' window"
    )
    lookback_s: float = Field(
        default=300.0, gt=0, description="how long traffic samples are kept (ISL histogram, burstiness)"
    )
    scale_down_window_leads: float = Field(
        default=0.0,
        ge=0,
        description="the scale-down window in measured scaling latencies if longer than scale_down_window_s",
    )
    keep_window_leads: float = Field(
        default=1.0,
        ge=0,
        description="attainment sizing: a count is lowered only to the highest of the up horizon's counts "
        "over the last this many measured scaling latencies",
    )
    history_s: float = Field(
        default=1800.0, gt=0, description="how much of the traffic's past the forecast learns from"
    )
    growth_quantile: float = Field(
        default=0.9, gt=0, lt=1, description="quantile of the peak-within-a-lead growth the headroom covers"
    )
    growth_neighbour_share: float = Field(
        default=0.3,
        gt=0,
        le=1,
        description="the headroom learns from this share of the history's pairs, those nearest the level now",
    )
    forecast_neighbour_share: float = Field(
        default=0.1,
        gt=0,
        le=1,
        description="attainment sizing: the scenarios are what followed this share of the history's pairs, "
        "those nearest the level now (at least growth_min_points)",
    )
    growth_regression: bool = Field(
        default=True,
        description="also estimate the headroom by quantile regression on the level (the larger counts)",
    )
    growth_min_points: int = Field(default=24, ge=1, description="history pairs to learn the headroom")
    cold_start_growth: float = Field(
        default=1.6, ge=1, description="the forecast's headroom until the history can teach one"
    )
    dispersion_prior_s: float = Field(
        default=60.0,
        ge=0,
        description="burstiness starts at Poisson's and the ticks' own reading outweighs it after this long",
    )
    latency_prior_records: float = Field(
        default=10.0,
        gt=0,
        description="how many forward passes the profile's points are worth in the learned latency model",
    )
    latency_half_life_s: float = Field(
        default=900.0, gt=0, description="forward passes this old count half in the learned latency model"
    )
    busy_check_min: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="prefill is checked against the engines' busy time when they are this busy or more",
    )
    quiet_fraction: float = Field(
        default=0.1,
        gt=0,
        lt=1,
        description="traffic below this share of its usual busy level is a quiet period (and a surge from "
        "below this share of the rate it reached needs three rising ticks, not two)",
    )
    quiet_keep_probability: float = Field(
        default=0.2,
        ge=0,
        le=1,
        description="when quiet, what a return needs is kept while a return within a lead is this likely",
    )
    scale_bounds: tuple[float, float] = (0.5, 4.0)
    scale_smoothing: float = Field(default=0.3, gt=0, le=1, description="EWMA weight of a tick's ratio")

    @classmethod
    def for_interval(cls, interval_s: float) -> SlaModel:
        """The parameters for a planner ticking every `interval_s`: the windows in ticks."""
        return cls(
            burst_window_s=BURST_TICKS * interval_s,
            level_window_s=LEVEL_TICKS * interval_s,
            trend_window_s=TREND_TICKS * interval_s,
        )


class SlaSettings(SlaModel, SlaTuning):
    """The deployment's tuning and targets, the model's parameters, bounds and engine capacities."""

    ttft_target_ms: float = Field(gt=0)
    itl_target_ms: float = Field(gt=0)
    attainment_target: float = Field(
        default=0.99, gt=0, lt=1, description="the share of requests meeting both TTFT and ITL to size for"
    )
    gpus_per_engine: dict[Role, int] = Field(
        default_factory=dict, description="GPUs one engine of a role takes"
    )
    bounds: dict[Role, RoleBounds]
    chunk_tokens: int = Field(ge=1, description="prefill max_num_batched_tokens")
    max_kv_tokens: int = Field(ge=1, description="KV cache capacity per decode engine")
    max_num_seqs: int | None = Field(
        default=None, ge=1, description="most requests a decode engine schedules"
    )

    # One target: the prompts' length quantile prefill is sized to serve within the TTFT target,
    # and the quantile of the requests in flight decode is sized for, are the attainment target.
    @property
    def quantile(self) -> float:
        return self.attainment_target

    @property
    def decode_peak_quantile(self) -> float:
        return self.attainment_target

"""`planner plan`: what-if replicas for a profile and a steady load."""

from __future__ import annotations

import argparse
import json

from app.cli.common import (
    MAX_GPUS_PER_ENGINE,
    MAX_LATENCY_MS,
    MAX_REPLICAS,
    MAX_RPS,
    MAX_TOKENS,
    fail,
    number,
    one_line_error,
)
from app.config import REPO_ROOT, Settings

DEFAULT_PROFILE = REPO_ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8"


def cmd_plan(settings: Settings, args: argparse.Namespace) -> int:
    from app.core.errors import ProfileError
    from app.core.perf.interpolation import PerfModel
    from app.core.seed.replicas import what_if
    from app.sources.profile_files import load_profile

    try:
        model = PerfModel.from_profile(load_profile(args.profile))
    except ProfileError as exc:
        return fail(f"--profile: {exc}")
    result = {
        "profile": str(args.profile),
        **what_if(
            model=model,
            rps=args.rps,
            isl=args.isl,
            osl=args.osl,
            ttft_ms=args.ttft_ms,
            itl_ms=args.itl_ms,
            prefill_gpus=args.prefill_gpus,
            decode_gpus=args.decode_gpus,
            min_replicas=args.min_replicas,
        ),
    }
    if args.json:
        print(json.dumps(result))
        return 0

    def verdict(met: bool) -> str:
        return "meets" if met else "MISSES"

    print(f"profile  {args.profile}")
    print(f"load     {args.rps:g} req/s, ISL {args.isl:g}, OSL {args.osl:g} tokens")
    print()
    print(f"{'role':<8} {'replicas':>8} {'GPUs/engine':>11} {'tok/s/GPU':>10}  expected latency")
    r = result
    print(
        f"{'prefill':<8} {r['num_prefill']:>8} {args.prefill_gpus:>11} {r['prefill_thpt_per_gpu']:>10.1f}"
        f"  TTFT {result['expected_ttft_ms']:.1f} ms ({verdict(result['ttft_met'])} {args.ttft_ms:g} ms)"
    )
    print(
        f"{'decode':<8} {r['num_decode']:>8} {args.decode_gpus:>11} {r['decode_thpt_per_gpu']:>10.1f}"
        f"  ITL {result['expected_itl_ms']:.1f} ms ({verdict(result['itl_met'])} {args.itl_ms:g} ms)"
        f" at {result['decode_kv_usage']:.0%} KV usage"
    )
    print()
    print(f"prefill: {result['prefill_reason']}")
    print(f"decode: {result['decode_reason']}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    plan = sub.add_parser(
        "plan",
        help="what-if: replicas for a profile and a steady load",
        description="Prefill and decode replicas for a steady load, from a profile's interpolated "
        "throughput (the throughput formula of the planner, before bounds, budget and overrides).",
    )
    plan.error = one_line_error  # type: ignore[method-assign]
    plan.add_argument(
        "--profile", default=str(DEFAULT_PROFILE), help="profile directory (default: %(default)s)"
    )
    tokens = number(minimum=0, inclusive=False, maximum=MAX_TOKENS)
    latency = number(minimum=0, inclusive=False, maximum=MAX_LATENCY_MS)
    rps = number(minimum=0, inclusive=True, maximum=MAX_RPS)
    plan.add_argument("--rps", required=True, type=rps, help="requests/s")
    plan.add_argument("--isl", required=True, type=tokens, help="mean input tokens per request")
    plan.add_argument("--osl", required=True, type=tokens, help="mean output tokens per request")
    plan.add_argument("--ttft-ms", required=True, type=latency, help="TTFT target (ms)")
    plan.add_argument("--itl-ms", required=True, type=latency, help="ITL target (ms)")
    gpus = number(minimum=1, inclusive=True, integer=True, maximum=MAX_GPUS_PER_ENGINE)
    plan.add_argument("--prefill-gpus", type=gpus, default=1, help="GPUs per prefill engine")
    plan.add_argument("--decode-gpus", type=gpus, default=1, help="GPUs per decode engine")
    plan.add_argument(
        "--min-replicas",
        type=number(minimum=0, inclusive=True, integer=True, maximum=MAX_REPLICAS),
        default=1,
    )
    plan.add_argument("--json", action="store_true", help="print one JSON object")
    plan.set_defaults(func=cmd_plan)

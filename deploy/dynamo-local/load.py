"""Traffic for the Dynamo frontend: a step profile or a bundled trace, at its own timing.

    python deploy/dynamo-local/load.py --url http://127.0.0.1:8000 --step 1:60,6:90,1:90 --isl 1000 --osl 40
    python deploy/dynamo-local/load.py --url http://127.0.0.1:8000 \
        --trace data/traces/AzureLLMInferenceTrace_conv.csv --start-s 0 --duration-s 300 --speed 1 \
        --rate-scale 0.5 [--max-isl 4000] [--max-osl 200] [--out requests.csv]

Each request is one `POST /v1/completions` (`ignore_eos`, `max_tokens` = its OSL) whose prompt is
ISL words of the tiny model's vocabulary (deploy/dynamo-local/model/: one word, one token), drawn
at random so that no two prompts share a prefix (no prefix-cache hits the trace did not have).
Requests are sent at their arrival times whatever the answers, so a slow cluster builds a queue,
as real users do. Unary requests by default: the frontend measures TTFT and ITL for them too
(its own histograms, what the planner reads), and the client stays cheap; `--stream` measures
the client's own TTFT as well.

- `--step RPS:SECONDS,...`: Poisson arrivals at each rate in turn, fixed ISL and OSL;
- `--trace CSV`: the Azure LLM inference trace layout (TIMESTAMP, ContextTokens,
  GeneratedTokens): the arrivals from `--start-s` for `--duration-s`, replayed `--speed` times
  faster, each kept with probability `--rate-scale` (< 1 thins it; > 1 repeats each request
  ⌊scale⌋ or ⌈scale⌉ times, jittered by up to 0.5 s), lengths clipped to `--max-isl`/`--max-osl`.

Needs httpx (the planner's venv has it).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from pathlib import Path

import httpx

VOCAB_WORDS = 2048  # deploy/dynamo-local/model/make_model.py


@dataclass(frozen=True)
class Request:
    at_s: float  # from the start of the run
    isl: int
    osl: int


@dataclass
class Result:
    at_s: float  # scheduled
    sent_s: float
    isl: int
    osl: int
    status: int  # HTTP status; 0 for a transport error
    latency_s: float
    ttft_s: float | None  # with --stream only
    output_tokens: int | None
    error: str = ""


def step_schedule(levels: Sequence[tuple[float, float]], isl: int, osl: int, seed: int = 0) -> list[Request]:
    """Poisson arrivals at each (rate, duration) in turn."""
    rng = random.Random(seed)
    out: list[Request] = []
    start = 0.0
    for rate, duration in levels:
        t = start
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= start + duration:
                break
            out.append(Request(t, isl, osl))
        start += duration
    return out


def parse_steps(text: str) -> list[tuple[float, float]]:
    try:
        return [(float(r), float(d)) for r, d in (part.split(":") for part in text.split(","))]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected RPS:SECONDS[,RPS:SECONDS...], got {text!r}") from None


def trace_schedule(
    path: Path,
    *,
    start_s: float = 0.0,
    duration_s: float = 300.0,
    speed: float = 1.0,
    rate_scale: float = 1.0,
    max_isl: int = 4000,
    max_osl: int = 200,
    seed: int = 0,
) -> list[Request]:
    """The Azure trace's requests in [start_s, start_s + duration_s) of its own clock, at
    1/speed of their spacing, thinned or repeated by rate_scale."""
    rng = random.Random(seed)
    out: list[Request] = []
    first: datetime | None = None
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            stamp = datetime.fromisoformat(row["TIMESTAMP"][:26])
            first = first or stamp
            t = (stamp - first).total_seconds() - start_s
            if t < 0:
                continue
            if t >= duration_s:
                break
            isl = max(1, min(int(row["ContextTokens"]), max_isl))
            osl = max(1, min(int(row["GeneratedTokens"]), max_osl))
            copies = math.floor(rate_scale) + (1 if rng.random() < rate_scale % 1 else 0)
            for k in range(copies):
                jitter = rng.uniform(0, 0.5) if k else 0.0
                out.append(Request(t / speed + jitter, isl, osl))
    out.sort(key=lambda r: r.at_s)
    return out


def prompt(rng: random.Random, isl: int) -> str:
    return " ".join(f"w{rng.randrange(VOCAB_WORDS)}" for _ in range(isl))


async def _one(
    client: httpx.AsyncClient, url: str, model: str, req: Request, t0: float, text: str, stream: bool
) -> Result:
    body = {"model": model, "prompt": text, "max_tokens": req.osl, "ignore_eos": True, "stream": stream}
    sent = time.monotonic()
    ttft = None
    tokens = None
    try:
        if stream:
            async with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
                tokens = 0
                if resp.status_code != 200:
                    await resp.aread()
                async for line in resp.aiter_lines():
                    if line.startswith("data:") and "[DONE]" not in line:
                        if ttft is None:
                            ttft = time.monotonic() - sent
                        tokens += 1
                status = resp.status_code
        else:
            resp = await client.post(f"{url}/v1/completions", json=body)
            status = resp.status_code
            if status == 200:
                tokens = resp.json().get("usage", {}).get("completion_tokens")
        # The frontend's reason (for example "no backend worker available") makes a failure readable.
        error = "" if status == 200 else f"HTTP {status}: {resp.text[:200]}"
    except httpx.HTTPError as exc:
        status, error = 0, f"{type(exc).__name__}: {exc}"
    return Result(req.at_s, sent - t0, req.isl, req.osl, status, time.monotonic() - sent, ttft, tokens, error)


async def run_load(
    url: str,
    schedule: Sequence[Request],
    *,
    model: str = "tiny",
    stream: bool = False,
    seed: int = 0,
    timeout_s: float = 300.0,
    stop: asyncio.Event | None = None,
) -> list[Result]:
    """Send every request of `schedule` at its time; the results in schedule order."""
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        t0 = time.monotonic()
        tasks = []
        for req in schedule:
            delay = req.at_s - (time.monotonic() - t0)
            if delay > 0:
                if stop is not None:
                    try:
                        await asyncio.wait_for(stop.wait(), delay)
                        break
                    except TimeoutError:
                        pass
                else:
                    await asyncio.sleep(delay)
            text = prompt(rng, req.isl)
            tasks.append(asyncio.create_task(_one(client, url, model, req, t0, text, stream)))
        return list(await asyncio.gather(*tasks))


def write_results(results: Sequence[Result], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[x.name for x in fields(Result)])
        writer.writeheader()
        for r in results:
            writer.writerow(asdict(r))


def summary(results: Sequence[Result]) -> str:
    ok = [r for r in results if r.status == 200]
    lat = sorted(r.latency_s for r in ok)
    p50 = lat[len(lat) // 2] if lat else float("nan")
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else float("nan")
    return f"{len(results)} requests, {len(ok)} ok, latency p50 {p50:.2f} s, p99 {p99:.2f} s"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="tiny")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--step", type=parse_steps, help="RPS:SECONDS,... (Poisson arrivals)")
    what.add_argument("--trace", type=Path, help="an Azure-layout CSV trace")
    parser.add_argument("--isl", type=int, default=1000)
    parser.add_argument("--osl", type=int, default=40)
    parser.add_argument("--start-s", type=float, default=0.0)
    parser.add_argument("--duration-s", type=float, default=300.0)
    parser.add_argument("--speed", type=float, default=1.0)
    parser.add_argument("--rate-scale", type=float, default=1.0)
    parser.add_argument("--max-isl", type=int, default=4000)
    parser.add_argument("--max-osl", type=int, default=200)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="per-request CSV")
    args = parser.parse_args(argv)
    if args.step is not None:
        schedule = step_schedule(args.step, args.isl, args.osl, args.seed)
    else:
        schedule = trace_schedule(
            args.trace,
            start_s=args.start_s,
            duration_s=args.duration_s,
            speed=args.speed,
            rate_scale=args.rate_scale,
            max_isl=args.max_isl,
            max_osl=args.max_osl,
            seed=args.seed,
        )
    span = schedule[-1].at_s if schedule else 0.0
    print(f"{len(schedule)} requests over {span:.0f} s to {args.url}", file=sys.stderr)
    try:
        results = asyncio.run(
            run_load(args.url, schedule, model=args.model, stream=args.stream, seed=args.seed)
        )
    except KeyboardInterrupt:
        return 130
    print(summary(results))
    if args.out is not None:
        write_results(results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Long-poll benchmark: how fast a decision reaches many held `GET /decisions/wait` requests, and
how many `GET /decisions` requests per second one `planner serve` process answers.

For SQLite (always) and PostgreSQL (when PLANNER_TEST_POSTGRES_URL is set): start one real
`planner serve` process on a fresh database with the demo deployment, hold `--waiters` long-poll
requests (`GET /decisions/wait?deployment=demo&after=N&timeout_s=60`), wait until the server's
/metrics shows all of them held, then take t0 and pin new replicas through `POST /override`. Each
waiter's wake-up latency is (the time its whole response has arrived - t0), so it includes the
pin request's own commit. `--rounds` rounds (after = the previous decision id), samples pooled.
Then `--clients` concurrent keep-alive clients call `GET /decisions?deployment=demo` (50 decisions
stored) for `--seconds` seconds.

The load comes from one asyncio process on the same machine as the server. By default it speaks
HTTP/1.1 over plain asyncio streams (`--client raw`): httpx's connection pool needs seconds to
hand 500 simultaneous responses to their callers, so with `--client httpx` (one
`httpx.AsyncClient` allowing waiters + 100 connections) the figures mostly measure the client.

    .venv/bin/python -m bench.longpoll [--waiters 500] [--rounds 3] [--seconds 5] [--client raw|httpx]

Prints a markdown table and writes bench/results/longpoll.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx

from bench.service import (
    PG_ENV,
    PlannerProcess,
    PostgresDatabases,
    SqliteDatabases,
    demo_config,
    postgres_admin_url,
    write_config,
)

REPO_ROOT = Path(__file__).resolve().parent.parent

TOKENS = "viewer:bench-viewer-1,orchestrator:bench-orch-1,operator:bench-oper-1"
VIEWER = {"Authorization": "Bearer bench-viewer-1"}
ORCH = {"Authorization": "Bearer bench-orch-1"}
OPER = {"Authorization": "Bearer bench-oper-1"}
RESULTS = REPO_ROOT / "bench" / "results" / "longpoll.json"
LIST_DECISIONS = 50  # decisions stored before GET /decisions is measured

# A GET that answers (status, parsed JSON body or None).
Getter = Callable[[str, dict[str, Any], dict[str, str]], Awaitable[tuple[int, Any]]]


# --- a minimal HTTP/1.1 client ---------------------------------------------------------------------


class RawConnection:
    """One keep-alive HTTP/1.1 connection over asyncio streams: GET only, Content-Length bodies."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def open(self) -> RawConnection:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def get(self, path: str, params: dict[str, Any], headers: dict[str, str]) -> tuple[int, Any]:
        assert self._reader is not None and self._writer is not None
        lines = [f"GET {path}?{urlencode(params)} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        self._writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        await self._writer.drain()
        head = (await self._reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split(" ", 2)[1])
        fields = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:] if h)}
        if "chunked" in fields.get("transfer-encoding", ""):
            raise RuntimeError("chunked responses are not supported by this client")
        body = await self._reader.readexactly(int(fields.get("content-length", "0")))
        return status, json.loads(body) if body else None

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except OSError:
                pass


def httpx_getter(client: httpx.AsyncClient) -> Getter:
    async def get(path: str, params: dict[str, Any], headers: dict[str, str]) -> tuple[int, Any]:
        r = await client.get(path, params=params, headers=headers)
        return r.status_code, r.json() if r.content else None

    return get


# --- measurements -----------------------------------------------------------------------------------


@dataclass
class BackendResult:
    backend: str
    client: str
    waiters: int
    rounds: int
    samples: int
    wake_p50_ms: float
    wake_p99_ms: float
    wake_max_ms: float
    wake_mean_ms: float
    per_round_p99_ms: list[float]
    pin_request_ms: list[float]
    list_clients: int
    list_seconds: float
    list_requests: int
    list_errors: int
    list_rps: float


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), -(-int(q * len(ordered)) // 100)))
    return ordered[rank - 1]


async def held_waiters(control: httpx.AsyncClient) -> float:
    text = (await control.get("/metrics")).text
    for line in text.splitlines():
        if line.startswith("dynamo_planner_decision_waiters "):
            return float(line.split()[1])
    raise RuntimeError("dynamo_planner_decision_waiters missing from /metrics")


async def pin(control: httpx.AsyncClient, prefill: int, decode: int, reason: str) -> int:
    body = {
        "deployment": "demo",
        "action": "pin",
        "num_prefill": prefill,
        "num_decode": decode,
        "reason": reason,
    }
    r = await control.post("/override", headers=OPER, json=body)
    if r.status_code != 201 or r.json()["decision"] is None:
        raise RuntimeError(f"pin failed: {r.status_code} {r.text}")
    return int(r.json()["decision"]["id"])


async def wake_round(
    getters: list[Getter],
    control: httpx.AsyncClient,
    after: int,
    target: tuple[int, int],
    at_t0: Callable[[], None] | None = None,
) -> tuple[list[float], float, int]:
    """Hold one long-poll per getter, pin, and return each waiter's latency (s), the pin request's
    own duration (s) and the new decision id. `at_t0`, if given, is called once every waiter is
    held, just before the pin."""
    received: list[tuple[float, int, Any]] = []
    params = {"deployment": "demo", "after": after, "timeout_s": 60}

    async def waiter(get: Getter) -> None:
        status, body = await get("/decisions/wait", params, ORCH)
        received.append((time.perf_counter(), status, body["id"] if status == 200 else None))

    tasks = [asyncio.create_task(waiter(get)) for get in getters]
    for _ in range(6000):  # up to ~60 s for every request to be accepted and held
        if await held_waiters(control) == len(getters):
            break
        if any(t.done() for t in tasks):
            raise RuntimeError("a waiter returned before the decision was made")
        await asyncio.sleep(0.01)
    else:
        raise RuntimeError(
            f"the server never held {len(getters)} waiters (now {await held_waiters(control)})"
        )

    if at_t0 is not None:
        at_t0()
    t0 = time.perf_counter()
    decision_id = await pin(control, *target, reason=f"bench round after {after}")
    pin_s = time.perf_counter() - t0
    await asyncio.gather(*tasks)
    bad = [(status, got) for _, status, got in received if (status, got) != (200, decision_id)]
    if bad:
        raise RuntimeError(f"{len(bad)} waiters got something else than decision {decision_id}: {bad[:5]}")
    return [t - t0 for t, _, _ in received], pin_s, decision_id


async def list_throughput(getters: list[Getter], seconds: float) -> tuple[int, int, float]:
    done = errors = 0
    stop_at = time.perf_counter() + seconds

    async def worker(get: Getter) -> None:
        nonlocal done, errors
        while time.perf_counter() < stop_at:
            status, body = await get("/decisions", {"deployment": "demo"}, VIEWER)
            if status == 200 and len(body["items"]) == LIST_DECISIONS:
                done += 1
            else:
                errors += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker(get) for get in getters))
    return done, errors, time.perf_counter() - start


async def run_backend(backend: str, url: str, workdir: Path, args: argparse.Namespace) -> BackendResult:
    config = write_config(workdir / f"planner-{backend}.yaml", demo_config())
    proc = PlannerProcess(
        url,
        config,
        tokens=TOKENS,
        log_path=workdir / f"planner-{backend}.log",
        # One token holds all the waiters; the default bound per caller is lower.
        extra_env={"PLANNER_MAX_HELD_LONGPOLLS_PER_CALLER": str(max(args.waiters, 1))},
    )
    proc.start()
    raw: list[RawConnection] = []
    pools: list[httpx.AsyncClient] = []
    timeout = httpx.Timeout(120.0)

    async def getters(count: int) -> list[Getter]:
        if args.client == "raw":
            conns = [await RawConnection("127.0.0.1", proc.port).open() for _ in range(count)]
            raw.extend(conns)
            return [c.get for c in conns]
        limits = httpx.Limits(max_connections=count + 100, max_keepalive_connections=count + 100)
        pool = httpx.AsyncClient(base_url=proc.base_url, limits=limits, timeout=timeout)
        pools.append(pool)
        return [httpx_getter(pool)] * count

    try:
        async with httpx.AsyncClient(base_url=proc.base_url, timeout=timeout) as control:
            waiter_getters = await getters(args.waiters)
            samples: list[float] = []
            per_round_p99: list[float] = []
            pin_ms: list[float] = []
            after = 0
            for round_no in range(args.rounds):
                n = 2 + round_no % 6
                latencies, pin_s, after = await wake_round(waiter_getters, control, after, (n, n + 1))
                samples += latencies
                per_round_p99.append(round(percentile(latencies, 99) * 1000, 2))
                pin_ms.append(round(pin_s * 1000, 2))
                p50, p99 = percentile(latencies, 50) * 1000, percentile(latencies, 99) * 1000
                print(
                    f"  {backend} round {round_no + 1}: decision {after}, p50 {p50:.1f} ms, "
                    f"p99 {p99:.1f} ms, pin request {pin_s * 1000:.1f} ms",
                    file=sys.stderr,
                )

            # 50 decisions for the list benchmark (each pin differs from the one before).
            while after < LIST_DECISIONS:
                after = await pin(control, 2 + after % 2, 3, "bench fill")
            requests, errors, elapsed = await list_throughput(await getters(args.clients), args.seconds)
    except BaseException:
        print(f"planner log: {proc.log_path}", file=sys.stderr)
        raise
    finally:
        for conn in raw:
            await conn.close()
        for pool in pools:
            await pool.aclose()
        proc.stop()

    ms = [s * 1000 for s in samples]
    return BackendResult(
        backend=backend,
        client=args.client,
        waiters=args.waiters,
        rounds=args.rounds,
        samples=len(ms),
        wake_p50_ms=round(percentile(ms, 50), 2),
        wake_p99_ms=round(percentile(ms, 99), 2),
        wake_max_ms=round(max(ms), 2),
        wake_mean_ms=round(statistics.fmean(ms), 2),
        per_round_p99_ms=per_round_p99,
        pin_request_ms=pin_ms,
        list_clients=args.clients,
        list_seconds=round(elapsed, 2),
        list_requests=requests,
        list_errors=errors,
        list_rps=round(requests / elapsed, 1),
    )


def table(results: list[BackendResult]) -> str:
    lines = [
        "| backend | waiters | wake p50 ms | wake p99 ms | wake max ms | GET /decisions req/s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.backend} | {r.waiters} | {r.wake_p50_ms:.1f} | {r.wake_p99_ms:.1f} | {r.wake_max_ms:.1f} "
            f"| {r.list_rps:.0f} |"
        )
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> list[BackendResult]:
    results: list[BackendResult] = []
    with tempfile.TemporaryDirectory(prefix="planner-bench-") as tmp:
        workdir = Path(tmp)
        sqlite = SqliteDatabases(workdir)
        url = sqlite.fresh()
        results.append(await run_backend("sqlite", url, workdir, args))
        sqlite.drop(url)

        pg_url = postgres_admin_url()
        if pg_url is None:
            print(f"PostgreSQL skipped: set {PG_ENV} to a server URL", file=sys.stderr)
        else:
            pg = PostgresDatabases(pg_url)
            try:
                results.append(await run_backend("postgresql", pg.fresh(), workdir, args))
            finally:
                pg.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--waiters", type=int, default=500, help="concurrent long-poll requests (default 500)")
    add("--rounds", type=int, default=3, help="decisions to wake the waiters with (default 3)")
    add("--seconds", type=float, default=5.0, help="duration of the GET /decisions run (default 5)")
    add("--clients", type=int, default=32, help="concurrent GET /decisions clients (default 32)")
    add("--client", choices=["raw", "httpx"], default="raw", help="HTTP client of the load (default raw)")
    args = parser.parse_args()

    results = asyncio.run(main_async(args))
    print(f"client: {args.client}, {os.cpu_count()} CPUs shared by client and server\n")
    print(table(results))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    document: dict[str, Any] = {
        "benchmark": "longpoll",
        "parameters": vars(args),
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_at_end": os.getloadavg(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "results": [asdict(r) for r in results],
    }
    RESULTS.write_text(json.dumps(document, indent=2) + "\n")
    print(f"\nwrote {RESULTS.relative_to(REPO_ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

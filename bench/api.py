"""API benchmark: in one run against one real `planner serve` process, `GET /decisions` (a
50-decision page) requests per second as a ratio to the same server's `GET /healthz`, and the
wake-up latency of 500 held long-polls.

Starts `planner serve` on a fresh database (SQLite, or PostgreSQL with `--backend postgresql` and
PLANNER_TEST_POSTGRES_URL) with the demo deployment, stores 50 decisions (pins), then:

1. `--clients` (32) keep-alive connections call `GET /healthz`, then `GET /decisions?deployment=demo`
   (the 50 decisions, one page), in alternating 1 s slices, `--seconds` (5) seconds each; the
   ratio of the two rates says what the page costs beyond the framework's floor;
3. `--waiters` (500) connections hold `GET /decisions/wait?deployment=demo&after=N&timeout_s=60`;
   when /metrics shows all of them held, t0, and a pin stores a new decision; each waiter's
   wake-up latency is (its whole response has arrived - t0), the pin's commit included;
   `--rounds` (3) rounds, samples pooled (the same procedure as bench/longpoll.py); and the
   server's CPU time and write system calls from t0 to the last answer (/proc schedstat and io;
   the median of the rounds), which the machine's other jobs do not inflate as they do the
   latencies.

The load comes from one asyncio process on the same machine, speaking HTTP/1.1 over plain asyncio
streams (bench/longpoll.py's raw client). Goals: the page at 0.5x healthz or better, wake-up p99
under 100 ms.

    .venv/bin/python -m bench.api [--backend sqlite|postgresql] [--clients 32] [--seconds 5]
        [--waiters 500] [--rounds 3]

Prints a markdown table and writes bench/results/api.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx

from bench.longpoll import (
    OPER,
    ORCH,
    TOKENS,
    VIEWER,
    RawConnection,
    percentile,
    pin,
    wake_round,
)
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

RESULTS = REPO_ROOT / "bench" / "results" / "api.json"
PAGE_DECISIONS = 50
assert OPER and ORCH  # the long-poll rounds use them through bench.longpoll


class RawGet:
    """One keep-alive HTTP/1.1 connection sending one GET again and again. The response body is
    kept as bytes: the load client shares the machine's CPUs with the server, and parsing a
    50-decision page on every response would slow the client, not the server, and make the page
    look slower than it is. Bodies are checked by `check` on the first response and by length
    (the page does not change while it is measured) on the others."""

    def __init__(
        self, conn: RawConnection, path: str, params: dict[str, Any], headers: dict[str, str]
    ) -> None:
        assert conn._reader is not None and conn._writer is not None
        self._reader, self._writer = conn._reader, conn._writer
        lines = [f"GET {path}?{urlencode(params)} HTTP/1.1", f"Host: {conn.host}:{conn.port}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        self._request = ("\r\n".join(lines) + "\r\n\r\n").encode()

    async def get(self) -> tuple[int, bytes]:
        self._writer.write(self._request)
        head = await self._reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        start = head.lower().index(b"content-length:") + len(b"content-length:")
        length = int(head[start : head.index(b"\r\n", start)])
        return status, await self._reader.readexactly(length)


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_ns(pid: int) -> int:
    """CPU nanoseconds the process's live threads have run so far (/proc schedstat: finer than
    cpu_s's clock ticks, 10 ms here, for the short wake-ups)."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # the thread ended
    return total


def write_calls(pid: int) -> int:
    """Write-family system calls the process has made so far (/proc io `syscw`): the server's
    socket sends (and its log writes)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("syscw:"):
            return int(line.split()[1])
    raise RuntimeError(f"no syscw in /proc/{pid}/io")


async def rates(
    conns: list[RawConnection],
    targets: dict[str, tuple[str, dict[str, Any], dict[str, str], Any]],
    seconds: float,
    server_pid: int,
    slice_s: float = 1.0,
) -> dict[str, tuple[float, int, int, float]]:
    """Requests per second of `conns` calling each target back to back: `seconds` per target, in
    alternating slices of `slice_s`, so that a change in the machine's load (it is shared) weighs
    on every target alike. Per target: (rate, ok, bad, server CPU ms per request)."""
    totals = {name: [0.0, 0, 0, 0.0] for name in targets}
    expected: dict[str, int] = {}
    for name, (path, params, headers, check) in targets.items():
        status, body = await RawGet(conns[0], path, params, headers).get()
        if status != 200 or not check(json.loads(body)):
            raise RuntimeError(f"{name}: unexpected answer {status} {body[:200]!r}")
        expected[name] = len(body)
    done = 0.0
    while done < seconds:
        for name, (path, params, headers, _) in targets.items():
            getters = [RawGet(c, path, params, headers) for c in conns]
            stop_at = time.perf_counter() + slice_s

            async def worker(getter: RawGet, name: str = name, stop_at: float = stop_at) -> None:
                while time.perf_counter() < stop_at:
                    status, body = await getter.get()
                    ok = status == 200 and len(body) == expected[name]
                    totals[name][1 if ok else 2] += 1

            start, cpu_start = time.perf_counter(), cpu_s(server_pid)
            await asyncio.gather(*(worker(g) for g in getters))
            totals[name][0] += time.perf_counter() - start
            totals[name][3] += cpu_s(server_pid) - cpu_start
        done += slice_s
    return {
        name: (ok / elapsed, ok, bad, cpu / max(ok + bad, 1) * 1000)
        for name, (elapsed, ok, bad, cpu) in totals.items()
    }


async def run(url: str, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    config = write_config(workdir / "planner.yaml", demo_config())
    proc = PlannerProcess(
        url,
        config,
        tokens=TOKENS,
        log_path=workdir / "planner.log",
        # One token holds all the waiters; the default bound per caller is lower.
        extra_env={"PLANNER_MAX_HELD_LONGPOLLS_PER_CALLER": str(args.waiters)},
    )
    proc.start()
    conns: list[RawConnection] = []
    try:
        async with httpx.AsyncClient(base_url=proc.base_url, timeout=httpx.Timeout(120.0)) as control:
            last = 0
            while last < PAGE_DECISIONS:
                last = await pin(control, 2 + last % 2, 3, "bench fill")
            clients = [await RawConnection("127.0.0.1", proc.port).open() for _ in range(args.clients)]
            conns += clients
            targets = {
                "healthz": ("/healthz", {}, {}, lambda b: b == {"status": "ok"}),
                "page": (
                    "/decisions",
                    {"deployment": "demo"},
                    VIEWER,
                    lambda b: len(b["items"]) == PAGE_DECISIONS,
                ),
            }
            assert proc.proc is not None
            pid = proc.proc.pid
            await rates(clients, targets, 1.0, pid, slice_s=0.5)  # warm-up: imports, caches, the pool
            measured = await rates(clients, targets, args.seconds, pid)
            healthz, healthz_ok, healthz_bad, healthz_cpu_ms = measured["healthz"]
            page, page_ok, page_bad, page_cpu_ms = measured["page"]

            waiters = [await RawConnection("127.0.0.1", proc.port).open() for _ in range(args.waiters)]
            conns += waiters
            samples: list[float] = []
            per_round_p99: list[float] = []
            wake_cpu_ms: list[float] = []
            wake_writes: list[int] = []
            after = last
            for round_no in range(args.rounds):
                n = 4 + round_no % 4
                at_t0 = [0, 0]

                def mark(at_t0: list[int] = at_t0) -> None:
                    at_t0[:] = [cpu_ns(pid), write_calls(pid)]

                latencies, _, after = await wake_round(
                    [w.get for w in waiters], control, after, (n, n + 1), at_t0=mark
                )
                # The server's CPU time and write calls from the pin to the last answer: the pin
                # request, the hub's wake-up and the 500 responses (whatever the load client and
                # the machine's other jobs take of the CPUs).
                wake_cpu_ms.append(round((cpu_ns(pid) - at_t0[0]) / 1e6, 1))
                wake_writes.append(write_calls(pid) - at_t0[1])
                samples += latencies
                per_round_p99.append(round(percentile(latencies, 99) * 1000, 1))
    except BaseException:
        print(f"planner log: {proc.log_path}", file=sys.stderr)
        raise
    finally:
        for conn in conns:
            await conn.close()
        proc.stop()

    ms = [s * 1000 for s in samples]
    return {
        "backend": args.backend,
        "clients": args.clients,
        "seconds": args.seconds,
        "healthz_rps": round(healthz, 1),
        "healthz_requests": healthz_ok,
        "healthz_errors": healthz_bad,
        "decisions_page_rps": round(page, 1),
        "decisions_page_requests": page_ok,
        "decisions_page_errors": page_bad,
        "page_to_healthz": round(page / healthz, 3),
        # What a request costs the server, whatever the load client takes of the shared CPUs.
        "healthz_server_cpu_ms": round(healthz_cpu_ms, 3),
        "decisions_page_server_cpu_ms": round(page_cpu_ms, 3),
        "waiters": args.waiters,
        "rounds": args.rounds,
        "wake_p50_ms": round(percentile(ms, 50), 1),
        "wake_p99_ms": round(percentile(ms, 99), 1),
        "wake_max_ms": round(max(ms), 1),
        "per_round_p99_ms": per_round_p99,
        "wake_server_cpu_ms": sorted(wake_cpu_ms)[len(wake_cpu_ms) // 2],
        "per_round_wake_server_cpu_ms": wake_cpu_ms,
        "wake_server_write_calls": sorted(wake_writes)[len(wake_writes) // 2],
        "per_round_wake_server_write_calls": wake_writes,
    }


def table(r: dict[str, Any]) -> str:
    return "\n".join(
        [
            "| backend | GET /healthz req/s | GET /decisions (50) req/s | ratio (goal >= 0.5) "
            "| server CPU ms/req healthz, page | waiters | wake p50 ms | wake p99 ms (goal < 100) "
            "| wake max ms | server CPU ms, write calls per wake-up |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            f"| {r['backend']} | {r['healthz_rps']:.0f} | {r['decisions_page_rps']:.0f} "
            f"| {r['page_to_healthz']:.2f} "
            f"| {r['healthz_server_cpu_ms']:.2f}, {r['decisions_page_server_cpu_ms']:.2f} "
            f"| {r['waiters']} | {r['wake_p50_ms']:.1f} "
            f"| {r['wake_p99_ms']:.1f} | {r['wake_max_ms']:.1f} "
            f"| {r['wake_server_cpu_ms']:.1f}, {r['wake_server_write_calls']} |",
        ]
    )


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="planner-bench-api-") as tmp:
        workdir = Path(tmp)
        if args.backend == "sqlite":
            sqlite = SqliteDatabases(workdir)
            return await run(sqlite.fresh(), workdir, args)
        admin = postgres_admin_url()
        if admin is None:
            raise SystemExit(f"--backend postgresql needs {PG_ENV} pointing to a server")
        pg = PostgresDatabases(admin)
        try:
            return await run(pg.fresh(), workdir, args)
        finally:
            pg.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    add("--clients", type=int, default=32, help="keep-alive connections for the rates (default 32)")
    add("--seconds", type=float, default=5.0, help="duration of each rate run (default 5)")
    add("--waiters", type=int, default=500, help="held long-polls (default 500)")
    add("--rounds", type=int, default=3, help="decisions to wake the waiters with (default 3)")
    args = parser.parse_args()

    result = asyncio.run(main_async(args))
    print(
        f"{os.cpu_count()} CPUs shared by the client and the server, load average {os.getloadavg()[0]:.1f}\n"
    )
    print(table(result))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": "api",
        "parameters": vars(args),
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_at_end": os.getloadavg(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "result": result,
    }
    RESULTS.write_text(json.dumps(document, indent=2) + "\n")
    print(f"\nwrote {RESULTS.relative_to(REPO_ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

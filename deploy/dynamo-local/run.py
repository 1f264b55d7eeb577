"""The planner steering a live Dynamo stack: stack + `planner serve` + orchestrator (+ traffic).

    python deploy/dynamo-local/run.py [--load step|trace|none] [--record DIR]    # make run-dynamo

Starts, in a work folder (default `$TMPDIR/dynamo-local-run`):
1. the Dynamo stack of stack.py: the real frontend on `--frontend-port` and one prefill and one
   decode mocker worker (`--speedup 0.1`: the H200 profile ten times slower, so that a few
   requests a second need several engines on a small machine);
2. `planner serve` on `--planner-port` with deploy/dynamo-local/planner.yaml (SLA scaling every
   2 s; traffic scraped from the frontend's `/metrics`; the engines' ForwardPassMetrics from
   Dynamo's event plane, publishers found in the stack's discovery folder) and an SQLite file;
3. orchestrator.py, which applies each decision by starting or draining mocker workers and
   acknowledges it once discovery shows them;
4. with `--load step` (default) the step profile of load.py (`--step`), with `--load trace` the
   Azure conversation trace, scaled; with `--load none` nothing: send your own requests to the
   frontend (`curl http://127.0.0.1:8000/v1/completions -d '{"model": "tiny", ...}'`).

Every `--sample-s` it records the workers per role (registered in discovery), the frontend's
TTFT and ITL over the sample (from its `/metrics` histograms) and the requests sent; with
`--record DIR` it writes `timeline.csv`, `events.jsonl` (decisions, starts, drains,
acknowledgements) and `summary.json` there at the end. Ctrl-C stops everything.

Python: this script and the planner run on the planner's venv (`.venv`, this repository on the
path); the Dynamo processes on Dynamo's (`.venv-dynamo`, `bash bench/install_dynamo.sh`).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
import load as loadgen  # noqa: E402
from orchestrator import Orchestrator  # noqa: E402
from stack import Stack, StackConfig  # noqa: E402

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from app.sources.frontend_scrape import difference, parse_metrics  # noqa: E402

DEPLOYMENT = "dynamo-local"
CONFIG_TEMPLATE = HERE / "planner.yaml"
DEFAULT_STEP = [(0.5, 40.0), (5.0, 80.0), (1.0, 100.0)]  # (requests/s, seconds)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Sample:
    t_s: float
    prefill: int
    decode: int
    requests: float | None
    ttft_ms: float | None
    itl_ms: float | None
    isl: float | None
    osl: float | None


@dataclass
class LiveRun:
    workdir: Path
    frontend_port: int = 8000
    planner_port: int = 8080
    speedup: float = 0.1
    startup_s: float = 5.0
    decode_max_num_seqs: int = 16  # planner.yaml's decode.max_num_seqs says the same
    initial: dict[str, int] = field(default_factory=lambda: {"prefill": 1, "decode": 1})
    sample_s: float = 2.0
    config_template: Path = CONFIG_TEMPLATE
    stack: Stack | None = None
    planner: subprocess.Popen[bytes] | None = None
    orchestrator: Orchestrator | None = None
    samples: list[Sample] = field(default_factory=list)
    t0: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _sampler: threading.Thread | None = None

    @property
    def planner_url(self) -> str:
        return f"http://127.0.0.1:{self.planner_port}"

    def write_config(self) -> Path:
        text = self.config_template.read_text().replace("FRONTEND_URL", self.stack.url)  # type: ignore[union-attr]
        text = text.replace("../../data/", f"{REPO}/data/")
        path = self.workdir / "planner.yaml"
        path.write_text(text)
        return path

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.t0 = time.time()
        self.stack = Stack(
            StackConfig(
                workdir=str(self.workdir / "stack"),
                port=self.frontend_port,
                startup_s=self.startup_s,
                speedup=self.speedup,
                decode_max_num_seqs=self.decode_max_num_seqs,
            )
        )
        self.stack.start(self.initial["prefill"], self.initial["decode"])
        config = self.write_config()
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "PLANNER_CONFIG": str(config),
            "PLANNER_DATABASE_URL": f"sqlite:///{self.workdir / 'planner.db'}",
            "PLANNER_HOST": "127.0.0.1",
            "PLANNER_PORT": str(self.planner_port),
            "PLANNER_API_TOKENS": "",
            "PLANNER_LOG_LEVEL": "INFO",
            "DYN_FILE_KV": str(self.stack.discovery_dir),
        }
        with (self.workdir / "planner.log").open("ab") as log:
            self.planner = subprocess.Popen(
                [sys.executable, "-m", "app.cli", "serve"],
                env=env,
                cwd=str(REPO),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._wait_planner()
        events = self.workdir / "events.jsonl"
        events.unlink(missing_ok=True)
        self.orchestrator = Orchestrator(
            self.stack,
            planner_url=self.planner_url,
            deployment=DEPLOYMENT,
            events=events,
            clock=lambda: time.time() - self.t0,
        )
        self.orchestrator.start()
        self._sampler = threading.Thread(target=self._sample_loop, name="sampler", daemon=True)
        self._sampler.start()

    def _wait_planner(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.planner is not None
            if self.planner.poll() is not None:
                raise RuntimeError(f"planner serve exited: see {self.workdir / 'planner.log'}")
            try:
                if httpx.get(f"{self.planner_url}/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"planner serve did not answer within {timeout_s} s")

    def _sample_loop(self) -> None:
        assert self.stack is not None
        previous = None
        with httpx.Client(timeout=5.0) as client:
            while not self._stop.wait(self.sample_s):
                try:
                    current = parse_metrics(client.get(f"{self.stack.url}/metrics").text)
                except (httpx.HTTPError, ValueError):
                    continue
                counts = self.stack.ready_counts()
                if previous is not None:
                    diff = difference(previous, current, self.stack.config.model_name)

                    def mean(name: str, factor: float = 1.0, diff: Any = diff) -> float | None:
                        total, count = diff.histograms.get(name, (None, None))
                        return None if not count else round(total / count * factor, 3)

                    self.samples.append(
                        Sample(
                            t_s=round(time.time() - self.t0, 2),
                            prefill=counts["prefill"],
                            decode=counts["decode"],
                            requests=diff.num_req,
                            ttft_ms=mean("ttft_ms", 1000.0),
                            itl_ms=mean("itl_ms", 1000.0),
                            isl=mean("isl"),
                            osl=mean("osl"),
                        )
                    )
                previous = current

    def decisions(self) -> list[dict[str, Any]]:
        r = httpx.get(
            f"{self.planner_url}/decisions", params={"deployment": DEPLOYMENT, "limit": 500}, timeout=10
        )
        r.raise_for_status()
        body = r.json()
        return body["items"] if isinstance(body, dict) and "items" in body else body

    def stop(self) -> None:
        self._stop.set()
        if self.orchestrator is not None:
            self.orchestrator.stop_event.set()
        if self.planner is not None and self.planner.poll() is None:
            self.planner.send_signal(signal.SIGTERM)
            try:
                self.planner.wait(15)
            except subprocess.TimeoutExpired:
                self.planner.kill()
        if self.orchestrator is not None:
            self.orchestrator.join_drains(30)
        if self.stack is not None:
            self.stack.stop()

    def record(self, out: Path, decisions: list[dict[str, Any]] | None = None, **extra: Any) -> None:
        out.mkdir(parents=True, exist_ok=True)
        with (out / "timeline.csv").open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["t_s", "prefill", "decode", "requests", "ttft_ms", "itl_ms", "isl", "osl"])
            for s in self.samples:
                writer.writerow([s.t_s, s.prefill, s.decode, s.requests, s.ttft_ms, s.itl_ms, s.isl, s.osl])
        assert self.orchestrator is not None
        with (out / "events.jsonl").open("w") as f:
            for e in self.orchestrator.events:
                f.write(json.dumps(e) + "\n")
        summary = {
            "decisions": [
                {k: d.get(k) for k in ("id", "num_prefill", "num_decode", "source", "status", "reasons")}
                for d in (decisions or [])
            ],
            **extra,
        }
        (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "dynamo-local-run")
    parser.add_argument("--frontend-port", type=int, default=8000)
    parser.add_argument("--planner-port", type=int, default=8080)
    parser.add_argument("--speedup", type=float, default=0.1)
    parser.add_argument("--load", choices=["step", "trace", "none"], default="step")
    parser.add_argument("--step", type=loadgen.parse_steps, default=DEFAULT_STEP)
    parser.add_argument("--isl", type=int, default=1500)
    parser.add_argument("--osl", type=int, default=60)
    parser.add_argument("--trace-rate-scale", type=float, default=0.5)
    parser.add_argument("--record", type=Path, default=None)
    args = parser.parse_args(argv)
    run = LiveRun(
        workdir=args.workdir,
        frontend_port=args.frontend_port,
        planner_port=args.planner_port,
        speedup=args.speedup,
    )
    try:
        run.start()
        print(f"frontend {run.stack.url}, planner {run.planner_url}, work folder {args.workdir}")  # type: ignore[union-attr]
        print(f"decisions: curl '{run.planner_url}/decisions?deployment={DEPLOYMENT}'; Ctrl-C stops")
        if args.load == "none":
            signal.pause()
        else:
            if args.load == "step":
                schedule = loadgen.step_schedule(args.step, args.isl, args.osl)
            else:
                schedule = loadgen.trace_schedule(
                    REPO / "data/traces/AzureLLMInferenceTrace_conv.csv",
                    duration_s=600,
                    rate_scale=args.trace_rate_scale,
                    max_isl=3000,
                    max_osl=60,
                )
            results = asyncio.run(loadgen.run_load(run.stack.url, schedule))  # type: ignore[union-attr]
            print(loadgen.summary(results))
            time.sleep(30)  # the planner's scale-down after the load
        if args.record is not None:
            run.record(args.record, run.decisions())
    except KeyboardInterrupt:
        pass
    finally:
        run.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

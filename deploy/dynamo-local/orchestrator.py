"""An orchestrator that applies the planner's decisions to a live Dynamo stack (stack.py).

    python deploy/dynamo-local/orchestrator.py --planner http://127.0.0.1:8080 --deployment dynamo-local \
        [--workdir /tmp/dynamo-local] [--token TOKEN] [--events events.jsonl]

It speaks the virtual connector's protocol (as examples/orchestrator.py does): long-poll
`GET /decisions/wait?deployment=&after=`, apply, `POST /decisions/{id}/complete` with the
counts it observed. Applying a decision, per role:

- more workers wanted: start them (`python -m dynamo.mocker ...`, each ready after the stack's
  simulated start-up), then wait until Dynamo's discovery shows every one registered (its model
  card in the file backend, which is also when the frontend starts routing to it);
- fewer: drain the newest ones: SIGTERM makes Dynamo's runtime remove the worker from discovery
  at once (the frontend stops routing to it), finish its in-flight requests, then exit; the
  acknowledgement waits for the deregistration, not for the drain, which goes on in the
  background (killed after `--drain-timeout-s`).

The acknowledgement is `succeeded` with the registered counts when they reach the targets within
`--register-timeout-s`, else `failed` with what was reached. A decision superseded meanwhile is
answered 409 by the planner, and the next one is applied from the counts that run.

Every step is appended to `--events` (JSON lines: decision, start, drain, ack, with times), which
the live test and the recorded run read.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stack import DEFAULT_WORKDIR, ROLES, Stack, _alive  # noqa: E402


class Orchestrator:
    def __init__(
        self,
        stack: Stack,
        *,
        planner_url: str,
        deployment: str,
        token: str | None = None,
        events: Path | None = None,
        register_timeout_s: float = 120.0,
        drain_timeout_s: float = 120.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.stack = stack
        self.planner_url = planner_url.rstrip("/")
        self.deployment = deployment
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.events_path = events
        self.register_timeout_s = register_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self.clock = clock
        self.after = 0
        self.stop_event = threading.Event()
        self._lock = threading.Lock()
        self._drains: list[threading.Thread] = []
        self.events: list[dict[str, Any]] = []

    def event(self, kind: str, **fields: Any) -> None:
        record = {"t": round(self.clock(), 3), "event": kind, **fields}
        with self._lock:
            self.events.append(record)
            if self.events_path is not None:
                with self.events_path.open("a") as f:
                    f.write(json.dumps(record) + "\n")
        print(f"[orchestrator] {kind} {fields}", flush=True)

    # --- applying a decision ---

    def apply(self, targets: dict[str, int]) -> tuple[str, dict[str, int], str]:
        """Start or drain workers until each role runs its target; (status, observed, message)."""
        started = []
        for role, target in targets.items():
            running = self.stack.running(role)
            for _ in range(target - len(running)):
                worker = self.stack.start_worker(role)
                started.append(worker)
                self.event("start", role=role, pid=worker.pid)
            if target < len(running):
                # The newest first: the oldest have the warmest caches and the longest record.
                for worker in sorted(running, key=lambda w: w.started_at)[target:]:
                    self.stack.identify()
                    self.event("drain", role=role, pid=worker.pid, instance_id=worker.instance_id)
                    thread = threading.Thread(
                        target=self._drain, args=(worker,), name=f"drain-{worker.pid}", daemon=True
                    )
                    thread.start()
                    self._drains.append(thread)
        deadline = time.monotonic() + self.register_timeout_s
        while True:
            observed = self.stack.ready_counts()
            if all(observed[r] == n for r, n in targets.items()):
                return "succeeded", observed, f"registered {observed}"
            for worker in started:
                if not worker.stopping and not _alive(worker.pid):
                    return (
                        "failed",
                        observed,
                        f"{worker.kind} worker pid {worker.pid} exited: see {worker.log}",
                    )
            if time.monotonic() > deadline or self.stop_event.is_set():
                return "failed", observed, f"after {self.register_timeout_s:g} s registered {observed}"
            time.sleep(0.2)

    def _drain(self, worker: Any) -> None:
        t0 = time.monotonic()
        self.stack.stop_worker(worker, drain_timeout_s=self.drain_timeout_s)
        self.event("drained", role=worker.kind, pid=worker.pid, after_s=round(time.monotonic() - t0, 2))

    # --- the protocol ---

    def run(self) -> None:
        """Long-poll, apply, acknowledge, until `stop_event` is set."""
        with httpx.Client(
            base_url=self.planner_url, headers=self.headers, timeout=httpx.Timeout(10.0, read=40.0)
        ) as client:
            while not self.stop_event.is_set():
                try:
                    r = client.get(
                        "/decisions/wait",
                        params={"deployment": self.deployment, "after": self.after, "timeout_s": 5},
                    )
                except httpx.TransportError as exc:
                    if self.stop_event.wait(1.0):
                        break
                    print(f"[orchestrator] planner unreachable ({exc}); retrying", file=sys.stderr)
                    continue
                if r.status_code == 204:
                    continue
                if r.status_code in (429, 503) or r.status_code >= 500:
                    # A planner that is stopping (503, Retry-After: 1) or restarting, or too many
                    # long-polls held (429): poll again after the wait it asks for, capped.
                    try:
                        wait_s = float(r.headers.get("Retry-After", "1"))
                    except ValueError:
                        wait_s = 1.0
                    if self.stop_event.wait(min(max(wait_s, 0.1), 10.0)):
                        break
                    print(f"[orchestrator] planner answered {r.status_code}; polling again", file=sys.stderr)
                    continue
                if r.status_code != 200:
                    raise RuntimeError(f"GET /decisions/wait: {r.status_code} {r.text}")
                decision = r.json()
                targets = {
                    role: decision[f"num_{role}"] for role in ROLES if decision.get(f"num_{role}") is not None
                }
                self.event("decision", id=decision["id"], targets=targets, source=decision.get("source"))
                t0 = time.monotonic()
                status, observed, message = self.apply(targets)
                ack = client.post(
                    f"/decisions/{decision['id']}/complete",
                    params={"deployment": self.deployment},
                    json={"status": status, "observed": observed, "message": message},
                )
                self.event(
                    "ack",
                    id=decision["id"],
                    status=status,
                    observed=observed,
                    http=ack.status_code,
                    apply_s=round(time.monotonic() - t0, 2),
                )
                if ack.status_code not in (200, 409):
                    raise RuntimeError(
                        f"POST /decisions/{decision['id']}/complete: {ack.status_code} {ack.text}"
                    )
                self.after = decision["id"]

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run_logged, name="orchestrator", daemon=True)
        thread.start()
        return thread

    def _run_logged(self) -> None:
        try:
            self.run()
        except Exception as exc:  # the live test reads this
            self.event("failure", error=f"{type(exc).__name__}: {exc}")
            raise

    def join_drains(self, timeout_s: float = 60.0) -> None:
        for thread in self._drains:
            thread.join(timeout_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--planner", default="http://127.0.0.1:8080")
    parser.add_argument("--deployment", default="dynamo-local")
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help="a stack started by stack.py")
    parser.add_argument("--token", default=None)
    parser.add_argument("--events", type=Path, default=None)
    parser.add_argument("--register-timeout-s", type=float, default=120.0)
    parser.add_argument("--drain-timeout-s", type=float, default=120.0)
    args = parser.parse_args(argv)
    stack = Stack.load(args.workdir)
    orchestrator = Orchestrator(
        stack,
        planner_url=args.planner,
        deployment=args.deployment,
        token=args.token,
        events=args.events,
        register_timeout_s=args.register_timeout_s,
        drain_timeout_s=args.drain_timeout_s,
    )
    try:
        orchestrator.run()
    except KeyboardInterrupt:
        orchestrator.stop_event.set()
    orchestrator.join_drains()
    return 0


if __name__ == "__main__":
    sys.exit(main())

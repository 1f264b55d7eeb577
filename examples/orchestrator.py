"""A minimal orchestrator for the planner's virtual connector.

It long-polls for decisions, "applies" each one by running a command you give (or just printing
it), and acknowledges it. Replace `apply()` with your Slurm, Ray or custom scheduler call.

    python examples/orchestrator.py --url http://planner-a:8080,http://planner-b:8080 \
        --deployment demo [--token ORCHESTRATOR_TOKEN] [--state-file demo.state.json] \
        [--command 'scale.sh {prefill} {decode}'] [--once]

The command gets the decision's replica counts as {prefill}, {decode} and {workers}, and {id}
and {deployment}; exit status 0 acknowledges `succeeded`, anything else `failed`. When a count
goes down, {remove_prefill}, {remove_decode} and {remove_workers} name the ready engines the
planner would rather lose first (comma-separated worker ids, first choice first; empty when it
names none): a scheduler that can choose which engines stop should stop those.

It survives planner restarts and failovers (docs/operations.md):
- several planner replicas (`--url` repeated, or a comma list) are tried in turn: a connection
  error or a 5xx moves to the next one at once; once every one failed, it waits a capped,
  jittered exponential backoff (or the server's Retry-After, for 429 and 503) and starts over;
- it resumes after the last decision it applied, so it neither applies a decision twice nor
  skips one: the id is kept in `--state-file` (written before the acknowledgement, so an
  acknowledgement lost to a crash is sent again, without applying again). Without a state file
  the start point is `--after`, else the planner's latest decision: applied if still pending,
  left alone if it is already settled (only pending decisions are ever applied);
- a 4xx that retrying cannot fix (401, 403, 404, 422, ...) stops it with one line and status 1.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shlex
import subprocess
import sys
import time
from email.utils import parsedate_to_datetime
from pathlib import Path

import httpx

RETRY_STATUSES = {429, 500, 502, 503, 504}
BACKOFF_BASE_S = 0.5


class Fatal(Exception):
    """An answer that retrying cannot fix; the message is the one line the orchestrator prints."""


def apply(decision: dict, command: str | None) -> tuple[str, str]:
    counts = {role: decision.get(f"num_{role}") for role in ("prefill", "decode", "workers")}
    if command is None:
        return "succeeded", f"printed only: {counts}"
    remove = decision.get("remove") or {}
    named = {f"remove_{role}": ",".join(remove.get(role, ())) for role in ("prefill", "decode", "workers")}
    fields = {**counts, **named, "id": decision["id"], "deployment": decision["deployment"]}
    argv = shlex.split(command.format(**fields))
    done = subprocess.run(argv, capture_output=True, text=True)
    status = "succeeded" if done.returncode == 0 else "failed"
    return status, (done.stdout + done.stderr).strip()[-2000:] or f"exit status {done.returncode}"


def retry_after_s(response: httpx.Response) -> float | None:
    """The Retry-After header in seconds (a number or an HTTP date), if any."""
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def one_line(response: httpx.Response) -> str:
    try:
        body = response.json()
        detail = body.get("detail") or body.get("title") if isinstance(body, dict) else body
    except ValueError:
        detail = response.text
    return " ".join(str(detail).split())[:300]


class Planners:
    """The planner replicas, tried in turn; `request` returns the first answer worth reading."""

    def __init__(self, urls: list[str], headers: dict[str, str], max_backoff_s: float, wait_s: float) -> None:
        self.urls = urls
        self.current = 0
        self.max_backoff_s = max_backoff_s
        self.client = httpx.Client(headers=headers, timeout=httpx.Timeout(10.0, read=wait_s + 10.0))

    def request(self, method: str, path: str, *, ok: tuple[int, ...], **kwargs) -> httpx.Response:
        """Send until some replica answers one of `ok`; connection errors, 5xx and 429 are
        retried, any other status raises Fatal."""
        failures = 0
        while True:
            url = self.urls[self.current]
            wait_s: float | None = None
            throttled = False
            try:
                response = self.client.request(method, url + path, **kwargs)
            except httpx.TransportError as exc:
                problem = f"unreachable ({type(exc).__name__}: {exc})"
            else:
                if response.status_code in ok:
                    return response
                if response.status_code not in RETRY_STATUSES:
                    raise Fatal(f"{method} {url}{path} answered {response.status_code}: {one_line(response)}")
                problem = f"answered {response.status_code}: {one_line(response)}"
                wait_s = retry_after_s(response)
                throttled = response.status_code == 429  # it is up: ask it again, after the wait
            failures += 1
            if not throttled:
                self.current = (self.current + 1) % len(self.urls)
                if failures % len(self.urls) != 0:  # a replica not tried this round may answer at once
                    print(f"planner {url} {problem}; trying {self.urls[self.current]}", file=sys.stderr)
                    continue
            rounds = math.ceil(failures / len(self.urls))
            ceiling = min(self.max_backoff_s, BACKOFF_BASE_S * 2 ** min(rounds - 1, 20))
            delay = ceiling / 2 + random.uniform(0, ceiling / 2)
            if wait_s is not None:
                delay = max(delay, wait_s)
            then = self.urls[self.current]
            print(f"planner {url} {problem}; retrying {then} in {delay:.1f} s", file=sys.stderr)
            time.sleep(delay)

    def close(self) -> None:
        self.client.close()


class StateFile:
    """The last decision applied, written atomically before it is acknowledged."""

    def __init__(self, path: Path | None, deployment: str) -> None:
        self.path = path
        self.deployment = deployment

    def load(self) -> dict | None:
        if self.path is None or not self.path.exists():
            return None
        try:
            state = json.loads(self.path.read_text())
            state["last_applied"] = int(state["last_applied"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise Fatal(f"{self.path}: not a state file this orchestrator wrote ({exc})") from None
        if state.get("deployment") != self.deployment:
            raise Fatal(f"{self.path} is the state of deployment {state.get('deployment')!r}")
        return state

    def save(self, **state) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump({"deployment": self.deployment, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


def start_after(planners: Planners, deployment: str) -> int:
    """Without a state file or --after: after the latest decision if it is settled, else just
    before it (a pending decision is still to be applied)."""
    r = planners.request("GET", f"/deployments/{deployment}", ok=(200,))
    latest = r.json().get("last_decision")
    if latest is None:
        return 0
    return latest["id"] - 1 if latest["status"] == "pending" else latest["id"]


def acknowledge(planners: Planners, deployment: str, decision_id: int, state: dict) -> None:
    # 409: the planner moved on (the decision was superseded or expired); wait for the next.
    planners.request(
        "POST",
        f"/decisions/{decision_id}/complete",
        ok=(200, 409),
        params={"deployment": deployment},
        json={"status": state["status"], "observed": state["observed"], "message": state["message"]},
    )


def run(args: argparse.Namespace, planners: Planners) -> int:
    store = StateFile(Path(args.state_file) if args.state_file else None, args.deployment)
    saved = store.load()
    if saved is not None:
        after = saved["last_applied"]
        if not saved.get("acknowledged"):
            # Applied, but the acknowledgement may not have reached the planner: send it again.
            acknowledge(planners, args.deployment, after, saved)
            store.save(**{**saved, "acknowledged": True})
    elif args.after is not None:
        after = args.after
    else:
        after = start_after(planners, args.deployment)
    params = {"deployment": args.deployment, "timeout_s": args.wait_s}
    while True:
        r = planners.request("GET", "/decisions/wait", ok=(200, 204), params={**params, "after": after})
        if r.status_code == 204:
            continue
        decision = r.json()
        if decision["id"] <= after:
            continue
        if decision["status"] != "pending":
            # Settled already (acknowledged by someone else, or expired): nothing to apply.
            print(f"decision {decision['id']} is {decision['status']}: not applied", file=sys.stderr)
            after = decision["id"]
            store.save(last_applied=after, acknowledged=True, status=None, observed=None, message=None)
            continue
        status, message = apply(decision, args.command)
        observed = {
            role: decision[f"num_{role}"]
            for role in ("prefill", "decode", "workers")
            if decision[f"num_{role}"] is not None and status == "succeeded"
        }
        state = {"status": status, "observed": observed or None, "message": message}
        store.save(last_applied=decision["id"], acknowledged=False, **state)
        acknowledge(planners, args.deployment, decision["id"], state)
        store.save(last_applied=decision["id"], acknowledged=True, **state)
        print(f"decision {decision['id']}: {status} ({message})", flush=True)
        after = decision["id"]
        if args.once:
            return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--url",
        action="append",
        default=None,
        help="a planner replica's URL; repeat it or give a comma list (default http://127.0.0.1:8080)",
    )
    parser.add_argument("--deployment", default="demo")
    parser.add_argument("--token", default=None)
    parser.add_argument("--command", default=None)
    parser.add_argument("--state-file", default=None, help="keeps the last decision applied across restarts")
    parser.add_argument("--after", type=int, default=None, help="last decision id already applied")
    parser.add_argument("--once", action="store_true", help="apply one decision, then exit")
    parser.add_argument("--wait-s", type=float, default=60.0, help="how long one long-poll is held")
    parser.add_argument("--max-backoff-s", type=float, default=30.0, help="the longest wait between retries")
    args = parser.parse_args()
    urls = [u.strip().rstrip("/") for value in args.url or [] for u in value.split(",") if u.strip()]
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    planners = Planners(urls or ["http://127.0.0.1:8080"], headers, args.max_backoff_s, args.wait_s)
    try:
        return run(args, planners)
    except Fatal as exc:
        print(f"orchestrator: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        planners.close()


if __name__ == "__main__":
    sys.exit(main())

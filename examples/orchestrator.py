"""A minimal orchestrator for the planner's virtual connector.

It long-polls for decisions, "applies" each one by running a command you give (or just printing
it), and acknowledges it. Replace `apply()` with your Slurm, Ray or custom scheduler call.

    python examples/orchestrator.py --url http://127.0.0.1:8080 --deployment demo \
        [--token ORCHESTRATOR_TOKEN] [--command 'scale.sh {prefill} {decode}'] [--once]

The command gets the decision's replica counts as {prefill}, {decode} and {workers}; exit status
0 acknowledges `succeeded`, anything else `failed`.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time

import httpx


def apply(decision: dict, command: str | None) -> tuple[str, str]:
    counts = {role: decision.get(f"num_{role}") for role in ("prefill", "decode", "workers")}
    if command is None:
        return "succeeded", f"printed only: {counts}"
    argv = shlex.split(command.format(**counts))
    done = subprocess.run(argv, capture_output=True, text=True)
    status = "succeeded" if done.returncode == 0 else "failed"
    return status, (done.stdout + done.stderr).strip()[-2000:] or f"exit status {done.returncode}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--deployment", default="demo")
    parser.add_argument("--token", default=None)
    parser.add_argument("--command", default=None)
    parser.add_argument("--after", type=int, default=0, help="last decision id already applied")
    parser.add_argument("--once", action="store_true", help="apply one decision, then exit")
    args = parser.parse_args()

    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    after = args.after
    with httpx.Client(base_url=args.url, headers=headers, timeout=httpx.Timeout(10.0, read=70.0)) as client:
        while True:
            try:
                r = client.get(
                    "/decisions/wait", params={"deployment": args.deployment, "after": after, "timeout_s": 60}
                )
            except httpx.TransportError as exc:
                print(f"planner unreachable ({exc}); retrying in 5 s", file=sys.stderr)
                time.sleep(5)
                continue
            if r.status_code == 204:
                continue
            if r.status_code != 200:
                print(f"wait failed: {r.status_code} {r.text}", file=sys.stderr)
                return 1
            decision = r.json()
            status, message = apply(decision, args.command)
            observed = {
                role: decision[f"num_{role}"]
                for role in ("prefill", "decode", "workers")
                if decision[f"num_{role}"] is not None and status == "succeeded"
            }
            ack = client.post(
                f"/decisions/{decision['id']}/complete",
                params={"deployment": args.deployment},
                json={"status": status, "observed": observed or None, "message": message},
            )
            # 409: the planner moved on (the decision was superseded or expired); wait for the next.
            if ack.status_code not in (200, 409):
                print(f"complete failed: {ack.status_code} {ack.text}", file=sys.stderr)
                return 1
            print(f"decision {decision['id']}: {status} ({message})", flush=True)
            after = decision["id"]
            if args.once:
                return 0


if __name__ == "__main__":
    sys.exit(main())

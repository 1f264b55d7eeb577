"""A real NVIDIA Dynamo 1.6.1 stack on loopback: the frontend and mocker workers, no etcd, no NATS.

    python deploy/dynamo-local/stack.py start [--prefill N] [--decode M] [--port 8000] [--workdir DIR]
    python deploy/dynamo-local/stack.py status [--workdir DIR]
    python deploy/dynamo-local/stack.py stop [--workdir DIR]
    python deploy/dynamo-local/stack.py run ...      # start, wait for Ctrl-C, stop

This file needs only the standard library; the processes it starts run on Dynamo's venv
(`$DYNAMO_PYTHON`, else `.venv-dynamo/bin/python` of this repository, made by
`bash bench/install_dynamo.sh`). What runs (README.md beside this file says more):

- `python -m dynamo.frontend`: the OpenAI-compatible HTTP frontend, its router and its `/metrics`;
- N `python -m dynamo.mocker --disaggregation-mode prefill` and M `... decode` workers: simulated
  engines that register with the runtime, serve requests with the timing of the bundled H200
  Llama-3.1-8B profile (converted once to the mocker's NPZ by `bench/dynamo_replay.py`'s
  `mocker_profile`, Dynamo's own converter), become ready `--startup-s` after they start, and
  publish ForwardPassMetrics on the event plane;
- discovery in files (`--discovery-backend file`, `DYN_FILE_KV=<workdir>/discovery`), requests
  over TCP (`--request-plane tcp`), events over ZMQ (`--event-plane zmq`), every address on
  127.0.0.1 (`DYN_TCP_RPC_HOST`, `DYN_EVENT_PLANE_HOST`, `DYN_TCP_RESPONSE_STREAM_HOST`);
- the model is deploy/dynamo-local/model/: a word-level tokenizer and a Llama-3.1-8B-shaped
  `config.json` written by model/make_model.py; nothing comes from a model hub.

Scaling: `Stack.start_worker(role)` starts one more worker; `Stack.stop_worker(worker)` drains
one: SIGTERM makes Dynamo's runtime remove the worker's endpoint from discovery first (the
frontend stops routing to it), then wait for its in-flight requests, then exit
(`dynamo_runtime::runtime` "Phase 1..3"); a worker still alive after `drain_timeout_s` is killed.
A request the frontend routed to a worker in the instant it deregistered is migrated to another
worker (the frontend's `--migration-limit`, StackConfig.migration_limit), not failed.
The orchestrator beside this file drives those two on the planner's decisions.

State (pids, ports, logs) is kept in `<workdir>/stack.json`, so `stop` and `status` work from
another shell.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import unquote

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
MODEL_DIR = HERE / "model"
PROFILE = REPO / "data" / "profiles" / "h200-llama3.1-8b-fp8"
DEFAULT_WORKDIR = Path(tempfile.gettempdir()) / "dynamo-local"
MODEL_NAME = "tiny"  # the name requests use and the frontend's metrics are labelled with
NAMESPACE = "dynamo"  # Dynamo's default namespace (DYN_NAMESPACE)

# Dynamo's component per role: a prefill mocker serves dyn://<ns>.prefill.generate, a decode one
# dyn://<ns>.backend.generate (dynamo.mocker.args DEFAULT_PREFILL_ENDPOINT / DEFAULT_ENDPOINT).
COMPONENTS = {"prefill": "prefill", "decode": "backend"}
ROLES = tuple(COMPONENTS)
# A discovery record not refreshed for this long belongs to a dead process. Dynamo's file backend
# touches each record every few seconds and expires it after 10 s (`storage::kv::file` "Expired").
RECORD_TTL_S = 10.0

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def dynamo_python() -> Path:
    """The interpreter of Dynamo's venv: $DYNAMO_PYTHON, else this repository's .venv-dynamo."""
    env = os.environ.get("DYNAMO_PYTHON")
    return Path(env) if env else REPO / ".venv-dynamo" / "bin" / "python"


def dynamo_available() -> bool:
    return dynamo_python().exists()


# --- discovery (read-only; Dynamo's file backend) ------------------------------------------------


@dataclass(frozen=True)
class Registration:
    """One worker as Dynamo's discovery shows it (a `v1/mdc` model-card record)."""

    role: str
    component: str
    instance_id: int  # the worker's connection id: FPM `worker_id`, the frontend's worker_id label
    worker_type: str  # the card's worker_type: "prefill" or "decode"


def _fresh_records(folder: Path, now: float, ttl_s: float = RECORD_TTL_S) -> Iterable[tuple[str, dict]]:
    if not folder.is_dir():
        return
    for path in folder.iterdir():
        try:
            if now - path.stat().st_mtime > ttl_s:
                continue
            yield unquote(path.name), json.loads(path.read_text())
        except (OSError, ValueError):  # removed or half-written while we read it
            continue


def registrations(discovery_dir: Path, namespace: str = NAMESPACE) -> dict[str, set[int]]:
    """The registered workers per role: model cards (`v1/mdc/<ns>/<component>/generate/<id>`)."""
    out: dict[str, set[int]] = {role: set() for role in ROLES}
    by_component = {c: r for r, c in COMPONENTS.items()}
    for _, rec in _fresh_records(discovery_dir / "v1" / "mdc", time.time()):
        if rec.get("type") != "Model" or rec.get("namespace") != namespace:
            continue
        role = by_component.get(rec.get("component", ""))
        if role is not None and rec.get("endpoint") == "generate":
            out[role].add(int(rec["instance_id"]))
    return out


# --- processes -----------------------------------------------------------------------------------


@dataclass
class Proc:
    kind: str  # "frontend", "prefill" or "decode"
    pid: int
    log: str
    started_at: float  # time.time()
    instance_id: int | None = None  # a worker's, once it registered
    stopping: bool = False


@dataclass
class StackConfig:
    workdir: str
    port: int = 8000
    startup_s: float = 5.0  # the mocker's simulated engine start-up (`--startup-time`)
    speedup: float = 1.0  # the mocker's `--speedup-ratio`: < 1 makes every iteration slower
    max_num_batched_tokens: int = 8192
    num_gpu_blocks: int | None = None  # None: the mocker's default KV capacity
    decode_max_num_seqs: int | None = None  # a decode engine's batch limit (None: the mocker's 256)
    namespace: str = NAMESPACE
    model_name: str = MODEL_NAME
    extra_worker_args: list[str] = field(default_factory=list)
    # The frontend's `--migration-limit`: a request routed to a worker that deregisters before the
    # request reaches it ("Worker disconnected before response stream was established") is retried
    # on another worker instead of answered 503. Dynamo's default is 0; any scaler that drains
    # workers under load needs it (measured: 1 of 1,190 requests failed with 0, none with 3).
    migration_limit: int = 3


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours is dead
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


class Stack:
    """The frontend and the workers of one stack; every method is synchronous and quick unless it
    says it waits."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.workdir = Path(config.workdir)
        self.discovery_dir = self.workdir / "discovery"
        self.logs = self.workdir / "logs"
        self.frontend: Proc | None = None
        self.workers: list[Proc] = []
        self.profile_npz: Path | None = None
        self._lock = threading.RLock()  # the orchestrator drains workers from threads

    # --- state file ---

    @property
    def state_path(self) -> Path:
        return self.workdir / "stack.json"

    def save(self) -> None:
        with self._lock:
            self._save()

    def _save(self) -> None:
        state = {
            "config": asdict(self.config),
            "profile_npz": str(self.profile_npz) if self.profile_npz else None,
            "frontend": asdict(self.frontend) if self.frontend else None,
            "workers": [asdict(w) for w in self.workers],
        }
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_path)

    @classmethod
    def load(cls, workdir: Path) -> Stack:
        state = json.loads((workdir / "stack.json").read_text())
        stack = cls(StackConfig(**state["config"]))
        stack.profile_npz = Path(state["profile_npz"]) if state["profile_npz"] else None
        stack.frontend = Proc(**state["frontend"]) if state["frontend"] else None
        stack.workers = [Proc(**w) for w in state["workers"]]
        return stack

    # --- environment ---

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.config.port}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "DYN_FILE_KV": str(self.discovery_dir),
                "DYN_DISCOVERY_BACKEND": "file",
                "DYN_REQUEST_PLANE": "tcp",
                "DYN_EVENT_PLANE": "zmq",
                "DYN_NAMESPACE": self.config.namespace,
                # Every listener and every advertised address on loopback.
                "DYN_TCP_RPC_HOST": "127.0.0.1",
                "DYN_EVENT_PLANE_HOST": "127.0.0.1",
                "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
                "DYN_LOG": env.get("DYN_LOG", "info"),
                "NO_COLOR": "1",
                # No model hub, ever: the model directory is local.
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
            }
        )
        env.pop("PYTHONPATH", None)  # Dynamo's venv, not the planner's tree
        return env

    def _spawn(self, kind: str, args: list[str]) -> Proc:
        self.logs.mkdir(parents=True, exist_ok=True)
        n = sum(1 for p in self.logs.iterdir() if p.name.startswith(kind + "-"))
        log_path = self.logs / f"{kind}-{n + 1}.log"
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                [str(dynamo_python()), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env(),
                cwd=str(self.workdir),
                start_new_session=True,  # a Ctrl-C in the caller's terminal is not a stop
            )
        return Proc(kind=kind, pid=popen.pid, log=str(log_path), started_at=time.time())

    # --- the stack ---

    def prepare(self) -> None:
        """The work folder and the mocker's timing tables (Dynamo's converter, once per stack)."""
        if not dynamo_available():
            raise SystemExit(
                f"Dynamo's venv is missing ({dynamo_python()}): run `bash bench/install_dynamo.sh` "
                "or set DYNAMO_PYTHON"
            )
        if self.discovery_dir.exists():
            shutil.rmtree(self.discovery_dir)  # a stale record would look like a live worker
        self.discovery_dir.mkdir(parents=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        npz = self.workdir / "perf_data.npz"
        if not npz.exists():
            code = (
                "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]);"
                "from bench.dynamo_replay import mocker_profile; print(mocker_profile(Path(sys.argv[2])))"
            )
            subprocess.run(
                [str(dynamo_python()), "-c", code, str(REPO), str(self.workdir)],
                check=True,
                env=self.env(),
                stdout=subprocess.DEVNULL,
            )
        self.profile_npz = npz
        self.save()

    def start_frontend(self) -> Proc:
        self.frontend = self._spawn(
            "frontend",
            [
                "-m",
                "dynamo.frontend",
                "--http-host",
                "127.0.0.1",
                "--http-port",
                str(self.config.port),
                "--discovery-backend",
                "file",
                "--request-plane",
                "tcp",
                "--event-plane",
                "zmq",
                "--router-mode",
                "round-robin",
                "--migration-limit",
                str(self.config.migration_limit),
            ],
        )
        self.save()
        return self.frontend

    def worker_args(self, role: str) -> list[str]:
        assert self.profile_npz is not None, "prepare() first"
        args = [
            "-m",
            "dynamo.mocker",
            "--model-path",
            str(MODEL_DIR),
            "--model-name",
            self.config.model_name,
            "--disaggregation-mode",
            role,
            "--discovery-backend",
            "file",
            "--request-plane",
            "tcp",
            "--event-plane",
            "zmq",
            "--planner-profile-data",
            str(self.profile_npz),
            "--startup-time",
            str(self.config.startup_s),
            "--speedup-ratio",
            str(self.config.speedup),
            "--max-num-batched-tokens",
            str(self.config.max_num_batched_tokens),
        ]
        if self.config.num_gpu_blocks is not None:
            args += ["--num-gpu-blocks-override", str(self.config.num_gpu_blocks)]
        if role == "decode" and self.config.decode_max_num_seqs is not None:
            args += ["--max-num-seqs", str(self.config.decode_max_num_seqs)]
        return args + list(self.config.extra_worker_args)

    def start_worker(self, role: str) -> Proc:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        worker = self._spawn(role, self.worker_args(role))
        self.workers.append(worker)
        self.save()
        return worker

    def running(self, role: str | None = None) -> list[Proc]:
        """Workers started and not being stopped (of one role, or all)."""
        return [
            w for w in self.workers if not w.stopping and (role is None or w.kind == role) and _alive(w.pid)
        ]

    def registered(self) -> dict[str, set[int]]:
        return registrations(self.discovery_dir, self.config.namespace)

    def identify(self) -> None:
        """Give each running worker the instance id its log announces once it registered."""
        changed = False
        for worker in self.workers:
            if worker.instance_id is None:
                worker.instance_id = worker_instance_id(Path(worker.log))
                changed = changed or worker.instance_id is not None
        if changed:
            self.save()

    def ready_counts(self) -> dict[str, int]:
        """Per role: workers of ours that are alive, not stopping, and registered in discovery."""
        self.identify()
        reg = self.registered()
        return {role: sum(1 for w in self.running(role) if w.instance_id in reg[role]) for role in ROLES}

    def wait_ready(self, counts: Mapping[str, int], timeout_s: float = 120.0) -> dict[str, int]:
        """Wait until at least `counts` workers per role are registered (and the frontend
        answers, when there is one). Raises TimeoutError naming what is missing."""
        deadline = time.monotonic() + timeout_s
        while True:
            ready = self.ready_counts()
            frontend_ok = self.frontend is None or self.frontend_models()
            if frontend_ok and all(ready[r] >= n for r, n in counts.items()):
                return ready
            for proc in ([self.frontend] if self.frontend else []) + self.running():
                if not _alive(proc.pid):
                    raise RuntimeError(f"{proc.kind} (pid {proc.pid}) exited: see {proc.log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"ready {ready}, wanted {dict(counts)}; frontend answers: {frontend_ok}")
            time.sleep(0.25)

    def frontend_models(self) -> list[str]:
        try:
            with urllib.request.urlopen(f"{self.url}/v1/models", timeout=2) as resp:
                return [m["id"] for m in json.load(resp).get("data", [])]
        except (OSError, ValueError, urllib.error.URLError):
            return []

    def stop_worker(self, worker: Proc, *, drain_timeout_s: float = 60.0, wait: bool = True) -> None:
        """Drain and stop one worker: SIGTERM (Dynamo deregisters it, then waits for its
        in-flight requests), then SIGKILL if it is still there after `drain_timeout_s`."""
        worker.stopping = True
        self.save()
        _signal(worker.pid, signal.SIGTERM)
        if wait:
            _wait_gone(worker.pid, drain_timeout_s)

    def stop(self, timeout_s: float = 20.0) -> None:
        """Everything: the workers (drained), then the frontend."""
        procs = [w for w in self.workers if _alive(w.pid)]
        for w in procs:
            w.stopping = True
            _signal(w.pid, signal.SIGTERM)
        for w in procs:
            _wait_gone(w.pid, timeout_s)
        if self.frontend is not None and _alive(self.frontend.pid):
            _signal(self.frontend.pid, signal.SIGTERM)
            _wait_gone(self.frontend.pid, timeout_s)
        self.save()

    def start(self, prefill: int, decode: int, *, timeout_s: float = 180.0) -> dict[str, int]:
        """prepare, the frontend, the workers; waits until all are registered and served."""
        self.prepare()
        self.start_frontend()
        for role, n in (("prefill", prefill), ("decode", decode)):
            for _ in range(n):
                self.start_worker(role)
        return self.wait_ready({"prefill": prefill, "decode": decode}, timeout_s)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait_gone(pid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        if time.monotonic() > deadline:
            _signal(pid, signal.SIGKILL)
            deadline = time.monotonic() + 5.0
        time.sleep(0.1)


_INSTANCE_ID = re.compile(r"FPM direct publisher started\s+worker_id=(\d+)")


def worker_instance_id(log: Path) -> int | None:
    """The worker's instance (connection) id, from the line its FPM publisher logs at start-up:
    the `worker_id` of its ForwardPassMetrics and the `instance_id` of its discovery records."""
    try:
        text = _ANSI.sub("", log.read_text(errors="replace"))
    except OSError:
        return None
    match = _INSTANCE_ID.search(text)
    return int(match.group(1)) if match else None


# --- command line --------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("start", "run"):
        p = sub.add_parser(name)
        p.add_argument("--prefill", type=int, default=1)
        p.add_argument("--decode", type=int, default=1)
        p.add_argument("--port", type=int, default=8000)
        p.add_argument("--startup-s", type=float, default=5.0, help="simulated engine start-up (s)")
        p.add_argument("--speedup", type=float, default=1.0, help="mocker speed-up (<1: slower engines)")
        p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    for name in ("status", "stop"):
        p = sub.add_parser(name)
        p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command in ("start", "run"):
        args.workdir.mkdir(parents=True, exist_ok=True)
        if (args.workdir / "stack.json").exists():
            old = Stack.load(args.workdir)
            if (old.frontend and _alive(old.frontend.pid)) or old.running():
                print(f"a stack is already running in {args.workdir}: stop it first", file=sys.stderr)
                return 1
        stack = Stack(
            StackConfig(
                workdir=str(args.workdir), port=args.port, startup_s=args.startup_s, speedup=args.speedup
            )
        )
        try:
            ready = stack.start(args.prefill, args.decode)
        except BaseException:
            stack.stop()
            raise
        print(f"Dynamo frontend {stack.url} (model {stack.config.model_name!r}), workers {ready}")
        print(f"discovery {stack.discovery_dir}, logs {stack.logs}")
        if args.command == "start":
            return 0
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
        finally:
            stack.stop()
        return 0
    if not (args.workdir / "stack.json").exists():
        print(f"no stack in {args.workdir}", file=sys.stderr)
        return 1 if args.command == "status" else 0
    stack = Stack.load(args.workdir)
    if args.command == "status":
        frontend = "up" if stack.frontend and _alive(stack.frontend.pid) else "down"
        print(f"frontend {stack.url}: {frontend}; models {stack.frontend_models()}")
        print(f"registered per role: { {r: len(ids) for r, ids in stack.registered().items()} }")
        for w in stack.workers:
            state = "stopping" if w.stopping else ("alive" if _alive(w.pid) else "gone")
            print(f"  {w.kind:8} pid {w.pid:7} {state:8} instance {w.instance_id}  {w.log}")
        return 0
    stack.stop()
    print("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())

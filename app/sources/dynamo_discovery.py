"""Dynamo's discovery, read: which ForwardPassMetrics publishers and workers exist now.

Dynamo 1.6's `--discovery-backend file` keeps one JSON record per registration in a folder
(`DYN_FILE_KV`, default `$TMPDIR/dynamo_store_kv`), under `v1/<bucket>/<URL-quoted key>`; each
process touches its records every few seconds and a record untouched for 10 s is expired (and
deleted by the first reader that notices). A worker stopped with SIGTERM deletes its records at
once. The names below were checked against a live Dynamo 1.6.1 stack
(tests/data/dynamo-1.6.1/discovery/, tests/contract/test_dynamo_names.py):

- `v1/event_channels/namespace/<ns>/component/<c>/endpoint/<e>/topic/forward-pass-metrics/<id>`:
  `{"type": "EventChannel", "scope": {"kind": "endpoint", "endpoint": {"namespace", "component",
  "name"}}, "topic": "forward-pass-metrics", "instance_id", "transport": {"kind": "Zmq",
  "config": {"endpoint": "tcp://host:port"}}}`: one per engine's FPM publisher;
- `v1/mdc/<ns>/<component>/<endpoint>/<instance hex>`: the model card a worker registered,
  `{"type": "Model", "namespace", "component", "endpoint", "instance_id", "card_json": {...,
  "worker_type": "prefill" | "decode"}}`; `instance_id` (decimal) is the `worker_id` of the
  worker's FPM records and the frontend's `worker_id` label.

Components are Dynamo's defaults: prefill workers serve `<ns>.prefill.generate`, decode workers
`<ns>.backend.generate` (`dynamo.mocker.args`, the vLLM and SGLang backends alike); a deployment
that names its components differently says so (`sources.fpm_discovery.components`).

Only the file backend is read here. With etcd or Kubernetes discovery the same records live in
etcd keys or DynamoWorkerMetadata resources; listing the FPM endpoints by hand
(`sources.fpm_endpoints`) still works there.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

FPM_TOPIC = "forward-pass-metrics"
DEFAULT_COMPONENTS = {"prefill": "prefill", "decode": "backend", "workers": "backend"}
DEFAULT_NAMESPACE = "dynamo"
DEFAULT_ENDPOINT = "generate"
RECORD_TTL_S = 10.0  # Dynamo's file backend expires a record untouched this long


def default_root() -> Path:
    """Where Dynamo's file backend keeps its records: $DYN_FILE_KV, else $TMPDIR/dynamo_store_kv."""
    env = os.environ.get("DYN_FILE_KV")
    return Path(env) if env else Path(tempfile.gettempdir()) / "dynamo_store_kv"


@dataclass(frozen=True)
class FpmPublisher:
    namespace: str
    component: str
    endpoint_name: str
    instance_id: int  # the publisher's (not the worker's) id
    address: str  # the ZMQ address to subscribe to


@dataclass(frozen=True)
class WorkerCard:
    namespace: str
    component: str
    endpoint_name: str
    instance_id: int  # the worker's connection id: FPM worker_id, frontend worker_id label
    worker_type: str | None


class FileDiscovery:
    """Reads a Dynamo file-discovery folder. Cheap (a directory listing and a few small files), so
    callers may call it every second; blocking I/O, so not on an event loop."""

    def __init__(
        self,
        root: str | Path | None = None,
        *,
        ttl_s: float = RECORD_TTL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root = Path(root) if root is not None else default_root()
        self.ttl_s = ttl_s
        self._clock = clock

    def _records(self, bucket: str) -> list[dict]:
        folder = self.root / "v1" / bucket
        if not folder.is_dir():  # nothing registered yet: Dynamo makes the folders on first use
            return []
        now = self._clock()
        out = []
        for path in sorted(folder.iterdir()):
            try:
                if now - path.stat().st_mtime > self.ttl_s:
                    continue  # its process is gone; Dynamo deletes it soon
                record = json.loads(path.read_text())
            except (OSError, ValueError):  # deleted or half-written while read: next call
                continue
            if isinstance(record, dict):
                record["_key"] = unquote(path.name)
                out.append(record)
        return out

    def fpm_publishers(self) -> list[FpmPublisher]:
        out = []
        for rec in self._records("event_channels"):
            if rec.get("type") != "EventChannel" or rec.get("topic") != FPM_TOPIC:
                continue
            scope = rec.get("scope") or {}
            ep = scope.get("endpoint") or {}
            transport = rec.get("transport") or {}
            address = (transport.get("config") or {}).get("endpoint")
            if transport.get("kind") != "Zmq" or not isinstance(address, str):
                continue  # NATS event plane: nothing to subscribe to over ZMQ
            out.append(
                FpmPublisher(
                    namespace=str(ep.get("namespace", "")),
                    component=str(ep.get("component", "")),
                    endpoint_name=str(ep.get("name", "")),
                    instance_id=int(rec.get("instance_id", 0)),
                    address=address,
                )
            )
        return out

    def workers(self) -> list[WorkerCard]:
        out = []
        for rec in self._records("mdc"):
            if rec.get("type") != "Model":
                continue
            card = rec.get("card_json") or {}
            out.append(
                WorkerCard(
                    namespace=str(rec.get("namespace", "")),
                    component=str(rec.get("component", "")),
                    endpoint_name=str(rec.get("endpoint", "")),
                    instance_id=int(rec["instance_id"]),
                    worker_type=card.get("worker_type"),
                )
            )
        return out

    def fpm_addresses(
        self, component: str, *, namespace: str = DEFAULT_NAMESPACE, endpoint_name: str = DEFAULT_ENDPOINT
    ) -> list[str]:
        """The ZMQ addresses of one component's FPM publishers (one per worker process)."""
        return sorted(
            {
                p.address
                for p in self.fpm_publishers()
                if p.namespace == namespace and p.component == component and p.endpoint_name == endpoint_name
            }
        )

    def worker_ids(
        self, component: str, *, namespace: str = DEFAULT_NAMESPACE, endpoint_name: str = DEFAULT_ENDPOINT
    ) -> set[int]:
        return {
            w.instance_id
            for w in self.workers()
            if w.namespace == namespace and w.component == component and w.endpoint_name == endpoint_name
        }

    def fpm_discoverer(
        self, component: str, *, namespace: str = DEFAULT_NAMESPACE, endpoint_name: str = DEFAULT_ENDPOINT
    ) -> Callable[[], list[str]]:
        """What `FpmSubscriber(discover=...)` calls: this component's publishers now."""
        return lambda: self.fpm_addresses(component, namespace=namespace, endpoint_name=endpoint_name)

"""A local stand-in for the Kubernetes API server, for the Kubernetes connector's tests.

No API server can run here, so this serves the few endpoints the connector uses, over real HTTP
on a free loopback port, with the API server's semantics for them (the rules themselves are in
tests/k8s_api_rules.py):

- custom resources, `GET /apis/{group}/{version}/namespaces/{ns}/{plural}[/{name}[/scale]]`
  and `PATCH` of an object or of its `scale` subresource (for resource types registered with
  scale paths, like a CRD's `subresources.scale`);
- pods of the core API, `GET /api/v1/namespaces/{ns}/pods` (with an equality-based
  `labelSelector`: `k=v`, `k==v`, `k!=v`, `k`, `!k`, comma-separated) and `GET` / `PATCH` of
  `/api/v1/namespaces/{ns}/pods/{name}`;
- errors as `Status` objects (`kind: Status`, `status: Failure`, `reason`, `code`, `details`):
  401 Unauthorized (wrong bearer token, when one is required), 403 Forbidden (per verb and
  resource, to simulate missing RBAC, checked before the object is looked up, as the real
  authorizer does), 404 NotFound (object missing: details name it; resource type unknown: "the
  server could not find the requested resource" with empty details), 405, 400 for bodies that
  do not parse, 409 Conflict (a stale `metadata.resourceVersion` precondition in the patch, or
  injected with `fail_next_patches`), 415 UnsupportedMediaType for a PATCH content type the
  type does not accept (strategic merge patch is for core types only, as custom resources have
  no patch-merge keys), 422 Invalid for negative or non-integer replicas;
- `application/merge-patch+json` (RFC 7386: objects merge, `null` deletes, anything else
  replaces) and `application/json-patch+json` (RFC 6902 add / remove / replace / test) are
  applied to the stored object, and for pods `application/strategic-merge-patch+json` made of
  maps (where it is a merge patch); strategic patches of lists or with `$` directives, and
  `application/apply-patch+yaml` (server-side apply), are accepted by the real API but not by
  this stand-in (415, saying so);
- the status subresource is on: a patch of the main resource leaves `.status` alone; a write
  that changes the object bumps `metadata.resourceVersion` (one counter for the whole server,
  like etcd's revision) and, when anything outside metadata and status changed,
  `metadata.generation`; a patch that changes nothing bumps nothing (as the real API).

Every request is recorded (method, path, query, content type, parsed body) for assertions;
`hold_next_request()` parks the next request until the test releases it, to show that a caller
keeps running while a call is in flight; `fail_next_reads()` and `delay_next_reads()` make reads
fail or answer only after a while (an API server overloaded or hung), `fail_next_patches()`
makes writes fail.
"""

from __future__ import annotations

import copy
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from tests.k8s_api_rules import (
    APPLY_PATCH,
    DGD,
    DGDSA,
    MERGE_PATCH,
    POD,
    STRATEGIC_PATCH,
    ApiError,
    ResourceType,
    Route,
    apply_patch,
    conflict,
    forbidden,
    get_path,
    label_selector,
    not_found,
    not_served,
    parse_route,
    scale_of,
    selects,
    set_path,
    valid_replicas,
    validate,
)

__all__ = ["DGD", "DGDSA", "MERGE_PATCH", "POD", "STRATEGIC_PATCH", "KubeStandIn", "ResourceType"]


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    content_type: str | None
    body: Any  # parsed JSON when it parsed, else the raw text; None without a body
    authorization: str | None


@dataclass
class Hold:
    """Parks one request until `release()` (or `timeout_s`, then `timed_out` is True)."""

    timeout_s: float = 10.0
    match: Callable[[RecordedRequest], bool] | None = None
    arrived: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    timed_out: bool = False

    def release(self) -> None:
        self.released.set()


class KubeStandIn:
    """Start with `with KubeStandIn() as api:`; `api.url` is the server address."""

    def __init__(
        self,
        *,
        token: str | None = None,
        resources: tuple[ResourceType, ...] = (DGD, DGDSA, POD),
        user: str = "system:serviceaccount:dynamo:planner",
    ) -> None:
        self.token = token
        self.user = user
        self.resources = {(r.group, r.version, r.plural): r for r in resources}
        self.requests: list[RecordedRequest] = []
        self._objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self._forbidden: set[tuple[str, str]] = set()
        self._failures: list[tuple[int, str | None]] = []
        self._read_failures: list[int] = []
        self._read_delays_s: list[float] = []
        self._holds: list[Hold] = []
        self._stopping = threading.Event()
        self._revision = 1000
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> KubeStandIn:
        handler = type("Handler", (_Handler,), {"standin": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="k8s-standin", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # delayed reads answer at once
        with self._lock:
            for hold in self._holds:
                hold.release()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> KubeStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "start() first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # --- state, for tests --------------------------------------------------------------------

    def _type(self, plural: str) -> ResourceType:
        return next(r for r in self.resources.values() if r.plural == plural)

    def _next_revision(self) -> str:
        self._revision += 1
        return str(self._revision)

    def put(self, plural: str, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace an object (as `kubectl apply` would); returns the stored copy. A
        `metadata.uid` given is kept (a pod's uid is what a caller may know it by)."""
        rtype = self._type(plural)
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        name = meta["name"]
        with self._lock:
            old = (self._objects.get((rtype.plural, namespace, name, rtype.group)) or {}).get("metadata", {})
            obj["apiVersion"] = rtype.api_version
            obj["kind"] = rtype.kind
            meta["namespace"] = namespace
            meta["uid"] = meta.get("uid") or old.get("uid") or str(uuid.uuid4())
            meta["creationTimestamp"] = old.get("creationTimestamp") or (
                datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            )
            meta["generation"] = old.get("generation", 0) + 1
            meta["resourceVersion"] = self._next_revision()
            self._objects[(rtype.plural, namespace, name, rtype.group)] = obj
            return copy.deepcopy(obj)

    def put_pod(
        self,
        namespace: str,
        name: str,
        *,
        labels: dict[str, str],
        uid: str | None = None,
        ready: bool = True,
        annotations: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """A running pod (as a controller creates it), Ready or not; returns the stored copy."""
        condition = {"type": "Ready", "status": "True" if ready else "False"}
        meta: dict[str, Any] = {"name": name, "labels": dict(labels)}
        if uid is not None:
            meta["uid"] = uid
        if annotations:
            meta["annotations"] = dict(annotations)
        return self.put(
            POD.plural,
            namespace,
            {
                "metadata": meta,
                "spec": {"containers": [{"name": "main", "image": "stand-in"}]},
                "status": {"phase": "Running", "conditions": [condition]},
            },
        )

    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        rtype = self._type(plural)
        with self._lock:
            obj = self._objects.get((rtype.plural, namespace, name, rtype.group))
            return copy.deepcopy(obj) if obj is not None else None

    def delete(self, plural: str, namespace: str, name: str) -> None:
        rtype = self._type(plural)
        with self._lock:
            self._objects.pop((rtype.plural, namespace, name, rtype.group), None)

    def set_status(self, plural: str, namespace: str, name: str, status: dict[str, Any]) -> None:
        """What a controller's status write does: replace `.status`, bump resourceVersion."""
        rtype = self._type(plural)
        with self._lock:
            obj = self._objects[(rtype.plural, namespace, name, rtype.group)]
            obj["status"] = copy.deepcopy(status)
            obj["metadata"]["resourceVersion"] = self._next_revision()

    def forbid(self, verb: str, resource: str) -> None:
        """Deny `verb` on `resource` ("plural" or "plural/subresource"), as a missing RBAC rule."""
        with self._lock:
            self._forbidden.add((verb, resource))

    def fail_next_patches(self, count: int, *, code: int = 409, resource: str | None = None) -> None:
        """Answer the next `count` PATCH requests (of `resource`, if given) with this error."""
        with self._lock:
            self._failures.extend([(code, resource)] * count)

    def fail_next_reads(self, count: int, *, code: int = 500) -> None:
        """Answer the next `count` GET requests of an object with this error (an API server
        overloaded or restarting)."""
        with self._lock:
            self._read_failures.extend([code] * count)

    def delay_next_reads(self, count: int, seconds: float) -> None:
        """Answer the next `count` GET requests of an object only after `seconds` (an API server
        that hangs: a caller with a shorter timeout gives up first)."""
        with self._lock:
            self._read_delays_s.extend([seconds] * count)

    def pending_read_delays(self) -> int:
        with self._lock:
            return len(self._read_delays_s)

    def hold_next_request(
        self, timeout_s: float = 10.0, *, match: Callable[[RecordedRequest], bool] | None = None
    ) -> Hold:
        """Park the next request (the next one `match` accepts) until the hold is released."""
        hold = Hold(timeout_s=timeout_s, match=match)
        with self._lock:
            self._holds.append(hold)
        return hold

    def patches(self) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.method == "PATCH"]

    def clear_requests(self) -> None:
        with self._lock:
            self.requests.clear()

    # --- request handling (server threads) -----------------------------------------------------

    def handle(
        self, method: str, raw_path: str, headers: dict[str, str], raw_body: bytes
    ) -> tuple[int, dict[str, Any]]:
        split = urlsplit(raw_path)
        content_type = headers.get("content-type")
        body: Any = None
        if raw_body:
            try:
                body = json.loads(raw_body)
            except ValueError:
                body = raw_body.decode("utf-8", "replace")
        request = RecordedRequest(
            method=method,
            path=split.path,
            query=dict(parse_qsl(split.query)),
            content_type=content_type,
            body=body,
            authorization=headers.get("authorization"),
        )
        delay_s = 0.0
        with self._lock:
            self.requests.append(request)
            hold = next((h for h in self._holds if h.match is None or h.match(request)), None)
            if hold is not None:
                self._holds.remove(hold)
            if method == "GET" and self._read_delays_s and _names_an_object(split.path):
                delay_s = self._read_delays_s.pop(0)
        if hold is not None:
            hold.arrived.set()
            if not hold.released.wait(hold.timeout_s):
                hold.timed_out = True
        if delay_s:
            self._stopping.wait(delay_s)
        try:
            return 200, self._dispatch(method, split.path, request.query, headers, content_type, raw_body)
        except ApiError as err:
            return err.code, err.status()

    def _dispatch(
        self,
        method: str,
        path: str,
        query: dict[str, str],
        headers: dict[str, str],
        content_type: str | None,
        raw_body: bytes,
    ) -> dict[str, Any]:
        if self.token is not None and headers.get("authorization") != f"Bearer {self.token}":
            raise ApiError(401, "Unauthorized", "Unauthorized")
        route = parse_route(path)
        name, sub = route.name, route.sub
        rtype = self.resources.get((route.group, route.version, route.plural))
        if rtype is None or (sub is not None and (sub != "scale" or rtype.scale_spec_path is None)):
            raise not_served()
        verb = {"GET": "get" if name else "list", "PATCH": "patch"}.get(method)
        if verb is None or (verb == "patch" and name is None):
            raise ApiError(
                405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
            )
        resource = f"{rtype.plural}/{sub}" if sub else rtype.plural
        if (verb, resource) in self._forbidden:
            raise forbidden(rtype, route, verb, resource, self.user)
        with self._lock:
            if name is None:
                return self._list(rtype, route, query.get("labelSelector", ""))
            if method == "PATCH":
                patch = self._parse_patch(rtype, content_type, raw_body)
            key = (rtype.plural, route.namespace, name, rtype.group)
            obj = self._objects.get(key)
            if obj is None:
                raise not_found(rtype, name)
            if method == "GET":
                if self._read_failures:
                    code = self._read_failures.pop(0)
                    raise ApiError(code, HTTPStatus(code).phrase.replace(" ", ""), f"injected failure {code}")
                return scale_of(rtype, obj) if sub else copy.deepcopy(obj)
            self._injected_failure(rtype, resource, name)
            if sub:
                return self._patch_scale(rtype, obj, content_type or "", patch)
            return self._patch_object(rtype, key, obj, content_type or "", patch)

    def _list(self, rtype: ResourceType, route: Route, selector: str) -> dict[str, Any]:
        terms = label_selector(selector)
        items = [
            copy.deepcopy(o)
            for (p, ns, _, g), o in sorted(self._objects.items())
            if p == rtype.plural
            and ns == route.namespace
            and g == rtype.group
            and selects(terms, o["metadata"].get("labels") or {})
        ]
        return {
            "apiVersion": rtype.api_version,
            "kind": f"{rtype.kind}List",
            "metadata": {"resourceVersion": str(self._revision)},
            "items": items,
        }

    def _parse_patch(self, rtype: ResourceType, content_type: str | None, raw_body: bytes) -> Any:
        media = (content_type or "").split(";")[0].strip().lower()
        if media not in rtype.patch_types:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types include: "
                f"{', '.join(rtype.patch_types)}",
            )
        if media == APPLY_PATCH:
            raise ApiError(
                415, "UnsupportedMediaType", "server-side apply is not implemented by the stand-in"
            )
        try:
            return json.loads(raw_body or b"null")
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"error decoding patch: {exc}") from None

    def _injected_failure(self, rtype: ResourceType, resource: str, name: str) -> None:
        for index, (code, only) in enumerate(self._failures):
            if only is None or only == resource:
                del self._failures[index]
                if code == 409:
                    raise conflict(rtype, name)
                raise ApiError(code, HTTPStatus(code).phrase.replace(" ", ""), f"injected failure {code}")

    def _check_precondition(
        self, patched: dict[str, Any], current: dict[str, Any], rtype: ResourceType
    ) -> None:
        """A `metadata.resourceVersion` in the patch is a precondition on the stored object."""
        wanted = (patched.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != current["metadata"]["resourceVersion"]:
            raise conflict(rtype, current["metadata"]["name"])

    def _patch_object(
        self, rtype: ResourceType, key: tuple[str, str, str, str], obj: dict[str, Any], media: str, patch: Any
    ) -> dict[str, Any]:
        name = obj["metadata"]["name"]
        patched = apply_patch(media, obj, patch)
        self._check_precondition(patched, obj, rtype)
        meta = patched.get("metadata") if isinstance(patched.get("metadata"), dict) else {}
        if meta.get("name", name) != name or meta.get("namespace", obj["metadata"]["namespace"]) != key[1]:
            raise ApiError(400, "BadRequest", "the name or namespace of the object does not match the URL")
        # Read-only fields keep their values; the status subresource owns .status.
        for field_name in ("uid", "creationTimestamp", "generation", "resourceVersion", "namespace", "name"):
            meta[field_name] = obj["metadata"][field_name]
        patched["metadata"] = meta
        patched["apiVersion"], patched["kind"] = obj["apiVersion"], obj["kind"]
        if "status" in obj:
            patched["status"] = copy.deepcopy(obj["status"])
        else:
            patched.pop("status", None)
        validate(rtype, patched)
        if patched == obj:
            return copy.deepcopy(obj)
        outside = {k: v for k, v in patched.items() if k not in ("metadata", "status")}
        before = {k: v for k, v in obj.items() if k not in ("metadata", "status")}
        if outside != before:
            meta["generation"] = obj["metadata"]["generation"] + 1
        meta["resourceVersion"] = self._next_revision()
        self._objects[key] = patched
        return copy.deepcopy(patched)

    def _patch_scale(
        self, rtype: ResourceType, obj: dict[str, Any], media: str, patch: Any
    ) -> dict[str, Any]:
        assert rtype.scale_spec_path is not None
        scale = scale_of(rtype, obj)
        patched = apply_patch(media, scale, patch)
        self._check_precondition(patched, obj, rtype)
        replicas = (patched.get("spec") or {}).get("replicas")
        if not valid_replicas(replicas):
            raise ApiError(
                422,
                "Invalid",
                f'Scale.autoscaling "{obj["metadata"]["name"]}" is invalid: spec.replicas: '
                f"Invalid value: {replicas!r}: must be greater than or equal to 0",
                {"name": obj["metadata"]["name"], "group": "autoscaling", "kind": "Scale"},
            )
        if replicas != get_path(obj, rtype.scale_spec_path):
            set_path(obj, rtype.scale_spec_path, replicas)
            obj["metadata"]["generation"] += 1
            obj["metadata"]["resourceVersion"] = self._next_revision()
        return scale_of(rtype, obj)


def _names_an_object(path: str) -> bool:
    try:
        return parse_route(path).name is not None
    except ApiError:
        return False


class _Handler(BaseHTTPRequestHandler):
    standin: KubeStandIn
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw_body = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        code, payload = self.standin.handle(self.command, self.path, headers, raw_body)
        data = json.dumps(payload).encode()
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the caller stopped waiting (its timeout ran out before a delayed answer)

    do_GET = do_PATCH = do_POST = do_PUT = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


@contextmanager
def running_standin(**kwargs: Any) -> Iterator[KubeStandIn]:
    with KubeStandIn(**kwargs) as standin:
        yield standin

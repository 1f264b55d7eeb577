"""A local stand-in for the Kubernetes API server, for the Kubernetes connector's tests.

No API server can run here, so this serves the few endpoints the connector uses, over real HTTP
on a free loopback port, with the API server's semantics for them:

- `GET /apis/{group}/{version}/namespaces/{ns}/{plural}[/{name}[/scale]]` and `PATCH` of an
  object or of its `scale` subresource (for resource types registered with scale paths, like a
  CRD's `subresources.scale`);
- errors as `Status` objects (`kind: Status`, `status: Failure`, `reason`, `code`, `details`):
  401 Unauthorized (wrong bearer token, when one is required), 403 Forbidden (per verb and
  resource, to simulate missing RBAC, checked before the object is looked up, as the real
  authorizer does), 404 NotFound (object missing: details name it; resource type unknown: "the
  server could not find the requested resource" with empty details), 405, 400 for bodies that
  do not parse, 409 Conflict (a stale `metadata.resourceVersion` precondition in the patch, or
  injected with `fail_next_patches`), 415 UnsupportedMediaType for a PATCH content type that
  custom resources do not accept (strategic merge patch included), 422 Invalid for negative or
  non-integer replicas;
- `application/merge-patch+json` (RFC 7386: objects merge, `null` deletes, anything else
  replaces) and `application/json-patch+json` (RFC 6902 add / remove / replace / test) are
  applied to the stored object; `application/apply-patch+yaml` (server-side apply) is accepted
  by the real API but not by this stand-in (415, saying so);
- the status subresource is on: a patch of the main resource leaves `.status` alone; a write
  that changes the object bumps `metadata.resourceVersion` (one counter for the whole server,
  like etcd's revision) and, when anything outside metadata and status changed,
  `metadata.generation`; a patch that changes nothing bumps nothing (as the real API).

Every request is recorded (method, path, query, content type, parsed body) for assertions, and
`hold_next_request()` parks the next request until the test releases it, to show that a caller
keeps running while a call is in flight.
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

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
_ACCEPTED_PATCH_TYPES = (JSON_PATCH, MERGE_PATCH, APPLY_PATCH)


@dataclass(frozen=True)
class ResourceType:
    """A served resource type, like an installed CRD."""

    group: str
    version: str
    kind: str
    plural: str
    # The CRD's subresources.scale paths (dotted, without the leading dot); None: no scale.
    scale_spec_path: str | None = None
    scale_status_path: str | None = None
    scale_selector_path: str | None = None


DGD = ResourceType("nvidia.com", "v1alpha1", "DynamoGraphDeployment", "dynamographdeployments")
DGDSA = ResourceType(
    "nvidia.com",
    "v1alpha1",
    "DynamoGraphDeploymentScalingAdapter",
    "dynamographdeploymentscalingadapters",
    scale_spec_path="spec.replicas",
    scale_status_path="status.replicas",
    scale_selector_path="status.selector",
)


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


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}

    def status(self) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": self.details,
            "code": self.code,
        }


def _not_served() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON Merge Patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ValueError(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 JSON Patch, the operations add, remove, replace and test."""
    if not isinstance(operations, list):
        raise ValueError("a JSON patch is a list of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise ValueError(f"invalid operation {op!r}")
        parts = _pointer(op["path"])
        if not parts:
            raise ValueError("operations on the whole document are not supported")
        parent = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        kind = op["op"]
        if kind == "test":
            current = parent[int(last)] if isinstance(parent, list) else parent.get(last, object())
            if current != op.get("value"):
                raise LookupError(f"test failed at {op['path']}")
        elif kind == "remove":
            if isinstance(parent, list):
                del parent[int(last)]
            else:
                del parent[last]
        elif kind in ("add", "replace"):
            if isinstance(parent, list):
                index = len(parent) if last == "-" else int(last)
                if kind == "add":
                    parent.insert(index, copy.deepcopy(op["value"]))
                else:
                    parent[index] = copy.deepcopy(op["value"])
            else:
                if kind == "replace" and last not in parent:
                    raise KeyError(last)
                parent[last] = copy.deepcopy(op["value"])
        else:
            raise ValueError(f"unsupported operation {kind!r}")
    return doc


def _get_path(obj: dict[str, Any], dotted: str) -> Any:
    node: Any = obj
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _set_path(obj: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = obj
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def _valid_replicas(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class KubeStandIn:
    """Start with `with KubeStandIn() as api:`; `api.url` is the server address."""

    def __init__(
        self,
        *,
        token: str | None = None,
        resources: tuple[ResourceType, ...] = (DGD, DGDSA),
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
        self._holds: list[Hold] = []
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
        """Create or replace an object (as `kubectl apply` would); returns the stored copy."""
        rtype = self._type(plural)
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        name = meta["name"]
        with self._lock:
            old = self._objects.get((rtype.plural, namespace, name, rtype.group))
            obj["apiVersion"] = f"{rtype.group}/{rtype.version}"
            obj["kind"] = rtype.kind
            meta["namespace"] = namespace
            meta["uid"] = (old or {}).get("metadata", {}).get("uid") or str(uuid.uuid4())
            meta["creationTimestamp"] = (old or {}).get("metadata", {}).get("creationTimestamp") or (
                datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            )
            meta["generation"] = (old or {}).get("metadata", {}).get("generation", 0) + 1
            meta["resourceVersion"] = self._next_revision()
            self._objects[(rtype.plural, namespace, name, rtype.group)] = obj
            return copy.deepcopy(obj)

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
        with self._lock:
            self.requests.append(request)
            hold = next((h for h in self._holds if h.match is None or h.match(request)), None)
            if hold is not None:
                self._holds.remove(hold)
        if hold is not None:
            hold.arrived.set()
            if not hold.released.wait(hold.timeout_s):
                hold.timed_out = True
        try:
            return 200, self._dispatch(method, split.path, headers, content_type, raw_body)
        except ApiError as err:
            return err.code, err.status()

    def _dispatch(
        self, method: str, path: str, headers: dict[str, str], content_type: str | None, raw_body: bytes
    ) -> dict[str, Any]:
        if self.token is not None and headers.get("authorization") != f"Bearer {self.token}":
            raise ApiError(401, "Unauthorized", "Unauthorized")
        parts = [p for p in path.split("/") if p]
        # apis / group / version / namespaces / ns / plural [/ name [/ subresource]]
        if len(parts) < 6 or len(parts) > 8 or parts[0] != "apis" or parts[3] != "namespaces":
            raise _not_served()
        group, version, namespace, plural = parts[1], parts[2], parts[4], parts[5]
        name = parts[6] if len(parts) > 6 else None
        sub = parts[7] if len(parts) > 7 else None
        rtype = self.resources.get((group, version, plural))
        if rtype is None or (sub is not None and (sub != "scale" or rtype.scale_spec_path is None)):
            raise _not_served()
        verb = {"GET": "get" if name else "list", "PATCH": "patch"}.get(method)
        if verb is None or (verb == "patch" and name is None):
            raise ApiError(
                405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
            )
        resource = f"{plural}/{sub}" if sub else plural
        if (verb, resource) in self._forbidden:
            target = f'{plural}.{group} "{name}"' if name else f"{plural}.{group}"
            raise ApiError(
                403,
                "Forbidden",
                f'{target} is forbidden: User "{self.user}" cannot {verb} resource "{resource}" '
                f'in API group "{group}" in the namespace "{namespace}"',
                {"name": name, "group": group, "kind": plural} if name else {"group": group, "kind": plural},
            )
        with self._lock:
            if name is None:
                items = [
                    copy.deepcopy(o)
                    for (p, ns, _, g), o in sorted(self._objects.items())
                    if p == plural and ns == namespace and g == group
                ]
                return {
                    "apiVersion": f"{group}/{version}",
                    "kind": f"{rtype.kind}List",
                    "metadata": {"resourceVersion": str(self._revision)},
                    "items": items,
                }
            if method == "PATCH":
                patch = self._parse_patch(content_type, raw_body)
            key = (plural, namespace, name, group)
            obj = self._objects.get(key)
            if obj is None:
                raise ApiError(
                    404,
                    "NotFound",
                    f'{plural}.{group} "{name}" not found',
                    {"name": name, "group": group, "kind": plural},
                )
            if method == "GET":
                if self._read_failures:
                    code = self._read_failures.pop(0)
                    raise ApiError(code, HTTPStatus(code).phrase.replace(" ", ""), f"injected failure {code}")
                return self._scale_of(rtype, obj) if sub else copy.deepcopy(obj)
            self._injected_failure(resource, plural, group, name)
            if sub:
                return self._patch_scale(rtype, obj, content_type or "", patch)
            return self._patch_object(rtype, key, obj, content_type or "", patch)

    def _parse_patch(self, content_type: str | None, raw_body: bytes) -> Any:
        media = (content_type or "").split(";")[0].strip().lower()
        if media not in _ACCEPTED_PATCH_TYPES:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types include: "
                f"{', '.join(_ACCEPTED_PATCH_TYPES)}",
            )
        if media == APPLY_PATCH:
            raise ApiError(
                415, "UnsupportedMediaType", "server-side apply is not implemented by the stand-in"
            )
        try:
            return json.loads(raw_body or b"null")
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"error decoding patch: {exc}") from None

    def _injected_failure(self, resource: str, plural: str, group: str, name: str) -> None:
        for index, (code, only) in enumerate(self._failures):
            if only is None or only == resource:
                del self._failures[index]
                if code == 409:
                    raise ApiError(
                        409,
                        "Conflict",
                        f'Operation cannot be fulfilled on {plural}.{group} "{name}": the object has been '
                        "modified; please apply your changes to the latest version and try again",
                        {"name": name, "group": group, "kind": plural},
                    )
                raise ApiError(code, HTTPStatus(code).phrase.replace(" ", ""), f"injected failure {code}")

    def _apply(self, media: str, current: dict[str, Any], patch: Any) -> dict[str, Any]:
        media = media.split(";")[0].strip().lower()
        if media == MERGE_PATCH:
            if not isinstance(patch, dict):
                raise ApiError(400, "BadRequest", "a merge patch of an object must be a JSON object")
            return merge_patch(current, patch)
        try:
            result = json_patch(current, patch)
        except LookupError as exc:  # a failed test operation, a missing path or index
            raise ApiError(
                422, "Invalid", f"the server rejected our request due to an error in our request: {exc}"
            ) from None
        except (ValueError, TypeError) as exc:
            raise ApiError(400, "BadRequest", f"invalid JSON patch: {exc}") from None
        if not isinstance(result, dict):
            raise ApiError(400, "BadRequest", "a JSON patch must leave an object")
        return result

    def _check_precondition(
        self, patched: dict[str, Any], current: dict[str, Any], rtype: ResourceType
    ) -> None:
        """A `metadata.resourceVersion` in the patch is a precondition on the stored object."""
        wanted = (patched.get("metadata") or {}).get("resourceVersion")
        have = current["metadata"]["resourceVersion"]
        if wanted is not None and wanted != have:
            plural, group, name = rtype.plural, rtype.group, current["metadata"]["name"]
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {plural}.{group} "{name}": the object has been modified; '
                "please apply your changes to the latest version and try again",
                {"name": name, "group": group, "kind": plural},
            )

    def _patch_object(
        self, rtype: ResourceType, key: tuple[str, str, str, str], obj: dict[str, Any], media: str, patch: Any
    ) -> dict[str, Any]:
        name = obj["metadata"]["name"]
        patched = self._apply(media, obj, patch)
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
        self._validate(rtype, patched)
        if patched == obj:
            return copy.deepcopy(obj)
        outside = {k: v for k, v in patched.items() if k not in ("metadata", "status")}
        before = {k: v for k, v in obj.items() if k not in ("metadata", "status")}
        if outside != before:
            meta["generation"] = obj["metadata"]["generation"] + 1
        meta["resourceVersion"] = self._next_revision()
        self._objects[key] = patched
        return copy.deepcopy(patched)

    def _validate(self, rtype: ResourceType, obj: dict[str, Any]) -> None:
        """The bits of the CRDs' schemas the tests rely on: replicas are non-negative integers."""
        problems = []
        if rtype.scale_spec_path is not None:
            value = _get_path(obj, rtype.scale_spec_path)
            if value is not None and not _valid_replicas(value):
                problems.append(f"{rtype.scale_spec_path}: Invalid value: {value!r}")
        services = (obj.get("spec") or {}).get("services") if rtype.plural == DGD.plural else None
        for service, spec in (services or {}).items():
            value = (spec or {}).get("replicas")
            if value is not None and not _valid_replicas(value):
                problems.append(f"spec.services.{service}.replicas: Invalid value: {value!r}")
        if problems:
            name = obj["metadata"]["name"]
            raise ApiError(
                422,
                "Invalid",
                f'{rtype.kind}.{rtype.group} "{name}" is invalid: {"; ".join(problems)}',
                {"name": name, "group": rtype.group, "kind": rtype.kind},
            )

    def _scale_of(self, rtype: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        assert rtype.scale_spec_path is not None
        status: dict[str, Any] = {"replicas": _get_path(obj, rtype.scale_status_path or "") or 0}
        if rtype.scale_selector_path and _get_path(obj, rtype.scale_selector_path):
            status["selector"] = _get_path(obj, rtype.scale_selector_path)
        meta = obj["metadata"]
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
                "resourceVersion": meta["resourceVersion"],
                "creationTimestamp": meta["creationTimestamp"],
            },
            "spec": {"replicas": _get_path(obj, rtype.scale_spec_path) or 0},
            "status": status,
        }

    def _patch_scale(
        self, rtype: ResourceType, obj: dict[str, Any], media: str, patch: Any
    ) -> dict[str, Any]:
        assert rtype.scale_spec_path is not None
        scale = self._scale_of(rtype, obj)
        patched = self._apply(media, scale, patch)
        self._check_precondition(patched, obj, rtype)
        replicas = (patched.get("spec") or {}).get("replicas")
        if not _valid_replicas(replicas):
            raise ApiError(
                422,
                "Invalid",
                f'Scale.autoscaling "{obj["metadata"]["name"]}" is invalid: spec.replicas: '
                f"Invalid value: {replicas!r}: must be greater than or equal to 0",
                {"name": obj["metadata"]["name"], "group": "autoscaling", "kind": "Scale"},
            )
        if replicas != _get_path(obj, rtype.scale_spec_path):
            _set_path(obj, rtype.scale_spec_path, replicas)
            obj["metadata"]["generation"] += 1
            obj["metadata"]["resourceVersion"] = self._next_revision()
        return self._scale_of(rtype, obj)


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
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_PATCH = do_POST = do_PUT = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


@contextmanager
def running_standin(**kwargs: Any) -> Iterator[KubeStandIn]:
    with KubeStandIn(**kwargs) as standin:
        yield standin

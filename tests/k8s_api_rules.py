"""The Kubernetes API server's rules that the stand-in (tests/k8s_standin.py) applies, without
the server: the resource types it serves, request paths, `Status` errors, the patch formats, and
label selectors. Pure functions of their arguments, so the stand-in keeps only state and HTTP.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
# Custom resources take no strategic merge patch (they have no patch-merge keys); core types do.
CUSTOM_PATCH_TYPES = (JSON_PATCH, MERGE_PATCH, APPLY_PATCH)
CORE_PATCH_TYPES = (JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH, APPLY_PATCH)


@dataclass(frozen=True)
class ResourceType:
    """A served resource type: a core type (group "") or an installed CRD."""

    group: str
    version: str
    kind: str
    plural: str
    # The CRD's subresources.scale paths (dotted, without the leading dot); None: no scale.
    scale_spec_path: str | None = None
    scale_status_path: str | None = None
    scale_selector_path: str | None = None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def patch_types(self) -> tuple[str, ...]:
        return CORE_PATCH_TYPES if not self.group else CUSTOM_PATCH_TYPES

    def qualified(self, name: str | None = None) -> str:
        """How the API server's messages name the type (and an object): `pods "x"`,
        `dynamographdeployments.nvidia.com "llm"`."""
        plural = f"{self.plural}.{self.group}" if self.group else self.plural
        return f'{plural} "{name}"' if name is not None else plural


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
POD = ResourceType("", "v1", "Pod", "pods")


@dataclass(frozen=True)
class Route:
    """A namespaced request path: `/api/{version}/...` (core) or `/apis/{group}/{version}/...`,
    then `namespaces/{ns}/{plural}[/{name}[/{subresource}]]`."""

    group: str
    version: str
    namespace: str
    plural: str
    name: str | None
    sub: str | None


def parse_route(path: str) -> Route:
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"]:
        group, rest = "", parts[1:]
    elif parts[:1] == ["apis"] and len(parts) > 1:
        group, rest = parts[1], parts[2:]
    else:
        raise not_served()
    if not 4 <= len(rest) <= 6 or rest[1] != "namespaces":
        raise not_served()
    return Route(
        group=group,
        version=rest[0],
        namespace=rest[2],
        plural=rest[3],
        name=rest[4] if len(rest) > 4 else None,
        sub=rest[5] if len(rest) > 5 else None,
    )


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


def not_served() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource")


def not_found(rtype: ResourceType, name: str) -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f"{rtype.qualified(name)} not found",
        {"name": name, "group": rtype.group, "kind": rtype.plural},
    )


def conflict(rtype: ResourceType, name: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f"Operation cannot be fulfilled on {rtype.qualified(name)}: the object has been modified; "
        "please apply your changes to the latest version and try again",
        {"name": name, "group": rtype.group, "kind": rtype.plural},
    )


def forbidden(rtype: ResourceType, route: Route, verb: str, resource: str, user: str) -> ApiError:
    details: dict[str, Any] = {"group": rtype.group, "kind": rtype.plural}
    if route.name:
        details = {"name": route.name, **details}
    return ApiError(
        403,
        "Forbidden",
        f'{rtype.qualified(route.name)} is forbidden: User "{user}" cannot {verb} resource "{resource}" '
        f'in API group "{rtype.group}" in the namespace "{route.namespace}"',
        details,
    )


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


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A strategic merge patch made of maps only: there it is a merge patch (maps merge, null
    deletes). Lists, which merge by their patch-merge keys, and `$patch`-style directives are not
    implemented here (415, saying so) rather than applied wrongly."""

    def check(node: Any) -> None:
        if isinstance(node, list):
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "strategic merge patch of lists is not implemented by the stand-in",
            )
        if isinstance(node, dict):
            for key, value in node.items():
                if str(key).startswith("$"):
                    raise ApiError(
                        415,
                        "UnsupportedMediaType",
                        f"strategic merge patch directive {key!r} is not implemented by the stand-in",
                    )
                check(value)

    check(patch)
    return merge_patch(target, patch)


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


def apply_patch(media: str, current: dict[str, Any], patch: Any) -> dict[str, Any]:
    """The patched object, for an accepted media type; ApiError as the API server answers."""
    media = media.split(";")[0].strip().lower()
    if media in (MERGE_PATCH, STRATEGIC_PATCH):
        if not isinstance(patch, dict):
            raise ApiError(400, "BadRequest", "a merge patch of an object must be a JSON object")
        return merge_patch(current, patch) if media == MERGE_PATCH else strategic_merge_patch(current, patch)
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


def label_selector(text: str) -> list[tuple[str, str, str | None]]:
    """An equality-based label selector, `k=v,k2==v2,k3!=v3`, plus existence (`k`, `!k`), as
    (key, operator, value). Set-based terms (`k in (a,b)`) are not implemented here: 400."""
    terms: list[tuple[str, str, str | None]] = []
    for raw in text.split(","):
        term = raw.strip()
        if not term:
            continue
        if "(" in term or ")" in term or " in " in f" {term} " or " notin " in f" {term} ":
            raise ApiError(
                400, "BadRequest", f"set-based selector {term!r} is not implemented by the stand-in"
            )
        for op in ("!=", "==", "="):
            if op in term:
                key, value = (s.strip() for s in term.split(op, 1))
                terms.append((key, "!=" if op == "!=" else "=", value))
                break
        else:
            terms.append((term[1:], "!", None) if term.startswith("!") else (term, "exists", None))
        if not terms[-1][0]:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {term!r}")
    return terms


def selects(terms: list[tuple[str, str, str | None]], labels: dict[str, str]) -> bool:
    for key, op, value in terms:
        if op == "=" and labels.get(key) != value:
            return False
        if op == "!=" and labels.get(key) == value:
            return False
        if op == "exists" and key not in labels:
            return False
        if op == "!" and key in labels:
            return False
    return True


def get_path(obj: dict[str, Any], dotted: str) -> Any:
    node: Any = obj
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def set_path(obj: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = obj
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def valid_replicas(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def validate(rtype: ResourceType, obj: dict[str, Any]) -> None:
    """The bits of the schemas the tests rely on: replicas are non-negative integers, and a
    pod's annotations are strings (an int32 `pod-deletion-cost` is written as "-2")."""
    problems = []
    if rtype.scale_spec_path is not None:
        value = get_path(obj, rtype.scale_spec_path)
        if value is not None and not valid_replicas(value):
            problems.append(f"{rtype.scale_spec_path}: Invalid value: {value!r}")
    services = (obj.get("spec") or {}).get("services") if rtype.plural == DGD.plural else None
    for service, spec in (services or {}).items():
        value = (spec or {}).get("replicas")
        if value is not None and not valid_replicas(value):
            problems.append(f"spec.services.{service}.replicas: Invalid value: {value!r}")
    for key, value in (obj["metadata"].get("annotations") or {}).items():
        if not isinstance(value, str):
            problems.append(f"metadata.annotations.{key}: Invalid value: {value!r}: must be a string")
    if problems:
        name = obj["metadata"]["name"]
        group = f".{rtype.group}" if rtype.group else ""
        raise ApiError(
            422,
            "Invalid",
            f'{rtype.kind}{group} "{name}" is invalid: {"; ".join(problems)}',
            {"name": name, "group": rtype.group, "kind": rtype.kind},
        )


def scale_of(rtype: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
    """The autoscaling/v1 Scale a CRD's scale subresource shows of `obj`."""
    assert rtype.scale_spec_path is not None
    status: dict[str, Any] = {"replicas": get_path(obj, rtype.scale_status_path or "") or 0}
    if rtype.scale_selector_path and get_path(obj, rtype.scale_selector_path):
        status["selector"] = get_path(obj, rtype.scale_selector_path)
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
        "spec": {"replicas": get_path(obj, rtype.scale_spec_path) or 0},
        "status": status,
    }

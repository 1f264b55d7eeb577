"""What the Kubernetes connector reads from a DynamoGraphDeployment (DGD), without the API: its
readiness, which service plays which role, and the GPUs a service's engine takes; and the
Kubernetes API's error bodies, read for their message. The connector (`kubernetes.py`) calls the
API and uses these on what it read.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes.client.exceptions import ApiException

from app.core.errors import ConnectorError
from app.core.types import Role

# Service names Dynamo's planner accepts for a role when no service declares a subComponentType.
LEGACY_NAMES: dict[str, tuple[str, ...]] = {
    "prefill": ("VllmPrefillWorker", "TRTLLMPrefillWorker", "prefill"),
    "decode": ("VllmDecodeWorker", "TRTLLMDecodeWorker", "decode"),
}


def adapter_name(dgd_name: str, service: str) -> str:
    """Dynamo's operator names a service's DGDSA `<dgd>-<service in lower case>`."""
    return f"{dgd_name}-{service.lower()}"


def is_ready(dgd: dict[str, Any]) -> bool:
    """True when the DGD's `Ready` condition has status "True" (Dynamo's readiness test)."""
    conditions = (dgd.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if isinstance(c, dict) and c.get("type") == "Ready"), None)
    return ready is not None and ready.get("status") == "True"


def ready_reason(dgd: dict[str, Any]) -> str:
    conditions = (dgd.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if isinstance(c, dict) and c.get("type") == "Ready"), None)
    if ready is None:
        return "no Ready condition yet"
    detail = ready.get("message") or ready.get("reason") or ""
    return f"Ready={ready.get('status')}" + (f" ({detail})" if detail else "")


def sub_component_type(spec: dict[str, Any]) -> str:
    return str(spec.get("subComponentType") or "")


def describe_services(services: dict[str, Any]) -> str:
    if not services:
        return "none"
    parts = []
    for name, spec in services.items():
        spec = spec if isinstance(spec, dict) else {}
        kind = sub_component_type(spec) or spec.get("componentType") or "-"
        parts.append(f"{name} ({kind})")
    return ", ".join(parts)


def resolve_role(role: Role, services: dict[str, dict[str, Any]]) -> tuple[str | None, str]:
    """(service name, "") or (None, why not)."""
    wanted = "decode" if role == "workers" else role
    by_type = [name for name, spec in services.items() if sub_component_type(spec) == wanted]
    if len(by_type) > 1:
        return None, f"services {', '.join(sorted(by_type))} all declare subComponentType {wanted}"
    if by_type:
        return by_type[0], ""
    untyped = {name: spec for name, spec in services.items() if not sub_component_type(spec)}
    candidates = [name for name in untyped if name in LEGACY_NAMES[wanted]]
    if role == "workers":
        candidates += [
            name
            for name, spec in untyped.items()
            if spec.get("componentType") == "worker" and name not in candidates
        ]
    if len(candidates) == 1:
        return candidates[0], ""
    if len(candidates) > 1:
        return None, f"services {', '.join(sorted(candidates))} could all be the {role} service"
    return None, f"no service has subComponentType {wanted}"


def parse_gpus(value: Any, *, where: str) -> int:
    """A Kubernetes quantity of whole GPUs: 2, "2", "2000m"."""
    if isinstance(value, bool):
        raise ConnectorError(f"{where}: GPU count {value!r} is not a whole number")
    if isinstance(value, int):
        count = value
    else:
        text = str(value).strip()
        try:
            if text.endswith("m") and text[:-1].isdigit() and int(text[:-1]) % 1000 == 0:
                count = int(text[:-1]) // 1000
            else:
                count = int(text)
        except ValueError:
            raise ConnectorError(f"{where}: GPU count {value!r} is not a whole number") from None
    if count < 0:
        raise ConnectorError(f"{where}: GPU count {value!r} is negative")
    return count


def service_gpus(name: str, spec: dict[str, Any]) -> int | None:
    """GPUs one engine of this service uses, or None when the service declares none.

    Looks at `resources.limits.gpu` (the DGD's own resources type), `resources.limits
    ["nvidia.com/gpu"]`, then the same under `requests`, then the main container's
    `extraPodSpec.mainContainer.resources`. A multinode engine (`multinode.nodeCount` > 1) uses
    that many times the per-node count."""
    resources = spec.get("resources") or {}
    main = ((spec.get("extraPodSpec") or {}).get("mainContainer") or {}).get("resources") or {}
    declared: Any = None
    where = ""
    for section_name, section in (("resources", resources), ("extraPodSpec.mainContainer.resources", main)):
        for kind in ("limits", "requests"):
            values = section.get(kind) or {}
            for key in ("gpu", "nvidia.com/gpu"):
                if values.get(key) not in (None, ""):
                    declared, where = values[key], f"spec.services.{name}.{section_name}.{kind}.{key}"
                    break
            if declared is not None:
                break
        if declared is not None:
            break
    if declared is None:
        return None
    per_node = parse_gpus(declared, where=where)
    nodes = (spec.get("multinode") or {}).get("nodeCount") or 1
    try:
        nodes = int(nodes)
    except (TypeError, ValueError):
        raise ConnectorError(f"spec.services.{name}.multinode.nodeCount {nodes!r} is not a number") from None
    return per_node * max(nodes, 1)


def status_body(exc: ApiException) -> dict[str, Any]:
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def server_message(exc: ApiException) -> str:
    return str(status_body(exc).get("message") or exc.reason or "").strip()

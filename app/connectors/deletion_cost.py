"""Which pods a scale-down removes first: the planner's choice, written as each pod's
`controller.kubernetes.io/pod-deletion-cost` before the replica count goes down.

A DGD service runs its engines as the pods of a Deployment. When its replicas go down, the
ReplicaSet controller deletes not-ready pods first, then, among the rest, those with the lowest
pod-deletion-cost (an int32 annotation, 0 when absent). The planner names, per role, the engines
it would rather lose, in order (engines still starting are not in the list: the controller takes
them first anyway). So the first one named gets the lowest cost (-n, ..., -1 for n pods named),
and the pods that are not named keep 0.

A cost written here is marked with a second annotation, `planner.dynamo/victim-of: <dgd name>`.
The next time the role goes down, a marked pod that is not named any more has both annotations
removed, so that an old choice does not decide a later scale-down; a cost someone else wrote (no
mark) is left alone.

The service's pods are those with the labels Dynamo's operator puts on them:
`nvidia.com/dynamo-graph-deployment-name=<dgd>` and `nvidia.com/dynamo-component=<service>`. A
worker id names a pod by its name or its `metadata.uid`.

The hint is advisory (pod-deletion-cost is best effort in Kubernetes too): a pod list or patch
that fails (no RBAC for pods, a pod already gone, a conflict, a timeout) is logged, and the
scale-down goes ahead without it. Nothing here raises for what the API server answers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from app.connectors.dgd import server_message

log = logging.getLogger(__name__)

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
MARK = "planner.dynamo/victim-of"
DGD_LABEL = "nvidia.com/dynamo-graph-deployment-name"
SERVICE_LABEL = "nvidia.com/dynamo-component"
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class PodView:
    name: str
    uid: str
    annotations: Mapping[str, str]


@dataclass(frozen=True)
class CostPlan:
    # (pod name, merge patch of its annotations; None removes one), in the order to send them.
    patches: list[tuple[str, dict[str, str | None]]]
    unmatched: list[str]  # worker ids that name no pod of the service


def plan_costs(pods: Sequence[PodView], victims: Sequence[str], *, mark: str) -> CostPlan:
    """The annotation changes that make `victims` (worker ids, the first to go first) the pods
    removed first; only pods whose annotations change are patched. Clearing stale marks comes
    before writing new costs, so no moment has an old and a new choice competing."""
    by_id: dict[str, PodView] = {}
    for pod in pods:
        by_id[pod.name] = pod
        if pod.uid:
            by_id[pod.uid] = pod
    chosen: list[PodView] = []
    unmatched: list[str] = []
    for worker_id in victims:
        pod = by_id.get(worker_id)
        if pod is None:
            unmatched.append(worker_id)
        elif pod.name not in {p.name for p in chosen}:  # named by name and by uid: the first counts
            chosen.append(pod)
    chosen_names = {pod.name for pod in chosen}
    patches: list[tuple[str, dict[str, str | None]]] = [
        (pod.name, {DELETION_COST: None, MARK: None})
        for pod in pods
        if MARK in pod.annotations and pod.name not in chosen_names
    ]
    for rank, pod in enumerate(chosen):
        cost = str(rank - len(chosen))
        if pod.annotations.get(DELETION_COST) != cost or pod.annotations.get(MARK) != mark:
            patches.append((pod.name, {DELETION_COST: cost, MARK: mark}))
    return CostPlan(patches, unmatched)


async def write_deletion_costs(
    api: k8s_client.CoreV1Api,
    *,
    namespace: str,
    dgd_name: str,
    service: str,
    victims: Sequence[str],
    timeout_s: float,
    where: str,
) -> int:
    """Write the planner's order onto the service's pods (see the module docstring); the number
    of worker ids that name no pod. Failures are logged, never raised."""
    selector = f"{DGD_LABEL}={dgd_name},{SERVICE_LABEL}={service}"
    try:
        listed = await _call(api.list_namespaced_pod, timeout_s, namespace=namespace, label_selector=selector)
    except _Failed as failed:
        log.warning(
            "%s: cannot list the pods of service %s (%s): scaling down without choosing which pods go",
            where,
            service,
            failed.describe("list", namespace),
        )
        return 0
    pods = [
        PodView(
            name=item.metadata.name,
            uid=item.metadata.uid or "",
            annotations=dict(item.metadata.annotations or {}),
        )
        for item in listed.items or []
    ]
    plan = plan_costs(pods, victims, mark=dgd_name)
    for pod, change in plan.patches:
        try:
            await _call(
                api.patch_namespaced_pod,
                timeout_s,
                name=pod,
                namespace=namespace,
                body={"metadata": {"annotations": change}},
                _content_type=MERGE_PATCH,
            )
        except _Failed as failed:
            log.warning(
                "%s: cannot annotate pod %s of service %s (%s): its place in the scale-down is the "
                "controller's choice",
                where,
                pod,
                service,
                failed.describe("patch", namespace),
            )
            continue
        log.debug("%s: pod %s annotated %s", where, pod, change)
    return len(plan.unmatched)


class _Failed(Exception):
    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause

    def describe(self, verb: str, namespace: str) -> str:
        exc = self.cause
        if isinstance(exc, ApiException):
            message = server_message(exc)
            if exc.status == 403:
                return (
                    f"forbidden; RBAC: grant verb {verb!r} on resource 'pods' in namespace {namespace}: "
                    f"{message}"
                )
            return f"HTTP {exc.status}: {message}"
        return f"{type(exc).__name__}: {exc}"


async def _call(fn: Callable[..., Any], timeout_s: float, /, **kwargs: Any) -> Any:
    """One blocking API call in a worker thread (the official client blocks)."""
    try:
        return await asyncio.to_thread(fn, _request_timeout=timeout_s, **kwargs)
    except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
        raise _Failed(exc) from None

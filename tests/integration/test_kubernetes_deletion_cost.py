"""A scale-down names the engines to remove: before the Kubernetes connector lowers a service's
replicas, the pods the planner would rather lose get `controller.kubernetes.io/pod-deletion-cost`
(the first named the lowest), a cost it wrote earlier on a pod no longer named is cleared, and
nothing about it stops the replicas from changing. Over real HTTP, with the official client,
against the API stand-in (tests/k8s_standin.py), which serves pods as the core API does."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from app.config import KubernetesConnectorConfig
from app.connectors.deletion_cost import DELETION_COST, DGD_LABEL, MARK, SERVICE_LABEL
from app.connectors.kubernetes import KubernetesConnector
from tests.integration.test_kubernetes_connector import (
    DGD_PATH,
    NAME,
    NS,
    TOKEN,
    _adapter_path,
    connector_settings,
    dgd_object,
    disagg_services,
    put_dgd,
)
from tests.k8s_standin import DGD, MERGE_PATCH, POD, STRATEGIC_PATCH, KubeStandIn, RecordedRequest

pytestmark = pytest.mark.anyio

PODS_PATH = f"/api/v1/namespaces/{NS}/pods"
DECODE = "DecodeWorker"
PREFILL = "PrefillWorker"
# Four decode engines, two prefill engines, and a pod of another DGD's service of the same name,
# which must never be touched.
DECODE_PODS = ["llm-decode-a", "llm-decode-b", "llm-decode-c", "llm-decode-d"]
PREFILL_PODS = ["llm-prefill-a", "llm-prefill-b"]
OTHER_DGD_POD = "other-decode-a"


@pytest.fixture
def cluster() -> Iterator[KubeStandIn]:
    with KubeStandIn(token=TOKEN) as api:
        yield api


@pytest.fixture
def connect(cluster: KubeStandIn, tmp_path: Path) -> Callable[[], KubernetesConnector]:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    config = KubernetesConnectorConfig.model_validate(connector_settings(cluster, token_file))
    return lambda: KubernetesConnector(config, roles=("prefill", "decode"))


def labels(service: str, dgd: str = NAME) -> dict[str, str]:
    return {DGD_LABEL: dgd, SERVICE_LABEL: service}


def uid(pod: str) -> str:
    return f"uid-{pod}"


def ours(cost: int) -> dict[str, str]:
    """The annotations this connector writes."""
    return {DELETION_COST: str(cost), MARK: NAME}


def put_cluster(standin: KubeStandIn, annotations: dict[str, dict[str, str]] | None = None) -> None:
    """The DGD at 2 prefill and 4 decode replicas, and their pods."""
    services = disagg_services()
    services[PREFILL]["replicas"] = 2
    services[DECODE]["replicas"] = 4
    put_dgd(standin, dgd_object(services))
    annotations = annotations or {}
    for service, pods in ((DECODE, DECODE_PODS), (PREFILL, PREFILL_PODS)):
        for pod in pods:
            standin.put_pod(NS, pod, labels=labels(service), uid=uid(pod), annotations=annotations.get(pod))
    standin.put_pod(NS, OTHER_DGD_POD, labels=labels(DECODE, dgd="other"), uid=uid(OTHER_DGD_POD))


def annotations_of(standin: KubeStandIn, pod: str) -> dict[str, str]:
    stored = standin.get(POD.plural, NS, pod)
    assert stored is not None
    return stored["metadata"].get("annotations") or {}


def pod_requests(standin: KubeStandIn) -> list[RecordedRequest]:
    return [r for r in standin.requests if r.path.startswith(PODS_PATH)]


def replicas(standin: KubeStandIn) -> dict[str, int]:
    stored = standin.get(DGD.plural, NS, NAME)
    assert stored is not None
    return {s: stored["spec"]["services"][s]["replicas"] for s in (PREFILL, DECODE)}


async def test_the_annotations_go_out_before_the_replicas_in_the_planners_order(
    cluster: KubeStandIn, connect: Callable[[], KubernetesConnector]
) -> None:
    put_cluster(cluster)
    remove = {"decode": ["llm-decode-c", "llm-decode-a", "llm-decode-d"]}
    await connect().set_replicas({"decode": 1}, remove)  # type: ignore[arg-type]

    sent = [(r.method, r.path) for r in cluster.requests]
    assert sent == [
        ("GET", DGD_PATH),
        ("GET", PODS_PATH),
        ("PATCH", f"{PODS_PATH}/llm-decode-c"),
        ("PATCH", f"{PODS_PATH}/llm-decode-a"),
        ("PATCH", f"{PODS_PATH}/llm-decode-d"),
        ("PATCH", _adapter_path("decodeworker")),
        ("PATCH", DGD_PATH),
    ]
    listed = cluster.requests[1]
    assert listed.query == {"labelSelector": f"{DGD_LABEL}={NAME},{SERVICE_LABEL}={DECODE}"}
    annotated = [r for r in cluster.patches() if r.path.startswith(PODS_PATH)]
    assert {r.content_type for r in annotated} == {MERGE_PATCH}
    # The first named goes first: the lowest cost; int32 values written as strings.
    assert [r.body for r in annotated] == [
        {"metadata": {"annotations": ours(-3)}},
        {"metadata": {"annotations": ours(-2)}},
        {"metadata": {"annotations": ours(-1)}},
    ]
    assert annotations_of(cluster, "llm-decode-b") == {}
    assert replicas(cluster) == {PREFILL: 2, DECODE: 1}


@dataclass
class VictimCase:
    name: str
    why: str
    targets: dict[str, int]
    remove: dict[str, list[str]] | None
    before: dict[str, dict[str, str]] = field(default_factory=dict)  # pod -> annotations
    forbid: tuple[str, str] | None = None
    fail_pod_patches: tuple[int, int] | None = None  # (count, HTTP code)
    # Afterwards: the annotations of every pod named here (the others must be as before).
    after: dict[str, dict[str, str]] = field(default_factory=dict)
    pod_calls: int = 0  # requests to the pods API
    log: tuple[str, ...] = ()  # substrings of the records at INFO or above


VICTIM_CASES = [
    VictimCase(
        "by-uid",
        "a worker id may be the pod's metadata.uid",
        {"decode": 3},
        {"decode": [uid("llm-decode-b")]},
        after={"llm-decode-b": ours(-1)},
        pod_calls=2,
    ),
    VictimCase(
        "named-twice",
        "a pod named by its name and its uid keeps its first place",
        {"decode": 2},
        {"decode": ["llm-decode-d", uid("llm-decode-b"), uid("llm-decode-d")]},
        after={"llm-decode-d": ours(-2), "llm-decode-b": ours(-1)},
        pod_calls=3,
    ),
    VictimCase(
        "unknown-ids",
        "ids that match no pod are skipped and counted once in the log; the others still rank",
        {"decode": 2},
        {"decode": ["gone-1", "llm-decode-d", "gone-2"]},
        after={"llm-decode-d": ours(-1)},
        pod_calls=2,
        log=("2 engines named for removal match no pod", "decode: 2"),
    ),
    VictimCase(
        "stale-cost-cleared",
        "a cost this connector wrote earlier, on a pod not named now, is removed with its mark",
        {"decode": 3},
        {"decode": ["llm-decode-a"]},
        before={"llm-decode-b": ours(-1), "llm-decode-c": ours(-2)},
        after={"llm-decode-a": ours(-1), "llm-decode-b": {}, "llm-decode-c": {}},
        pod_calls=4,
    ),
    VictimCase(
        "foreign-cost-kept",
        "a deletion cost without this connector's mark is someone else's choice: left alone",
        {"decode": 3},
        {"decode": ["llm-decode-a"]},
        before={"llm-decode-b": {DELETION_COST: "-5"}},
        after={"llm-decode-a": ours(-1), "llm-decode-b": {DELETION_COST: "-5"}},
        pod_calls=2,
    ),
    VictimCase(
        "already-so",
        "pods already carrying the costs wanted are not patched again",
        {"decode": 2},
        {"decode": ["llm-decode-a", "llm-decode-b"]},
        before={"llm-decode-a": ours(-2), "llm-decode-b": ours(-1)},
        after={"llm-decode-a": ours(-2), "llm-decode-b": ours(-1)},
        pod_calls=1,
    ),
    VictimCase(
        "both-roles",
        "each role going down ranks its own service's pods; one log line counts the unknown ids",
        {"prefill": 1, "decode": 3},
        {"prefill": ["llm-prefill-b", "nope"], "decode": ["nope", "llm-decode-c"]},
        after={"llm-prefill-b": ours(-1), "llm-decode-c": ours(-1)},
        pod_calls=4,
        log=("2 engines named for removal match no pod", "prefill: 1, decode: 1"),
    ),
    VictimCase(
        "raising",
        "a role going up loses no engine: no pod is read or written",
        {"decode": 6},
        {"decode": ["llm-decode-a"]},
    ),
    VictimCase(
        "keeping",
        "neither does a role staying where it is",
        {"prefill": 2, "decode": 4},
        {"prefill": ["llm-prefill-a"], "decode": ["llm-decode-a"]},
    ),
    VictimCase(
        "only-the-role-going-down",
        "prefill goes up, decode down: only decode's pods are read",
        {"prefill": 3, "decode": 3},
        {"prefill": ["llm-prefill-a"], "decode": ["llm-decode-a"]},
        after={"llm-prefill-a": {}, "llm-decode-a": ours(-1)},
        pod_calls=2,
    ),
    VictimCase("no-choice", "without a list the connector scales as it always did", {"decode": 2}, None),
    VictimCase(
        "empty-choice",
        "an empty list for the role is no choice either",
        {"decode": 2},
        {"decode": []},
        before={"llm-decode-b": ours(-1)},
        after={"llm-decode-b": ours(-1)},
    ),
    VictimCase(
        "list-forbidden",
        "no RBAC to list pods: a warning saying what to grant, and the replicas still change",
        {"decode": 2},
        {"decode": ["llm-decode-a"]},
        forbid=("list", "pods"),
        after={"llm-decode-a": {}},
        pod_calls=1,
        log=("cannot list the pods of service DecodeWorker", "grant verb 'list' on resource 'pods'"),
    ),
    VictimCase(
        "patch-forbidden",
        "no RBAC to patch pods: a warning naming the pod, and the replicas still change",
        {"decode": 2},
        {"decode": ["llm-decode-a", "llm-decode-b"]},
        forbid=("patch", "pods"),
        after={"llm-decode-a": {}, "llm-decode-b": {}},
        pod_calls=3,
        log=("cannot annotate pod llm-decode-a", "grant verb 'patch' on resource 'pods'"),
    ),
    VictimCase(
        "patch-conflict",
        "a 409 on one pod skips that pod only; the next is still ranked",
        {"decode": 2},
        {"decode": ["llm-decode-a", "llm-decode-b"]},
        fail_pod_patches=(1, 409),
        after={"llm-decode-a": {}, "llm-decode-b": ours(-1)},
        pod_calls=3,
        log=("cannot annotate pod llm-decode-a", "HTTP 409"),
    ),
]


@pytest.mark.parametrize("case", VICTIM_CASES, ids=lambda c: c.name)
async def test_scale_down_names_its_victims(
    case: VictimCase,
    cluster: KubeStandIn,
    connect: Callable[[], KubernetesConnector],
    caplog: pytest.LogCaptureFixture,
) -> None:
    put_cluster(cluster, copy.deepcopy(case.before))
    if case.forbid:
        cluster.forbid(*case.forbid)
    if case.fail_pod_patches:
        count, code = case.fail_pod_patches
        cluster.fail_next_patches(count, code=code, resource=POD.plural)
    untouched = {
        pod: annotations_of(cluster, pod)
        for pod in [*DECODE_PODS, *PREFILL_PODS, OTHER_DGD_POD]
        if pod not in case.after
    }
    with caplog.at_level(logging.INFO, logger="app.connectors"):
        await connect().set_replicas(case.targets, case.remove)  # type: ignore[arg-type]

    for pod, wanted in case.after.items():
        assert annotations_of(cluster, pod) == wanted, (case.why, pod)
    for pod, was in untouched.items():
        assert annotations_of(cluster, pod) == was, (case.why, pod)
    assert len(pod_requests(cluster)) == case.pod_calls, (case.why, [r.path for r in pod_requests(cluster)])
    expected = {"PrefillWorker": 2, "DecodeWorker": 4}
    expected.update({{"prefill": PREFILL, "decode": DECODE}[r]: n for r, n in case.targets.items()})
    assert replicas(cluster) == expected, case.why
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    for part in case.log:
        assert any(part in m for m in messages), (case.why, part, messages)
    assert sum("match no pod" in m for m in messages) <= 1, "once per call, whatever the roles"


async def test_a_pod_gone_before_its_patch_is_a_warning(
    cluster: KubeStandIn, connect: Callable[[], KubernetesConnector], caplog: pytest.LogCaptureFixture
) -> None:
    """The pod list named it, then it went (a node drained): 404 on its patch, and the scale-down
    goes on with the pods that remain."""
    put_cluster(cluster)
    hold = cluster.hold_next_request(match=lambda r: r.method == "PATCH" and r.path.endswith("/llm-decode-a"))
    connector = connect()
    with caplog.at_level(logging.WARNING, logger="app.connectors"):
        task = asyncio.create_task(
            connector.set_replicas({"decode": 2}, {"decode": ["llm-decode-a", "llm-decode-b"]})
        )
        await asyncio.to_thread(hold.arrived.wait, 10)
        cluster.delete(POD.plural, NS, "llm-decode-a")
        hold.release()
        await task
    assert annotations_of(cluster, "llm-decode-b") == ours(-1)
    assert replicas(cluster)[DECODE] == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "pod llm-decode-a" in warnings[0] and "HTTP 404" in warnings[0], warnings


async def test_a_conflict_retry_does_not_annotate_again(
    cluster: KubeStandIn, connect: Callable[[], KubernetesConnector]
) -> None:
    """The DGD patch answers 409 once: the connector reads the DGD again and repeats the replica
    write; the pods were annotated before the first attempt, once."""
    put_cluster(cluster)
    cluster.fail_next_patches(1, resource=DGD.plural)
    await connect().set_replicas({"decode": 2}, {"decode": ["llm-decode-a"]})
    assert [(r.method, r.path) for r in pod_requests(cluster)] == [
        ("GET", PODS_PATH),
        ("PATCH", f"{PODS_PATH}/llm-decode-a"),
    ]
    assert replicas(cluster)[DECODE] == 2


# --- the stand-in serves pods as the core API does ----------------------------------------------


async def test_standin_pod_semantics(cluster: KubeStandIn) -> None:
    put_cluster(cluster)
    pod_path = f"{PODS_PATH}/llm-decode-a"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=cluster.url, headers=headers) as http:

        async def names(selector: str) -> list[str] | int:
            r = await http.get(PODS_PATH, params={"labelSelector": selector})
            if r.status_code != 200:
                return r.status_code
            assert (r.json()["kind"], r.json()["apiVersion"]) == ("PodList", "v1")
            return [p["metadata"]["name"] for p in r.json()["items"]]

        selectors = [  # (selector, answer, why)
            (f"{SERVICE_LABEL}={PREFILL}", PREFILL_PODS, "equality"),
            (f"{SERVICE_LABEL}=={PREFILL}", PREFILL_PODS, "== is equality too"),
            (f"{DGD_LABEL}=other", [OTHER_DGD_POD], "another DGD's pods"),
            (f"{SERVICE_LABEL}={DECODE},{DGD_LABEL}!=other", DECODE_PODS, "terms are ANDed; != excludes"),
            (DGD_LABEL, sorted([*DECODE_PODS, *PREFILL_PODS, OTHER_DGD_POD]), "existence"),
            (f"!{DGD_LABEL}", [], "absence"),
            ("", sorted([*DECODE_PODS, *PREFILL_PODS, OTHER_DGD_POD]), "no selector: every pod"),
            (f"{SERVICE_LABEL} in (a,b)", 400, "set-based selectors are not implemented"),
        ]
        for selector, answer, why in selectors:
            assert await names(selector) == answer, why

        got = (await http.get(pod_path)).json()
        assert (got["kind"], got["apiVersion"], got["metadata"]["uid"]) == ("Pod", "v1", uid("llm-decode-a"))
        version = int(got["metadata"]["resourceVersion"])

        merged = await http.patch(
            pod_path,
            json={"metadata": {"annotations": {"a": "1", "b": "2"}}, "status": {"phase": "Failed"}},
            headers={"Content-Type": MERGE_PATCH},
        )
        assert merged.json()["metadata"]["annotations"] == {"a": "1", "b": "2"}
        assert merged.json()["status"]["phase"] == "Running"  # the status subresource owns .status
        assert int(merged.json()["metadata"]["resourceVersion"]) > version
        strategic = await http.patch(
            pod_path,
            json={"metadata": {"annotations": {"a": None, "c": "3"}}},
            headers={"Content-Type": STRATEGIC_PATCH},
        )
        assert strategic.json()["metadata"]["annotations"] == {"b": "2", "c": "3"}
        same = await http.patch(pod_path, json={"metadata": {}}, headers={"Content-Type": MERGE_PATCH})
        assert same.json()["metadata"]["resourceVersion"] == strategic.json()["metadata"]["resourceVersion"]
        json_patch = await http.patch(
            pod_path,
            json=[{"op": "remove", "path": "/metadata/annotations/b"}],
            headers={"Content-Type": "application/json-patch+json"},
        )
        assert json_patch.json()["metadata"]["annotations"] == {"c": "3"}

        lists = await http.patch(
            pod_path, json={"spec": {"containers": []}}, headers={"Content-Type": STRATEGIC_PATCH}
        )
        assert (lists.status_code, lists.json()["reason"]) == (415, "UnsupportedMediaType")
        stale = await http.patch(
            pod_path,
            json={"metadata": {"resourceVersion": str(version), "annotations": {"x": "y"}}},
            headers={"Content-Type": MERGE_PATCH},
        )
        assert (stale.status_code, stale.json()["message"][:40]) == (
            409,
            'Operation cannot be fulfilled on pods "l',
        )
        not_text = await http.patch(
            pod_path,
            json={"metadata": {"annotations": {DELETION_COST: -1}}},
            headers={"Content-Type": MERGE_PATCH},
        )
        assert (not_text.status_code, not_text.json()["reason"]) == (422, "Invalid")

        missing = await http.get(f"{PODS_PATH}/nope")
        assert missing.status_code == 404
        assert (missing.json()["message"], missing.json()["details"]) == (
            'pods "nope" not found',
            {"name": "nope", "group": "", "kind": "pods"},
        )
        cluster.forbid("patch", "pods")
        denied = await http.patch(pod_path, json={}, headers={"Content-Type": MERGE_PATCH})
        assert denied.status_code == 403
        assert denied.json()["message"] == (
            f'pods "llm-decode-a" is forbidden: User "system:serviceaccount:dynamo:planner" cannot patch '
            f'resource "pods" in API group "" in the namespace "{NS}"'
        )
        # Custom resources still refuse a strategic merge patch.
        strategic_dgd = await http.patch(DGD_PATH, json={}, headers={"Content-Type": STRATEGIC_PATCH})
        assert strategic_dgd.status_code == 415

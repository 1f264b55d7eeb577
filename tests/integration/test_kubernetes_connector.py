"""The Kubernetes connector against the API stand-in (tests/k8s_standin.py), over real HTTP with
the official client: service resolution, GPUs, readiness, scaling through the adapter or a
merge patch of the DGD, conflicts, RBAC, and an event loop that keeps running meanwhile."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

import app.connectors.kubernetes as kube
from app.config import KubernetesConnectorConfig
from app.connectors.kubernetes import KubernetesConnector
from app.core.errors import ConnectorError, ConnectorNotReadyError
from app.core.types import Role
from tests.k8s_standin import DGD, DGDSA, MERGE_PATCH, KubeStandIn

pytestmark = pytest.mark.anyio

NS = "dynamo"
NAME = "llm"
TOKEN = "stand-in-token-0123"
API = f"/apis/nvidia.com/v1alpha1/namespaces/{NS}"
DGD_PATH = f"{API}/dynamographdeployments/{NAME}"
DISAGG: tuple[Role, ...] = ("prefill", "decode")
AGG: tuple[Role, ...] = ("workers",)


def _adapter_path(service: str) -> str:
    return f"{API}/dynamographdeploymentscalingadapters/{NAME}-{service}/scale"


def worker(sub: str | None, replicas: int = 1, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"componentType": "worker", "replicas": replicas, **extra}
    if sub is not None:
        spec["subComponentType"] = sub
    return spec


FRONTEND = {"componentType": "frontend", "replicas": 1}


def disagg_services() -> dict[str, Any]:
    return {
        "Frontend": copy.deepcopy(FRONTEND),
        "PrefillWorker": worker("prefill", 1, resources={"limits": {"gpu": "1"}}),
        "DecodeWorker": worker("decode", 2, resources={"limits": {"gpu": "2"}}),
    }


def ready_condition(status: str = "True") -> dict[str, Any]:
    return {"type": "Ready", "status": status, "reason": "AllReady" if status == "True" else "Pending"}


def dgd_object(
    services: dict[str, Any] | None = None,
    *,
    conditions: list[dict[str, Any]] | None = None,
    service_status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "state": "successful",
        "conditions": conditions if conditions is not None else [ready_condition()],
    }
    if service_status is not None:
        status["services"] = service_status
    return {
        "metadata": {"name": NAME, "labels": {"app": "llm"}},
        "spec": {
            "backendFramework": "vllm",
            "services": services if services is not None else disagg_services(),
        },
        "status": status,
    }


def adapter_object(service: str, replicas: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{NAME}-{service.lower()}"},
        "spec": {"replicas": replicas, "dgdRef": {"name": NAME, "service": service}},
        "status": {"replicas": replicas, "selector": f"app={service.lower()}"},
    }


@pytest.fixture
def standin() -> Iterator[KubeStandIn]:
    with KubeStandIn(token=TOKEN) as api:
        yield api


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


def connector_settings(standin: KubeStandIn, token_file: Path) -> dict[str, Any]:
    """The deployments file's `connector:` for the DGD on the stand-in."""
    return {
        "type": "kubernetes",
        "dgd_name": NAME,
        "namespace": NS,
        "api_server": standin.url,
        "token_file": str(token_file),
    }


@pytest.fixture
def make_connector(standin: KubeStandIn, token_file: Path) -> Callable[..., KubernetesConnector]:
    def make(roles: tuple[Role, ...] = DISAGG, **overrides: Any) -> KubernetesConnector:
        config = KubernetesConnectorConfig.model_validate(
            {**connector_settings(standin, token_file), **overrides}
        )
        return KubernetesConnector(config, roles=roles)

    return make


def put_dgd(standin: KubeStandIn, obj: dict[str, Any] | None = None) -> dict[str, Any]:
    return standin.put(DGD.plural, NS, obj if obj is not None else dgd_object())


# --- validate ---------------------------------------------------------------------------------


@dataclass
class ValidateCase:
    name: str
    why: str
    dgd: dict[str, Any] | None  # None: no DGD stored
    roles: tuple[Role, ...] = DISAGG
    forbid: tuple[str, str] | None = None
    error: tuple[str, ...] = ()  # substrings of the ConnectorError; empty: validate passes
    resources_served: bool = True


VALIDATE_CASES = [
    ValidateCase("disagg", "prefill and decode found by subComponentType", dgd_object()),
    ValidateCase(
        "agg-decode-subcomponent",
        "Dynamo runs an aggregated deployment as decode only: the decode service is the workers",
        dgd_object({"Frontend": FRONTEND, "Worker": worker("decode")}),
        roles=AGG,
    ),
    ValidateCase(
        "agg-untyped-worker",
        "an agg DGD whose one worker declares no subComponentType",
        dgd_object({"Frontend": FRONTEND, "VllmWorker": worker(None)}),
        roles=AGG,
    ),
    ValidateCase(
        "legacy-names",
        "without subComponentType, Dynamo's legacy worker names still resolve",
        dgd_object(
            {"Frontend": FRONTEND, "VllmPrefillWorker": worker(None), "VllmDecodeWorker": worker(None)}
        ),
    ),
    ValidateCase(
        "missing",
        "404 on the DGD names namespace and name",
        None,
        error=(f"DynamoGraphDeployment {NS}/{NAME} not found",),
    ),
    ValidateCase(
        "crd-not-installed",
        "a 404 without object details means the resource type is not served",
        None,
        resources_served=False,
        error=(f"DynamoGraphDeployment {NS}/{NAME} not found", "CRD installed"),
    ),
    ValidateCase(
        "forbidden",
        "403 names the missing RBAC verb and resource",
        dgd_object(),
        forbid=("get", "dynamographdeployments"),
        error=("forbidden", "verb 'get'", "resource 'dynamographdeployments'", NS),
    ),
    ValidateCase(
        "missing-decode",
        "a role without a service is named, with the services that exist",
        dgd_object({"Frontend": FRONTEND, "PrefillWorker": worker("prefill")}),
        error=("role decode", "services found: Frontend (frontend), PrefillWorker (prefill)"),
    ),
    ValidateCase(
        "duplicate-prefill",
        "two services claiming one role is ambiguous",
        dgd_object({"P1": worker("prefill"), "P2": worker("prefill"), "D": worker("decode")}),
        error=("role prefill", "P1, P2"),
    ),
    ValidateCase(
        "agg-two-untyped-workers",
        "two untyped workers could both be the agg service",
        dgd_object({"A": worker(None), "B": worker(None)}),
        roles=AGG,
        error=("role workers", "A, B"),
    ),
    ValidateCase(
        "typed-service-not-taken-by-name",
        "a legacy name that declares another subComponentType is not a fallback",
        dgd_object({"prefill": worker("decode")}),
        error=("role prefill", "no service has subComponentType prefill"),
    ),
]


@pytest.mark.parametrize("case", VALIDATE_CASES, ids=lambda c: c.name)
async def test_validate(case: ValidateCase, make_connector: Callable[..., KubernetesConnector]) -> None:
    standin = KubeStandIn(token=TOKEN, resources=(DGD, DGDSA) if case.resources_served else ())
    with standin:
        if case.dgd is not None:
            put_dgd(standin, case.dgd)
        if case.forbid:
            standin.forbid(*case.forbid)
        connector = make_connector(case.roles, api_server=standin.url)
        if not case.error:
            await connector.validate()
            return
        with pytest.raises(ConnectorError) as raised:
            await connector.validate()
        for part in case.error:
            assert part in str(raised.value), (case.why, str(raised.value))


async def test_bearer_token_from_token_file(
    standin: KubeStandIn, make_connector: Callable[..., KubernetesConnector], tmp_path: Path
) -> None:
    put_dgd(standin)
    await make_connector().validate()
    assert {r.authorization for r in standin.requests} == {f"Bearer {TOKEN}"}

    wrong = tmp_path / "wrong-token"
    wrong.write_text("not-the-token")
    with pytest.raises(ConnectorError, match="rejected the planner's credentials"):
        await make_connector(token_file=str(wrong)).validate()


async def test_unreachable_api_server_is_a_connector_error(
    make_connector: Callable[..., KubernetesConnector],
) -> None:
    with KubeStandIn() as gone:
        url = gone.url
    connector = make_connector(api_server=url)
    connector.request_timeout_s = 2.0
    with pytest.raises(ConnectorError, match="cannot reach the Kubernetes API"):
        await connector.validate()


async def test_namespace_falls_back_to_service_account_then_default(
    standin: KubeStandIn,
    make_connector: Callable[..., KubernetesConnector],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    put_dgd(standin)
    monkeypatch.setattr(kube, "SERVICE_ACCOUNT_DIR", tmp_path / "sa")
    with pytest.raises(ConnectorError, match=f"DynamoGraphDeployment default/{NAME} not found"):
        await make_connector(namespace=None).validate()

    (tmp_path / "sa").mkdir()
    (tmp_path / "sa" / "namespace").write_text(NS + "\n")
    await make_connector(namespace=None).validate()
    assert standin.requests[-1].path == DGD_PATH


# --- gpus_per_engine ----------------------------------------------------------------------------


@dataclass
class GpuCase:
    name: str
    why: str
    services: dict[str, Any]
    expected: dict[str, int] | None = None
    roles: tuple[Role, ...] = DISAGG
    error: str | None = None


GPU_CASES = [
    GpuCase(
        "limits-gpu",
        "the DGD's own resources.limits.gpu (a string)",
        disagg_services(),
        {"prefill": 1, "decode": 2},
    ),
    GpuCase(
        "nvidia-key-and-requests",
        "limits[nvidia.com/gpu], and requests when no limit is set",
        {
            "P": worker("prefill", resources={"limits": {"nvidia.com/gpu": 4}}),
            "D": worker("decode", resources={"requests": {"gpu": "8"}}),
        },
        {"prefill": 4, "decode": 8},
    ),
    GpuCase(
        "main-container",
        "the main container's resources when the service has none",
        {
            "P": worker(
                "prefill", extraPodSpec={"mainContainer": {"resources": {"limits": {"nvidia.com/gpu": "2"}}}}
            ),
            "D": worker("decode", resources={"limits": {"gpu": "1"}}),
        },
        {"prefill": 2, "decode": 1},
    ),
    GpuCase(
        "multinode",
        "an engine spanning nodeCount nodes uses that many times the per-node GPUs",
        {
            "P": worker("prefill", resources={"limits": {"gpu": "1"}}),
            "D": worker("decode", resources={"limits": {"gpu": "8"}}, multinode={"nodeCount": 2}),
        },
        {"prefill": 1, "decode": 16},
    ),
    GpuCase(
        "one-undeclared",
        "a role without a declaration is left out",
        {"P": worker("prefill"), "D": worker("decode", resources={"limits": {"gpu": "2"}})},
        {"decode": 2},
    ),
    GpuCase(
        "none-declared",
        "no role declares GPUs: the cluster cannot say",
        {"P": worker("prefill"), "D": worker("decode")},
    ),
    GpuCase(
        "agg",
        "agg mode reads the workers service",
        {"W": worker("decode", resources={"limits": {"gpu": "4"}})},
        {"workers": 4},
        roles=AGG,
    ),
    GpuCase(
        "not-a-number",
        "a malformed quantity is an error naming the field",
        {"P": worker("prefill", resources={"limits": {"gpu": "lots"}}), "D": worker("decode")},
        error="spec.services.P.resources.limits.gpu",
    ),
]


@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: c.name)
async def test_gpus_per_engine(
    case: GpuCase, standin: KubeStandIn, make_connector: Callable[..., KubernetesConnector]
) -> None:
    put_dgd(standin, dgd_object(case.services))
    connector = make_connector(case.roles)
    if case.error:
        with pytest.raises(ConnectorError, match=case.error.replace(".", r"\.")):
            await connector.gpus_per_engine()
        return
    assert await connector.gpus_per_engine() == case.expected, case.why


# --- ready_counts -------------------------------------------------------------------------------


@dataclass
class ReadyCase:
    name: str
    why: str
    conditions: list[dict[str, Any]]
    service_status: dict[str, Any] | None
    expected: dict[str, int] | None


SERVICE_STATUS = {
    "PrefillWorker": {"replicas": 1, "updatedReplicas": 1, "readyReplicas": 1, "availableReplicas": 1},
    "DecodeWorker": {"replicas": 3, "updatedReplicas": 3, "readyReplicas": 3},
}

READY_CASES = [
    ReadyCase(
        "ready",
        "counts per role from status.services",
        [ready_condition()],
        SERVICE_STATUS,
        {"prefill": 1, "decode": 3},
    ),
    ReadyCase(
        "available-preferred",
        "availableReplicas wins over readyReplicas when present",
        [ready_condition()],
        {
            "PrefillWorker": {"readyReplicas": 2, "availableReplicas": 1},
            "DecodeWorker": {"readyReplicas": 4, "availableReplicas": 4},
        },
        {"prefill": 1, "decode": 4},
    ),
    ReadyCase(
        "not-ready", "Ready=False: the cluster cannot say", [ready_condition("False")], SERVICE_STATUS, None
    ),
    ReadyCase("no-conditions", "a fresh DGD without conditions is not Ready", [], SERVICE_STATUS, None),
    ReadyCase(
        "other-condition-only",
        "only the Ready condition counts",
        [{"type": "Available", "status": "True"}],
        SERVICE_STATUS,
        None,
    ),
    ReadyCase("no-service-status", "Ready but no per-service status yet", [ready_condition()], None, None),
]


@pytest.mark.parametrize("case", READY_CASES, ids=lambda c: c.name)
async def test_ready_counts(
    case: ReadyCase, standin: KubeStandIn, make_connector: Callable[..., KubernetesConnector]
) -> None:
    put_dgd(standin, dgd_object(conditions=case.conditions, service_status=case.service_status))
    assert await make_connector().ready_counts() == case.expected, case.why


# --- set_replicas -------------------------------------------------------------------------------


@dataclass
class ScaleCase:
    name: str
    why: str
    targets: dict[str, int]
    adapters: dict[str, int] = field(default_factory=dict)  # service → replicas of its DGDSA
    ready: bool = True
    conflicts: int = 0
    forbid: tuple[str, str] | None = None
    # What must hold afterwards.
    dgd_replicas: dict[str, int] = field(default_factory=dict)
    adapter_replicas: dict[str, int] = field(default_factory=dict)
    dgd_patches: int = 0
    adapter_patches: int = 0
    error: tuple[str, ...] = ()
    not_ready: bool = False


SCALE_CASES = [
    ScaleCase(
        "merge-patch-fallback",
        "no adapters (404): one merge patch of spec.services.<name>.replicas",
        {"prefill": 3, "decode": 5},
        dgd_replicas={"PrefillWorker": 3, "DecodeWorker": 5},
        dgd_patches=1,
        adapter_patches=2,
    ),
    ScaleCase(
        "only-changed-services",
        "the fallback patch leaves out services already at their target",
        {"prefill": 1, "decode": 4},
        dgd_replicas={"PrefillWorker": 1, "DecodeWorker": 4},
        dgd_patches=1,
        adapter_patches=2,
    ),
    ScaleCase(
        "already-there",
        "nothing to patch when the DGD already says so",
        {"prefill": 1, "decode": 2},
        dgd_replicas={"PrefillWorker": 1, "DecodeWorker": 2},
        dgd_patches=0,
        adapter_patches=2,
    ),
    ScaleCase(
        "through-adapters",
        "with DGDSAs the scale subresource is patched and the DGD left to the operator",
        {"prefill": 3, "decode": 5},
        adapters={"PrefillWorker": 1, "DecodeWorker": 2},
        dgd_replicas={"PrefillWorker": 1, "DecodeWorker": 2},
        adapter_replicas={"PrefillWorker": 3, "DecodeWorker": 5},
        adapter_patches=2,
    ),
    ScaleCase(
        "mixed",
        "an adapter for one service only: the other falls back to the DGD",
        {"prefill": 3, "decode": 5},
        adapters={"DecodeWorker": 2},
        dgd_replicas={"PrefillWorker": 3, "DecodeWorker": 2},
        adapter_replicas={"DecodeWorker": 5},
        dgd_patches=1,
        adapter_patches=2,
    ),
    ScaleCase(
        "not-ready",
        "while the DGD is not Ready nothing is patched, and the caller is told (not a success)",
        {"prefill": 3, "decode": 5},
        ready=False,
        dgd_replicas={"PrefillWorker": 1, "DecodeWorker": 2},
        error=("is not Ready", "not scaled yet"),
        not_ready=True,
    ),
    ScaleCase(
        "conflict-then-success",
        "409 twice: read again, retry, the third patch lands",
        {"prefill": 3, "decode": 5},
        conflicts=2,
        dgd_replicas={"PrefillWorker": 3, "DecodeWorker": 5},
        dgd_patches=3,
        adapter_patches=6,
    ),
    ScaleCase(
        "persistent-conflict",
        "409 on every attempt: a bounded number of tries, then ConnectorError",
        {"prefill": 3, "decode": 5},
        conflicts=100,
        dgd_replicas={"PrefillWorker": 1, "DecodeWorker": 2},
        dgd_patches=4,
        adapter_patches=8,
        error=("still conflicting after 4 attempts",),
    ),
    ScaleCase(
        "forbidden-dgd-patch",
        "403 on the DGD patch names the verb and resource to grant",
        {"prefill": 3, "decode": 5},
        forbid=("patch", "dynamographdeployments"),
        dgd_replicas={"PrefillWorker": 1, "DecodeWorker": 2},
        dgd_patches=1,
        adapter_patches=2,
        error=("forbidden", "verb 'patch'", "resource 'dynamographdeployments'"),
    ),
    ScaleCase(
        "forbidden-adapter-scale",
        "403 on the adapter's scale subresource is not a reason to bypass the adapter",
        {"prefill": 3, "decode": 5},
        adapters={"PrefillWorker": 1, "DecodeWorker": 2},
        forbid=("patch", "dynamographdeploymentscalingadapters/scale"),
        dgd_replicas={"PrefillWorker": 1, "DecodeWorker": 2},
        adapter_replicas={"PrefillWorker": 1, "DecodeWorker": 2},
        adapter_patches=1,
        error=("forbidden", "resource 'dynamographdeploymentscalingadapters/scale'"),
    ),
]


@pytest.mark.parametrize("case", SCALE_CASES, ids=lambda c: c.name)
async def test_set_replicas(
    case: ScaleCase, standin: KubeStandIn, make_connector: Callable[..., KubernetesConnector]
) -> None:
    before = put_dgd(standin, dgd_object(conditions=[ready_condition("True" if case.ready else "False")]))
    for service, replicas in case.adapters.items():
        standin.put(DGDSA.plural, NS, adapter_object(service, replicas))
    if case.forbid:
        standin.forbid(*case.forbid)
    if case.conflicts:
        standin.fail_next_patches(case.conflicts, resource=DGD.plural)
    connector = make_connector()
    connector.conflict_retries = 3

    if case.error:
        with pytest.raises(ConnectorError) as raised:
            await connector.set_replicas(case.targets)  # type: ignore[arg-type]
        for part in case.error:
            assert part in str(raised.value), (case.why, str(raised.value))
        assert isinstance(raised.value, ConnectorNotReadyError) == case.not_ready, case.why
    else:
        await connector.set_replicas(case.targets)  # type: ignore[arg-type]

    after = standin.get(DGD.plural, NS, NAME)
    assert after is not None
    got = {s: spec["replicas"] for s, spec in after["spec"]["services"].items() if s != "Frontend"}
    assert got == case.dgd_replicas, case.why
    # Nothing but the replicas changed: the rest of the spec, the labels and the status are intact.
    strip = {
        s: {k: v for k, v in spec.items() if k != "replicas"} for s, spec in after["spec"]["services"].items()
    }
    assert strip == {
        s: {k: v for k, v in spec.items() if k != "replicas"}
        for s, spec in before["spec"]["services"].items()
    }
    assert after["spec"]["backendFramework"] == "vllm"
    assert after["metadata"]["labels"] == {"app": "llm"}
    assert after["status"] == before["status"]
    for service, replicas in case.adapter_replicas.items():
        adapter = standin.get(DGDSA.plural, NS, f"{NAME}-{service.lower()}")
        assert adapter is not None and adapter["spec"]["replicas"] == replicas, case.why

    patches = standin.patches()
    dgd_patches = [p for p in patches if p.path == DGD_PATH]
    adapter_patches = [p for p in patches if p.path.endswith("/scale")]
    assert (len(dgd_patches), len(adapter_patches)) == (case.dgd_patches, case.adapter_patches), case.why
    assert {p.content_type for p in patches} <= {MERGE_PATCH}
    for p in adapter_patches:
        assert p.body == {"spec": {"replicas": case.targets["prefill" if "prefill" in p.path else "decode"]}}
    # A DGD patch names only the services without an adapter that are not at their target yet.
    initial = {"PrefillWorker": 1, "DecodeWorker": 2}
    services = {"prefill": "PrefillWorker", "decode": "DecodeWorker"}
    changed = {
        services[r]: {"replicas": n}
        for r, n in case.targets.items()
        if services[r] not in case.adapters and initial[services[r]] != n
    }
    for p in dgd_patches:
        assert p.body["spec"] == {"services": changed}, case.why
        assert set(p.body) == {"metadata", "spec"} and set(p.body["metadata"]) == {"resourceVersion"}


async def test_fallback_patch_is_exactly_the_replicas_under_the_read_version(
    standin: KubeStandIn, make_connector: Callable[..., KubernetesConnector]
) -> None:
    stored = put_dgd(standin)
    await make_connector().set_replicas({"prefill": 3, "decode": 5})

    methods_paths = [(r.method, r.path) for r in standin.requests]
    assert methods_paths == [
        ("GET", DGD_PATH),
        ("PATCH", _adapter_path("prefillworker")),
        ("PATCH", _adapter_path("decodeworker")),
        ("PATCH", DGD_PATH),
    ]
    patch = standin.requests[-1]
    assert patch.content_type == MERGE_PATCH
    assert patch.body == {
        "metadata": {"resourceVersion": stored["metadata"]["resourceVersion"]},
        "spec": {"services": {"PrefillWorker": {"replicas": 3}, "DecodeWorker": {"replicas": 5}}},
    }
    after = standin.get(DGD.plural, NS, NAME)
    assert after is not None
    assert int(after["metadata"]["resourceVersion"]) > int(stored["metadata"]["resourceVersion"])
    assert after["metadata"]["generation"] == stored["metadata"]["generation"] + 1


async def test_a_concurrent_change_is_read_again_before_retrying(
    standin: KubeStandIn, make_connector: Callable[..., KubernetesConnector]
) -> None:
    """The patch carries the resourceVersion it read: a write in between (here the operator's
    status update) makes it 409, and the retry goes out under the new version."""
    first = put_dgd(standin)
    # Park the connector's first PATCH (the prefill adapter); the DGD was read just before.
    hold = standin.hold_next_request(match=lambda r: r.method == "PATCH")
    task = asyncio.create_task(make_connector().set_replicas({"prefill": 3, "decode": 5}))
    await asyncio.to_thread(hold.arrived.wait, 10)
    standin.set_status(DGD.plural, NS, NAME, {"conditions": [ready_condition()], "state": "successful"})
    hold.release()
    await task

    dgd_patches = [r for r in standin.patches() if r.path == DGD_PATH]
    versions = [p.body["metadata"]["resourceVersion"] for p in dgd_patches]
    assert versions[0] == first["metadata"]["resourceVersion"]
    assert len(versions) == 2 and int(versions[1]) > int(versions[0])
    assert [r.method for r in standin.requests].count("GET") == 2  # read again before retrying
    after = standin.get(DGD.plural, NS, NAME)
    assert after is not None
    assert {s: after["spec"]["services"][s]["replicas"] for s in ("PrefillWorker", "DecodeWorker")} == {
        "PrefillWorker": 3,
        "DecodeWorker": 5,
    }


async def test_set_replicas_refuses_a_role_of_another_mode(
    standin: KubeStandIn, make_connector: Callable[..., KubernetesConnector]
) -> None:
    put_dgd(standin)
    with pytest.raises(ConnectorError, match="no role workers"):
        await make_connector().set_replicas({"workers": 2})
    with pytest.raises(ConnectorError, match="counts >= 0"):
        await make_connector().set_replicas({"prefill": -1, "decode": 2})
    assert standin.requests == []


async def test_shadow_mode_reads_and_never_writes(
    standin: KubeStandIn, make_connector: Callable[..., KubernetesConnector]
) -> None:
    """Shadow mode: the incumbent's replicas are the services' spec, ready or not; a write is
    refused before any call, whatever it asks."""
    put_dgd(standin, dgd_object(service_status={"PrefillWorker": {"availableReplicas": 0}}))
    connector = make_connector(mode="shadow")
    # Spec 1 and 2 (disagg_services), though no prefill engine is available yet.
    assert await connector.incumbent_replicas() == {"prefill": 1, "decode": 2}
    standin.clear_requests()
    with pytest.raises(ConnectorError, match="shadow mode and never writes"):
        await connector.set_replicas({"prefill": 3, "decode": 5})
    assert standin.requests == []


async def test_agg_scales_the_decode_service(
    standin: KubeStandIn, make_connector: Callable[..., KubernetesConnector]
) -> None:
    put_dgd(standin, dgd_object({"Frontend": FRONTEND, "VllmDecodeWorker": worker(None, 1)}))
    await make_connector(AGG).set_replicas({"workers": 4})
    after = standin.get(DGD.plural, NS, NAME)
    assert after is not None and after["spec"]["services"]["VllmDecodeWorker"]["replicas"] == 4
    assert after["spec"]["services"]["Frontend"]["replicas"] == 1


# --- the event loop keeps running -------------------------------------------------------------


@pytest.mark.parametrize("call", ["validate", "gpus_per_engine", "ready_counts", "set_replicas"])
async def test_event_loop_runs_while_a_call_is_in_flight(
    call: str, standin: KubeStandIn, make_connector: Callable[..., KubernetesConnector]
) -> None:
    """The stand-in parks the connector's request; a ticker task must keep advancing until the
    request is released. A connector that blocked the loop would stall the ticker (and the hold
    would run out, which fails the test instead of hanging it)."""
    put_dgd(standin)
    connector = make_connector()
    await connector.validate()  # the client is built; the next request is the one parked
    hold = standin.hold_next_request(timeout_s=10.0)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticking = asyncio.create_task(ticker())
    args = ({"prefill": 2, "decode": 2},) if call == "set_replicas" else ()
    work = asyncio.create_task(getattr(connector, call)(*args))
    while not hold.arrived.is_set():
        await asyncio.sleep(0.001)
    at_arrival = ticks
    while ticks < at_arrival + 50:
        await asyncio.sleep(0)
    assert not work.done()  # still waiting for the parked request, and yet the loop ran
    hold.release()
    await work
    ticking.cancel()
    assert not hold.timed_out


# --- the stand-in follows the API's rules -------------------------------------------------------


async def test_standin_semantics(standin: KubeStandIn) -> None:
    stored = put_dgd(standin)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=standin.url, headers=headers) as http:
        missing = await http.get(DGD_PATH.replace(NAME, "nope"))
        assert missing.status_code == 404
        assert missing.json() | {"message": ""} == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "",
            "reason": "NotFound",
            "details": {"name": "nope", "group": "nvidia.com", "kind": "dynamographdeployments"},
            "code": 404,
        }
        unserved = await http.get("/apis/nvidia.com/v1alpha1/namespaces/dynamo/widgets/x")
        assert (unserved.status_code, unserved.json()["details"]) == (404, {})

        strategic = await http.patch(
            DGD_PATH,
            content=b'{"spec": {}}',
            headers={"Content-Type": "application/strategic-merge-patch+json"},
        )
        assert (strategic.status_code, strategic.json()["reason"]) == (415, "UnsupportedMediaType")
        plain = await http.patch(DGD_PATH, content=b"{}", headers={"Content-Type": "application/json"})
        assert plain.status_code == 415

        merged = await http.patch(
            DGD_PATH,
            content=b'{"metadata": {"labels": {"app": null, "tier": "gpu"}},'
            b' "spec": {"services": {"Frontend": {"replicas": 2}}}, "status": {"state": "hacked"}}',
            headers={"Content-Type": MERGE_PATCH},
        )
        assert merged.status_code == 200
        body = merged.json()
        assert body["metadata"]["labels"] == {"tier": "gpu"}  # null deletes, new keys merge
        assert body["spec"]["services"]["Frontend"]["replicas"] == 2
        assert body["spec"]["services"]["PrefillWorker"] == stored["spec"]["services"]["PrefillWorker"]
        assert body["status"] == stored["status"]  # the status subresource owns .status
        assert int(body["metadata"]["resourceVersion"]) > int(stored["metadata"]["resourceVersion"])

        same = await http.patch(DGD_PATH, content=b"{}", headers={"Content-Type": MERGE_PATCH})
        assert same.json()["metadata"]["resourceVersion"] == body["metadata"]["resourceVersion"]

        stale = await http.patch(
            DGD_PATH,
            json={"metadata": {"resourceVersion": stored["metadata"]["resourceVersion"]}},
            headers={"Content-Type": MERGE_PATCH},
        )
        assert (stale.status_code, stale.json()["reason"]) == (409, "Conflict")

        json_patch = await http.patch(
            DGD_PATH,
            json=[{"op": "replace", "path": "/spec/services/DecodeWorker/replicas", "value": 7}],
            headers={"Content-Type": "application/json-patch+json"},
        )
        assert json_patch.json()["spec"]["services"]["DecodeWorker"]["replicas"] == 7

        negative = await http.patch(
            DGD_PATH,
            json={"spec": {"services": {"DecodeWorker": {"replicas": -1}}}},
            headers={"Content-Type": MERGE_PATCH},
        )
        assert (negative.status_code, negative.json()["reason"]) == (422, "Invalid")

        no_scale = await http.patch(DGD_PATH + "/scale", json={}, headers={"Content-Type": MERGE_PATCH})
        assert no_scale.status_code == 404  # the DGD has no scale subresource

        standin.put(DGDSA.plural, NS, adapter_object("DecodeWorker", 2))
        scale = await http.get(_adapter_path("decodeworker"))
        assert scale.json()["kind"] == "Scale" and scale.json()["spec"] == {"replicas": 2}

        standin.forbid("get", "dynamographdeployments")
        forbidden = await http.get(DGD_PATH)
        assert (forbidden.status_code, forbidden.json()["reason"]) == (403, "Forbidden")
        assert 'cannot get resource "dynamographdeployments"' in forbidden.json()["message"]

        unauthorized = await http.get(DGD_PATH, headers={"Authorization": "Bearer nope"})
        assert unauthorized.status_code == 401

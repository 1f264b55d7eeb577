"""The Kubernetes connector: scale a Dynamo DynamoGraphDeployment (DGD).

What it reads and writes (field names as Dynamo's operator, `nvidia.com/v1alpha1`):

- the DGD `dynamographdeployments/<dgd_name>`: `spec.services.<Service>` (map name → spec) with
  `subComponentType` (prefill | decode), `componentType`, `replicas`, `resources`, `multinode`;
  `status.conditions[type=Ready]` and `status.services.<Service>.{availableReplicas,readyReplicas}`;
- the scaling adapter (DGDSA) `dynamographdeploymentscalingadapters/<dgd_name>-<service lower>`,
  through its `scale` subresource.

Which service plays which role (`_resolve_services`):

- `prefill` / `decode`: the one service whose `subComponentType` is that role; when none has it,
  the one service without a `subComponentType` that carries a legacy worker name of the role
  (`VllmPrefillWorker`, `TRTLLMPrefillWorker`, `prefill`; `VllmDecodeWorker`,
  `TRTLLMDecodeWorker`, `decode`), as Dynamo's planner does. Two candidates are an error.
- `workers` (agg mode): Dynamo's planner runs an aggregated deployment as "decode only", so the
  service with `subComponentType: decode` wins; else the one service without a
  `subComponentType` whose `componentType` is `worker` or that carries a legacy decode name.

Readiness is the DGD's `Ready` condition (`status.conditions[type=Ready].status == "True"`),
which is what Dynamo's planner checks before it scales; `status.state` is a free-form summary
and is not read. While the DGD is not Ready, `ready_counts()` says None and `set_replicas()`
patches nothing and raises `ConnectorNotReadyError`, so the decision waits for the next tick.

Setting replicas: for each role, a merge patch `{"spec": {"replicas": N}}` of the DGDSA's scale
subresource (an adapter, when present, owns the service's replicas and would undo a DGD edit);
on 404 (no adapter: older operator) one merge patch of the DGD,
`{"metadata": {"resourceVersion": <read>}, "spec": {"services": {"<Service>": {"replicas": N}}}}`.
The resourceVersion makes the patch conditional on the DGD we read (Ready, current replicas): a
concurrent change answers 409, and the connector reads again and retries, a bounded number of
times. Every API call runs in a worker thread (`asyncio.to_thread`): the official client blocks.

Choosing which engines go: when a role goes down and the planner names the engines it would
rather lose, their pods get a `controller.kubernetes.io/pod-deletion-cost` first (the first named
the lowest), so that the ReplicaSet controller removes them (`deletion_cost.py`). Advisory: a
failure there is logged and the replicas are set all the same.

Shadow mode (`mode: shadow`, docs/shadow.md): the connector reads (`ready_counts()` and
`incumbent_replicas()`, the replicas the incumbent autoscaler set) and never writes:
`set_replicas()` raises before any API call, a safety net behind the worker, which never calls it.

Errors become `ConnectorError` naming the DGD, the service and, for 403, the RBAC verb and
resource to grant.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from app.config import KubernetesConnectorConfig
from app.connectors.deletion_cost import write_deletion_costs
from app.connectors.dgd import (
    adapter_name,
    describe_services,
    is_ready,
    ready_reason,
    resolve_role,
    server_message,
    service_gpus,
    status_body,
)
from app.connectors.kube_client import NoRetryAfterTimeout, timed_out, use_token_file
from app.core.errors import ConnectorError, ConnectorNotReadyError
from app.core.types import Replicas, Role

log = logging.getLogger(__name__)

GROUP = "nvidia.com"
VERSION = "v1alpha1"
DGD_PLURAL = "dynamographdeployments"
DGDSA_PLURAL = "dynamographdeploymentscalingadapters"
MERGE_PATCH = "application/merge-patch+json"

# The service account's files, when running in a pod (a module constant so tests can move it).
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

_T = TypeVar("_T")


class KubernetesConnector:
    """`Connector` for a DynamoGraphDeployment; see the module docstring."""

    def __init__(
        self,
        config: KubernetesConnectorConfig,
        *,
        roles: tuple[Role, ...],
        conflict_retries: int = 3,
        request_timeout_s: float | None = None,
    ) -> None:
        """`request_timeout_s`: each API call's timeout; default the config's."""
        if not roles:
            raise ValueError("roles must name at least one role")
        self.config = config
        self.roles = roles
        self.conflict_retries = conflict_retries
        self.request_timeout_s = (
            request_timeout_s if request_timeout_s is not None else config.request_timeout_s
        )
        self._api: k8s_client.CustomObjectsApi | None = None
        self._core: k8s_client.CoreV1Api | None = None
        self._api_client: k8s_client.ApiClient | None = None
        self._namespace: str | None = config.namespace
        self._init_lock = asyncio.Lock()

    # --- the Connector port --------------------------------------------------------------------

    async def validate(self) -> None:
        dgd = await self._get_dgd()
        self._resolve_services(dgd)

    async def gpus_per_engine(self) -> dict[Role, int] | None:
        """GPUs per engine of each role the DGD declares; a role that declares none is left out,
        and None when no role declares any."""
        dgd = await self._get_dgd()
        names = self._resolve_services(dgd)
        services = self._services(dgd)
        gpus: dict[Role, int] = {}
        for role, name in names.items():
            count = service_gpus(name, services[name])
            if count is not None:
                gpus[role] = count
        return gpus or None

    async def ready_counts(self) -> Replicas | None:
        """Engines serving per role (`availableReplicas`, else `readyReplicas`, of each service's
        status); None while the DGD is not Ready or a service has no status yet."""
        dgd = await self._get_dgd()
        if not is_ready(dgd):
            return None
        names = self._resolve_services(dgd)
        statuses = (dgd.get("status") or {}).get("services") or {}
        counts: Replicas = {}
        for role, name in names.items():
            status = statuses.get(name)
            if not isinstance(status, dict):
                log.debug("%s: no status for service %s yet", self._where(), name)
                return None
            value = status.get("availableReplicas")
            if value is None:
                value = status.get("readyReplicas", 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConnectorError(
                    f"{self._where()}: status.services.{name} has a replica count {value!r}, not a count"
                )
            counts[role] = value
        return counts

    async def incumbent_replicas(self) -> Replicas:
        """The replicas each role's service is set to (`spec.services.<Service>.replicas`),
        whoever set them, ready or not: in shadow mode, what the incumbent autoscaler ordered."""
        dgd = await self._get_dgd()
        services = self._services(dgd)
        counts: Replicas = {}
        for role, name in self._resolve_services(dgd).items():
            value = services[name].get("replicas")
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConnectorError(
                    f"{self._where()}: spec.services.{name}.replicas is {value!r}, not a count"
                )
            counts[role] = value
        return counts

    async def set_replicas(
        self, targets: Replicas, remove: Mapping[Role, Sequence[str]] | None = None
    ) -> None:
        """Set each role's replicas. `remove[role]`: the engines (worker ids: pod names or uids)
        the planner would rather lose first when that role goes down, in order; their pods get a
        deletion cost before the replicas change. Without it no pod is read or written. In shadow
        mode it refuses, before any call."""
        if self.config.mode == "shadow":
            raise ConnectorError(
                f"{self._where()}: the connector runs in shadow mode and never writes "
                f"(asked to set {dict(targets)})"
            )
        unknown = sorted(set(targets) - set(self.roles))
        if unknown:
            raise ConnectorError(
                f"{self._where()}: no role {', '.join(unknown)} in this deployment "
                f"(roles: {', '.join(self.roles)})"
            )
        bad = {r: n for r, n in targets.items() if isinstance(n, bool) or not isinstance(n, int) or n < 0}
        if bad:
            raise ConnectorError(f"{self._where()}: replica targets must be counts >= 0, got {bad}")
        chosen = False
        for attempt in range(self.conflict_retries + 1):
            dgd = await self._get_dgd()
            if not is_ready(dgd):
                # Not a failure and not a success: the planner keeps the decision pending and
                # hands it over again once the DGD is Ready.
                raise ConnectorNotReadyError(
                    f"{self._where()} is not Ready ({ready_reason(dgd)}): not scaled yet"
                )
            names = self._resolve_services(dgd)
            if remove and not chosen:
                # Once per call: a conflict retry repeats the replica write, not the annotations.
                chosen = True
                await self._choose_removals(dgd, names, targets, remove)
            try:
                await self._apply(dgd, {names[role]: n for role, n in targets.items()})
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise
                log.info(
                    "%s changed while scaling (attempt %d of %d): reading it again",
                    self._where(),
                    attempt + 1,
                    self.conflict_retries + 1,
                )
                if attempt < self.conflict_retries:
                    await asyncio.sleep(min(0.05 * 2**attempt, 1.0))
        raise ConnectorError(
            f"{self._where()}: still conflicting after {self.conflict_retries + 1} attempts "
            "(the DGD keeps changing under the planner); giving up on this decision"
        )

    async def close(self) -> None:
        if self._api_client is not None:
            await asyncio.to_thread(self._api_client.close)
            self._api_client = self._api = self._core = None

    # --- scaling -----------------------------------------------------------------------------

    async def _apply(self, dgd: dict[str, Any], targets: dict[str, int]) -> None:
        """Scale each service through its adapter; patch the DGD for those without one. A 409
        propagates (as ApiException) so that the caller reads again and retries."""
        services = self._services(dgd)
        fallback: dict[str, int] = {}
        for service, replicas in targets.items():
            adapter = adapter_name(self.config.dgd_name, service)
            try:
                await self._call(
                    "patch",
                    f"{DGDSA_PLURAL}/scale",
                    adapter,
                    self._custom().patch_namespaced_custom_object_scale,
                    group=GROUP,
                    version=VERSION,
                    namespace=self._ns(),
                    plural=DGDSA_PLURAL,
                    name=adapter,
                    body={"spec": {"replicas": replicas}},
                    _content_type=MERGE_PATCH,
                    passthrough=(404, 409),
                )
                log.info("%s: scaled adapter %s to %d", self._where(), adapter, replicas)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                if services[service].get("replicas") == replicas:
                    log.debug("%s: service %s already at %d", self._where(), service, replicas)
                else:
                    fallback[service] = replicas
        if not fallback:
            return
        body = {
            "metadata": {"resourceVersion": (dgd.get("metadata") or {}).get("resourceVersion")},
            "spec": {"services": {s: {"replicas": n} for s, n in fallback.items()}},
        }
        if body["metadata"]["resourceVersion"] is None:
            del body["metadata"]
        await self._call(
            "patch",
            DGD_PLURAL,
            self.config.dgd_name,
            self._custom().patch_namespaced_custom_object,
            group=GROUP,
            version=VERSION,
            namespace=self._ns(),
            plural=DGD_PLURAL,
            name=self.config.dgd_name,
            body=body,
            _content_type=MERGE_PATCH,
            passthrough=(409,),
        )
        log.info(
            "%s: patched %s (no scaling adapter)",
            self._where(),
            " ".join(f"spec.services.{s}.replicas={n}" for s, n in fallback.items()),
        )

    async def _choose_removals(
        self,
        dgd: dict[str, Any],
        names: dict[Role, str],
        targets: Replicas,
        remove: Mapping[Role, Sequence[str]],
    ) -> None:
        """Deletion costs on the pods the planner names, for each role going down (target below
        the service's `spec.replicas`); raising or keeping a role touches no pod."""
        services = self._services(dgd)
        unmatched: dict[Role, int] = {}
        for role, target in targets.items():
            victims = list(remove.get(role) or ())
            current = services[names[role]].get("replicas")
            if not victims or not isinstance(current, int) or target >= current:
                continue
            assert self._core is not None
            missing = await write_deletion_costs(
                self._core,
                namespace=self._ns(),
                dgd_name=self.config.dgd_name,
                service=names[role],
                victims=victims,
                timeout_s=self.request_timeout_s,
                where=self._where(),
            )
            if missing:
                unmatched[role] = missing
        if unmatched:
            log.info(
                "%s: %d engines named for removal match no pod by name or uid (%s): "
                "the controller chooses in their place",
                self._where(),
                sum(unmatched.values()),
                ", ".join(f"{role}: {n}" for role, n in unmatched.items()),
            )

    # --- reading -----------------------------------------------------------------------------

    async def _get_dgd(self) -> dict[str, Any]:
        await self._ensure_client()
        dgd = await self._call(
            "get",
            DGD_PLURAL,
            self.config.dgd_name,
            self._custom().get_namespaced_custom_object,
            group=GROUP,
            version=VERSION,
            namespace=self._ns(),
            plural=DGD_PLURAL,
            name=self.config.dgd_name,
        )
        if not isinstance(dgd, dict):
            raise ConnectorError(
                f"{self._where()}: the API server answered {type(dgd).__name__}, not an object"
            )
        return dgd

    def _services(self, dgd: dict[str, Any]) -> dict[str, dict[str, Any]]:
        services = (dgd.get("spec") or {}).get("services") or {}
        if not isinstance(services, dict):
            raise ConnectorError(f"{self._where()}: spec.services is not a map of services")
        return {str(k): (v if isinstance(v, dict) else {}) for k, v in services.items()}

    def _resolve_services(self, dgd: dict[str, Any]) -> dict[Role, str]:
        services = self._services(dgd)
        names: dict[Role, str] = {}
        problems: list[str] = []
        for role in self.roles:
            name, why = resolve_role(role, services)
            if name is None:
                problems.append(f"role {role}: {why}")
            else:
                names[role] = name
        if problems:
            raise ConnectorError(
                f"{self._where()}: cannot find the service of every role ({'; '.join(problems)}); "
                f"services found: {describe_services(services)}"
            )
        return names

    # --- the client --------------------------------------------------------------------------

    def _where(self) -> str:
        return f"DynamoGraphDeployment {self._namespace or '?'}/{self.config.dgd_name}"

    def _ns(self) -> str:
        assert self._namespace is not None
        return self._namespace

    def _custom(self) -> k8s_client.CustomObjectsApi:
        assert self._api is not None
        return self._api

    async def _ensure_client(self) -> None:
        if self._api is not None:
            return
        async with self._init_lock:
            if self._api is None:
                api_client, namespace = await asyncio.to_thread(self._build_client)
                self._namespace = namespace
                self._api_client = api_client
                self._api = k8s_client.CustomObjectsApi(api_client)
                self._core = k8s_client.CoreV1Api(api_client)

    def _build_client(self) -> tuple[k8s_client.ApiClient, str]:
        """In a worker thread: files are read here. An explicit `api_server` wins, then an
        explicit `kubeconfig`, then the in-cluster service account, then the default kubeconfig."""
        cfg = self.config
        conf = k8s_client.Configuration()
        try:
            if cfg.api_server:
                conf.host = cfg.api_server.rstrip("/")
                if cfg.token_file:
                    use_token_file(conf, Path(cfg.token_file))
                ca = SERVICE_ACCOUNT_DIR / "ca.crt"
                if conf.host.startswith("https://") and ca.is_file():
                    conf.ssl_ca_cert = str(ca)
            elif cfg.kubeconfig:
                k8s_config.load_kube_config(config_file=cfg.kubeconfig, client_configuration=conf)
            else:
                try:
                    k8s_config.load_incluster_config(client_configuration=conf)
                except ConfigException:
                    k8s_config.load_kube_config(client_configuration=conf)
        except (ConfigException, OSError) as exc:
            raise ConnectorError(
                f"DynamoGraphDeployment {cfg.dgd_name}: no usable Kubernetes client configuration "
                f"(api_server, kubeconfig, in-cluster service account, ~/.kube/config): {exc}"
            ) from None
        namespace = cfg.namespace
        if not namespace:
            try:
                namespace = (SERVICE_ACCOUNT_DIR / "namespace").read_text().strip() or None
            except OSError:
                namespace = None
        conf.retries = NoRetryAfterTimeout(3)
        return k8s_client.ApiClient(conf), namespace or "default"

    async def _call(
        self,
        verb: str,
        resource: str,
        name: str,
        fn: Callable[..., _T],
        /,
        *,
        passthrough: tuple[int, ...] = (),
        **kwargs: Any,
    ) -> _T:
        """Run one blocking API call in a worker thread; translate its errors. Statuses listed
        in `passthrough` reach the caller as ApiException."""
        kwargs.setdefault("_request_timeout", self.request_timeout_s)
        try:
            return await asyncio.to_thread(fn, **kwargs)
        except ApiException as exc:
            if exc.status in passthrough:
                raise
            raise self._translate(exc, verb=verb, resource=resource, name=name) from None
        except urllib3.exceptions.HTTPError as exc:
            host = self._api_client.configuration.host if self._api_client else "?"
            if timed_out(exc):
                raise ConnectorError(
                    f"{self._where()}: the Kubernetes API at {host} did not answer {verb} {resource} "
                    f"{name!r} within {kwargs['_request_timeout']:g} s (request_timeout_s)"
                ) from None
            raise ConnectorError(
                f"{self._where()}: cannot reach the Kubernetes API at {host} ({type(exc).__name__}: {exc})"
            ) from None
        except OSError as exc:  # e.g. the token file went away
            raise ConnectorError(f"{self._where()}: {verb} {resource} {name!r}: {exc}") from None

    def _translate(self, exc: ApiException, *, verb: str, resource: str, name: str) -> ConnectorError:
        message = server_message(exc)
        body = status_body(exc)
        if exc.status == 404 and resource == DGD_PLURAL:
            if not (body.get("details") or {}).get("name"):
                # No object details: the API server does not serve the resource type at all.
                return ConnectorError(
                    f"{self._where()} not found: the API server does not serve "
                    f"{GROUP}/{VERSION} {DGD_PLURAL} (is Dynamo's CRD installed?)"
                )
            return ConnectorError(f"{self._where()} not found")
        if exc.status == 403:
            return ConnectorError(
                f"{self._where()}: forbidden to {verb} {resource} {name!r} in API group {GROUP} "
                f"(RBAC: grant verb {verb!r} on resource {resource!r} in namespace {self._ns()}): {message}"
            )
        if exc.status == 401:
            return ConnectorError(
                f"{self._where()}: the API server rejected the planner's credentials (401): {message}"
            )
        return ConnectorError(
            f"{self._where()}: {verb} {resource} {name!r} failed with HTTP {exc.status}: {message}"
        )

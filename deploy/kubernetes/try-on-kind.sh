#!/usr/bin/env bash
# Try the planner's Kubernetes connector on a throwaway kind cluster, without Dynamo's operator:
#
#   1. create (or reuse) a kind cluster;
#   2. install the minimal DGD CRD, the planner's namespace, ServiceAccount, Role and RoleBinding,
#      and the example DGD (prefill + decode services); mark the DGD Ready by hand (no operator);
#   3. write a kubeconfig for the planner's ServiceAccount (a short-lived token), so that the
#      planner runs with exactly the RBAC of rbac.yaml, not with your admin credentials;
#   4. run `planner serve` on this machine against the cluster, wait for /readyz, pin 2 prefill
#      and 3 decode replicas through POST /override;
#   5. check that the pin reaches spec.services.*.replicas of the DGD (or, with ADAPTERS=1, the
#      scaling adapters' spec.replicas through their scale subresource, the DGD left alone).
#
# Needs: kind, kubectl >= 1.24 (patch --subresource), curl, and the planner installed in the
# repository's .venv (`make run` or `pip install -e .`).
#
# Environment: KIND_CLUSTER (default planner-try), KEEP_CLUSTER=1 to keep a cluster this script
# created, ADAPTERS=1 to try the adapter path, TIMEOUT_S (default 120), PLANNER (planner command).
#
# This script was written without access to any cluster and has NOT been run; the connector
# itself is tested against tests/k8s_standin.py. Please report what breaks.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
CLUSTER="${KIND_CLUSTER:-planner-try}"
CTX="kind-$CLUSTER"
NS=dynamo
DGD=llm
ADAPTERS="${ADAPTERS:-0}"
KEEP="${KEEP_CLUSTER:-0}"
TIMEOUT_S="${TIMEOUT_S:-120}"
PLANNER="${PLANNER:-$REPO/.venv/bin/planner}"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"

say() { printf '== %s\n' "$*"; }
fail() { printf 'try-on-kind: %s\n' "$*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || fail "$1 is required"; }

need kind
need kubectl
need curl
[ -x "$PLANNER" ] || fail "$PLANNER not found: install the planner first (make run, or pip install -e .)"
[ -x "$PYTHON" ] || PYTHON=python3

WORK="$(mktemp -d)"
PLANNER_PID=""
CREATED=0
cleanup() {
  local status=$?
  if [ -n "$PLANNER_PID" ]; then
    kill "$PLANNER_PID" 2>/dev/null || true
    wait "$PLANNER_PID" 2>/dev/null || true
  fi
  if [ "$status" -ne 0 ] && [ -f "$WORK/planner.log" ]; then
    echo "--- planner log (last 60 lines)"
    tail -n 60 "$WORK/planner.log" || true
  fi
  if [ "$CREATED" = 1 ] && [ "$KEEP" != 1 ]; then
    kind delete cluster --name "$CLUSTER" || true
  fi
  rm -rf "$WORK"
  exit "$status"
}
trap cleanup EXIT

K=(kubectl --context "$CTX")

# --- 1. cluster -------------------------------------------------------------------------------
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  say "using the existing kind cluster $CLUSTER"
else
  say "creating kind cluster $CLUSTER"
  kind create cluster --name "$CLUSTER" --wait 120s
  CREATED=1
fi

# --- 2. CRD, RBAC, the example DGD --------------------------------------------------------------
say "installing the DGD CRD, RBAC and the example DGD"
"${K[@]}" apply -f "$HERE/crd-dynamographdeployment.yaml"
"${K[@]}" wait --for condition=established --timeout=60s crd/dynamographdeployments.nvidia.com
if [ "$ADAPTERS" = 1 ]; then
  "${K[@]}" apply -f "$HERE/crd-dynamographdeploymentscalingadapter.yaml"
  "${K[@]}" wait --for condition=established --timeout=60s \
    crd/dynamographdeploymentscalingadapters.nvidia.com
fi
"${K[@]}" apply -f "$HERE/rbac.yaml"
# Recreate rather than apply: apply would keep replicas a previous run's planner had set.
"${K[@]}" delete -f "$HERE/example-dgd.yaml" --ignore-not-found --wait=true
"${K[@]}" create -f "$HERE/example-dgd.yaml"
if [ "$ADAPTERS" = 1 ]; then
  "${K[@]}" delete -f "$HERE/example-adapters.yaml" --ignore-not-found --wait=true
  "${K[@]}" create -f "$HERE/example-adapters.yaml"
fi

# No operator runs here, so nobody reports the DGD Ready: write the status the operator would.
NOW="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
"${K[@]}" -n "$NS" patch dynamographdeployment "$DGD" --subresource=status --type=merge -p "$(cat <<JSON
{"status": {
  "state": "successful",
  "conditions": [{"type": "Ready", "status": "True", "reason": "SetByTryOnKind",
                  "message": "no operator in this cluster; set by try-on-kind.sh",
                  "lastTransitionTime": "$NOW"}],
  "services": {
    "VllmPrefillWorker": {"replicas": 1, "updatedReplicas": 1, "readyReplicas": 1, "availableReplicas": 1},
    "VllmDecodeWorker": {"replicas": 1, "updatedReplicas": 1, "readyReplicas": 1, "availableReplicas": 1}
  }
}}
JSON
)"

# --- 3. the planner's own credentials -----------------------------------------------------------
SA="system:serviceaccount:$NS:planner"
say "checking the planner's RBAC as $SA"
for check in "get dynamographdeployments.nvidia.com" \
             "patch dynamographdeployments.nvidia.com" \
             "patch dynamographdeploymentscalingadapters.nvidia.com --subresource=scale"; do
  # shellcheck disable=SC2086  # $check is several words on purpose
  answer="$("${K[@]}" -n "$NS" auth can-i $check --as="$SA" 2>/dev/null || true)"
  [ "$answer" = "yes" ] || fail "the planner may not: $check (answer: ${answer:-none})"
done

TOKEN="$("${K[@]}" -n "$NS" create token planner --duration=1h)"
SERVER="$(kubectl config view --raw -o jsonpath="{.clusters[?(@.name==\"$CTX\")].cluster.server}")"
CA_DATA="$(kubectl config view --raw -o jsonpath="{.clusters[?(@.name==\"$CTX\")].cluster.certificate-authority-data}")"
[ -n "$SERVER" ] && [ -n "$CA_DATA" ] || fail "cannot read the server and CA of context $CTX from the kubeconfig"
KUBECONFIG_PLANNER="$WORK/planner.kubeconfig"
cat >"$KUBECONFIG_PLANNER" <<YAML
apiVersion: v1
kind: Config
clusters:
  - name: $CTX
    cluster:
      server: $SERVER
      certificate-authority-data: $CA_DATA
users:
  - name: planner
    user:
      token: $TOKEN
contexts:
  - name: planner
    context: {cluster: $CTX, user: planner, namespace: $NS}
current-context: planner
YAML
chmod 600 "$KUBECONFIG_PLANNER"
kubectl --kubeconfig "$KUBECONFIG_PLANNER" -n "$NS" get dynamographdeployment "$DGD" >/dev/null \
  || fail "the planner's kubeconfig cannot read the DGD"

# --- 4. run the planner against the cluster -----------------------------------------------------
cat >"$WORK/deployments.yaml" <<YAML
deployments:
  - name: $DGD
    mode: disagg
    connector:
      type: kubernetes
      dgd_name: $DGD
      namespace: $NS
      kubeconfig: $KUBECONFIG_PLANNER
    sla: {ttft_ms: 500, itl_ms: 50}
    prefill: {gpus_per_engine: 1, min_replicas: 1, max_replicas: 8}
    decode: {gpus_per_engine: 1, min_replicas: 1, max_replicas: 8}
    # No traffic source here: only the operator's pin decides. Tick often so that it is applied soon.
    throughput: {enabled: false, interval_s: 5}
    load: {enabled: false}
YAML
PORT="$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
OPERATOR_TOKEN="operator-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
BASE="http://127.0.0.1:$PORT"

say "starting the planner on $BASE (log: $WORK/planner.log)"
PLANNER_CONFIG="$WORK/deployments.yaml" \
PLANNER_DATABASE_URL="sqlite:///$WORK/planner.db" \
PLANNER_HOST=127.0.0.1 \
PLANNER_PORT="$PORT" \
PLANNER_API_TOKENS="operator:$OPERATOR_TOKEN" \
PLANNER_API_TOKENS_FILE="" \
  "$PLANNER" serve >"$WORK/planner.log" 2>&1 &
PLANNER_PID=$!

deadline=$((SECONDS + TIMEOUT_S))
until curl -fsS "$BASE/readyz" >/dev/null 2>&1; do
  kill -0 "$PLANNER_PID" 2>/dev/null || fail "the planner exited"
  if [ "$SECONDS" -ge "$deadline" ]; then
    curl -sS "$BASE/readyz" || true
    echo
    fail "the planner is not ready after ${TIMEOUT_S}s"
  fi
  sleep 1
done
say "planner ready; pinning prefill=2 decode=3"
curl -fsS -X POST "$BASE/override" \
  -H "Authorization: Bearer $OPERATOR_TOKEN" -H "Content-Type: application/json" \
  -d "{\"deployment\": \"$DGD\", \"action\": \"pin\", \"num_prefill\": 2, \"num_decode\": 3, \"reason\": \"try-on-kind.sh\"}"
echo

# --- 5. the pin reaches the cluster -------------------------------------------------------------
dgd_replicas() {
  "${K[@]}" -n "$NS" get dynamographdeployment "$DGD" \
    -o jsonpath='{.spec.services.VllmPrefillWorker.replicas}/{.spec.services.VllmDecodeWorker.replicas}'
}
adapter_replicas() {
  echo "$("${K[@]}" -n "$NS" get dgdsa llm-vllmprefillworker -o jsonpath='{.spec.replicas}')/$(
    "${K[@]}" -n "$NS" get dgdsa llm-vllmdecodeworker -o jsonpath='{.spec.replicas}')"
}
if [ "$ADAPTERS" = 1 ]; then what=adapter_replicas; else what=dgd_replicas; fi

deadline=$((SECONDS + TIMEOUT_S))
got="$($what)"
until [ "$got" = "2/3" ]; do
  kill -0 "$PLANNER_PID" 2>/dev/null || fail "the planner exited"
  [ "$SECONDS" -lt "$deadline" ] || fail "prefill/decode replicas are $got after ${TIMEOUT_S}s, expected 2/3"
  sleep 2
  got="$($what)"
done
if [ "$ADAPTERS" = 1 ]; then
  say "adapters scaled to 2/3 through their scale subresource"
  [ "$(dgd_replicas)" = "1/1" ] || fail "the DGD was patched although adapters exist: $(dgd_replicas)"
  say "the DGD is untouched (1/1): Dynamo's operator would copy the adapters' replicas into it"
else
  say "spec.services.VllmPrefillWorker.replicas=2 and spec.services.VllmDecodeWorker.replicas=3: OK"
fi

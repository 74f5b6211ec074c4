#!/usr/bin/env bash
# The pool demo: a fleet testbed of 3 nodes on rhel-9 (each its own fake rpm-ostreed, host root
# and real streamd), the StreamPool CRD and RBAC from docs/deploy/rollout/, and streamd-rollout
# running as its service account. A StreamPool "worker" asks for rhel-10 with maxUnavailable 1;
# the script shows the pool and the nodes whenever they change until the pool is Updated.
# Exits 0 when every node runs rhel-10.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cargo build --locked --quiet -p streamd -p testbed -p rollout
bin=${CARGO_TARGET_DIR:-target}/debug

dir=$(mktemp -d /tmp/streamd-pool-demo.XXXXXX)
controller_pid=
cleanup() {
    [[ -n "$controller_pid" ]] && kill "$controller_pid" 2>/dev/null && wait "$controller_pid" 2>/dev/null
    "$bin/testbed" down --dir "$dir" || true
}
trap cleanup EXIT

echo "== testbed up --dir $dir --nodes 3"
"$bin/testbed" up --dir "$dir" --nodes 3 >/dev/null
# shellcheck disable=SC1091
. "$dir/env"
export HOME=$dir

echo "== kubectl apply -f docs/deploy/rollout/crd.yaml, rbac.yaml"
kubectl apply -f docs/deploy/rollout/crd.yaml >/dev/null
# The testbed serves no ServiceAccounts: the account is a token user of the API server.
python3 - docs/deploy/rollout/rbac.yaml >"$dir/rbac.yaml" <<'PY'
import sys
docs = open(sys.argv[1]).read().split("\n---\n")
print("\n---\n".join(d for d in docs if "kind: ServiceAccount" not in d.splitlines()))
PY
kubectl apply -f "$dir/rbac.yaml" >/dev/null
sa_kubeconfig=$("$bin/testbed" ctl --dir "$dir" \
    '{"target":"apiserver","cmd":"add-user","user":"system:serviceaccount:streamd-rollout:streamd-rollout"}' |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["kubeconfig"])')

echo "== starting streamd-rollout as system:serviceaccount:streamd-rollout:streamd-rollout (log: $dir/rollout.log)"
KUBECONFIG=$sa_kubeconfig "$bin/streamd-rollout" run --identity demo --leader-elect=false \
    >"$dir/rollout.log" 2>&1 &
controller_pid=$!

echo "== kubectl apply: StreamPool worker, target rhel-10, maxUnavailable 1"
kubectl apply -f - >/dev/null <<'YAML'
apiVersion: osstream.openshift.io/v1alpha1
kind: StreamPool
metadata:
  name: worker
spec:
  nodeSelector:
    matchLabels:
      node-role.kubernetes.io/worker: ""
  target:
    stream: rhel-10
  maxUnavailable: 1
YAML

show() {
    kubectl get streampools -o json | python3 -c 'import json,sys
for p in json.load(sys.stdin)["items"]:
    s = p.get("status", {})
    cond = {c["type"]: c["status"] for c in s.get("conditions", [])}
    print("    pool %s: updated %s/%s, unavailable %s, Updating=%s Updated=%s Degraded=%s" % (
        p["metadata"]["name"], s.get("updatedMachineCount", 0), s.get("machineCount", 0),
        s.get("unavailableMachineCount", 0), cond.get("Updating"), cond.get("Updated"), cond.get("Degraded")))
    for n in s.get("nodes", []):
        print("      %s %s: %s" % (n["name"], n["state"], n["reason"][:100]))'
    kubectl get nodes -o json | python3 -c 'import json,sys
for n in json.load(sys.stdin)["items"]:
    a = n["metadata"].get("annotations", {})
    g = lambda k: a.get("osstream.openshift.io/" + k, "-")
    ready = [c["status"] for c in n["status"].get("conditions", []) if c["type"] == "Ready"]
    print("    %-9s %-9s %-10s current=%-7s desired=%-7s cordoned=%-5s step=%s" % (
        n["metadata"]["name"], "Ready" if ready == ["True"] else "NotReady", g("state"),
        g("current-stream"), g("desired-stream"), bool(n["spec"].get("unschedulable")), g("rollout-step")[:24]))'
}
updated() {
    kubectl get streampool worker -o jsonpath='{.status.conditions[?(@.type=="Updated")].status}'
}

last= deadline=$((SECONDS + 300))
while ((SECONDS < deadline)); do
    now=$(show)
    if [[ "$now" != "$last" ]]; then
        echo "== $(date +%T)"; echo "$now"
        last=$now
    fi
    if [[ "$(updated)" == True ]]; then
        echo "== $(date +%T)"; show
        echo "== the pool is Updated: every node runs rhel-10"
        echo "== the API server's record of unavailable nodes: at most $("$bin/testbed" ctl --dir "$dir" \
            '{"target":"apiserver","cmd":"unavailable"}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["max"])') at once"
        echo "== the pool's Events (kubectl get events.events.k8s.io -n default)"
        kubectl get events.events.k8s.io -n default -o json | python3 -c 'import json,sys
events = [e for e in json.load(sys.stdin)["items"] if e.get("regarding", {}).get("kind") == "StreamPool"]
for e in sorted(events, key=lambda e: e["eventTime"]):
    print("    %-7s %-15s %s" % (e["type"], e["reason"], e.get("note", "")[:90]))'
        exit 0
    fi
    sleep 0.5
done
echo "demo-pool: the pool was not Updated within 300 s; controller log:" >&2
cat "$dir/rollout.log" >&2
exit 1

#!/usr/bin/env bash
# The demo: testbed up, streamd against it, request rhel-10 with kubectl, show the node's
# streamd annotations and `streamctl status` as they change until the node is Staged, then stop
# everything. Exits 0 when the node reached Staged.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cargo build --workspace --locked --quiet
bin=target/debug

dir=$(mktemp -d /tmp/streamd-demo.XXXXXX)
streamd_pid=
cleanup() {
    [[ -n "$streamd_pid" ]] && kill "$streamd_pid" 2>/dev/null && wait "$streamd_pid" 2>/dev/null
    "$bin/testbed" down --dir "$dir" || true
}
trap cleanup EXIT

echo "== testbed up --dir $dir"
"$bin/testbed" up --dir "$dir" >/dev/null
# shellcheck disable=SC1091
. "$dir/env"
# A staging that takes a few seconds, so progress is visible.
"$bin/testbed" ctl --dir "$dir" '{"target":"rpmostreed","cmd":"progress","signals":30,"per-second":6}' >/dev/null

echo "== starting streamd (log: $dir/streamd.log)"
"$bin/streamd" >"$dir/streamd.log" 2>&1 &
streamd_pid=$!

show() {
    kubectl get node "$STREAMD_NODE_NAME" -o json |
        python3 -c 'import json,sys
a=json.load(sys.stdin)["metadata"].get("annotations",{})
for k in sorted(a):
    if k.startswith("osstream.openshift.io/"): print("   ", k.split("/",1)[1], "=", a[k])'
}
state() {
    kubectl get node "$STREAMD_NODE_NAME" -o jsonpath='{.metadata.annotations.osstream\.openshift\.io/state}'
}

for _ in $(seq 100); do [[ "$(state)" == Idle ]] && break; sleep 0.1; done
echo "== node before the request"; show

echo "== kubectl annotate node $STREAMD_NODE_NAME desired-stream=rhel-10 desired-os-image=$TESTBED_RHEL10_IMAGE"
kubectl annotate --overwrite node "$STREAMD_NODE_NAME" \
    osstream.openshift.io/desired-stream=rhel-10 \
    "osstream.openshift.io/desired-os-image=$TESTBED_RHEL10_IMAGE" >/dev/null

last=
deadline=$((SECONDS + 60))
while ((SECONDS < deadline)); do
    now=$(show)
    if [[ "$now" != "$last" ]]; then
        echo "== $(date +%T) node annotations"; echo "$now"
        echo "== streamctl status"; "$bin/streamctl" status | sed 's/^/    /'
        last=$now
    fi
    if [[ "$(state)" == Staged ]]; then
        echo "== the node reports Staged"
        exit 0
    fi
    sleep 0.3
done
echo "demo: the node did not reach Staged within 60 s; streamd log:" >&2
cat "$dir/streamd.log" >&2
exit 1

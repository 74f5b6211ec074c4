#!/usr/bin/env bash
# The demo: testbed up, streamd against it, request rhel-10 with kubectl, show the node's
# streamd annotations and `streamctl status` as they change until the node is Staged and asks for a
# reboot; approve it with kubectl, let the testbed reboot the host, start streamd again and watch
# it report Done on rhel-10. Then stop everything. Exits 0 when the node reached Done.
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

annotation() {
    kubectl get node "$STREAMD_NODE_NAME" -o jsonpath="{.metadata.annotations.osstream\.openshift\.io/$1}"
}

# Prints every change of the annotations (and streamctl status) until the state is $1.
watch_until() {
    local want=$1 last= now deadline=$((SECONDS + 90))
    while ((SECONDS < deadline)); do
        now=$(show)
        if [[ "$now" != "$last" ]]; then
            echo "== $(date +%T) node annotations"; echo "$now"
            echo "== streamctl status"; "$bin/streamctl" status | sed 's/^/    /'
            last=$now
        fi
        if [[ "$(state)" == "$want" && ("$want" != Staged || -n "$(annotation reboot-requested)") ]]; then
            return 0
        fi
        sleep 0.3
    done
    echo "demo: the node did not reach $want within 90 s; streamd log:" >&2
    cat "$dir/streamd.log" >&2
    exit 1
}

watch_until Staged
token=$(annotation reboot-requested)
echo "== the node is Staged and asks for a reboot; approving token $token"
kubectl annotate --overwrite node "$STREAMD_NODE_NAME" "osstream.openshift.io/reboot-approved=$token" >/dev/null
watch_until Rebooting
# rpm-ostreed got FinalizeDeployment and would reboot now: stop streamd as a shutdown does, let the
# testbed reboot the host (the unlocked deployment is applied, the boot id changes), start again.
for _ in $(seq 100); do
    "$bin/testbed" ctl --dir "$dir" '{"target":"rpmostreed","cmd":"transactions"}' |
        grep -q '"reboot_requested": true' && break
    sleep 0.1
done
kill "$streamd_pid"; wait "$streamd_pid" || true
echo "== testbed reboot --dir $dir"
"$bin/testbed" reboot --dir "$dir" | sed 's/^/    /'
echo "== starting streamd after the reboot"
"$bin/streamd" >>"$dir/streamd.log" 2>&1 &
streamd_pid=$!
watch_until Done
echo "== the node reports Done: it runs $(annotation current-stream)"

#!/usr/bin/env bash
# Installs what the demo and the tests need and is missing. Safe to run again.
set -euo pipefail

need=()
have() { command -v "$1" >/dev/null 2>&1; }
have dbus-daemon || need+=(dbus)
have kubectl || need+=(kubernetes-client)
have tmux || need+=(tmux)
have pkg-config || need+=(pkg-config)
have rpmbuild || need+=(rpm)
have docker-registry || need+=(docker-registry)
have ostree || need+=(ostree)
pkg-config --exists ostree-1 2>/dev/null || need+=(libostree-dev)
# Writes the real journal the testbed leaves after a failed finalization.
[[ -x /lib/systemd/systemd-journal-remote ]] || need+=(systemd-journal-remote)

if ((${#need[@]})); then
    echo "setup: installing ${need[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

for c in rustfmt cargo-clippy; do
    have "$c" || rustup component add "${c#cargo-}"
done

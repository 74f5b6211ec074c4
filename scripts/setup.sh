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
# The fake rpm-ostreed imports registry images with the ostree-ext crate, as rpm-ostree does:
# it runs skopeo's image proxy and links libzstd and OpenSSL.
have skopeo || need+=(skopeo)
pkg-config --exists libzstd 2>/dev/null || need+=(libzstd-dev)
pkg-config --exists openssl 2>/dev/null || need+=(libssl-dev)
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

# Debian trixie's libostree (2025.x) in a minimal root of its own, for the tests that let real
# libostree stage and lock a deployment (bookworm's 2022.7 predates the `locked` key of
# /run/ostree/staged-deployment). Kept outside the clone and between runs; made again only when
# the stamp, written last, is missing. The path is short: the tests bind sockets below it.
# Bump the revision when what goes into the root changes (testbed/src/fakes/rpmostreed/libostree.rs
# names the same path).
trixie_root=/var/cache/streamd-testbed/trixie-1
trixie_stamp=$trixie_root/.streamd-complete
if [[ ! -e $trixie_stamp ]]; then
    have debootstrap || {
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
    }
    # The mirror apt already uses for bookworm (deb822 `.sources` or one-line `sources.list`).
    mirror=$(
        { awk 'BEGIN{RS=""} /Suites:[^\n]*bookworm( |\n|$)/ && /Components:[^\n]*main/ {
                 if (match($0, /URIs:[ \t]*[^ \t\n]+/)) { u = substr($0, RSTART, RLENGTH); sub(/URIs:[ \t]*/, "", u); print u } }' \
              /etc/apt/sources.list.d/*.sources 2>/dev/null
          awk '$1 == "deb" && / bookworm / { for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) { print $i; break } }' \
              /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null; } | head -n1
    ) || true
    [[ -n $mirror ]] || { echo "setup: no apt source for bookworm main to fetch trixie from" >&2; exit 1; }
    echo "setup: making a trixie root with ostree in $trixie_root (about 2 minutes, once)" >&2
    rm -rf "$trixie_root"
    mkdir -p "$(dirname "$trixie_root")"
    if ! debootstrap --variant=minbase --include=ostree trixie "$trixie_root" "$mirror" \
        >"$trixie_root.log" 2>&1; then
        tail -n 20 "$trixie_root.log" >&2
        echo "setup: debootstrap of trixie failed (full log: $trixie_root.log)" >&2
        exit 1
    fi
    # Where the testbed binds its sysroot's repository and deployments.
    mkdir -p "$trixie_root/ostree"
    chroot "$trixie_root" ostree --version | awk -F"'" '/Version/ { print $2 }' >"$trixie_stamp.tmp"
    mv "$trixie_stamp.tmp" "$trixie_stamp"
    rm -f "$trixie_root.log"
fi

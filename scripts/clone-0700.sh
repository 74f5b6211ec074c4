#!/usr/bin/env bash
# The tests that depend on where the project is cloned, from a fresh clone below a directory
# only its owner may enter (a `mktemp -d`, mode 0700, like root's home): the D-Bus policy test
# runs busctl and streamctl as `nobody` (they must reach the bus socket and the binary), and the
# fake rpm-ostreed's interface is checked against the XML kept in the repository.
#
# The clone's path is about 120 characters long, and one end-to-end test runs there.
#
# It clones the committed HEAD (uncommitted changes are not tested) and builds into the clone's
# own target directory, so it is a cold build of those two test binaries: run it as root (the
# policy test switches to `nobody` with setpriv). Extra arguments go to both `cargo test` calls.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"

[[ $(id -u) == 0 ]] || { echo "clone-0700: run as root (the policy test uses setpriv)" >&2; exit 1; }

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
mode="$(stat -c %a "$scratch")"
[[ $mode == 700 ]] || { echo "clone-0700: mktemp -d made mode $mode, not 700" >&2; exit 1; }

# A long path too (about 120 characters, like a home directory's projects folder): nothing the
# tests make may depend on a short clone path (sockets live in short scratch directories).
clone="$scratch/$(printf 'p%.0s' {1..80})/streamd"
while (( ${#clone} < 120 )); do clone="${clone%/streamd}p/streamd"; done
git clone --quiet --no-hardlinks "$repo" "$clone"
cd "$clone"
# Everything below the 0700 directory: sources, target/, target/tmp.
unset CARGO_TARGET_DIR
# A cold build: no debug info keeps it short.
export CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_TEST_DEBUG=0

echo "== clone in $scratch (mode $mode): D-Bus policy as nobody"
cargo test --locked -p streamd --test daemon "$@" -- --exact dbus_policy_lets_others_read_but_not_call
echo "== clone in $scratch (mode $mode): the reference interface XML"
cargo test --locked -p testbed --test rpmostreed "$@" -- --exact introspection_matches_the_reference_interface
echo "== clone at a ${#clone}-character path: an end-to-end test (a host refusal over the testbed's bus)"
cargo test --locked -p streamd --test variants "$@" -- --exact host_refusals

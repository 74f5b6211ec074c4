#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit, end-to-end and host-integration tests.
# .ci/run calls exactly this script.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh

# CI builds from a clean clone, once: incremental caches (1.4 GiB here) and line tables (a third
# of each of ~40 test binaries) buy nothing there and a CI run once died mid-link
# (`ld terminated with signal 7`, the mark of a full disk). Say what the machine has, so a failure like that reads as such.
if [[ ${CI:-} == true ]]; then
    export CARGO_INCREMENTAL=0 CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_TEST_DEBUG=0
    echo "== machine: $(nproc) cores; $(df -h --output=avail . | tail -1 | tr -d ' ') free on the clone's disk"
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== cargo test"
cargo test --workspace --locked

# A fresh clone below a 0700 directory (a cold build of two test binaries, as root only).
if [[ $(id -u) == 0 ]]; then
    echo "== the tests that depend on where the clone is, from a clone in a 0700 directory"
    scripts/clone-0700.sh
fi

if [[ -x tests/host/run.sh ]]; then
    echo "== host integration (systemd, D-Bus policy, journal catalog, SELinux, RPM)"
    tests/host/run.sh
fi

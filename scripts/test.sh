#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit, end-to-end and host-integration tests.
# .ci/run calls exactly this script.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== cargo test"
cargo test --workspace --locked

if [[ -x tests/host/run.sh ]]; then
    echo "== host integration (systemd, D-Bus policy, journal catalog, SELinux, RPM)"
    tests/host/run.sh
fi

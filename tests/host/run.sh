#!/bin/bash
# All host-integration checks, in order: systemd unit, D-Bus policy, journal
# catalog, SELinux module, RPM build. Prints one result line per check and
# exits non-zero if any failed. Each check installs what it needs.
#
#   tests/host/run.sh [CHECK...]      (default: all; e.g. `run.sh catalog`)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$HERE/../.." && pwd)"

checks=("$@")
[[ ${#checks[@]} -gt 0 ]] || checks=(systemd dbus-policy catalog selinux rpm)

# One `apt-get update` for the whole run, shared through this file.
STREAMD_APT_MARKER="$(mktemp)"
export STREAMD_APT_MARKER
logdir="$(mktemp -d)"
trap 'rm -rf -- "$STREAMD_APT_MARKER" "$logdir"' EXIT

declare -a lines=()
failed=0
for c in "${checks[@]}"; do
    case "$c" in
        rpm) cmd=("$REPO_ROOT/packaging/build-rpm.sh") ;;
        *) cmd=("$HERE/$c.sh") ;;
    esac
    [[ -f "${cmd[0]}" ]] || { echo "unknown check: $c" >&2; exit 2; }
    echo "== host check: $c" >&2
    start=$SECONDS
    rc=0
    # Output goes to the log as it comes (CI shows it); the summary line is
    # picked from it afterwards.
    bash "${cmd[@]}" 2>&1 | tee "$logdir/$c.log" >&2 || rc=$?
    secs=$((SECONDS - start))
    if [[ "$c" == rpm ]]; then
        summary="$(sed -n 's/^RPM-SUMMARY: //p' "$logdir/$c.log" | tail -1)"
    else
        summary="$(sed -n 's/^RESULT: //p' "$logdir/$c.log" | tail -1)"
    fi
    if [[ $rc -eq 0 && -n "$summary" ]]; then
        lines+=("PASS $c (${secs}s): $summary")
    else
        failed=$((failed + 1))
        why="$(grep -E 'FAIL' "$logdir/$c.log" | tail -1)"
        lines+=("FAIL $c (${secs}s): ${why:-exit code $rc}")
    fi
done

echo
echo "host checks:"
printf '  %s\n' "${lines[@]}"
passed=$((${#checks[@]} - failed))
echo "host: $passed passed, $failed failed"
[[ $failed -eq 0 ]]

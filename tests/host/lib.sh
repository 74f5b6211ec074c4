# shellcheck shell=bash
# Shared helpers for the host-integration checks; sourced, not executed.

# Repository root, whatever the caller's working directory is.
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export REPO_ROOT

log() { printf '%s: %s\n' "${0##*/}" "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }

# need_cmd CMD PACKAGE...: install the Debian packages when CMD is missing.
# CI runs on a fresh machine, so every check brings its own tools.
need_cmd() {
    local cmd="$1"; shift
    command -v "$cmd" >/dev/null 2>&1 && return 0
    apt_install "$@"
    command -v "$cmd" >/dev/null 2>&1 || die "$cmd still missing after installing $*"
}

# need_file PATH PACKAGE...: same, keyed on a file (headers, python modules).
need_file() {
    local file="$1"; shift
    [[ -e "$file" ]] && return 0
    apt_install "$@"
    [[ -e "$file" ]] || die "$file still missing after installing $*"
}

apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    # Refresh the package lists once per run, so a stale list cannot make the
    # install 404; run.sh shares one marker file with all the checks.
    local marker="${STREAMD_APT_MARKER:-}"
    if [[ -z "${_host_apt_updated:-}" && ! -s "$marker" ]]; then
        log "installing $* (apt-get update first)"
        apt-get update -qq >&2
        _host_apt_updated=1
        [[ -n "$marker" ]] && echo updated >"$marker"
    else
        log "installing $*"
    fi
    apt-get install -y -qq --no-install-recommends "$@" >&2
}

# result TEXT: the one-line summary run.sh collects (last "RESULT:" line).
result() { printf 'RESULT: %s\n' "$*"; }

# new_tmpdir: create a temp dir that is removed on exit, also on failure.
# Use as: d="$(new_tmpdir)"; rm_on_exit "$d"  (the trap lives in this shell).
_host_tmpdirs=()
_host_pids=()
_host_cleanup() {
    local p d
    for p in "${_host_pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${_host_pids[@]}"; do wait "$p" 2>/dev/null || true; done
    for d in "${_host_tmpdirs[@]}"; do rm -rf -- "$d"; done
}
trap _host_cleanup EXIT
new_tmpdir() { mktemp -d "${TMPDIR:-/tmp}/streamd-host.XXXXXX"; }
rm_on_exit() { _host_tmpdirs+=("$1"); }

# kill_on_exit PID: a background process of ours, stopped on exit.
kill_on_exit() { _host_pids+=("$1"); }

# le A B: true when decimal A <= B (bash has no float arithmetic).
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 <= b + 0) }'; }

#!/bin/bash
# systemd unit checks: `systemd-analyze verify` on the unit as installed in a
# throw-away root, the offline security exposure (must be <= MAX_EXPOSURE),
# the preset, and the kernel facts the sandbox relies on (connect() to a
# socket on a read-only mount works; uid 0 without capabilities, also in a
# PrivateUsers=-style user namespace, reads the journal by its owner bits).
set -euo pipefail
# shellcheck source=tests/host/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# The figure the unit has; a change that raises it must say why here.
MAX_EXPOSURE="${MAX_EXPOSURE:-1.4}"
UNIT="$REPO_ROOT/systemd/streamd.service"
PRESET="$REPO_ROOT/systemd/50-streamd.preset"

need_cmd systemd-analyze systemd
need_cmd systemctl systemd
need_cmd python3 python3
need_cmd unshare util-linux

root="$(new_tmpdir)"
rm_on_exit "$root"

# A root with the distribution's own units (verify needs sysinit.target and
# friends) plus ours and an executable at the ExecStart path. A stub is
# enough: verify only checks that the command exists and is executable, and
# this keeps the check independent of the daemon's build state.
mkdir -p "$root/usr/lib/systemd/system" "$root/usr/libexec" "$root/etc/systemd/system"
cp -a /usr/lib/systemd/system/. "$root/usr/lib/systemd/system/"
install -m 0644 "$UNIT" "$root/usr/lib/systemd/system/streamd.service"
printf '#!/bin/sh\nexit 0\n' >"$root/usr/libexec/streamd"
chmod 0755 "$root/usr/libexec/streamd"

# verify exits 0 on unknown keys and bad values (it only warns), so any
# output at all counts as a failure. Man pages are not in the test root.
verify() {
    local out rc=0
    out="$(systemd-analyze verify --man=no --root="$root" "${1:-streamd.service}" 2>&1)" || rc=$?
    printf '%s' "$out"
    [[ $rc -eq 0 && -z "$out" ]]
}
if ! out="$(verify)"; then
    die "systemd-analyze verify: ${out:-non-zero exit}"
fi
log "systemd-analyze verify: clean"

# Negative control: the same check must notice a missing ExecStart binary,
# otherwise the pass above means nothing.
mv "$root/usr/libexec/streamd" "$root/usr/libexec/streamd.off"
if out="$(verify)"; then
    die "verify did not notice a missing /usr/libexec/streamd"
fi
mv "$root/usr/libexec/streamd.off" "$root/usr/libexec/streamd"
log "negative control: verify rejects a missing ExecStart ($out)"

# streamd's bootloader-update target, beside bootupd's unit as bootupd ships it
# (coreos/bootupd:contrib/packaging/bootloader-update.service) and a stub
# bootupctl: verify loads the Requires= dependency too.
TARGET="$REPO_ROOT/systemd/streamd-bootloader-update.target"
install -m 0644 "$TARGET" "$root/usr/lib/systemd/system/"
printf '[Unit]\nDescription=Update bootloader on boot\n\n[Service]\nType=oneshot\nExecStart=/usr/bin/bootupctl update\nRemainAfterExit=yes\nMountFlags=slave\n' \
    >"$root/usr/lib/systemd/system/bootloader-update.service"
mkdir -p "$root/usr/bin"
printf '#!/bin/sh\nexit 0\n' >"$root/usr/bin/bootupctl"
chmod 0755 "$root/usr/bin/bootupctl"
if ! out="$(verify streamd-bootloader-update.target)"; then
    die "systemd-analyze verify streamd-bootloader-update.target: ${out:-non-zero exit}"
fi
grep -qx 'Requires=bootloader-update.service' "$TARGET" && grep -qx 'After=bootloader-update.service' "$TARGET" ||
    die "the target must require and order after bootloader-update.service (a failed update fails its job)"
rm "$root/usr/lib/systemd/system/bootloader-update.service"
if out="$(verify streamd-bootloader-update.target)"; then
    die "verify did not notice the target's missing dependency"
fi
log "streamd-bootloader-update.target: verify clean; negative control without bootupd's unit: $out"

# Exposure: parse systemd's own number rather than trusting a constant.
sec="$(systemd-analyze security --offline=true --root="$root" streamd.service 2>&1)" ||
    die "systemd-analyze security failed: $sec"
exposure="$(sed -n 's/.*Overall exposure level for streamd\.service: \([0-9.]*\).*/\1/p' <<<"$sec")"
[[ -n "$exposure" ]] || die "no exposure figure in: $sec"
# Show what is still open, for the log.
grep -E '^✗' <<<"$sec" | sed 's/  */ /g' >&2 || true
le "$exposure" "$MAX_EXPOSURE" || die "exposure $exposure > $MAX_EXPOSURE"
log "exposure $exposure (limit $MAX_EXPOSURE)"

# Resources: MemoryMax= must leave room for the largest extraction streamd
# allows into /run/streamd (tmpfs pages are charged to the writer's cgroup),
# read from the code so the two cannot drift apart; TasksMax= must be set.
max_total_mib="$(sed -n 's/^ *max_total: \([0-9]*\) << 20,$/\1/p' "$REPO_ROOT/src/image/registry/extract.rs")"
[[ -n "$max_total_mib" ]] || die "cannot read EXTRACT_LIMITS.max_total from src/image/registry/extract.rs"
memory_max="$(sed -n 's/^MemoryMax=\([0-9]*\)M$/\1/p' "$UNIT")"
[[ -n "$memory_max" ]] || die "the unit has no MemoryMax=<n>M"
((memory_max >= max_total_mib + 128)) ||
    die "MemoryMax=${memory_max}M leaves less than 128 MiB beside a ${max_total_mib} MiB extraction"
grep -qE '^TasksMax=[0-9]+$' "$UNIT" || die "the unit has no TasksMax="
log "MemoryMax=${memory_max}M (extractions up to ${max_total_mib} MiB), $(grep '^TasksMax=' "$UNIT")"

# Preset: image builds enable the unit through it; check it really does.
mkdir -p "$root/usr/lib/systemd/system-preset"
install -m 0644 "$PRESET" "$root/usr/lib/systemd/system-preset/"
systemctl --root="$root" preset streamd.service >&2
[[ -L "$root/etc/systemd/system/multi-user.target.wants/streamd.service" ]] ||
    die "preset did not enable streamd.service"
log "preset enables streamd.service"

# ProtectSystem=strict leaves /run read-only; the daemon must still reach the
# system bus and rpm-ostree sockets. Check that connect() works on a
# read-only bind mount while creating a file there fails.
if unshare --mount true 2>/dev/null; then
    sockdir="$(new_tmpdir)"
    rm_on_exit "$sockdir"
    ro_out="$(unshare --mount --propagation private python3 - "$sockdir" <<'EOF' 2>&1
import errno, os, socket, subprocess, sys
d = sys.argv[1]
path = os.path.join(d, "bus.sock")
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(path)
srv.listen(1)
subprocess.run(["mount", "--bind", d, d], check=True)
subprocess.run(["mount", "-o", "remount,bind,ro", d], check=True)
try:
    open(os.path.join(d, "probe"), "w")
    sys.exit("mount is not read-only")
except OSError as e:
    if e.errno != errno.EROFS:
        raise
cli = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
cli.connect(path)
print("connect on read-only mount: ok")
EOF
)" || die "read-only socket check: $ro_out"
    log "$ro_out"
    ro_note="ro-connect ok"
else
    log "SKIP read-only socket check: cannot create a mount namespace here"
    ro_note="ro-connect skipped"
fi

# The journal (journalctl --boot=-1 in src/host/facts/journal.rs) is read with
# an empty capability bounding set and PrivateUsers=yes, without
# SupplementaryGroups=systemd-journal. That works only because the files are
# root's own: systemd's tmpfiles.d/systemd.conf makes /var/log/journal and
# /var/log/journal/<machine-id> 2755 and the files 0640, all
# root:systemd-journal. Rebuild that layout (group: a gid we are not in) and
# read it the way the unit does. Control: a file of another owner with the
# same mode is refused without capabilities, so the drop is real.
need_cmd setpriv util-linux
j="$(new_tmpdir)"
rm_on_exit "$j"
chmod 0755 "$j"
mkdir -p "$j/journal/mid"
chgrp 4242 "$j/journal" "$j/journal/mid"
chmod 2755 "$j/journal" "$j/journal/mid"
echo entry >"$j/journal/mid/system.journal"
echo entry >"$j/journal/mid/foreign.journal"
chown 0:4242 "$j/journal/mid/system.journal"
chown 4343:4242 "$j/journal/mid/foreign.journal"
chmod 0640 "$j/journal/mid/"*.journal
nocaps=(setpriv --bounding-set=-all --inh-caps=-all --ambient-caps=-all)
"${nocaps[@]}" cat "$j/journal/mid/system.journal" >/dev/null ||
    die "uid 0 without capabilities cannot read a root-owned 0640 journal file"
if "${nocaps[@]}" cat "$j/journal/mid/foreign.journal" >/dev/null 2>&1; then
    die "control: capabilities were not dropped (a foreign 0640 file was readable)"
fi
if unshare --user --map-root-user true 2>/dev/null; then
    unshare --user --map-root-user "${nocaps[@]}" cat "$j/journal/mid/system.journal" >/dev/null ||
        die "in a user namespace mapping only root, uid 0 cannot read the journal file"
    journal_note="journal by owner bits (userns too)"
else
    log "SKIP user-namespace journal read: cannot create a user namespace here"
    journal_note="journal by owner bits (userns skipped)"
fi
log "journal readable as uid 0 with no capabilities; foreign 0640 file refused"

result "systemd: verify clean, exposure $exposure (<= $MAX_EXPOSURE), MemoryMax=${memory_max}M, preset ok, $ro_note, $journal_note"

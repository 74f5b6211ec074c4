#!/bin/sh
# Installs streamd on the host whose root is mounted at $STREAMD_HOST (the DaemonSet's
# privileged init container, docs/deploy/openshift/README.md), from the files in $STREAMD_SRC.
# Runs at every pod start: after each boot (so also after the rebase to rhel-10) and after each
# rollout of a new image. Idempotent: a file that is already there as shipped is not touched,
# and streamd is restarted only when something changed.
#
# Everything goes where an rpm-ostree rebase keeps it: /usr/local (on RHCOS a link to
# /var/usrlocal: /var is shared by all deployments) and /etc (carried into the new deployment
# by ostree's /etc merge). Nothing goes into /usr, which the next deployment replaces, and
# nothing is layered, so streamd's own layered-packages check sees no streamd package.
set -eu

HOST=${STREAMD_HOST:-/host}
SRC=${STREAMD_SRC:-/opt/streamd}
# How a command runs on the host: in its root, talking to its systemd.
RUN=${STREAMD_HOST_RUN:-chroot $HOST}

LIBEXEC=/usr/local/libexec
changed=

# put MODE FILE DEST: FILE (below $SRC, or a path) becomes DEST on the host, atomically, if
# it differs from what is there.
put() {
    case $2 in /*) from=$2 ;; *) from=$SRC/$2 ;; esac
    dest=$HOST$3
    if cmp -s "$from" "$dest"; then
        return 0
    fi
    mkdir -p "$(dirname "$dest")"
    cp "$from" "$dest.streamd-new"
    chmod "$1" "$dest.streamd-new"
    mv -f "$dest.streamd-new" "$dest"
    echo "installed $3"
    changed=1
}

put 0755 streamd "$LIBEXEC/streamd"
# streamd runs its libostree helper from next to itself.
put 0755 streamd-verify "$LIBEXEC/streamd-verify"
put 0755 streamctl /usr/local/bin/streamctl
put 0644 io.openshift.OSStream1.conf /etc/dbus-1/system.d/io.openshift.OSStream1.conf
put 0644 streamd-bootloader-update.target /etc/systemd/system/streamd-bootloader-update.target
# The packaged unit, started from /usr/local instead of /usr/libexec.
unit=$(mktemp)
trap 'rm -f "$unit"' EXIT
sed 's|^ExecStart=/usr/libexec/streamd$|ExecStart=/usr/local/libexec/streamd|' \
    "$SRC/streamd.service" >"$unit"
grep -qx 'ExecStart=/usr/local/libexec/streamd' "$unit" || {
    echo "streamd.service has no ExecStart=/usr/libexec/streamd to rewrite" >&2
    exit 1
}
put 0644 "$unit" /etc/systemd/system/streamd.service

# The SELinux module: a local module (priority 400) in the policy store under /etc, kept by
# the /etc merge and rebuilt against the new base policy when ostree finalizes the new
# deployment; installed again here whenever it is missing or differs from the shipped one.
module_changed=
if ! cmp -s "$SRC/streamd.pp.bz2" "$HOST/usr/local/share/streamd/streamd.pp.bz2"; then
    module_changed=1
fi
put 0644 streamd.pp.bz2 /usr/local/share/streamd/streamd.pp.bz2
if [ -n "$module_changed" ] || ! $RUN semodule -l | grep -qx 'streamd'; then
    $RUN semodule -i /usr/local/share/streamd/streamd.pp.bz2
    changed=1
fi
$RUN restorecon -R /usr/local/libexec/streamd /usr/local/libexec/streamd-verify \
    /etc/systemd/system/streamd.service /etc/systemd/system/streamd-bootloader-update.target

if [ -n "$changed" ]; then
    $RUN systemctl daemon-reload
    $RUN systemctl reload dbus.service
    $RUN systemctl enable streamd.service
    $RUN systemctl restart streamd.service
else
    $RUN systemctl enable --now streamd.service
fi
echo "streamd installed"

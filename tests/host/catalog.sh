#!/bin/bash
# Journal catalog check with journald's own compiler: install the catalog in
# a throw-away root, `journalctl --update-catalog --root` must build the
# database without a complaint, and `--list-catalog` must show exactly the
# MESSAGE_IDs the daemon logs, each with the required headers.
set -euo pipefail
# shellcheck source=tests/host/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CATALOG="$REPO_ROOT/systemd/streamd.catalog"
# The daemon's MESSAGE_IDs (state Idle .. Refused, then "preflight check
# failed"); this list is the contract with src/, so it is spelled out here.
EXPECTED_IDS="
f7bcb00c925e4a0c9943482617af1787
d45016d4a4da4105a434f738eb4b0c7f
d5cca62458344f21afd07f3e1873f4e5
788d47dc36164036885cebe8a5e951b1
b8fed307798f4342b80fd97c0de5742d
56ea3490fe404ef5a4952792ba4da120
94f683ff270c4077b190bd09069b1767
e0e3cc530e8f442582d19ef6d6b8e8dd
2a112241026c42db81625fa7b057ad16
"
# Journal fields the daemon attaches; @FIELD@ references to anything else
# would print literally in `journalctl -x`.
FIELDS="STREAMD_STATE STREAMD_REASON STREAMD_STREAM STREAMD_IMAGE STREAMD_CHECK STREAMD_NODE"

need_cmd journalctl systemd

compile() { # compile ROOT: build the catalog database, silent on success
    local out rc=0
    out="$(journalctl --update-catalog --root="$1" 2>&1)" || rc=$?
    printf '%s' "$out"
    [[ $rc -eq 0 && -z "$out" ]]
}

root="$(new_tmpdir)"
rm_on_exit "$root"
install -D -m 0644 "$CATALOG" "$root/usr/lib/systemd/catalog/streamd.catalog"
out="$(compile "$root")" || die "journalctl --update-catalog: ${out:-non-zero exit}"
[[ -s "$root/var/lib/systemd/catalog/database" ]] || die "no catalog database was written"

listed="$(journalctl --root="$root" --list-catalog)"
got_ids="$(awk '{ print $1 }' <<<"$listed" | sort)"
want_ids="$(grep -v '^$' <<<"$EXPECTED_IDS" | sort)"
if [[ "$got_ids" != "$want_ids" ]]; then
    diff <(echo "$want_ids") <(echo "$got_ids") >&2 || true
    die "catalog IDs differ from the daemon's MESSAGE_IDs (< expected, > listed)"
fi

# Every entry, as journald serves it, carries the headers admins rely on.
n=0
for id in $want_ids; do
    entry="$(journalctl --root="$root" --dump-catalog "$id")"
    for hdr in 'Subject: ' 'Defined-By: streamd' 'Support: ' 'Documentation: '; do
        grep -q "^$hdr" <<<"$entry" || die "entry $id lacks '$hdr'"
    done
    # A body after the headers, not just a subject.
    [[ "$(sed '1,/^$/d' <<<"$entry" | grep -c .)" -ge 2 ]] || die "entry $id has no explanatory body"
    n=$((n + 1))
done

# Only documented fields may be substituted.
for f in $(grep -v '^#' "$CATALOG" | grep -o '@[A-Z0-9_]*@' | tr -d @ | sort -u); do
    [[ " $FIELDS " == *" $f "* ]] || die "catalog substitutes unknown field @$f@"
done

# Negative control: the same compiler must reject a malformed catalog, so
# the clean run above is meaningful.
printf -- '-- not-an-id\nSubject: broken\n\nbody\n' >"$root/usr/lib/systemd/catalog/broken.catalog"
if compile "$root" >/dev/null; then
    die "journalctl accepted a malformed catalog; the check proves nothing"
fi

result "catalog: $n/9 MESSAGE_IDs compiled and listed by journalctl, headers and bodies present"

#!/bin/bash
# SELinux module checks:
#  1. build streamd.pp with the reference policy's devel Makefile (a copy in a
#     temp dir; any error or warning fails);
#  2. source rules: no unconfined, no wildcard or complemented permissions;
#  3. link and expand it together with a complete real policy (Debian's
#     selinux-policy-default modules, unpacked, not installed): unresolved
#     requirements and neverallow violations fail here, which compiling
#     alone cannot show;
#  4. on that linked policy: streamd_t has no capabilities and writes only
#     its own state and runtime directories.
set -euo pipefail
# shellcheck source=tests/host/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DEVEL_MK=/usr/share/selinux/devel/Makefile
need_file "$DEVEL_MK" selinux-policy-dev
need_cmd make make
need_cmd checkmodule checkpolicy
need_cmd semodule_package semodule-utils
need_cmd semodule_link semodule-utils
need_cmd semodule_expand semodule-utils
need_cmd sesearch setools
need_cmd bzip2 bzip2

t="$(new_tmpdir)"
rm_on_exit "$t"
mkdir "$t/src"
cp "$REPO_ROOT"/selinux/streamd.{te,if,fc} "$t/src/"

# 1. Build. The Makefile exits non-zero on m4/checkmodule errors; warnings
# (e.g. an unknown interface left unexpanded) are treated as errors too.
if ! make -C "$t/src" -f "$DEVEL_MK" streamd.pp >"$t/build.log" 2>&1; then
    cat "$t/build.log" >&2
    die "policy build failed"
fi
if grep -i -E 'warning|error' "$t/build.log" >&2; then
    die "policy build printed warnings"
fi
[[ -s "$t/src/streamd.pp" ]] || die "no streamd.pp produced"
log "built streamd.pp ($(stat -c %s "$t/src/streamd.pp") bytes)"

# 2. Source rules (comments stripped).
strip_comments() { sed -e 's/#.*//' "$@"; }
if strip_comments "$REPO_ROOT"/selinux/streamd.{te,if} | grep -n -w unconfined >&2; then
    die "policy uses unconfined"
fi
if strip_comments "$REPO_ROOT"/selinux/streamd.{te,if} |
    grep -n -E '^\s*(allow|dontaudit|auditallow)\b.*(\*|~)' >&2; then
    die "policy uses a wildcard or complemented permission set"
fi

# 3. Link against a full policy. apt-get download fetches the .deb only; it
# is unpacked here and never installed, so the machine's policy is untouched.
mkdir "$t/pol" "$t/pp"
(cd "$t/pol" && apt-get download selinux-policy-default >/dev/null 2>"$t/dl.log") || {
    apt_install ca-certificates # ensure apt works; then one retry after an update
    (cd "$t/pol" && apt-get update -qq && apt-get download selinux-policy-default >/dev/null) ||
        die "cannot download selinux-policy-default: $(cat "$t/dl.log")"
}
dpkg -x "$t"/pol/selinux-policy-default_*.deb "$t/pol/x"
for f in "$t"/pol/x/usr/share/selinux/default/*.pp.bz2; do
    bzip2 -dc "$f" >"$t/pp/$(basename "$f" .bz2)"
done
[[ -s "$t/pp/base.pp" ]] || die "no base.pp in selinux-policy-default"
mods=()
for f in "$t"/pp/*.pp; do [[ $f == */base.pp ]] || mods+=("$f"); done
semodule_link -o "$t/all.lnk" "$t/pp/base.pp" "${mods[@]}" "$t/src/streamd.pp" >/dev/null 2>"$t/link.log" ||
    die "semodule_link failed: $(tail -5 "$t/link.log")"
semodule_expand "$t/all.lnk" "$t/policy.bin" >"$t/expand.log" 2>&1 ||
    die "semodule_expand (neverallow check) failed: $(tail -5 "$t/expand.log")"
log "linked with ${#mods[@]} modules of selinux-policy-default and expanded (neverallows hold)"

# 4. What the linked policy really grants.
pol="$t/policy.bin"
caps="$(sesearch -A -s streamd_t -c capability "$pol"; sesearch -A -s streamd_t -c capability2 "$pol")"
[[ -z "$caps" ]] || die "streamd_t has capabilities: $caps"
writes="$(sesearch -A -s streamd_t -c file,dir,lnk_file -p write,append,create,unlink,rename,setattr "$pol" |
    awk '{ split($3, a, ":"); print a[1] }' | sort -u)"
# Guard against a query that matches nothing (the state dir must be there).
grep -qx streamd_var_lib_t <<<"$writes" || die "sesearch shows no write to streamd_var_lib_t: query broken?"
for ty in $writes; do
    case "$ty" in
        streamd_var_lib_t | streamd_var_run_t) ;;
        streamd_t) ;;     # its own /proc/self entries
        init_tmpfs_t) ;;  # inherited memfd (StandardInput=), from init_domain()
        *) die "streamd_t may write files of type $ty" ;;
    esac
done
n_allow="$(sesearch -A -s streamd_t "$pol" | wc -l)"
# Optional blocks whose modules Debian does not ship (rpm, container) are
# disabled here; say so instead of hiding it.
opt=""
for ty in rpm_t install_t container_var_lib_t; do
    if sesearch -A -s streamd_t -t "$ty" "$pol" 2>/dev/null | grep -q .; then
        opt+=" $ty:on"
    else
        opt+=" $ty:off"
    fi
done
log "streamd_t: $n_allow allow rules, no capabilities, writes only:" "$(tr '\n' ' ' <<<"$writes")"
result "selinux: streamd.pp builds, links and expands with Debian's full policy; $n_allow allow rules, 0 capabilities; optional blocks$opt"

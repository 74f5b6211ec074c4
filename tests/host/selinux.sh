#!/bin/bash
# SELinux module checks:
#  1. build streamd.pp with the reference policy's devel Makefile (a copy in a
#     temp dir; any error or warning fails);
#  2. source rules: no unconfined, no wildcard or complemented permissions;
#  3. link and expand it together with a complete real policy (Debian's
#     selinux-policy-default modules, unpacked, not installed): unresolved
#     requirements and neverallow violations fail here, which compiling
#     alone cannot show;
#  4. on that linked policy: streamd_t has no capabilities, writes only its
#     own state and runtime directories, reads /proc/sys/crypto, starts no
#     unit but its own bootloader-update target unless the streamd_bootc
#     tunable is on and then transient units too (never stops or reloads
#     one), and can run journalctl and read the
#     journal; systemd can create the bootc status file in /run/streamd;
#  5. with a stub of the Fedora/RHEL types Debian lacks, both builds link, and
#     the DISTRO=redhat one grants what streamd needs on an RHCOS node.
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
need_cmd seinfo setools
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

# 1b. The Fedora/RHEL branches (ifdef distro_redhat) are not in that build;
# compile them too, against the same interfaces. This catches syntax and
# unknown-interface errors there, not Fedora's own type names.
mkdir "$t/redhat"
cp "$REPO_ROOT"/selinux/streamd.{te,if,fc} "$t/redhat/"
if ! make -C "$t/redhat" -f "$DEVEL_MK" DISTRO=redhat streamd.pp >"$t/build-redhat.log" 2>&1 ||
    grep -i -E 'warning|error' "$t/build-redhat.log" >&2; then
    cat "$t/build-redhat.log" >&2
    die "policy build with DISTRO=redhat failed or warned"
fi
log "built the DISTRO=redhat variant too"

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
# link_policy MODULE OUT: link MODULE with the full policy and expand it into OUT.
link_policy() {
    semodule_link -o "$2.lnk" "$t/pp/base.pp" "${mods[@]}" "$1" >/dev/null 2>"$t/link.log" ||
        die "semodule_link failed: $(tail -5 "$t/link.log")"
    semodule_expand "$2.lnk" "$2" >"$t/expand.log" 2>&1 ||
        die "semodule_expand (neverallow check) failed: $(tail -5 "$t/expand.log")"
}
link_policy "$t/src/streamd.pp" "$t/policy.bin"
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
# allows ARGS...: the linked policy has a matching allow rule. (Not
# `sesearch | grep -q`: grep's early exit fails the pipeline under pipefail.
# sesearch prints "not a valid type" on stdout and exits 1 for an unknown
# type, hence the status check.)
allows() { local out; out="$(sesearch -A "$@" "$pol")" && [[ -n "$out" ]]; }
# systemd units. Starting one is behind the streamd_bootc tunable, off by
# default: with uid 0 and polkit, starting a unit is running any command as
# root. The expanded policy keeps the tunable as a boolean, so its rules show
# up marked "[ streamd_bootc ]:True"; none may be unconditional.
seinfo -x -b streamd_bootc "$pol" | grep -qE '^\s*bool streamd_bootc false;' ||
    die "streamd_bootc is not a boolean that defaults to false: $(seinfo -x -b streamd_bootc "$pol")"
# The one exception: streamd's own bootloader-update target, which only pulls
# in bootupd's unit (systemd checks the start on the named unit alone).
starts="$(sesearch -A -s streamd_t -c service -p start "$pol"; sesearch -A -s streamd_t -t init_t -c system -p start "$pol")"
if grep -v '\[ streamd_bootc \]:True$' <<<"$starts" |
    grep -vx 'allow streamd_t streamd_bootloader_unit_file_t:service start;' | grep . >&2; then
    die "streamd_t may start units without the streamd_bootc boolean"
fi
grep -qx 'allow streamd_t streamd_bootloader_unit_file_t:service start;' <<<"$starts" ||
    die "streamd_t cannot start streamd-bootloader-update.target without a boolean: $starts"
fcon="$(grep -F 'streamd-bootloader-update' "$REPO_ROOT/selinux/streamd.fc")"
[[ "$fcon" == *streamd_bootloader_unit_file_t* ]] ||
    die "streamd-bootloader-update.target is not labelled streamd_bootloader_unit_file_t: $fcon"
# With it: start only transient units (the bootc backend); never stop,
# reload, enable or disable, nothing on unit files.
svc="$(sesearch -A -s streamd_t -c service "$pol")"
grep -q 'systemd_transient_unit_t:service start; \[ streamd_bootc \]:True$' <<<"$svc" ||
    die "streamd_t cannot start transient units with streamd_bootc on: $svc"
if grep -E ' (stop|reload|enable|disable)\b|\{[^}]*\b(stop|reload|enable|disable)\b' <<<"$svc" >&2; then
    die "streamd_t may do more than start/status systemd units"
fi
start_on="$(sesearch -A -s streamd_t -c service -p start "$pol" | awk '{ split($3, a, ":"); print a[1] }' | sort -u)"
[[ "$start_on" == $'streamd_bootloader_unit_file_t\nsystemd_transient_unit_t' ]] ||
    die "streamd_t may start units of: $start_on"
grep -q 'init_t:system start; \[ streamd_bootc \]:True$' <<<"$starts" ||
    die "streamd_t lacks system start on init_t (StartTransientUnit) with streamd_bootc on"
allows -s streamd_t -t systemd_transient_unit_t -c service -p status ||
    die "streamd_t cannot read a transient unit's properties (status)"
# systemd creates the bootc status file in /run/streamd for the transient unit.
for p in create write; do
    allows -s init_t -t streamd_var_run_t -c file -p "$p" ||
        die "init_t cannot $p files in /run/streamd (StandardOutputFileToTruncate=)"
done
# journalctl in streamd_t: execute it, read (and map) the journal files.
allows -s streamd_t -t bin_t -c file -p execute_no_trans ||
    die "streamd_t cannot run journalctl (bin_t)"
for p in read map; do
    allows -s streamd_t -t systemd_journal_t -c file -p "$p" ||
        die "streamd_t cannot $p the journal files (systemd_journal_t)"
done
# /proc/sys/crypto/fips_enabled (sysctl_crypto_t): without it every FIPS
# node reads as inconsistent and is refused.
for p in search; do
    allows -s streamd_t -t sysctl_crypto_t -c dir -p "$p" ||
        die "streamd_t cannot $p /proc/sys/crypto (sysctl_crypto_t)"
done
for p in open read; do
    allows -s streamd_t -t sysctl_crypto_t -c file -p "$p" ||
        die "streamd_t cannot $p /proc/sys/crypto/fips_enabled (sysctl_crypto_t)"
done
# The libostree helper streamd-verify (streamd_exec_t) runs in streamd_t.
allows -s streamd_t -t streamd_exec_t -c file -p execute_no_trans ||
    die "streamd_t cannot run streamd-verify (streamd_exec_t)"
n_allow="$(sesearch -A -s streamd_t "$pol" | wc -l)"
# Optional blocks whose modules Debian does not ship (rpm, container) are
# disabled here; say so instead of hiding it.
opt=""
for ty in rpm_t install_t container_var_lib_t; do
    if allows -s streamd_t -t "$ty" 2>/dev/null; then
        opt+=" $ty:on"
    else
        opt+=" $ty:off"
    fi
done
# 5. Fedora/RHEL's types. Debian's policy lacks some types that streamd meets on
# an RHCOS node (fedora-selinux/selinux-policy, RHEL 9.2+ and 10; see
# docs/upstream/selinux-rpm-layering.md): rpm-ostreed runs as install_t and its
# transaction socket is install_var_run_t (anaconda.te), /ostree/repo is
# system_conf_t (files.fc), /usr/bin/journalctl is
# journalctl_exec_t, kubelet's pull secret container_var_lib_t and CRI-O's
# configuration container_config_t (container-selinux). A stub module declares
# the ones Debian's policy lacks (named as Fedora names them, nothing else of
# Fedora's policy), which turns the optional blocks on; then both builds are
# linked with it: the refpolicy one must hold exactly what
# anaconda_stream_connect() grants and no write to the generic var_run_t socket
# type, and the DISTRO=redhat one (the branch RHEL runs) every rule streamd
# relies on for these types.
mkdir "$t/fedora"
{
    printf 'module fedora_types 1.0;\nrequire {\n\tattribute domain;\n}\n'
    for ty in install_t install_var_run_t system_conf_t journalctl_exec_t container_var_lib_t container_config_t; do
        known="$(seinfo -t "$ty" "$pol" 2>/dev/null || true)"
        grep -qE "^\s*$ty\s*$" <<<"$known" && continue
        if [[ $ty == install_t ]]; then printf 'type install_t, domain;\n'; else printf 'type %s;\n' "$ty"; fi
    done
} >"$t/fedora/fedora_types.te"
checkmodule -M -m -o "$t/fedora/fedora_types.mod" "$t/fedora/fedora_types.te" >"$t/fedora/build.log" 2>&1 ||
    die "fedora type stub does not compile: $(cat "$t/fedora/build.log")"
semodule_package -o "$t/fedora/fedora_types.pp" -m "$t/fedora/fedora_types.mod"
mods+=("$t/fedora/fedora_types.pp")
link_policy "$t/src/streamd.pp" "$t/policy-fedora.bin"
fpol="$t/policy-fedora.bin"
fallows() { local out; out="$(sesearch -A "$@" "$fpol")" && [[ -n "$out" ]]; }
fallows -s streamd_t -t install_var_run_t -c sock_file -p write ||
    die "with Fedora's types, streamd_t may not write rpm-ostreed's transaction socket (install_var_run_t)"
fallows -s streamd_t -t install_t -c unix_stream_socket -p connectto ||
    die "with Fedora's types, streamd_t may not connect to install_t's socket"
fallows -s streamd_t -t install_t -c dbus -p send_msg && fallows -s install_t -t streamd_t -c dbus -p send_msg ||
    die "with Fedora's types, streamd_t and install_t may not exchange D-Bus messages"
if fallows -s streamd_t -t var_run_t -c sock_file -p write; then
    die "streamd_t may write any var_run_t socket: the transaction socket is install_var_run_t"
fi
opt+=" install_t:on(fedora types: install_var_run_t sock_file write, connectto, dbus)"

# 5b. The DISTRO=redhat build, linked and expanded the same way, and the rules it
# relies on for each type streamd meets on a Fedora/RHEL node (labels as
# docs/upstream/selinux-rpm-layering.md reads them from files.fc, anaconda.fc,
# container.fc and logging.fc).
link_policy "$t/redhat/streamd.pp" "$t/policy-redhat.bin"
rpol="$t/policy-redhat.bin"
rallows() { local out; out="$(sesearch -A "$@" "$rpol")" && [[ -n "$out" ]]; }
# need WHAT TYPE CLASS PERM...: every permission is granted on the redhat link.
need() {
    local what="$1" ty="$2" cls="$3" p
    shift 3
    for p in "$@"; do
        rallows -s streamd_t -t "$ty" -c "$cls" -p "$p" ||
            die "DISTRO=redhat: streamd_t may not $p $cls $ty ($what)"
    done
}
need "rpm-ostreed's transaction socket /run/rpm-ostree-transaction.sock" install_var_run_t sock_file write
need "rpm-ostreed (install_t)" install_t unix_stream_socket connectto
need "rpm-ostreed's D-Bus messages" install_t dbus send_msg
rallows -s install_t -t streamd_t -c dbus -p send_msg || die "DISTRO=redhat: install_t may not send D-Bus messages to streamd_t"
need "libostree's record /run/ostree/staged-deployment" var_run_t file open read
need "/run/ostree" var_run_t dir search
need "/ostree (usr_t)" usr_t dir search read
need "/ostree/repo (system_conf_t)" system_conf_t dir search read
need "/ostree/repo objects (system_conf_t)" system_conf_t file open read
need "/etc/ostree/auth.json and /etc/containers (etc_t)" etc_t file open read
need "the pull secret /var/lib/kubelet/config.json" container_var_lib_t file open read
need "CRI-O's configuration /etc/crio" container_config_t file open read
need "/proc/sys/crypto/fips_enabled" sysctl_crypto_t file open read
need "journalctl (journalctl_exec_t)" journalctl_exec_t file execute execute_no_trans
need "the journal (var_log_t)" var_log_t file open read map
need "streamd-bootloader-update.target (pulls in bootupd's unit)" streamd_bootloader_unit_file_t service start
if rallows -s streamd_t -t var_run_t -c sock_file -p write; then
    die "DISTRO=redhat: streamd_t may write any var_run_t socket"
fi
rcaps="$(sesearch -A -s streamd_t -c capability "$rpol"; sesearch -A -s streamd_t -c capability2 "$rpol")"
[[ -z "$rcaps" ]] || die "DISTRO=redhat: streamd_t has capabilities: $rcaps"
opt+=" redhat:linked(the rules for each RHCOS node type asserted)"

log "streamd_t: $n_allow allow rules, no capabilities, writes only:" "$(tr '\n' ' ' <<<"$writes")"
result "selinux: streamd.pp builds (also DISTRO=redhat), links and expands with Debian's full policy; $n_allow allow rules, 0 capabilities, reads fips_enabled, starts only its bootloader-update target (streamd_bootc off) and transient units too (on), reads the journal; optional blocks$opt"

#!/bin/bash
# Build the streamd RPMs from the working tree, then list and lint them.
#
#   packaging/build-rpm.sh [OUTDIR]     (default OUTDIR: target/rpm-out)
#
# Steps: source tarball of the working tree (tracked and untracked, not
# ignored, files) -> vendored crates (offline from the cargo cache when it
# has them, else from crates.io) -> release build in the very directory
# rpmbuild's %prep will recreate, with a persistent CARGO_TARGET_DIR
# (target/rpm-cargo), so rpmbuild's %build finds everything fresh instead of
# doing a second cold build -> rpmbuild -bb -> rpm -qlp -> rpmlint (no errors
# allowed).
#
# On a machine without Fedora's macro packages (Debian), it loads
# packaging/macros.compat and passes --nodeps (BuildRequires name Fedora
# packages that Debian's empty rpm database cannot satisfy).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SPEC="$REPO_ROOT/packaging/streamd.spec"
OUTDIR="${1:-$REPO_ROOT/target/rpm-out}"
# A cargo target dir of its own under target/: vendored crates keep their
# crates.io package ids, so they land on the same artifact names as the
# workspace's own release builds but with different fingerprints (the source
# path is part of them); sharing target/release would make each build
# invalidate the other's. This one persists, so only the first run is cold.
export CARGO_TARGET_DIR="${STREAMD_RPM_TARGET_DIR:-$REPO_ROOT/target/rpm-cargo}"

log() { printf 'build-rpm: %s\n' "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }
now() { date +%s; }

apt_install() {
    log "installing $*"
    if [[ -z "${_apt_updated:-}" ]]; then apt-get update -qq >&2; _apt_updated=1; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2
}
need() { # need CMD PACKAGE...: install the Debian packages when CMD is missing
    local cmd="$1"; shift
    command -v "$cmd" >/dev/null 2>&1 || apt_install "$@"
}
need rpmbuild rpm
need rpmlint rpmlint
need git git
need bzip2 bzip2
need make make
need checkmodule checkpolicy
need python3 python3
[[ -e /usr/share/selinux/devel/Makefile ]] || apt_install selinux-policy-dev
need pkg-config pkg-config
# The ostree crate links libostree (BuildRequires: pkgconfig(ostree-1)).
pkg-config --exists ostree-1 || apt_install libostree-dev
command -v cargo >/dev/null || die "cargo not found (the Rust toolchain is a prerequisite)"

name=streamd
version="$(awk '/^Version:/ { print $2; exit }' "$SPEC")"
# The spec and the crate must agree on the version.
crate_version="$(awk -F'"' '/^\[workspace.package\]/ { w = 1 } w && /^version *=/ { print $2; exit }' "$REPO_ROOT/Cargo.toml")"
[[ "$version" == "$crate_version" ]] || die "spec Version $version != workspace version $crate_version"

# A fixed _topdir under the cargo target dir, not a fresh temp dir: cargo's
# fingerprints include the absolute source paths of the vendored crates, so
# only a stable BUILD path lets the next run reuse target/release instead of
# rebuilding ~200 crates. It is removed on exit like a temp dir; flock keeps
# two concurrent runs apart.
topdir="$CARGO_TARGET_DIR/rpmbuild"
mkdir -p "$CARGO_TARGET_DIR"
exec 9>"$CARGO_TARGET_DIR/rpmbuild.lock"
flock 9
rm -rf -- "$topdir"
trap 'rm -rf -- "$topdir"' EXIT
mkdir -p "$topdir"/{SOURCES,SPECS,BUILD,RPMS,SRPMS,stage}
stage="$topdir/stage/$name-$version"
build="$topdir/BUILD/$name-$version"
t_start="$(now)"

# --- 1. the working tree -----------------------------------------------------
mkdir -p "$stage"
(
    cd "$REPO_ROOT"
    # Tracked and new files, minus ignored ones and files deleted in the tree.
    git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do [[ -e "$f" ]] && printf '%s\0' "$f"; done |
        tar --null -T - -cf -
) | tar -xf - -C "$stage"

# --- 2. Cargo.lock and vendored crates -------------------------------------
# The repository's own Cargo.lock is never touched; only the staged copy.
cd "$stage"
if ! cargo metadata --offline --locked --format-version 1 >/dev/null 2>"$topdir/lock.err"; then
    if grep -q 'lock file' "$topdir/lock.err"; then
        log "WARNING: Cargo.lock is out of date with Cargo.toml; the package is built with a"
        log "         re-resolved lock file (the repository's Cargo.lock is left as it is)"
        cargo metadata --offline --format-version 1 >/dev/null 2>&1 ||
            cargo metadata --format-version 1 >/dev/null
    else
        log "cargo metadata --offline: $(tail -1 "$topdir/lock.err"); resolving online"
    fi
fi
t0="$(now)"
if cargo vendor --locked --versioned-dirs --offline vendor >/dev/null 2>"$topdir/vendor.err"; then
    vendor_mode=offline
else
    # shellcheck disable=SC2016 # the backticks are literal, in cargo's message
    log "offline vendoring incomplete ($(grep -m1 -o 'failed to download[^`]*`[^`]*`' "$topdir/vendor.err" || tail -1 "$topdir/vendor.err")); using crates.io"
    rm -rf vendor
    cargo vendor --locked --versioned-dirs vendor >/dev/null 2>"$topdir/vendor.err" ||
        die "cargo vendor: $(tail -5 "$topdir/vendor.err")"
    vendor_mode=online
fi
t_vendor=$(($(now) - t0))
log "vendored $(find vendor -mindepth 1 -maxdepth 1 | wc -l) crates ($vendor_mode, ${t_vendor}s)"

tar --exclude=./vendor --exclude=./target --transform "s,^\./,$name-$version/," \
    -czf "$topdir/SOURCES/$name-$version.tar.gz" .
tar -czf "$topdir/SOURCES/$name-$version-vendor.tar.gz" vendor
cd "$topdir"
rm -rf "$topdir/stage"

# --- 3. rpm macros ----------------------------------------------------------
rpm_args=(--define "_topdir $topdir")
if [[ -z "$(rpm --eval '%{?systemd_post}')" ]]; then
    log "Fedora macro packages absent: using packaging/macros.compat, --nodeps, no debuginfo"
    compat=1
    # Debian's rpm has no find-debuginfo, and the release profile strips
    # debug info anyway, so there is nothing to split out.
    rpm_args+=(--load "$REPO_ROOT/packaging/macros.compat" --nodeps
        --define 'debug_package %{nil}'
        --define "streamd_cargo_out $CARGO_TARGET_DIR/release")
else
    compat=0
fi

# --- 4. release build where %prep will put the sources ---------------------
# Extract exactly as %autosetup -a1 does (same path, same mtimes): cargo then
# sees nothing changed when rpmbuild builds, and reuses this build.
mkdir -p "$build"
tar -xzf "$topdir/SOURCES/$name-$version.tar.gz" -C "$topdir/BUILD"
tar -xzf "$topdir/SOURCES/$name-$version-vendor.tar.gz" -C "$build"
out_dir="$CARGO_TARGET_DIR/release"
if [[ $compat -eq 1 ]]; then
    (cd "$build" && eval "$(rpm "${rpm_args[@]}" --eval '%cargo_prep -v vendor')")
    t0="$(now)"
    log "cargo build --release (CARGO_TARGET_DIR=$CARGO_TARGET_DIR; waits if another build holds the lock)"
    # Same environment as rpmbuild's %build (its preamble sets PKG_CONFIG_PATH,
    # LANG and RPM_*): -sys crates rerun their build scripts when such
    # variables change, and everything above them would be rebuilt.
    build_env="$(rpm "${rpm_args[@]}" --eval '%{___build_pre}' | grep -E '^\s*([A-Z_]+=|export )')"
    (cd "$build" && set +u && eval "$build_env" && set -u && cargo build --release --offline --locked --package streamd --bins) >&2 ||
        die "release build failed"
    t_cargo=$(($(now) - t0))
    log "release build: ${t_cargo}s"
else
    t_cargo=0 # the real %cargo_build does it inside rpmbuild
fi

# TODO(streamctl generate): remove this probe once `streamctl generate man`
# and `streamctl generate completions` exist; until then the package is
# built without man pages and completions, and says so loudly.
if [[ $compat -eq 1 ]] && ! "$out_dir/streamctl" generate --help >/dev/null 2>&1; then
    log "WARNING: TODO: streamctl has no 'generate' subcommand yet; building --without generated_docs"
    log "         (no man pages, no shell completions in this RPM)"
    rpm_args+=(--without generated_docs)
    docs_note="no man/completions (TODO: streamctl generate)"
else
    docs_note="man pages and completions included"
fi

# --- 5. rpmbuild -------------------------------------------------------------
cp "$SPEC" "$topdir/SPECS/"
t0="$(now)"
if ! rpmbuild -bb "${rpm_args[@]}" "$topdir/SPECS/streamd.spec" >"$topdir/rpmbuild.log" 2>&1; then
    tail -40 "$topdir/rpmbuild.log" >&2
    die "rpmbuild failed"
fi
t_rpmbuild=$(($(now) - t0))
grep -E '^\s+(Compiling|Finished)' "$topdir/rpmbuild.log" | tail -3 >&2 || true

mapfile -t rpms < <(find "$topdir/RPMS" -name '*.rpm' | sort)
[[ ${#rpms[@]} -ge 2 ]] || die "expected the main and -selinux RPMs, got: ${rpms[*]}"
mkdir -p "$OUTDIR"
for r in "${rpms[@]}"; do
    cp "$r" "$OUTDIR/"
    echo "== $(basename "$r")"
    rpm -qlp "$r"
done
# The daemon runs its verification helper from its own directory.
listed="$(for r in "${rpms[@]}"; do rpm -qlp "$r"; done)"
for f in /usr/libexec/streamd /usr/libexec/streamd-verify; do
    grep -qx "$f" <<<"$listed" || die "no $f in the RPMs"
done
# The pages in their sections: the daemon and streamctl in 8, the configuration in 5.
if [[ $docs_note == "man pages and completions included" ]]; then
    for f in /usr/share/man/man8/streamd.8.gz /usr/share/man/man8/streamctl.8.gz \
        /usr/share/man/man5/streamd.conf.5.gz; do
        grep -qx "$f" <<<"$listed" || die "no $f in the RPMs"
    done
fi

# Where SELinux policy is installed the module is required, not recommended
# (without it streamd runs unconfined there), and from the same build.
main_rpm="$(printf '%s\n' "${rpms[@]}" | grep -E '/streamd-[0-9][^/]*\.(x86_64|aarch64|ppc64le|s390x)\.rpm$' | head -1)"
[[ -n "$main_rpm" ]] || die "no main streamd RPM among: ${rpms[*]}"
evr="$(rpm -qp --queryformat '%{VERSION}-%{RELEASE}' "$main_rpm")"
want="(streamd-selinux = $evr if selinux-policy-targeted)"
rpm -qp --requires "$main_rpm" | grep -qxF "$want" ||
    die "$(basename "$main_rpm") does not require $want: $(rpm -qp --requires --recommends "$main_rpm" | tr '\n' ' ')"
log "requires $want"

# --- 6. rpmlint -------------------------------------------------------------
lint_out="$(rpmlint -r "$REPO_ROOT/packaging/streamd.rpmlintrc" "${rpms[@]}" 2>&1)" || lint_rc=$?
printf '%s\n' "$lint_out"
summary="$(grep -E '[0-9]+ packages and [0-9]+ specfiles checked' <<<"$lint_out" | tail -1 |
    sed -e 's/^ *//' -e 's/; has taken.*//')"
errors="$(sed -n 's/.* \([0-9][0-9]*\) errors.*/\1/p' <<<"$summary")"
[[ -n "$errors" ]] || die "could not read rpmlint's summary (rc=${lint_rc:-0})"
[[ "$errors" -eq 0 ]] || die "rpmlint reported $errors errors"

t_total=$(($(now) - t_start))
log "done in ${t_total}s (vendor ${t_vendor}s, cargo ${t_cargo}s, rpmbuild ${t_rpmbuild}s); RPMs in $OUTDIR"
echo "RPM-SUMMARY: ${#rpms[@]} RPMs; rpmlint: $summary; build ${t_total}s (vendor ${t_vendor}s $vendor_mode, cargo release ${t_cargo}s, rpmbuild ${t_rpmbuild}s); $docs_note"

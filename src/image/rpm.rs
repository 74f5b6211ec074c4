//! RPM names: a package name or a NEVRA (`name-version-release.arch`), as rpm-ostree reports
//! layered packages and as extensions images name their files.

/// Whether `spec` (a name or a NEVRA) names package `name`.
pub fn names_package(spec: &str, name: &str) -> bool {
    match spec.strip_prefix(name) {
        Some("") => true,
        // NEVRA: name-version-release.arch. Neither version nor release holds a '-', so what
        // follows the name has exactly one, and the version starts with a digit (or an epoch);
        // `kernel-64k-core-…` therefore does not name `kernel`.
        Some(rest) => rest.strip_prefix('-').is_some_and(|vr| {
            vr.matches('-').count() == 1 && vr.starts_with(|c: char| c.is_ascii_digit())
        }),
        None => false,
    }
}

/// The package name of a name-or-NEVRA (`name-version-release.arch`).
pub fn package_name(spec: &str) -> &str {
    let mut parts = spec.rsplitn(3, '-');
    match (parts.next(), parts.next(), parts.next()) {
        // A NEVRA's release carries the arch after a dot and its version starts with a digit;
        // a plain name such as `kernel-64k-core` has neither.
        (Some(release), Some(version), Some(name))
            if release.contains('.') && version.starts_with(|c: char| c.is_ascii_digit()) =>
        {
            name
        }
        _ => spec,
    }
}

/// The `el<N>` major of a kernel release or NEVRA (`…el10_1.x86_64` → 10).
pub fn el_major(release: &str) -> Option<u32> {
    release.split(['.', '-', '_', '+']).find_map(|part| {
        let digits = part.strip_prefix("el")?;
        digits.parse().ok()
    })
}

//! The host root streamd reads: `/proc` facts and the booted OS's os-release.

use std::path::Path;

use anyhow::Context as _;

use crate::images::TestImage;

/// Writes a host root for `node` booted on `booted` below `root`.
pub fn write(root: &Path, node: &str, booted: &TestImage) -> anyhow::Result<()> {
    let put = |rel: &str, text: &str| -> anyhow::Result<()> {
        let p = root.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))
    };
    put("proc/sys/kernel/hostname", &format!("{node}\n"))?;
    put("proc/sys/kernel/arch", "x86_64\n")?;
    put("proc/sys/kernel/osrelease", &format!("{}\n", booted.kernel))?;
    put("usr/lib/os-release", &booted.os_release())?;
    // As on RHCOS, /etc/os-release is a relative link into /usr.
    let etc = root.join("etc");
    std::fs::create_dir_all(&etc).with_context(|| format!("creating {}", etc.display()))?;
    let link = etc.join("os-release");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink("../usr/lib/os-release", &link)
        .with_context(|| format!("linking {}", link.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::images::{DEFAULT_REGISTRY, catalog};

    #[test]
    fn writes_a_readable_root() {
        let d = std::env::temp_dir().join(format!("testbed-host-{}", std::process::id()));
        let img = &catalog(DEFAULT_REGISTRY)[0];
        write(&d, "worker-0", img).expect("write");
        let os = std::fs::read_to_string(d.join("etc/os-release")).expect("read via link");
        assert!(os.contains("RHEL_VERSION=9.6"));
        assert_eq!(
            std::fs::read_to_string(d.join("proc/sys/kernel/hostname")).expect("read"),
            "worker-0\n"
        );
        std::fs::remove_dir_all(&d).ok();
    }
}

//! Each host fixture, as the testbed builds it, is one machine: the host root streamd reads
//! (`host_root`) and the booted deployment the fake rpm-ostreed creates in its sysroot agree on
//! the kernel, the kernel arguments, FIPS, the CPU and the layered packages.

use std::path::Path;

use super::host_root;
use crate::fakes::rpmostreed;
use crate::fixtures::images::{DEFAULT_REGISTRY, catalog};
use crate::fixtures::{Cpu, Kernel, fixture};
use crate::scratch::ScratchDir;

/// Builds the fixture's sysroot and host root and checks that they describe one machine.
async fn host_matches_booted_deployment(name: &str) {
    let images = catalog(DEFAULT_REGISTRY);
    let fixture = fixture(name).expect("fixture");
    let dir = ScratchDir::new(&format!("fixture-{name}")).expect("scratch dir");
    let sysroot = dir.join("sysroot");
    let state = rpmostreed::create_initial(
        &sysroot,
        &dir.join("scratch"),
        "rhcos",
        &images[0],
        &fixture,
        None,
    )
    .await
    .expect("sysroot");
    let booted = state.booted().expect("booted").clone();
    let disk = booted.disk.clone().expect("on disk");
    let host = dir.join("host");
    host_root::write(
        &host,
        "worker-0",
        &images[0],
        &fixture,
        &disk.proc_cmdline(),
    )
    .expect("host root");
    let read =
        |p: &Path| std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));

    // One real deployment on disk, the one the fake considers booted.
    let on_disk = rpmostreed::read_deployments(&sysroot).expect("read");
    assert_eq!(on_disk.len(), 1, "{name}");
    assert_eq!(
        (on_disk[0].checksum.as_str(), on_disk[0].serial),
        (booted.checksum.as_str(), booted.serial)
    );
    let root = sysroot.join(format!(
        "ostree/deploy/rhcos/deploy/{}.{}",
        booted.checksum, booted.serial
    ));

    // Kernel: osrelease = the kernel the entry boots = the modules dir in the tree.
    let release = read(&host.join("proc/sys/kernel/osrelease"))
        .trim()
        .to_string();
    assert_eq!(release, disk.kernel_release(), "{name}");
    assert!(
        root.join(format!("usr/lib/modules/{release}/vmlinuz"))
            .exists(),
        "{name}"
    );
    assert_eq!(
        release.ends_with("+rt"),
        fixture.kernel == Kernel::Realtime,
        "{name}"
    );
    assert_eq!(
        release.ends_with("+64k"),
        fixture.kernel == Kernel::SixtyFourK,
        "{name}"
    );
    assert_eq!(
        host.join("sys/kernel/realtime").exists(),
        fixture.kernel == Kernel::Realtime,
        "{name}"
    );
    assert_eq!(
        read(&host.join("proc/sys/kernel/arch")).trim(),
        fixture.arch(),
        "{name}"
    );
    assert!(release.contains(fixture.arch()), "{name}");
    // Overrides: a variant's kernel packages replace the default kernel.
    let variant_layered = booted.layering.requested_local_packages.iter().any(|p| {
        rpmostreed::names_package(p, "kernel-rt-core")
            || rpmostreed::names_package(p, "kernel-64k-core")
    });
    assert_eq!(variant_layered, fixture.kernel != Kernel::Default, "{name}");
    assert_eq!(
        booted.layering.requested_base_removals.len(),
        if variant_layered { 5 } else { 0 },
        "{name}"
    );
    assert_eq!(
        booted.layering.requested_packages,
        fixture.requested_packages(),
        "{name}"
    );
    assert_eq!(
        booted.base_checksum.is_some(),
        booted.layering.is_layered(),
        "{name}"
    );
    // FIPS: kernel argument, fips_enabled and /proc/cmdline agree; the tree can do FIPS.
    let fips_karg = disk.options.split_whitespace().any(|a| a == "fips=1");
    assert_eq!(fips_karg, fixture.fips, "{name}");
    assert_eq!(
        read(&host.join("proc/sys/crypto/fips_enabled")).trim() == "1",
        fixture.fips,
        "{name}"
    );
    let cmdline = read(&host.join("proc/cmdline"));
    assert!(
        cmdline.trim_end().ends_with(&disk.options),
        "{name}: {cmdline}"
    );
    assert!(cmdline.contains("root=UUID="), "{name}");
    assert!(
        root.join("usr/share/crypto-policies/policies/FIPS.pol")
            .exists(),
        "{name}"
    );
    assert!(
        root.join("usr/lib/dracut/modules.d/01fips/module-setup.sh")
            .exists(),
        "{name}"
    );
    // The OS: host os-release is the deployment's.
    assert_eq!(
        read(&host.join("usr/lib/os-release")),
        read(&root.join("usr/lib/os-release")),
        "{name}"
    );
    // CPU, runtime and disk markers.
    let cpuinfo = read(&host.join("proc/cpuinfo"));
    assert_eq!(
        cpuinfo.contains(" avx2 "),
        fixture.cpu == Cpu::X86_64V3,
        "{name}"
    );
    assert_eq!(
        cpuinfo.contains("Features"),
        fixture.cpu == Cpu::Aarch64,
        "{name}"
    );
    assert!(
        read(&host.join("etc/crio/crio.conf")).contains(&format!(
            "default_runtime = \"{}\"",
            fixture.default_runtime
        )),
        "{name}"
    );
    assert_eq!(
        rpmostreed::low_disk(Some(&host)),
        fixture.low_disk,
        "{name}"
    );
    assert_eq!(
        rpmostreed::sanity_check(Some(&host), &images[1]).is_err(),
        fixture.cpu == Cpu::X86_64V2,
        "{name}"
    );
}

macro_rules! fixture_tests {
    ($($test:ident => $name:literal),* $(,)?) => {$(
        #[tokio::test]
        async fn $test() {
            host_matches_booted_deployment($name).await;
        }
    )*};
}

fixture_tests! {
    fixture_default => "default",
    fixture_fips => "fips",
    fixture_realtime => "realtime",
    fixture_fips_realtime => "fips-realtime",
    fixture_64k_aarch64 => "64k-aarch64",
    fixture_old_cpu => "old-cpu",
    fixture_runc => "runc",
    fixture_low_disk => "low-disk",
    fixture_layered => "layered",
}

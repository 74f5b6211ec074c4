//! Host fixtures: the kinds of node a testbed can pretend to be (`testbed up --host NAME`).
//!
//! A fixture is plain data. From it the testbed writes the host root streamd reads
//! (`crate::host`) and the fake rpm-ostreed builds the booted deployment of its sysroot, so
//! the two always describe the same machine: a real-time host runs a `+rt` kernel *and* its
//! booted deployment carries the kernel-rt overrides that made it so.

use anyhow::bail;

use crate::images::TestImage;

/// Fixture names, in table order.
pub const NAMES: [&str; 15] = [
    "default",
    "fips",
    "realtime",
    "fips-realtime",
    "64k-aarch64",
    "old-cpu",
    "runc",
    "low-disk",
    "layered",
    "realtime-image",
    "mcd",
    "secureboot",
    "layered-image",
    "realtime-layered-image",
    "mcd-layered-usbguard",
];

/// The CPU the host root's `/proc/cpuinfo` describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cpu {
    /// x86_64 with every x86-64-v3 flag (what RHEL 10 needs).
    X86_64V3,
    /// x86_64 that stops at x86-64-v2 (RHEL 9 runs, RHEL 10's glibc refuses to start).
    X86_64V2,
    /// aarch64 (a `Features` line, no `flags`).
    Aarch64,
}

impl Cpu {
    /// `uname -m` / `/proc/sys/kernel/arch`, also the RPM architecture.
    pub fn arch(self) -> &'static str {
        match self {
            Cpu::X86_64V3 | Cpu::X86_64V2 => "x86_64",
            Cpu::Aarch64 => "aarch64",
        }
    }
}

/// The kernel the booted deployment runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// The image's own kernel.
    Default,
    /// kernel-rt, layered as local packages over a removal of the default kernel.
    Realtime,
    /// kernel-64k (aarch64), layered the same way.
    SixtyFourK,
}

impl Kernel {
    /// Suffix of the kernel release (`uname -r`).
    pub fn release_suffix(self) -> &'static str {
        match self {
            Kernel::Default => "",
            Kernel::Realtime => "+rt",
            Kernel::SixtyFourK => "+64k",
        }
    }

    /// The packages that make up the variant on RHEL 9.2+ and 10 (never the meta-package):
    /// what the MCO requests plus `-modules-core`, which they require (kernel.spec).
    pub fn packages(self) -> &'static [&'static str] {
        match self {
            Kernel::Default => &[],
            Kernel::Realtime => &[
                "kernel-rt-core",
                "kernel-rt-modules",
                "kernel-rt-modules-core",
                "kernel-rt-modules-extra",
            ],
            Kernel::SixtyFourK => &[
                "kernel-64k-core",
                "kernel-64k-modules",
                "kernel-64k-modules-core",
                "kernel-64k-modules-extra",
            ],
        }
    }
}

/// The default-kernel packages of every base image; a kernel variant removes them.
pub const DEFAULT_KERNEL_PACKAGES: [&str; 5] = [
    "kernel",
    "kernel-core",
    "kernel-modules",
    "kernel-modules-core",
    "kernel-modules-extra",
];

/// One kind of host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fixture {
    /// `--host` name.
    pub name: &'static str,
    pub cpu: Cpu,
    pub kernel: Kernel,
    /// FIPS mode: `fips=1` in the kernel arguments and `/proc/sys/crypto/fips_enabled` = 1.
    pub fips: bool,
    /// CRI-O's `default_runtime`.
    pub default_runtime: &'static str,
    /// Whether `HOST/run/testbed/low-disk` exists (the fake then fails imports on free space).
    pub low_disk: bool,
    /// Repo packages layered on the booted deployment (`requested-packages`).
    pub layered_packages: &'static [&'static str],
    /// The variant kernel comes from the booted image itself (a variant or on-cluster-layered
    /// image), not from package overrides: the origin carries none.
    pub kernel_from_image: bool,
    /// Whether the machine-config daemon's on-disk state
    /// (`/etc/machine-config-daemon/currentconfig`) is on the host: an OpenShift node the MCD
    /// manages.
    pub mcd: bool,
    /// UEFI Secure Boot on (the `SecureBoot` EFI variable is 1); without it the host boots
    /// like a BIOS host (no `/sys/firmware/efi`).
    pub secure_boot: bool,
    /// The booted image was built by the machine-config operator's on-cluster layering (its
    /// labels name `baseOSContainerImage`): a base stream image would drop what was layered.
    pub layered_image: bool,
    /// The MachineConfig the machine-config daemon applied, as it stores it in
    /// `/etc/machine-config-daemon/currentconfig` (with `mcd`; `None`: a MachineConfig without
    /// kernel type or extensions).
    pub machine_config: Option<&'static str>,
}

/// Every fixture (see [`NAMES`]).
pub const FIXTURES: [Fixture; 15] = {
    const DEFAULT: Fixture = Fixture {
        name: "default",
        cpu: Cpu::X86_64V3,
        kernel: Kernel::Default,
        fips: false,
        default_runtime: "crun",
        low_disk: false,
        layered_packages: &[],
        kernel_from_image: false,
        mcd: false,
        secure_boot: false,
        layered_image: false,
        machine_config: None,
    };
    [
        DEFAULT,
        Fixture {
            name: "fips",
            fips: true,
            ..DEFAULT
        },
        Fixture {
            name: "realtime",
            kernel: Kernel::Realtime,
            ..DEFAULT
        },
        Fixture {
            name: "fips-realtime",
            kernel: Kernel::Realtime,
            fips: true,
            ..DEFAULT
        },
        Fixture {
            name: "64k-aarch64",
            cpu: Cpu::Aarch64,
            kernel: Kernel::SixtyFourK,
            ..DEFAULT
        },
        Fixture {
            name: "old-cpu",
            cpu: Cpu::X86_64V2,
            ..DEFAULT
        },
        Fixture {
            name: "runc",
            default_runtime: "runc",
            ..DEFAULT
        },
        Fixture {
            name: "low-disk",
            low_disk: true,
            ..DEFAULT
        },
        Fixture {
            name: "layered",
            layered_packages: &["usbguard"],
            ..DEFAULT
        },
        Fixture {
            name: "realtime-image",
            kernel: Kernel::Realtime,
            kernel_from_image: true,
            ..DEFAULT
        },
        Fixture {
            name: "mcd",
            mcd: true,
            ..DEFAULT
        },
        Fixture {
            name: "secureboot",
            secure_boot: true,
            ..DEFAULT
        },
        Fixture {
            name: "layered-image",
            layered_image: true,
            ..DEFAULT
        },
        // The on-cluster layering swapped in kernel-rt (MachineConfig kernelType realtime): the
        // kernel comes from the layered image, the origin carries no override.
        Fixture {
            name: "realtime-layered-image",
            kernel: Kernel::Realtime,
            kernel_from_image: true,
            layered_image: true,
            ..DEFAULT
        },
        // An on-cluster-layered node whose MachineConfig asks for the usbguard extension: the
        // build installed it into the image, so the origin carries no package for it.
        Fixture {
            name: "mcd-layered-usbguard",
            mcd: true,
            layered_image: true,
            machine_config: Some(MACHINE_CONFIG_USBGUARD),
            ..DEFAULT
        },
    ]
};

/// A rendered MachineConfig asking for the `usbguard` extension, as the machine-config daemon
/// stores it (openshift/machine-config-operator:pkg/daemon/daemon.go `storeCurrentConfigOnDisk`:
/// `json.Marshal` of the MachineConfig).
pub const MACHINE_CONFIG_USBGUARD: &str = r#"{"kind":"MachineConfig","apiVersion":"machineconfiguration.openshift.io/v1","metadata":{"name":"rendered-worker-fedcba9876543210fedcba9876543210"},"spec":{"osImageURL":"","config":{"ignition":{"version":"3.5.0"}},"kernelArguments":null,"extensions":["usbguard"],"fips":false,"kernelType":"default"}}"#;

/// The fixture called `name`.
pub fn fixture(name: &str) -> anyhow::Result<Fixture> {
    match FIXTURES.iter().find(|f| f.name == name) {
        Some(f) => Ok(*f),
        None => bail!(
            "unknown host fixture {name:?} (one of: {})",
            NAMES.join(", ")
        ),
    }
}

/// Kernel arguments every fixture boots with (RHCOS's, without `ostree=`, which ostree adds).
const BASE_KARGS: [&str; 5] = [
    "rw",
    "ignition.platform.id=metal",
    "root=UUID=91b1b4fd-9a3d-4f7e-8f4e-0c8f0a3a5a62",
    "rootflags=prjquota",
    "boot=UUID=8e2d5b3a-2f1c-4c5e-9b6a-3d2f1e0c9b8a",
];

/// `(version, release)` of a kernel release such as `5.14.0-570.60.1.el9_6.x86_64`.
pub fn kernel_version_release(kernel: &str) -> (String, String) {
    // Drop the architecture (and any +variant) after the last '.' of the release part.
    let (version, rest) = kernel.split_once('-').unwrap_or((kernel, ""));
    let release = rest.rsplit_once('.').map_or(rest, |(r, _)| r);
    (version.to_string(), release.to_string())
}

/// The kernel release (`uname -r`) of `image`'s kernel `variant` on `arch`.
pub fn kernel_release(image: &TestImage, arch: &str, variant: Kernel) -> String {
    let (version, release) = kernel_version_release(&image.kernel);
    format!("{version}-{release}.{arch}{}", variant.release_suffix())
}

impl Fixture {
    /// The RPM / kernel architecture.
    pub fn arch(&self) -> &'static str {
        self.cpu.arch()
    }

    /// The running kernel release on `booted`.
    pub fn kernel_release(&self, booted: &TestImage) -> String {
        kernel_release(booted, self.arch(), self.kernel)
    }

    /// The booted deployment's kernel arguments (no `ostree=`; ostree manages that one).
    pub fn kargs(&self) -> Vec<String> {
        let mut k: Vec<String> = BASE_KARGS.iter().map(|s| s.to_string()).collect();
        if self.fips {
            k.push("fips=1".into());
        }
        k
    }

    /// `requested-local-packages` of the booted deployment: the variant's kernel packages
    /// built for `booted`'s release (el9 NEVRAs on a rhel-9 host).
    pub fn local_packages(&self, booted: &TestImage) -> Vec<String> {
        if self.kernel_from_image {
            return Vec::new();
        }
        let (version, release) = kernel_version_release(&booted.kernel);
        self.kernel
            .packages()
            .iter()
            .map(|name| format!("{name}-{version}-{release}.{}", self.arch()))
            .collect()
    }

    /// `requested-base-removals` of the booted deployment.
    pub fn base_removals(&self) -> Vec<String> {
        match self.kernel {
            _ if self.kernel_from_image => Vec::new(),
            Kernel::Default => Vec::new(),
            Kernel::Realtime | Kernel::SixtyFourK => DEFAULT_KERNEL_PACKAGES
                .iter()
                .map(|s| s.to_string())
                .collect(),
        }
    }

    /// `requested-packages` of the booted deployment.
    pub fn requested_packages(&self) -> Vec<String> {
        self.layered_packages
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    /// `/proc/cpuinfo` with two processors.
    pub fn cpuinfo(&self) -> String {
        const V2: &str = "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 \
                          clflush mmx fxsr sse sse2 ht syscall nx pdpe1gb rdtscp lm constant_tsc \
                          rep_good nopl xtopology cpuid tsc_known_freq pni pclmulqdq ssse3 cx16 \
                          pcid sse4_1 sse4_2 x2apic popcnt aes rdrand hypervisor lahf_lm \
                          3dnowprefetch arat";
        const V3: &str = "fma movbe xsave avx f16c abm bmi1 avx2 bmi2 erms invpcid xsaveopt";
        let mut out = String::new();
        for n in 0..2 {
            match self.cpu {
                Cpu::X86_64V3 | Cpu::X86_64V2 => {
                    let (model, flags) = if self.cpu == Cpu::X86_64V3 {
                        ("Intel Xeon Processor (Cascadelake)", format!("{V2} {V3}"))
                    } else {
                        ("Intel Xeon E312xx (Sandy Bridge)", V2.to_string())
                    };
                    out.push_str(&format!(
                        "processor\t: {n}\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n\
                         model name\t: {model}\nflags\t\t: {flags}\nbogomips\t: 4589.21\n\n"
                    ));
                }
                Cpu::Aarch64 => out.push_str(&format!(
                    "processor\t: {n}\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes pmull \
                     sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs\n\
                     CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x3\n\
                     CPU part\t: 0xd0c\nCPU revision\t: 1\n\n"
                )),
            }
        }
        out
    }
}

/// One package of a base image, split like rpm-ostree's `(sstsss)` NEVRA tuples.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nevra {
    pub name: String,
    pub epoch: u64,
    pub version: String,
    pub release: String,
    pub arch: String,
}

impl Nevra {
    /// Parse `name-[epoch:]version-release.arch`.
    pub fn parse(s: &str) -> Option<Nevra> {
        let (rest, arch) = s.rsplit_once('.')?;
        let (rest, release) = rest.rsplit_once('-')?;
        let (name, evr) = rest.rsplit_once('-')?;
        let (epoch, version) = match evr.split_once(':') {
            Some((e, v)) => (e.parse().ok()?, v),
            None => (0, evr),
        };
        if name.is_empty() || version.is_empty() || release.is_empty() || arch.is_empty() {
            return None;
        }
        Some(Nevra {
            name: name.into(),
            epoch,
            version: version.into(),
            release: release.into(),
            arch: arch.into(),
        })
    }

    /// The EL major of the release (`…el9_6` → 9), if it names one.
    pub fn el_major(&self) -> Option<u32> {
        let at = self.release.rfind(".el")?;
        let digits: String = self.release[at + 3..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    }
}

impl std::fmt::Display for Nevra {
    /// The NEVRA as rpm-ostree prints it (epoch only when non-zero).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.epoch == 0 {
            write!(
                f,
                "{}-{}-{}.{}",
                self.name, self.version, self.release, self.arch
            )
        } else {
            write!(
                f,
                "{}-{}:{}-{}.{}",
                self.name, self.epoch, self.version, self.release, self.arch
            )
        }
    }
}

/// The packages of `image`'s base on `arch`: the default kernel (from the image's kernel
/// release) and a fixed set of userspace packages per EL major.
pub fn base_packages(image: &TestImage, arch: &str) -> Vec<Nevra> {
    let (kver, krel) = kernel_version_release(&image.kernel);
    let major = image.rhel_version.split('.').next().unwrap_or("9");
    let el10 = major == "10";
    let nv = |name: &str, epoch: u64, version: &str, release: &str, arch: &str| Nevra {
        name: name.into(),
        epoch,
        version: version.into(),
        release: release.into(),
        arch: arch.into(),
    };
    let mut out: Vec<Nevra> = DEFAULT_KERNEL_PACKAGES
        .iter()
        .map(|n| nv(n, 0, &kver, &krel, arch))
        .collect();
    let userspace: [(&str, u64, &str, &str, &str); 11] = if el10 {
        [
            ("bash", 0, "5.2.26", "6.el10", arch),
            ("coreutils", 0, "9.5", "6.el10", arch),
            ("glibc", 0, "2.39", "43.el10_1", arch),
            ("systemd", 0, "257", "13.el10", arch),
            ("ostree", 0, "2025.6", "1.el10", arch),
            ("rpm-ostree", 0, "2025.10", "1.el10", arch),
            ("cri-o", 0, "1.34.1", "2.rhaos4.21.el10", arch),
            ("podman", 5, "5.6.0", "2.el10_1", arch),
            ("NetworkManager", 1, "1.54.0", "2.el10_1", arch),
            (
                "crypto-policies",
                0,
                "20250905",
                "1.git5d4d5e9.el10",
                "noarch",
            ),
            ("dracut", 0, "105", "4.el10", arch),
        ]
    } else {
        [
            ("bash", 0, "5.1.8", "9.el9", arch),
            ("coreutils", 0, "8.32", "39.el9", arch),
            ("glibc", 0, "2.34", "168.el9_6.20", arch),
            ("systemd", 0, "252", "51.el9_6.1", arch),
            ("ostree", 0, "2025.2", "1.el9_6", arch),
            ("rpm-ostree", 0, "2025.6", "1.el9_6", arch),
            ("cri-o", 0, "1.32.6", "2.rhaos4.19.git2b1f0c2.el9", arch),
            ("podman", 5, "5.4.0", "12.el9_6", arch),
            ("NetworkManager", 1, "1.52.0", "5.el9_6", arch),
            (
                "crypto-policies",
                0,
                "20250128",
                "1.git5269e22.el9",
                "noarch",
            ),
            ("dracut", 0, "057", "88.git20250311.el9_6", arch),
        ]
    };
    out.extend(userspace.iter().map(|(n, e, v, r, a)| nv(n, *e, v, r, a)));
    // One package only the el9 base has (RHEL 10 dropped the ISC DHCP client), so an origin's
    // removal can name a package the new base lacks (rpm-ostree's "Inactive base removals").
    if !el10 {
        out.push(nv("dhcp-client", 12, "4.4.2", "19.b1.el9", arch));
    }
    out
}

/// The packages the fake resolves by name from the target's extensions repository
/// (`install-packages`): the kernel variants and the usual OpenShift extensions.
pub const EXTENSION_PACKAGES: [&str; 12] = [
    "kernel-rt-core",
    "kernel-rt-modules",
    "kernel-rt-modules-core",
    "kernel-rt-modules-extra",
    "kernel-64k-core",
    "kernel-64k-modules",
    "kernel-64k-modules-core",
    "kernel-64k-modules-extra",
    "usbguard",
    "kata-containers",
    "libreswan",
    "NetworkManager-libreswan",
];

/// One dependency line of a spec: its kind (`Provides`, `Requires`, `Requires(pre)`,
/// `Requires(preun)`) and `name [op evr]`.
pub type SpecDep = (&'static str, String);

/// The Provides/Requires RHEL's kernel.spec gives subpackage `sub` (`core`, `modules-core`,
/// `modules`, `modules-extra`) of variant `flavor` (`rt`, `64k`) for the kernel release
/// `kver` (`KVERREL+rt`), as built since `-modules-core` was split out (RHEL 9.2, and RHEL
/// 10): `kernel_variant_package` + `kernel_reqprovconf` for `-core`,
/// `kernel_modules_core_package`, `kernel_modules_package`, `kernel_modules_extra_package`
/// (mkuron/almalinux-kernel:redhat/kernel.spec.template, the CentOS Stream 10 kernel's).
/// Left out: `Provides: kernel-<arch> = …` aliases nothing requires, and
/// `Requires(pre): ((linux-firmware >= …) if linux-firmware)`, a rich dependency the fake
/// daemon does not evaluate. Used by the rpmbuild specs and by [`fake_rpm`].
pub fn kernel_subpackage_deps(flavor: &str, sub: &str, kver: &str) -> Vec<SpecDep> {
    let uname = |s: &str| format!("kernel-{flavor}-{s}-uname-r = {kver}");
    let mut deps = vec![("Provides", uname(sub))];
    match sub {
        "core" => deps.extend([
            ("Provides", "installonlypkg(kernel)".to_string()),
            ("Provides", format!("kernel-uname-r = {kver}")),
            ("Requires", uname("modules-core")),
            ("Requires(pre)", "coreutils".into()),
            ("Requires(pre)", "systemd >= 203-2".into()),
            ("Requires(pre)", "/usr/bin/kernel-install".into()),
            ("Requires(pre)", "dracut >= 027".into()),
            ("Requires(preun)", "systemd >= 200".into()),
        ]),
        "modules-core" => deps.extend([
            ("Provides", "installonlypkg(kernel-module)".to_string()),
            ("Requires", format!("kernel-uname-r = {kver}")),
        ]),
        "modules" => deps.extend([
            ("Provides", "installonlypkg(kernel-module)".to_string()),
            ("Requires", format!("kernel-uname-r = {kver}")),
            ("Requires", uname("modules-core")),
        ]),
        _ => deps.extend([
            ("Provides", "installonlypkg(kernel-module)".to_string()),
            ("Requires", format!("kernel-uname-r = {kver}")),
            ("Requires", uname("modules")),
            ("Requires", uname("modules-core")),
        ]),
    }
    deps
}

/// The kernel.spec dependencies of `nevra` when it is a kernel variant's subpackage.
fn kernel_deps_of(nevra: &Nevra) -> Vec<SpecDep> {
    for flavor in ["rt", "64k"] {
        if let Some(sub) = nevra.name.strip_prefix(&format!("kernel-{flavor}-")) {
            let kver = format!(
                "{}-{}.{}+{flavor}",
                nevra.version, nevra.release, nevra.arch
            );
            return kernel_subpackage_deps(flavor, sub, &kver);
        }
    }
    Vec::new()
}

/// A minimal but well-formed binary RPM (lead, a signature header and a main header, each
/// an immutable region as rpm requires; NAME, VERSION, RELEASE, EPOCH, OS and ARCH, and for
/// a kernel variant's subpackage kernel.spec's Provides/Requires; no payload): enough for
/// anything that reads the header, as `rpm -qp` and the fake's `install-local-packages` do.
pub fn fake_rpm(nevra: &Nevra) -> Vec<u8> {
    // Tag numbers, types and sense flags from rpm's rpmtag.h / rpmds.h.
    const STRING: u32 = 6;
    const INT32: u32 = 4;
    const STRING_ARRAY: u32 = 8;
    let mut tags: Vec<(u32, u32, Vec<u8>, u32)> = vec![
        (1000, STRING, cstr(&nevra.name), 1),
        (1001, STRING, cstr(&nevra.version), 1),
        (1002, STRING, cstr(&nevra.release), 1),
    ];
    if nevra.epoch > 0 {
        let epoch = u32::try_from(nevra.epoch).unwrap_or(u32::MAX);
        tags.push((1003, INT32, epoch.to_be_bytes().to_vec(), 1));
    }
    tags.push((1021, STRING, cstr("linux"), 1));
    tags.push((1022, STRING, cstr(&nevra.arch), 1));
    let deps = kernel_deps_of(nevra);
    // (names, flags, versions) tags of PROVIDE* and REQUIRE*.
    for (kinds, (names, flags, versions)) in [
        (&["Provides"][..], (1047, 1112, 1113)),
        (
            &["Requires", "Requires(pre)", "Requires(preun)"][..],
            (1049, 1048, 1050),
        ),
    ] {
        let mine: Vec<(String, u32, String)> = deps
            .iter()
            .filter(|(k, _)| kinds.contains(k))
            .map(|(_, d)| {
                let mut parts = d.splitn(3, ' ');
                let name = parts.next().unwrap_or_default().to_string();
                let sense = match parts.next() {
                    Some("=") => 8,
                    Some(">=") => 12,
                    _ => 0,
                };
                (name, sense, parts.next().unwrap_or_default().to_string())
            })
            .collect();
        if mine.is_empty() {
            continue;
        }
        let count = u32::try_from(mine.len()).unwrap_or(u32::MAX);
        let strings = |f: &dyn Fn(&(String, u32, String)) -> &str| -> Vec<u8> {
            mine.iter().flat_map(|d| cstr(f(d))).collect()
        };
        tags.push((names, STRING_ARRAY, strings(&|d| &d.0), count));
        tags.push((
            flags,
            INT32,
            mine.iter().flat_map(|d| d.1.to_be_bytes()).collect(),
            count,
        ));
        tags.push((versions, STRING_ARRAY, strings(&|d| &d.2), count));
    }
    tags.sort_by_key(|t| t.0);
    let mut out = Vec::new();
    // Lead: magic, version 3.0, type 0 (binary), archnum, 66-byte name, osnum 1, signature type 5.
    out.extend_from_slice(&[0xed, 0xab, 0xee, 0xdb, 3, 0, 0, 0, 0, 1]);
    let mut name = [0u8; 66];
    let text = nevra.to_string();
    let n = text.len().min(65);
    name[..n].copy_from_slice(&text.as_bytes()[..n]);
    out.extend_from_slice(&name);
    out.extend_from_slice(&[0, 1, 0, 5]);
    out.extend_from_slice(&[0u8; 16]);
    // RPMTAG_HEADERSIGNATURES (62) and RPMTAG_HEADERIMMUTABLE (63) regions.
    let sig = header(62, &[]);
    out.extend_from_slice(&sig);
    out.resize(out.len() + (8 - sig.len() % 8) % 8, 0);
    out.extend_from_slice(&header(63, &tags));
    out
}

fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// An RPM header structure (magic, index, data store) whose entries all lie in the
/// immutable region `region`: the region tag comes first in the index and points at a
/// trailer at the end of the data, whose negative offset covers the whole index.
fn header(region: u32, tags: &[(u32, u32, Vec<u8>, u32)]) -> Vec<u8> {
    const BIN: u32 = 7;
    let entry = |tag: u32, ty: u32, offset: u32, count: u32| {
        let mut e = Vec::with_capacity(16);
        for v in [tag, ty, offset, count] {
            e.extend_from_slice(&v.to_be_bytes());
        }
        e
    };
    let mut index = Vec::new();
    let mut data: Vec<u8> = Vec::new();
    for (tag, ty, bytes, count) in tags {
        if *ty == 4 {
            data.resize(data.len().div_ceil(4) * 4, 0);
        }
        let offset = u32::try_from(data.len()).unwrap_or(u32::MAX);
        index.extend_from_slice(&entry(*tag, *ty, offset, *count));
        data.extend_from_slice(bytes);
    }
    let count = u32::try_from(tags.len() + 1).unwrap_or(u32::MAX);
    let trailer_at = u32::try_from(data.len()).unwrap_or(u32::MAX);
    // The trailer's offset is minus the size of the region's index (two's complement).
    let back = 0u32.wrapping_sub(count.wrapping_mul(16));
    data.extend_from_slice(&entry(region, BIN, back, 16));
    let size = u32::try_from(data.len()).unwrap_or(u32::MAX);
    let mut out = vec![0x8e, 0xad, 0xe8, 0x01, 0, 0, 0, 0];
    out.extend_from_slice(&count.to_be_bytes());
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&entry(region, BIN, trailer_at, 16));
    out.extend_from_slice(&index);
    out.extend_from_slice(&data);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::images::{DEFAULT_REGISTRY, catalog};
    use std::path::Path;

    #[test]
    fn table_names_are_unique_and_listed() {
        let names: Vec<_> = FIXTURES.iter().map(|f| f.name).collect();
        assert_eq!(names, NAMES);
        assert!(fixture("nope").is_err());
        assert_eq!(fixture("old-cpu").map(|f| f.cpu).ok(), Some(Cpu::X86_64V2));
    }

    #[test]
    fn nevras_parse_and_print() {
        let n = Nevra::parse("kernel-rt-core-5.14.0-570.60.1.el9_6.x86_64").expect("nevra");
        assert_eq!(n.name, "kernel-rt-core");
        assert_eq!(n.version, "5.14.0");
        assert_eq!(n.release, "570.60.1.el9_6");
        assert_eq!(n.el_major(), Some(9));
        assert_eq!(n.to_string(), "kernel-rt-core-5.14.0-570.60.1.el9_6.x86_64");
        let e = Nevra::parse("NetworkManager-1:1.52.0-5.el9_6.x86_64").expect("epoch");
        assert_eq!(e.epoch, 1);
        assert_eq!(e.to_string(), "NetworkManager-1:1.52.0-5.el9_6.x86_64");
        assert!(Nevra::parse("kernel").is_none());
    }

    #[test]
    fn kernel_releases_follow_the_variant() {
        let images = catalog(DEFAULT_REGISTRY);
        let rt = fixture("realtime").expect("rt");
        assert_eq!(
            rt.kernel_release(&images[0]),
            "5.14.0-570.60.1.el9_6.x86_64+rt"
        );
        let k64 = fixture("64k-aarch64").expect("64k");
        assert_eq!(
            k64.kernel_release(&images[1]),
            "6.12.0-124.8.1.el10_1.aarch64+64k"
        );
        assert_eq!(
            rt.local_packages(&images[0]),
            [
                "kernel-rt-core-5.14.0-570.60.1.el9_6.x86_64",
                "kernel-rt-modules-5.14.0-570.60.1.el9_6.x86_64",
                "kernel-rt-modules-core-5.14.0-570.60.1.el9_6.x86_64",
                "kernel-rt-modules-extra-5.14.0-570.60.1.el9_6.x86_64"
            ]
        );
        let base = base_packages(&images[1], "x86_64");
        assert_eq!(
            base[1].to_string(),
            "kernel-core-6.12.0-124.8.1.el10_1.x86_64"
        );
    }

    #[test]
    fn fake_rpms_are_read_by_rpm() {
        let nevra = Nevra::parse("kernel-rt-core-5.14.0-570.60.1.el9_6.x86_64").expect("nevra");
        let bytes = fake_rpm(&nevra);
        let dir = std::env::temp_dir().join(format!("testbed-rpm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("k.rpm");
        std::fs::write(&path, &bytes).expect("write");
        // The real rpm, where installed, reads it the same way (an independent check).
        if let Ok(out) = std::process::Command::new("rpm")
            .args([
                "-qp",
                "--nosignature",
                "--nodigest",
                "--queryformat",
                "%{NEVRA}",
            ])
            .arg(&path)
            .output()
        {
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(String::from_utf8_lossy(&out.stdout), nevra.to_string());
            let out = std::process::Command::new("rpm")
                .args(["-qp", "--nosignature", "--nodigest", "--requires"])
                .arg(&path)
                .output()
                .expect("rpm --requires");
            let requires = String::from_utf8_lossy(&out.stdout);
            assert!(
                requires
                    .contains("kernel-rt-modules-core-uname-r = 5.14.0-570.60.1.el9_6.x86_64+rt\n")
                    && requires.contains("systemd >= 203-2\n"),
                "{requires}"
            );
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Builds the fixture's sysroot and host root and checks that they describe one machine.
    async fn host_matches_booted_deployment(name: &str) {
        let images = catalog(DEFAULT_REGISTRY);
        let fixture = fixture(name).expect("fixture");
        let dir =
            std::env::temp_dir().join(format!("testbed-fixture-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let sysroot = dir.join("sysroot");
        let state = crate::rpmostreed::create_initial(
            &sysroot,
            &dir.join("scratch"),
            "rhcos",
            &images[0],
            &fixture,
        )
        .await
        .expect("sysroot");
        let booted = state.booted().expect("booted").clone();
        let disk = booted.disk.clone().expect("on disk");
        let host = dir.join("host");
        crate::host::write(
            &host,
            "worker-0",
            &images[0],
            &fixture,
            &disk.proc_cmdline(),
        )
        .expect("host root");
        let read = |p: &Path| {
            std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        };

        // One real deployment on disk, the one the fake considers booted.
        let on_disk = crate::rpmostreed::read_deployments(&sysroot).expect("read");
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
            crate::rpmostreed::names_package(p, "kernel-rt-core")
                || crate::rpmostreed::names_package(p, "kernel-64k-core")
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
            crate::rpmostreed::low_disk(Some(&host)),
            fixture.low_disk,
            "{name}"
        );
        assert_eq!(
            crate::rpmostreed::sanity_check(Some(&host), &images[1]).is_err(),
            fixture.cpu == Cpu::X86_64V2,
            "{name}"
        );
        std::fs::remove_dir_all(&dir).ok();
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
}

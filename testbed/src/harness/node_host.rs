//! One node's host: its private system bus, the D-Bus fakes on it, the host root streamd reads
//! and streamd's config, all below one directory. The single-node testbed has one, a fleet one
//! per node.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use crate::control::Command;
use crate::fakes::bootc::FakeBootc;
use crate::fakes::bus::Bus;
use crate::fakes::logind::FakeLogind;
use crate::fakes::registry::Registry;
use crate::fakes::rpmostreed::{FakeRpmOstreed, RpmOstreeVersion, RpmOstreedConfig};
use crate::fakes::systemd::FakeSystemd;
use crate::fixtures::images::TestImage;
use crate::fixtures::openshift::OpenShift;

/// The OS update tool of the testbed host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// rpm-ostreed owns its name on the bus (and `bootc` is installed too, as on RHCOS).
    #[default]
    RpmOstree,
    /// No rpm-ostreed on the bus: `bootc`, run through the fake systemd.
    Bootc,
}

/// The error a failed finalization logs (what a bootloader failure at shutdown looks like).
const FINALIZE_FAILURE: &str =
    "error: Bootloader write config: grub2-mkconfig: Child process exited with code 1";

/// One node's host: its private system bus, the fake rpm-ostreed (with systemd, logind and bootc
/// on the same bus), the host root streamd reads and streamd's config, all below one directory.
/// The single-node testbed has one, a fleet one per node.
pub(crate) struct NodeHost {
    node: String,
    dir: PathBuf,
    bus: Bus,
    rpmostreed: FakeRpmOstreed,
    /// systemd, logind and bootc; bootc acts on the fake rpm-ostreed's host model.
    systemd: FakeSystemd,
    logind: FakeLogind,
    bootc: FakeBootc,
    /// The host fixture, rewritten for what boots by a simulated reboot.
    fixture: crate::fixtures::Fixture,
    images: Vec<TestImage>,
}

/// What a node host needs from the cluster around it.
pub(crate) struct HostSetup<'a> {
    /// The node's name (its Node object and `system:node:<name>` identity).
    pub(crate) node: &'a str,
    /// Host fixture name.
    pub(crate) host: &'a str,
    pub(crate) backend: Backend,
    /// The rpm-ostree release the fake rpm-ostreed plays.
    pub(crate) rpm_ostree: RpmOstreeVersion,
    /// Stage through real libostree (`Options::real_libostree`).
    pub(crate) real_libostree: bool,
    /// The OpenShift release whose machine-config operator rendered the host's MachineConfig.
    pub(crate) openshift: OpenShift,
    pub(crate) registry: &'a Registry,
    /// The node identity's kubeconfig (it may be written after the host starts).
    pub(crate) kubeconfig: &'a Path,
    pub(crate) pull_secret: &'a Path,
}

impl NodeHost {
    /// Starts the bus and the fakes in `dir` and writes the host root (booted on the first
    /// image, `rhel-9`) and streamd's config.
    pub(crate) async fn start(dir: &Path, setup: &HostSetup<'_>) -> anyhow::Result<NodeHost> {
        let fixture = crate::fixtures::Fixture {
            openshift: setup.openshift,
            ..crate::fixtures::fixture(setup.host)?
        };
        for sub in ["bus", "host", "config.d", "state", "rpmostreed", "run"] {
            std::fs::create_dir_all(dir.join(sub))
                .with_context(|| format!("creating {}", dir.join(sub).display()))?;
        }
        let registry = setup.registry;
        // The variant images and the later rhel-10 build can be pulled too, after the catalog's.
        let images: Vec<_> = registry
            .images()
            .iter()
            .chain(registry.variant_images())
            .chain(std::iter::once(registry.update_image()))
            .cloned()
            .collect();
        let booted = images.first().context("empty image catalog")?.clone();
        if setup.real_libostree && setup.backend == Backend::Bootc {
            // The fake bootc stages with the testbed's `ostree admin deploy`.
            anyhow::bail!("real libostree staging is played on the rpm-ostree backend only");
        }
        // The node's container stack configuration; the OS daemons pull with the ostree auth
        // file the machine-config daemon would link there. Written first: the fake
        // rpm-ostreed imports the booted image with it.
        crate::fakes::registry::node::write_node_config(
            &dir.join("host"),
            &registry.pull_secret_json(),
        )?;
        let bus = Bus::start(&dir.join("bus")).await?;
        let rpmostreed = FakeRpmOstreed::start(RpmOstreedConfig {
            bus_address: bus.address().to_string(),
            txn_socket: dir.join("rpm-ostree-transaction.sock"),
            state_dir: dir.join("rpmostreed"),
            sysroot: dir.join("sysroot"),
            host_root: Some(dir.join("host")),
            fixture,
            osname: "rhcos".into(),
            images: images.clone(),
            booted: 0,
            version: setup.rpm_ostree,
            real_libostree: setup.real_libostree,
        })
        .await
        .context("starting the fake rpm-ostreed")?;
        if setup.backend == Backend::Bootc {
            // The host model stays; only the daemon's name goes.
            rpmostreed.leave_bus().await?;
        }
        let systemd = FakeSystemd::start(bus.address())
            .await
            .context("starting the fake systemd")?;
        // StartUnit finds bootloader-update.service below the host root.
        systemd.set_host_root(dir.join("host"));
        let host = rpmostreed.host();
        let logind = FakeLogind::start(bus.address(), Box::new(move || host.record_reboot()))
            .await
            .context("starting the fake logind")?;
        let bootc = FakeBootc::start(&bus, &rpmostreed, &dir.join("bin/bootc"))
            .await
            .context("starting the fake bootc")?;
        // After the sysroot exists: /proc/cmdline is the booted deployment's entry.
        let cmdline = rpmostreed
            .booted_cmdline()
            .context("the fake rpm-ostreed has no booted deployment")?;
        crate::harness::host_root::write(
            &dir.join("host"),
            setup.node,
            &booted,
            &fixture,
            &cmdline,
        )?;
        crate::harness::host_root::keep_boot_id(&dir.join("host"))?;
        // streamd reads the sysroot and /boot below the host root, as on a node.
        for (link, target) in [
            ("sysroot", dir.join("sysroot")),
            ("boot", dir.join("sysroot/boot")),
        ] {
            let l = dir.join("host").join(link);
            let _ = std::fs::remove_file(&l);
            std::os::unix::fs::symlink(&target, &l)
                .with_context(|| format!("linking {}", l.display()))?;
        }
        let mut config = format!(
            "# written by the testbed\nnode-name = {node:?}\nkubeconfig = {kc:?}\nhost-root = {hr:?}\n\
             pull-secret = {ps:?}\nruntime-dir = {rd:?}\nstate-dir = {sd:?}\nbootc-path = {bc:?}\n\
             insecure-registries = [{reg:?}]\n\
             # act on a changed image at once: a share of the default 600 s, fixed by the image's\n\
             # digest, outlasts a test's wait (tests of the spread set theirs in a later drop-in)\n\
             resolve-spread-seconds = 0\n",
            node = setup.node,
            kc = setup.kubeconfig.display().to_string(),
            hr = dir.join("host").display().to_string(),
            ps = setup.pull_secret.display().to_string(),
            rd = dir.join("run").display().to_string(),
            sd = dir.join("state").display().to_string(),
            bc = dir.join("bin/bootc").display().to_string(),
            reg = registry.host(),
        );
        if fixture.low_disk {
            // The sysroot here lives on the build machine's disk; asking for more free space than
            // any disk has makes streamd's disk-space check see a "full" sysroot for real.
            config.push_str("min-free-sysroot-mib = 1073741824\n");
        }
        std::fs::write(dir.join("config.d/50-testbed.toml"), config)
            .context("writing the streamd config")?;
        Ok(NodeHost {
            node: setup.node.to_string(),
            dir: dir.to_path_buf(),
            bus,
            rpmostreed,
            systemd,
            logind,
            bootc,
            fixture,
            images,
        })
    }

    /// The environment streamd (and `streamctl`) run with on this host.
    pub(crate) fn streamd_env(&self, kubeconfig: &Path) -> BTreeMap<String, String> {
        let path = |p: &str| self.dir.join(p).display().to_string();
        BTreeMap::from([
            (
                "DBUS_SYSTEM_BUS_ADDRESS".to_string(),
                self.bus.address().to_string(),
            ),
            ("STREAMD_NODE_NAME".into(), self.node.clone()),
            ("STREAMD_CONFIG_DIR".into(), path("config.d")),
            ("STREAMD_HOST_ROOT".into(), path("host")),
            ("STREAMD_STATE_DIR".into(), path("state")),
            (
                "STREAMD_KUBECONFIG".into(),
                kubeconfig.display().to_string(),
            ),
            (
                "TESTBED_BOOTC".into(),
                self.bootc.program().display().to_string(),
            ),
        ])
    }

    /// The private system bus.
    pub(crate) fn bus(&self) -> &Bus {
        &self.bus
    }

    /// Whether a reboot was asked for (`FinalizeDeployment` with reboot, or logind's `Reboot`)
    /// and not yet performed: the fake's `reboot_requested`, read from its state file.
    pub(crate) fn reboot_requested(&self) -> bool {
        std::fs::read_to_string(self.dir.join("rpmostreed/state.json"))
            .ok()
            .and_then(|text| serde_json::from_str::<Value>(&text).ok())
            .is_some_and(|state| state["reboot_requested"] == Value::Bool(true))
    }

    /// Reboots the host: the fake rpm-ostreed applies an unlocked staged deployment (a locked
    /// one is discarded), then the host root is rewritten for what booted, with a new boot id;
    /// booting another deployment replaces the host root's `/usr` and keeps `/etc` and `/var`.
    /// streamd is not touched: whoever started it stops it before and starts it after.
    pub(crate) async fn reboot(&self, fail_finalize: bool) -> anyhow::Result<Value> {
        let out = self.rpmostreed.simulate_reboot(fail_finalize).await?;
        let root = self.dir.join("host");
        let image = self
            .images
            .iter()
            .find(|i| i.digest == out.booted_digest)
            .with_context(|| format!("booted image {} is not in the catalog", out.booted_digest))?;
        let previous_boot = crate::harness::host_root::boot_id(&root)?;
        if out.applied {
            crate::harness::host_root::boot_new_deployment(&root)?;
        }
        crate::harness::host_root::write(&root, &self.node, image, &self.fixture, &out.cmdline)?;
        crate::harness::host_root::boot(&root, &out.booted_kernel)?;
        if out.finalize_failed {
            // What ostree-finalize-staged.service leaves in the journal of the boot it failed in.
            crate::harness::host_root::journal_finalize_failure(
                &root,
                &previous_boot,
                &crate::harness::host_root::boot_id(&root)?,
                FINALIZE_FAILURE,
            )
            .await?;
        }
        Ok(json!({
            "applied": out.applied,
            "discarded": out.discarded,
            "finalize_failed": out.finalize_failed,
            "booted": out.booted_digest,
            "kernel": out.booted_kernel,
        }))
    }

    /// The host's current boot id and booted kernel (what its kubelet reports).
    pub(crate) fn boot_facts(&self) -> anyhow::Result<(String, String)> {
        let root = self.dir.join("host");
        let kernel = std::fs::read_to_string(root.join("proc/sys/kernel/osrelease"))
            .context("reading the host's kernel release")?;
        Ok((
            crate::harness::host_root::boot_id(&root)?,
            kernel.trim().to_string(),
        ))
    }

    /// Runs a control command for one of the host's fakes (`target` rpmostreed, systemd,
    /// logind or bootc).
    pub(crate) async fn control(&self, cmd: Command) -> anyhow::Result<Value> {
        match cmd {
            Command::Rpmostreed(cmd) => self.rpmostreed.control(cmd).await,
            Command::Systemd(cmd) => self.systemd.control(cmd).await,
            Command::Logind(cmd) => self.logind.control(cmd).await,
            Command::Bootc(cmd) => self.bootc.control(cmd),
            Command::Testbed(_) | Command::Apiserver(_) => {
                bail!("{cmd:?} is not for a node's host (rpmostreed, systemd, logind, bootc)")
            }
        }
    }
}

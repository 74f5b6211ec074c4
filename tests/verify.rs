//! `verify_staged` against the testbed's real ostree sysroot: deployments are staged through
//! the fake rpm-ostreed over D-Bus, read back as `Deployments`, and verified on disk.

mod common;

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{bus_connection, scratch_dir, start_testbed};
use futures::StreamExt;
use streamd::backend::Deployment;
use streamd::backend::KernelVariant;
use streamd::host::verify::{Expectation, VerifyError, verify_staged};
use testbed::fixtures::images::TestImage;
use testbed::scratch::ScratchDir;
use testbed::{Backend, Testbed};
use zbus::zvariant::{self, OwnedValue, Value};
use zbus::{Connection, MessageStream};

const BUS_NAME: &str = "org.projectatomic.rpmostree1";
const SYSROOT_PATH: &str = "/org/projectatomic/rpmostree1/Sysroot";
const OS_PATH: &str = "/org/projectatomic/rpmostree1/rhcos";
const SYSROOT: &str = "org.projectatomic.rpmostree1.Sysroot";
const OS: &str = "org.projectatomic.rpmostree1.OS";
const TXN: &str = "org.projectatomic.rpmostree1.Transaction";
const WAIT: Duration = Duration::from_secs(30);
const KERNEL_RT: [&str; 4] = [
    "kernel-rt-core",
    "kernel-rt-modules",
    "kernel-rt-modules-core",
    "kernel-rt-modules-extra",
];

type Dict = HashMap<String, OwnedValue>;

/// A testbed on one host fixture and a system-bus client; the directory goes last.
struct Env {
    tb: Testbed,
    client: Connection,
    dir: ScratchDir,
}

impl Env {
    /// A testbed in a scratch directory `verify-<name>` on the host fixture `host`.
    async fn new(name: &str, host: &str) -> Env {
        let dir = scratch_dir("verify", name);
        let tb = start_testbed(&dir, host, Backend::default()).await;
        let client = bus_connection(&tb).await;
        Env { tb, client, dir }
    }

    fn sysroot(&self) -> PathBuf {
        self.tb.dir().join("sysroot")
    }

    fn rhel9(&self) -> &TestImage {
        &self.tb.images()[0]
    }

    fn rhel10(&self) -> &TestImage {
        &self.tb.images()[1]
    }

    async fn prop(&self, path: &str, iface: &str, name: &str) -> OwnedValue {
        self.client
            .call_method(
                Some(BUS_NAME),
                path,
                Some("org.freedesktop.DBus.Properties"),
                "Get",
                &(iface, name),
            )
            .await
            .unwrap_or_else(|e| panic!("Get {iface}.{name}: {e}"))
            .body()
            .deserialize::<OwnedValue>()
            .expect("variant")
    }

    /// `Sysroot.Deployments`, parsed the way streamd parses it.
    async fn deployments(&self) -> Vec<Deployment> {
        let v = self.prop(SYSROOT_PATH, SYSROOT, "Deployments").await;
        let dicts = Vec::<Dict>::try_from(v).expect("aa{sv}");
        Deployment::parse_all(&dicts).expect("deployments parse")
    }

    /// `(staged, booted)` from the daemon.
    async fn staged_and_booted(&self) -> (Deployment, Deployment) {
        let all = self.deployments().await;
        let staged = all.iter().find(|d| d.staged).expect("a staged deployment");
        let booted = all.iter().find(|d| d.booted).expect("a booted deployment");
        (staged.clone(), booted.clone())
    }

    /// `UpdateDeployment(modifiers, {})` run to a successful end over the transaction's
    /// peer-to-peer socket.
    async fn stage(&self, modifiers: &Dict) {
        let addr: String = self
            .client
            .call_method(
                Some(BUS_NAME),
                OS_PATH,
                Some(OS),
                "UpdateDeployment",
                &(modifiers, &Dict::new()),
            )
            .await
            .expect("UpdateDeployment")
            .body()
            .deserialize()
            .expect("transaction address");
        let peer = zbus::connection::Builder::address(addr.as_str())
            .expect("transaction address")
            .p2p()
            .build()
            .await
            .expect("connect to the transaction");
        // Subscribe before Start so that Finished cannot be missed.
        let mut stream = MessageStream::from(&peer);
        let started: bool = peer
            .call_method(None::<&str>, "/", Some(TXN), "Start", &())
            .await
            .expect("Start")
            .body()
            .deserialize()
            .expect("b");
        assert!(started, "Start() starts the transaction");
        let deadline = Instant::now() + WAIT;
        let finished = loop {
            let next = tokio::time::timeout_at(deadline.into(), stream.next())
                .await
                .expect("Finished within the deadline");
            let Some(Ok(msg)) = next else {
                panic!("the transaction closed without Finished")
            };
            let h = msg.header();
            if h.message_type() == zbus::message::Type::Signal
                && h.interface().map(|i| i.as_str()) == Some(TXN)
                && h.member().map(|m| m.as_str()) == Some("Finished")
            {
                break msg.body().deserialize::<(bool, String)>().expect("(bs)");
            }
        };
        assert_eq!(finished, (true, String::new()), "the staging succeeds");
        drop(stream);
        drop(peer);
        // The transaction is released once its last peer has gone.
        let start = Instant::now();
        loop {
            let v = self.prop(SYSROOT_PATH, SYSROOT, "ActiveTransaction").await;
            let (method, _, _) = <(String, String, String)>::try_from(v).expect("(sss)");
            if method.is_empty() {
                break;
            }
            assert!(start.elapsed() < WAIT, "transaction never released");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stages a plain rebase to rhel-10.
    async fn rebase_rhel10(&self) {
        self.stage(&dict(&[(
            "set-refspec",
            Value::from(refspec(self.rhel10())),
        )]))
        .await;
    }

    /// Verifies on a blocking thread, as streamd's caller does.
    async fn verify(
        &self,
        staged: &Deployment,
        booted: &Deployment,
        exp: &Expectation,
    ) -> Result<(), VerifyError> {
        let (sysroot, staged, booted, exp) =
            (self.sysroot(), staged.clone(), booted.clone(), exp.clone());
        tokio::task::spawn_blocking(move || verify_staged(&sysroot, &staged, &booted, &exp))
            .await
            .expect("the verification thread")
    }

    /// What streamd expects of a staged rhel-10: the digest ostree-ext stores is the platform
    /// manifest's (amd64: these hosts are x86_64), not the index the pullspec pins.
    fn expect_rhel10(&self, kernel: KernelVariant, fips: bool) -> Expectation {
        Expectation {
            image_digest: self.tb.registry().os_images()[1].platforms[0]
                .digest
                .clone(),
            target_major: 10,
            kernel,
            fips,
        }
    }
}

fn dict(entries: &[(&str, Value<'_>)]) -> Dict {
    entries
        .iter()
        .map(|(k, v)| (k.to_string(), v.try_to_owned().expect("owned value")))
        .collect()
}

fn refspec(image: &TestImage) -> String {
    format!("ostree-unverified-registry:{}", image.pullspec)
}

/// The differences of a `Mismatch`, or a panic naming what came instead.
fn mismatches(r: Result<(), VerifyError>) -> Vec<String> {
    match r {
        Err(VerifyError::Mismatch(m)) => m,
        other => panic!("expected a mismatch, got {other:?}"),
    }
}

/// The bootloader entry file of the on-disk deployment `<checksum>.<serial>`.
fn entry_of(sysroot: &Path, d: &Deployment) -> PathBuf {
    let want = format!("{}.{}", d.checksum, d.serial);
    for entry in std::fs::read_dir(sysroot.join("boot/loader/entries")).expect("entries") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("read entry");
        let ostree = text
            .split_whitespace()
            .find_map(|a| a.strip_prefix("ostree="))
            .expect("ostree= argument");
        let target =
            std::fs::read_link(sysroot.join(ostree.trim_start_matches('/'))).expect("boot link");
        if target.ends_with(&want) {
            return path;
        }
    }
    panic!("no bootloader entry for {want}");
}

#[tokio::test]
async fn default_host_staged_rhel10_verifies() {
    let env = Env::new("default", "default").await;
    env.rebase_rhel10().await;
    let (staged, booted) = env.staged_and_booted().await;
    assert_ne!(staged.checksum, booted.checksum);
    assert_eq!(
        env.verify(
            &staged,
            &booted,
            &env.expect_rhel10(KernelVariant::Default, false)
        )
        .await,
        Ok(())
    );

    // A deployment the sysroot does not have, and a path that is no sysroot, cannot be read.
    let ghost = Deployment {
        serial: staged.serial + 7,
        ..staged.clone()
    };
    let exp = env.expect_rhel10(KernelVariant::Default, false);
    match env.verify(&ghost, &booted, &exp).await {
        Err(VerifyError::Sysroot(m)) => {
            assert!(m.contains("staged deployment"), "{m}");
            assert!(m.contains(&env.sysroot().display().to_string()), "{m}");
            assert!(m.contains(&booted.checksum), "lists what is there: {m}");
        }
        other => panic!("expected a sysroot error, got {other:?}"),
    }
    let nowhere = env.dir.join("no-such-sysroot");
    let (s, b) = (staged.clone(), booted.clone());
    let r = tokio::task::spawn_blocking(move || verify_staged(&nowhere, &s, &b, &exp))
        .await
        .expect("thread");
    match r {
        Err(VerifyError::Sysroot(m)) => assert!(m.contains("no-such-sysroot"), "{m}"),
        other => panic!("expected a sysroot error, got {other:?}"),
    }
}

#[tokio::test]
async fn mismatches_on_a_default_staging_are_each_named() {
    let env = Env::new("mismatch", "default").await;
    env.rebase_rhel10().await;
    let (staged, booted) = env.staged_and_booted().await;
    let good = env.expect_rhel10(KernelVariant::Default, false);

    let wrong_digest = Expectation {
        image_digest: env.rhel9().digest.clone(),
        ..good.clone()
    };
    let m = mismatches(env.verify(&staged, &booted, &wrong_digest).await);
    assert_eq!(m.len(), 1, "{m:#?}");
    assert!(
        m[0].contains(&good.image_digest) && m[0].contains(&env.rhel9().digest),
        "{m:#?}"
    );

    let realtime = Expectation {
        kernel: KernelVariant::Realtime,
        ..good.clone()
    };
    let m = mismatches(env.verify(&staged, &booted, &realtime).await);
    assert_eq!(m.len(), 1, "{m:#?}");
    assert!(
        m[0].contains("is a default kernel, expected realtime"),
        "{m:#?}"
    );

    // Every testbed tree ships the FIPS policy and dracut module; the kernel arguments lack
    // fips=1 on a non-FIPS host.
    let fips = Expectation {
        fips: true,
        ..good.clone()
    };
    let m = mismatches(env.verify(&staged, &booted, &fips).await);
    assert_eq!(
        m,
        ["the node is FIPS but the staged kernel arguments lack fips=1"]
    );

    let major9 = Expectation {
        target_major: 9,
        ..good.clone()
    };
    let m = mismatches(env.verify(&staged, &booted, &major9).await);
    assert_eq!(m.len(), 1, "{m:#?}");
    assert!(m[0].contains("(major 10), expected major 9"), "{m:#?}");

    let all_wrong = Expectation {
        image_digest: env.rhel9().digest.clone(),
        target_major: 9,
        kernel: KernelVariant::SixtyFourK,
        fips: true,
    };
    let err = env
        .verify(&staged, &booted, &all_wrong)
        .await
        .expect_err("four differences");
    assert_eq!(mismatches(Err(err.clone())).len(), 4, "{err}");
    assert!(
        err.to_string()
            .starts_with("the staged deployment does not match: "),
        "{err}"
    );

    // Verifying the booted rhel-9 deployment as if it were staged names its release.
    let m = mismatches(env.verify(&booted, &booted, &good).await);
    assert_eq!(m.len(), 2, "digest and major: {m:#?}");
}

#[tokio::test]
async fn fips_host_verifies_and_a_lost_fips_karg_is_found_on_disk() {
    let env = Env::new("fips", "fips").await;
    env.rebase_rhel10().await;
    let (staged, booted) = env.staged_and_booted().await;
    let exp = env.expect_rhel10(KernelVariant::Default, true);
    assert_eq!(env.verify(&staged, &booted, &exp).await, Ok(()));

    // Drop fips=1 from the staged deployment's bootloader entry: the kernel arguments are read
    // from disk, not from what rpm-ostreed reported.
    let entry = entry_of(&env.sysroot(), &staged);
    let text = std::fs::read_to_string(&entry).expect("entry");
    assert!(text.contains(" fips=1"), "{text}");
    std::fs::write(&entry, text.replace(" fips=1", "")).expect("rewrite entry");
    let m = mismatches(env.verify(&staged, &booted, &exp).await);
    assert_eq!(
        m,
        [
            "kernel argument \"fips=1\" of the booted deployment is missing from the staged one",
            "the node is FIPS but the staged kernel arguments lack fips=1",
        ]
    );
}

#[tokio::test]
async fn realtime_host_staged_with_el10_kernel_rt_verifies() {
    let env = Env::new("realtime", "realtime").await;
    // The el9 kernel-rt overrides are swapped for el10 builds in the same transaction (a
    // plain rebase fails the depsolve); the fake reads the RPMs from real descriptors.
    let (version, release) = testbed::fixtures::kernel_version_release(&env.rhel10().kernel);
    let rpm_dir = env.dir.join("rpms");
    std::fs::create_dir_all(&rpm_dir).expect("rpm dir");
    let files: Vec<std::fs::File> = KERNEL_RT
        .iter()
        .map(|name| {
            let nevra = testbed::fixtures::packages::Nevra::parse(&format!(
                "{name}-{version}-{release}.x86_64"
            ))
            .expect("nevra");
            let path = rpm_dir.join(format!("{nevra}.rpm"));
            std::fs::write(&path, testbed::fixtures::packages::fake_rpm(&nevra))
                .expect("write rpm");
            std::fs::File::open(&path).expect("open rpm")
        })
        .collect();
    let fds: Vec<zvariant::Fd<'_>> = files.iter().map(|f| f.as_fd().into()).collect();
    env.stage(&dict(&[
        ("set-refspec", Value::from(refspec(env.rhel10()))),
        ("uninstall-packages", Value::from(KERNEL_RT.to_vec())),
        ("install-local-packages", Value::from(fds)),
    ]))
    .await;
    let (staged, booted) = env.staged_and_booted().await;
    assert_eq!(
        env.verify(
            &staged,
            &booted,
            &env.expect_rhel10(KernelVariant::Realtime, false)
        )
        .await,
        Ok(())
    );
    let m = mismatches(
        env.verify(
            &staged,
            &booted,
            &env.expect_rhel10(KernelVariant::Default, false),
        )
        .await,
    );
    assert_eq!(m.len(), 1, "{m:#?}");
    assert!(
        m[0].contains(&format!(
            "{version}-{release}.x86_64+rt is a realtime kernel, expected default"
        )),
        "{m:#?}"
    );
}

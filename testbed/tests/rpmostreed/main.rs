//! The fake rpm-ostreed against a real `dbus-daemon` and real zbus clients.

mod introspection;
mod libostree;
mod sysroot;
mod transactions;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use testbed::control::RpmOstreedCmd;
use testbed::fakes::rpmostreed::{FakeRpmOstreed, RpmOstreedConfig};
use testbed::fixtures::images::{DEFAULT_REGISTRY, TestImage, catalog};
use testbed::fixtures::{self, Fixture};
use testbed::scratch::ScratchDir;
use zbus::message::Message;
use zbus::zvariant::{self, OwnedValue, Value};
use zbus::{Connection, MessageStream};

const BUS_NAME: &str = "org.projectatomic.rpmostree1";
const SYSROOT_PATH: &str = "/org/projectatomic/rpmostree1/Sysroot";
const OS_PATH: &str = "/org/projectatomic/rpmostree1/rhcos";
const SYSROOT: &str = "org.projectatomic.rpmostree1.Sysroot";
const OS: &str = "org.projectatomic.rpmostree1.OS";
const TXN: &str = "org.projectatomic.rpmostree1.Transaction";
const GIO_FAILED: &str = "org.gtk.GDBus.UnmappedGError.Quark._g_2dio_2derror_2dquark.Code0";
const GIO_NOT_FOUND: &str = "org.gtk.GDBus.UnmappedGError.Quark._g_2dio_2derror_2dquark.Code1";
const GIO_BUSY: &str = "org.gtk.GDBus.UnmappedGError.Quark._g_2dio_2derror_2dquark.Code26";
const WAIT: Duration = Duration::from_secs(10);

type Dict = HashMap<String, OwnedValue>;

/// A private system-bus-like `dbus-daemon`, killed on drop.
struct BusDaemon {
    child: Child,
    address: String,
}

impl BusDaemon {
    fn start(dir: &Path) -> BusDaemon {
        let config = dir.join("system.conf");
        std::fs::write(
            &config,
            format!(
                "<busconfig><type>system</type><listen>unix:path={}</listen><auth>EXTERNAL</auth>\
                 <policy context=\"default\"><allow send_destination=\"*\" eavesdrop=\"true\"/>\
                 <allow eavesdrop=\"true\"/><allow own=\"*\"/></policy></busconfig>",
                dir.join("bus.sock").display()
            ),
        )
        .expect("write bus config");
        let mut child = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", config.display()))
            .args(["--nofork", "--print-address"])
            .stdout(Stdio::piped())
            // It complains that it cannot raise its fd limit; that is harmless here.
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn dbus-daemon");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read bus address");
        assert!(line.starts_with("unix:"), "bus address: {line:?}");
        BusDaemon {
            child,
            address: line.trim().to_string(),
        }
    }
}

impl Drop for BusDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Bus, fake daemon and a client connection; dropped in this order.
struct Env {
    client: Connection,
    fake: Option<FakeRpmOstreed>,
    images: Vec<TestImage>,
    fixture: Fixture,
    /// The fake stages through real libostree.
    real_libostree: bool,
    bus: BusDaemon,
    dir: ScratchDir,
}

impl Env {
    async fn new() -> Env {
        Env::with_host("default").await
    }

    /// A fake on the host fixture `name`, with its host root written the way the testbed does.
    async fn with_host(name: &str) -> Env {
        Env::start(name, false).await
    }

    /// A fake on the default host that stages through real libostree.
    async fn over_libostree() -> Env {
        Env::start("default", true).await
    }

    async fn start(name: &str, real_libostree: bool) -> Env {
        let dir = ScratchDir::new("rpmostreed").expect("scratch dir");
        let bus = BusDaemon::start(&dir);
        let images = catalog(DEFAULT_REGISTRY);
        let mut env = Env {
            client: connect(&bus.address).await,
            fake: None,
            images,
            fixture: fixtures::fixture(name).expect("fixture"),
            real_libostree,
            bus,
            dir,
        };
        let fake = FakeRpmOstreed::start(env.config())
            .await
            .expect("start fake");
        let cmdline = fake.booted_cmdline().expect("booted cmdline");
        testbed::harness::host_root::write(
            &env.dir.join("host"),
            "worker-0",
            &env.images[0],
            &env.fixture,
            &cmdline,
        )
        .expect("host root");
        env.fake = Some(fake);
        env
    }

    fn sysroot(&self) -> PathBuf {
        self.dir.join("sysroot")
    }

    fn config(&self) -> RpmOstreedConfig {
        RpmOstreedConfig {
            bus_address: self.bus.address.clone(),
            txn_socket: self.socket(),
            state_dir: self.dir.join("state"),
            sysroot: self.dir.join("sysroot"),
            host_root: Some(self.dir.join("host")),
            fixture: self.fixture,
            osname: "rhcos".into(),
            images: self.images.clone(),
            booted: 0,
            version: testbed::RpmOstreeVersion::default(),
            real_libostree: self.real_libostree,
        }
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("rpm-ostree-transaction.sock")
    }

    fn rhel9(&self) -> &TestImage {
        &self.images[0]
    }

    fn rhel10(&self) -> &TestImage {
        &self.images[1]
    }

    async fn control(&self, cmd: RpmOstreedCmd) -> serde_json::Value {
        self.fake
            .as_ref()
            .expect("fake running")
            .control(cmd)
            .await
            .expect("control command")
    }

    async fn deployments(&self) -> Vec<Dict> {
        let v = prop(&self.client, SYSROOT_PATH, SYSROOT, "Deployments").await;
        Vec::<Dict>::try_from(v).expect("aa{sv}")
    }

    async fn active_transaction(&self) -> (String, String, String) {
        let v = prop(&self.client, SYSROOT_PATH, SYSROOT, "ActiveTransaction").await;
        <(String, String, String)>::try_from(v).expect("(sss)")
    }

    async fn wait_idle(&self) {
        let start = Instant::now();
        while !self.active_transaction().await.0.is_empty() {
            assert!(start.elapsed() < WAIT, "transaction never released");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Rebase to `refspec` and run the transaction to its end.
    async fn rebase(&self, refspec: &str, options: &Dict) -> Signals {
        let modifiers = dict(&[("set-refspec", Value::from(refspec))]);
        self.update(&modifiers, options).await
    }

    /// One `UpdateDeployment` transaction, started and run to its end.
    async fn update(&self, modifiers: &Dict, options: &Dict) -> Signals {
        let addr = update_deployment(&self.client, modifiers, options)
            .await
            .expect("UpdateDeployment");
        let mut peer = Peer::connect(&addr).await;
        assert!(peer.start().await, "Start() starts the transaction");
        let signals = peer.until_finished().await;
        drop(peer);
        self.wait_idle().await;
        signals
    }

    /// `Cleanup(kinds)`: the address of its transaction.
    async fn cleanup_address(&self, kinds: &[&str]) -> String {
        os_call(&self.client, "Cleanup", &(kinds,))
            .await
            .expect("Cleanup")
            .body()
            .deserialize::<String>()
            .expect("address")
    }

    /// `UpdateDeployment(modifiers, {})` run to its end; the `Finished` arguments.
    async fn deploy(&self, modifiers: &Dict) -> (bool, String) {
        let addr = update_deployment(&self.client, modifiers, &Dict::new())
            .await
            .expect("UpdateDeployment");
        let mut peer = Peer::connect(&addr).await;
        assert!(peer.start().await);
        let finished = peer.until_finished().await.finished.expect("Finished");
        drop(peer);
        self.wait_idle().await;
        finished
    }

    /// `GetDeploymentBootConfig(index, false)`: the boot configuration of a deployment.
    async fn boot_config(&self, index: &str) -> Dict {
        os_call(&self.client, "GetDeploymentBootConfig", &(index, false))
            .await
            .expect("boot config")
            .body()
            .deserialize()
            .expect("a{sv}")
    }

    /// libostree's `/run/ostree/staged-deployment` below the host root, decoded.
    fn staged_record(&self) -> Option<HashMap<String, OwnedValue>> {
        let bytes = std::fs::read(self.dir.join("host/run/ostree/staged-deployment")).ok()?;
        let ctxt = zvariant::serialized::Context::new(
            zvariant::serialized::Format::GVariant,
            zvariant::NATIVE_ENDIAN,
            0,
        );
        let data = zvariant::serialized::Data::new(bytes, ctxt);
        Some(data.deserialize().expect("a{sv} GVariant").0)
    }

    /// The legacy `/run/ostree/staged-deployment-locked` below the host root.
    fn legacy_lock_file(&self) -> PathBuf {
        self.dir.join("host/run/ostree/staged-deployment-locked")
    }

    /// The fake's `state/state.json` as it is on disk.
    fn state_on_disk(&self) -> serde_json::Value {
        serde_json::from_slice(
            &std::fs::read(self.dir.join("state/state.json")).expect("state.json"),
        )
        .expect("state json")
    }

    /// `Cleanup(["pending-deploy"])` run to a successful end.
    async fn cleanup_pending(&self) {
        let addr = self.cleanup_address(&["pending-deploy"]).await;
        self.run_to_success(&addr).await;
    }

    /// Starts the transaction at `addr`, expects it to finish successfully and waits until
    /// the daemon has let it go.
    async fn run_to_success(&self, addr: &str) {
        let mut peer = Peer::connect(addr).await;
        assert!(peer.start().await);
        assert_eq!(
            peer.until_finished().await.finished,
            Some((true, String::new()))
        );
        drop(peer);
        self.wait_idle().await;
    }

    async fn last_record(&self) -> serde_json::Value {
        let records = self.control(RpmOstreedCmd::Transactions).await;
        records
            .as_array()
            .and_then(|r| r.last())
            .cloned()
            .expect("a transaction record")
    }
}

async fn connect(address: &str) -> Connection {
    zbus::connection::Builder::address(address)
        .expect("bus address")
        .build()
        .await
        .expect("connect to bus")
}

fn dict(entries: &[(&str, Value<'_>)]) -> Dict {
    entries
        .iter()
        .map(|(k, v)| (k.to_string(), v.try_to_owned().expect("owned value")))
        .collect()
}

fn registry_ref(image: &TestImage) -> String {
    format!("ostree-unverified-registry:{}", image.pullspec)
}

/// Modifiers that rebase to `image` in the registry: `set-refspec` alone.
fn rebase_to(image: &TestImage) -> Dict {
    dict(&[("set-refspec", Value::from(registry_ref(image)))])
}

/// `files` as `ah` handles (borrowing their descriptors).
fn handles(files: &[std::fs::File]) -> Vec<zvariant::Fd<'_>> {
    files.iter().map(|f| f.as_fd().into()).collect()
}

async fn prop(conn: &Connection, path: &str, iface: &str, name: &str) -> OwnedValue {
    conn.call_method(
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

async fn update_deployment(
    conn: &Connection,
    modifiers: &Dict,
    options: &Dict,
) -> zbus::Result<String> {
    conn.call_method(
        Some(BUS_NAME),
        OS_PATH,
        Some(OS),
        "UpdateDeployment",
        &(modifiers, options),
    )
    .await?
    .body()
    .deserialize::<String>()
}

async fn os_call<B>(conn: &Connection, method: &str, body: &B) -> zbus::Result<Message>
where
    B: serde::Serialize + zvariant::DynamicType,
{
    conn.call_method(Some(BUS_NAME), OS_PATH, Some(OS), method, body)
        .await
}

/// (error name, message) of a D-Bus error reply.
fn dbus_error(result: zbus::Result<impl std::fmt::Debug>) -> (String, String) {
    match result {
        Err(zbus::Error::MethodError(name, message, _)) => {
            (name.to_string(), message.unwrap_or_default())
        }
        other => panic!("expected a D-Bus error, got {other:?}"),
    }
}

/// A peer-to-peer client of a transaction.
struct Peer {
    conn: Connection,
    stream: MessageStream,
}

/// The signals a peer saw, in order.
struct Signals {
    all: Vec<(String, Message)>,
    finished: Option<(bool, String)>,
}

impl Signals {
    fn strings(&self, member: &str) -> Vec<String> {
        self.all
            .iter()
            .filter(|(m, _)| m == member)
            .map(|(_, msg)| {
                let (text,): (String,) = msg.body().deserialize().expect("(s)");
                text
            })
            .collect()
    }

    fn percents(&self) -> Vec<u32> {
        self.all
            .iter()
            .filter(|(m, _)| m == "PercentProgress")
            .map(|(_, msg)| {
                let (_, pct): (String, u32) = msg.body().deserialize().expect("(su)");
                pct
            })
            .collect()
    }

    fn count(&self, member: &str) -> usize {
        self.all.iter().filter(|(m, _)| m == member).count()
    }
}

impl Peer {
    async fn connect(address: &str) -> Peer {
        let conn = zbus::connection::Builder::address(address)
            .expect("transaction address")
            .p2p()
            .max_queued(100_000)
            .build()
            .await
            .expect("connect to the transaction");
        let stream = MessageStream::from(&conn);
        Peer { conn, stream }
    }

    async fn call(&self, method: &str) -> zbus::Result<Message> {
        self.conn
            .call_method(None::<&str>, "/", Some(TXN), method, &())
            .await
    }

    async fn start(&self) -> bool {
        self.call("Start")
            .await
            .expect("Start")
            .body()
            .deserialize::<bool>()
            .expect("b")
    }

    async fn prop(&self, name: &str) -> OwnedValue {
        self.conn
            .call_method(
                None::<&str>,
                "/",
                Some("org.freedesktop.DBus.Properties"),
                "Get",
                &(TXN, name),
            )
            .await
            .expect("Get")
            .body()
            .deserialize::<OwnedValue>()
            .expect("variant")
    }

    /// Signals up to and including `Finished`, or until the connection ends.
    async fn until_finished(&mut self) -> Signals {
        let mut signals = Signals {
            all: Vec::new(),
            finished: None,
        };
        let deadline = Instant::now() + WAIT;
        loop {
            let next = tokio::time::timeout_at(deadline.into(), self.stream.next())
                .await
                .expect("transaction signals timed out");
            let Some(Ok(msg)) = next else { break };
            let header = msg.header();
            if header.message_type() != zbus::message::Type::Signal
                || header.interface().map(|i| i.as_str()) != Some(TXN)
            {
                continue;
            }
            let member = header.member().map(|m| m.to_string()).unwrap_or_default();
            if member == "Finished" {
                let (ok, message): (bool, String) = msg.body().deserialize().expect("(bs)");
                signals.finished = Some((ok, message));
                signals.all.push((member, msg.clone()));
                break;
            }
            signals.all.push((member, msg.clone()));
        }
        signals
    }
}

fn sig_of(d: &Dict, key: &str) -> String {
    d.get(key)
        .unwrap_or_else(|| panic!("deployment has no {key}"))
        .value_signature()
        .to_string()
}

fn string_of(d: &Dict, key: &str) -> String {
    match d.get(key).map(|v| &**v) {
        Some(Value::Str(s)) => s.to_string(),
        other => panic!("{key} is not a string: {other:?}"),
    }
}

fn bool_of(d: &Dict, key: &str) -> bool {
    match d.get(key).map(|v| &**v) {
        Some(Value::Bool(b)) => *b,
        other => panic!("{key} is not a boolean: {other:?}"),
    }
}

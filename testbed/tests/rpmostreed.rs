//! The fake rpm-ostreed against a real `dbus-daemon` and real zbus clients.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;
use testbed::control::{InhibitMode, Inhibitor, LogindCmd, RpmOstreedCmd};
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
    bus: BusDaemon,
    dir: ScratchDir,
}

impl Env {
    async fn new() -> Env {
        Env::with_host("default").await
    }

    /// A fake on the host fixture `name`, with its host root written the way the testbed does.
    async fn with_host(name: &str) -> Env {
        let dir = ScratchDir::new("rpmostreed").expect("scratch dir");
        let bus = BusDaemon::start(&dir);
        let images = catalog(DEFAULT_REGISTRY);
        let mut env = Env {
            client: connect(&bus.address).await,
            fake: None,
            images,
            fixture: fixtures::fixture(name).expect("fixture"),
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

// ---------------------------------------------------------------------------------------
// Introspection against the reference XML
// ---------------------------------------------------------------------------------------

/// A member of an interface: kind, name, and its typed shape.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Member {
    kind: String,
    name: String,
    /// (type, direction) of each argument; signal arguments are always "out".
    args: Vec<(String, String)>,
    /// (type, access) of a property.
    property: Option<(String, String)>,
}

type Interfaces = BTreeMap<String, BTreeMap<(String, String), Member>>;

/// The tags of an XML document: (name, attributes, self-closing, closing).
fn xml_tags(xml: &str) -> Vec<(String, HashMap<String, String>, bool, bool)> {
    let mut tags = Vec::new();
    let mut rest = xml;
    while let Some(start) = rest.find('<') {
        rest = &rest[start..];
        if let Some(body) = rest.strip_prefix("<!--") {
            let end = body.find("-->").expect("unterminated comment");
            rest = &body[end + 3..];
            continue;
        }
        // Find the closing '>' outside quotes (attribute values may contain '>').
        let mut quoted = false;
        let mut end = None;
        for (i, c) in rest.char_indices() {
            match c {
                '"' => quoted = !quoted,
                '>' if !quoted => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let end = end.expect("unterminated tag");
        let tag = &rest[1..end];
        rest = &rest[end + 1..];
        if tag.starts_with('!') || tag.starts_with('?') {
            continue;
        }
        let closing = tag.starts_with('/');
        let self_closing = tag.ends_with('/');
        let tag = tag.trim_start_matches('/').trim_end_matches('/');
        let name = tag
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string();
        let mut attrs = HashMap::new();
        let mut a = &tag[name.len()..];
        while let Some(eq) = a.find('=') {
            let key = a[..eq].trim().to_string();
            let after = &a[eq + 1..];
            let open = after.find('"').expect("quoted attribute");
            let close = after[open + 1..].find('"').expect("closing quote") + open + 1;
            attrs.insert(key, after[open + 1..close].to_string());
            a = &after[close + 1..];
        }
        tags.push((name, attrs, self_closing, closing));
    }
    tags
}

fn parse_interfaces(xml: &str) -> Interfaces {
    let mut out = Interfaces::new();
    let mut iface: Option<String> = None;
    let mut member: Option<Member> = None;
    for (name, attrs, self_closing, closing) in xml_tags(xml) {
        let attr = |k: &str| attrs.get(k).cloned().unwrap_or_default();
        match (name.as_str(), closing) {
            ("interface", false) => iface = Some(attr("name")),
            ("interface", true) => iface = None,
            ("method" | "signal", false) => {
                let m = Member {
                    kind: name.clone(),
                    name: attr("name"),
                    args: Vec::new(),
                    property: None,
                };
                if self_closing {
                    let i = iface.clone().expect("member outside interface");
                    out.entry(i)
                        .or_default()
                        .insert((m.kind.clone(), m.name.clone()), m);
                } else {
                    member = Some(m);
                }
            }
            ("method" | "signal", true) => {
                let m = member.take().expect("closing member");
                let i = iface.clone().expect("member outside interface");
                out.entry(i)
                    .or_default()
                    .insert((m.kind.clone(), m.name.clone()), m);
            }
            ("arg", false) => {
                let m = member.as_mut().expect("arg outside member");
                let direction = if m.kind == "signal" {
                    "out".to_string()
                } else {
                    attrs
                        .get("direction")
                        .cloned()
                        .unwrap_or_else(|| "in".into())
                };
                m.args.push((attr("type"), direction));
            }
            ("property", false) => {
                let i = iface.clone().expect("property outside interface");
                let m = Member {
                    kind: "property".into(),
                    name: attr("name"),
                    args: Vec::new(),
                    property: Some((attr("type"), attr("access"))),
                };
                out.entry(i)
                    .or_default()
                    .insert((m.kind.clone(), m.name.clone()), m);
            }
            _ => {}
        }
    }
    out
}

/// Every exported member that is missing from the reference or differs from it.
fn mismatches(exported: &Interfaces, reference: &Interfaces) -> Vec<String> {
    let mut out = Vec::new();
    for (iface, members) in exported {
        if iface.starts_with("org.freedesktop.DBus.") {
            continue;
        }
        let Some(ref_members) = reference.get(iface) else {
            out.push(format!("interface {iface} is not in the reference"));
            continue;
        };
        for (key, m) in members {
            match ref_members.get(key) {
                None => out.push(format!(
                    "{iface}: {} {} is not in the reference",
                    m.kind, m.name
                )),
                Some(r) if r != m => out.push(format!("{iface}: {m:?} differs from {r:?}")),
                Some(_) => {}
            }
        }
    }
    out
}

fn reference_xml() -> String {
    let path = std::env::var("RPMOSTREE_REFERENCE_XML").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/rpm-ostree/org.projectatomic.rpmostree1.xml"
        )
        .to_string()
    });
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

async fn introspect(conn: &Connection, destination: Option<&str>, path: &str) -> String {
    conn.call_method(
        destination,
        path,
        Some("org.freedesktop.DBus.Introspectable"),
        "Introspect",
        &(),
    )
    .await
    .unwrap_or_else(|e| panic!("Introspect {path}: {e}"))
    .body()
    .deserialize::<String>()
    .expect("xml")
}

#[tokio::test]
async fn introspection_matches_the_reference_interface() {
    let env = Env::new().await;
    let reference_text = reference_xml();
    let reference = parse_interfaces(&reference_text);

    let mut exported = Interfaces::new();
    for path in [SYSROOT_PATH, OS_PATH] {
        exported.extend(parse_interfaces(
            &introspect(&env.client, Some(BUS_NAME), path).await,
        ));
    }
    let addr = env.cleanup_address(&[]).await;
    let peer = Peer::connect(&addr).await;
    exported.extend(parse_interfaces(&introspect(&peer.conn, None, "/").await));

    // Not vacuous: the members the agent relies on are all exported.
    for (iface, kind, name) in [
        (SYSROOT, "property", "Deployments"),
        (SYSROOT, "property", "ActiveTransaction"),
        (SYSROOT, "method", "RegisterClient"),
        (SYSROOT, "method", "GetOS"),
        (OS, "method", "UpdateDeployment"),
        (OS, "method", "Rebase"),
        (OS, "method", "Cleanup"),
        (OS, "method", "FinalizeDeployment"),
        (OS, "method", "GetDeploymentBootConfig"),
        (OS, "property", "DefaultDeployment"),
        (TXN, "method", "Start"),
        (TXN, "method", "Cancel"),
        (TXN, "signal", "Finished"),
        (TXN, "signal", "PercentProgress"),
        (TXN, "property", "Title"),
    ] {
        assert!(
            exported
                .get(iface)
                .is_some_and(|m| m.contains_key(&(kind.to_string(), name.to_string()))),
            "{iface} {kind} {name} is not exported"
        );
    }
    let problems = mismatches(&exported, &reference);
    assert!(problems.is_empty(), "{problems:#?}");

    // The comparison catches a changed signature.
    let mutated = reference_text.replace(
        r#"<arg type="a{sv}" name="modifiers" direction="in"/>"#,
        r#"<arg type="a{ss}" name="modifiers" direction="in"/>"#,
    );
    assert_ne!(mutated, reference_text);
    let problems = mismatches(&exported, &parse_interfaces(&mutated));
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert!(problems[0].contains("UpdateDeployment"), "{problems:#?}");
}

// ---------------------------------------------------------------------------------------
// Transactions
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn rebase_transaction_stages_a_locked_deployment() {
    let env = Env::new().await;
    os_call(&env.client, "GetDeploymentBootConfig", &("", false))
        .await
        .expect("boot config");
    env.client
        .call_method(
            Some(BUS_NAME),
            SYSROOT_PATH,
            Some(SYSROOT),
            "RegisterClient",
            &(dict(&[("id", Value::from("streamd-test"))]),),
        )
        .await
        .expect("RegisterClient");

    // The booted deployment has the real keys and types.
    let deployments = env.deployments().await;
    assert_eq!(deployments.len(), 1);
    let booted = &deployments[0];
    for (key, sig) in [
        ("id", "s"),
        ("osname", "s"),
        ("serial", "i"),
        ("checksum", "s"),
        ("booted", "b"),
        ("staged", "b"),
        ("pinned", "b"),
        ("unlocked", "s"),
        ("base-commit-meta", "a{sv}"),
        ("packages", "as"),
        ("base-removals", "av"),
        ("base-local-replacements", "a(vv)"),
        ("base-remote-replacements", "a{sv}"),
        ("requested-packages", "as"),
        ("requested-local-packages", "as"),
        ("requested-local-fileoverride-packages", "as"),
        ("requested-base-removals", "as"),
        ("requested-base-local-replacements", "as"),
        ("regenerate-initramfs", "b"),
        ("version", "s"),
        ("timestamp", "t"),
        ("container-image-reference", "s"),
        ("container-image-reference-digest", "s"),
    ] {
        assert_eq!(sig_of(booted, key), sig, "type of {key}");
    }
    assert!(
        !booted.contains_key("origin"),
        "container deployments have no origin"
    );
    assert!(!booted.contains_key("finalization-locked"));
    assert!(bool_of(booted, "booted"));
    assert_eq!(string_of(booted, "osname"), "rhcos");
    assert_eq!(string_of(booted, "unlocked"), "none");
    let checksum = string_of(booted, "checksum");
    assert_eq!(checksum.len(), 64);
    assert_eq!(string_of(booted, "id"), format!("rhcos-{checksum}.0"));
    assert_eq!(
        string_of(booted, "container-image-reference"),
        registry_ref(env.rhel9())
    );
    assert_eq!(
        string_of(booted, "container-image-reference-digest"),
        env.rhel9().digest
    );
    let meta = Dict::try_from(booted["base-commit-meta"].clone()).expect("a{sv}");
    assert_eq!(
        string_of(&meta, "ostree.manifest-digest"),
        env.rhel9().digest
    );
    let config: serde_json::Value =
        serde_json::from_str(&string_of(&meta, "ostree.container.image-config")).expect("json");
    assert_eq!(
        config["config"]["Labels"]["io.openshift.os.streamclass"],
        "rhel-9"
    );

    let booted_path = prop(&env.client, SYSROOT_PATH, SYSROOT, "Booted").await;
    assert_eq!(
        &*booted_path,
        &Value::from(zvariant::ObjectPath::from_static_str_unchecked(OS_PATH))
    );

    // Watch property changes the way a caching proxy would.
    let rule = zbus::MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .interface("org.freedesktop.DBus.Properties")
        .expect("interface")
        .member("PropertiesChanged")
        .expect("member")
        .path(SYSROOT_PATH)
        .expect("path")
        .build();
    let mut changes = MessageStream::for_match_rule(rule, &env.client, Some(64))
        .await
        .expect("match rule");

    // Create the transaction.
    let modifiers = rebase_to(env.rhel10());
    let options = dict(&[
        ("lock-finalization", Value::from(true)),
        ("initiating-command-line", Value::from("streamd rebase")),
    ]);
    let addr = update_deployment(&env.client, &modifiers, &options)
        .await
        .expect("UpdateDeployment");
    assert_eq!(addr, format!("unix:path={}", env.socket().display()));
    let unique = env.client.unique_name().expect("unique name").to_string();
    assert_eq!(
        env.active_transaction().await,
        ("UpdateDeployment".to_string(), unique, OS_PATH.to_string())
    );
    let path = prop(&env.client, SYSROOT_PATH, SYSROOT, "ActiveTransactionPath").await;
    assert_eq!(&*path, &Value::from(addr.as_str()));

    let mut peer = Peer::connect(&addr).await;
    assert_eq!(&*peer.prop("Title").await, &Value::from("new-deployment"));
    let who = String::try_from(peer.prop("InitiatingClientDescription").await).expect("s");
    assert!(who.starts_with("client(id:streamd-test dbus:1."), "{who}");
    assert!(who.ends_with(" uid:0)"), "{who}");
    assert!(peer.start().await);
    assert!(
        !peer.start().await,
        "a second Start() does not start it again"
    );
    let signals = peer.until_finished().await;
    assert_eq!(signals.finished, Some((true, String::new())));

    let messages = signals.strings("Message");
    let imgref = registry_ref(env.rhel10());
    assert_eq!(messages[0], format!("Pulling manifest: {imgref}"));
    assert_eq!(
        messages[1],
        format!("Importing: {imgref} (digest: {})", env.rhel10().digest)
    );
    assert_eq!(messages[2], "ostree chunk layers needed: 12 (1.2 GB)");
    let tasks = signals.strings("TaskBegin");
    assert_eq!(tasks.len(), 13, "{tasks:?}");
    assert!(
        tasks[0].starts_with("[1/12] Fetching ostree chunk sha256:"),
        "{tasks:?}"
    );
    assert!(tasks[0].ends_with(" (100.0 MB)"), "{tasks:?}");
    assert_eq!(tasks[12], "Staging deployment");
    assert!(
        signals.percents().is_empty(),
        "a container pull reports layer tasks only"
    );
    assert_eq!(signals.count("ProgressEnd"), 1);
    assert_eq!(
        signals.all.last().map(|(m, _)| m.as_str()),
        Some("Finished")
    );
    assert_eq!(&*peer.prop("Title").await, &Value::from("streamd rebase"));

    let deployments = env.deployments().await;
    assert_eq!(deployments.len(), 2);
    let staged = &deployments[0];
    assert!(bool_of(staged, "staged"));
    assert!(!bool_of(staged, "booted"));
    assert_eq!(
        string_of(staged, "container-image-reference-digest"),
        env.rhel10().digest
    );
    assert_eq!(string_of(staged, "container-image-reference"), imgref);
    assert_eq!(string_of(staged, "version"), env.rhel10().version);
    // rpm-ostree >= v2024.6 reports no `finalization-locked`: the lock is only libostree's
    // `locked` key in /run/ostree/staged-deployment, and no legacy lock file exists.
    assert!(!staged.contains_key("finalization-locked"), "{staged:?}");
    let record = env.staged_record().expect("/run/ostree/staged-deployment");
    assert_eq!(record.get("locked").map(|v| &**v), Some(&Value::Bool(true)));
    let target = Dict::try_from(record["target"].try_clone().expect("clone")).expect("a{sv}");
    assert_eq!(
        string_of(&target, "name"),
        format!(
            "{}.{}",
            string_of(staged, "checksum"),
            i32::try_from(&*staged["serial"]).expect("i")
        )
    );
    assert_eq!(string_of(&target, "osname"), "rhcos");
    // What rpm-ostree v2025.5 passes besides the lock: the booted deployment as the merge
    // deployment, its kernel arguments, and an empty `overlay-initrds`.
    let merge =
        Dict::try_from(record["merge-deployment"].try_clone().expect("clone")).expect("a{sv}");
    assert_eq!(
        string_of(&merge, "name"),
        format!(
            "{}.{}",
            string_of(&deployments[1], "checksum"),
            i32::try_from(&*deployments[1]["serial"]).expect("i")
        )
    );
    let strs = |key: &str| -> Vec<String> {
        record[key]
            .try_clone()
            .expect("clone")
            .try_into()
            .expect("as")
    };
    assert!(
        strs("kargs").iter().any(|a| a.starts_with("ostree=")),
        "{:?}",
        strs("kargs")
    );
    assert!(strs("overlay-initrds").is_empty());
    assert!(!env.legacy_lock_file().exists());
    assert!(bool_of(&deployments[1], "booted"));
    let default =
        Dict::try_from(prop(&env.client, OS_PATH, OS, "DefaultDeployment").await).expect("a{sv}");
    assert_eq!(string_of(&default, "id"), string_of(staged, "id"));

    let changed = tokio::time::timeout(WAIT, async {
        while let Some(Ok(msg)) = changes.next().await {
            let (_, props, _): (String, Dict, Vec<String>) =
                msg.body().deserialize().expect("(sa{sv}as)");
            if let Some(v) = props.get("Deployments") {
                return Vec::<Dict>::try_from(v.clone()).expect("aa{sv}").len();
            }
        }
        0
    })
    .await
    .expect("PropertiesChanged for Deployments");
    assert_eq!(changed, 2);

    // A client that starts a finished transaction is told how it ended, on its own connection.
    let mut late = Peer::connect(&addr).await;
    assert!(!late.start().await);
    assert_eq!(
        late.until_finished().await.finished,
        Some((true, String::new()))
    );
    drop(late);
    assert_eq!(env.active_transaction().await.0, "UpdateDeployment");

    // Dropping the last peer releases the transaction at once.
    drop(peer);
    env.wait_idle().await;
    let path = prop(&env.client, SYSROOT_PATH, SYSROOT, "ActiveTransactionPath").await;
    assert_eq!(&*path, &Value::from(""));

    let records = env.control(RpmOstreedCmd::Transactions).await;
    let record = &records[0];
    assert_eq!(record["method"], "UpdateDeployment");
    assert_eq!(record["modifiers"]["set-refspec"], imgref);
    assert_eq!(record["options"]["lock-finalization"], true);
    assert_eq!(record["title"], "streamd rebase");
    assert_eq!(record["fds"], 0);
    assert_eq!(record["started"], true);
    assert_eq!(record["result"], json!({"ok": true, "message": ""}));
    assert_eq!(record["cancelled"], false);

    let json = env.control(RpmOstreedCmd::Deployments).await;
    assert_eq!(
        json[0]["container-image-reference-digest"],
        env.rhel10().digest
    );
    assert_eq!(json[0].get("finalization-locked"), None);
    let on_disk = env.state_on_disk();
    assert_eq!(on_disk["deployments"][0]["staged"], true);
}

#[tokio::test]
async fn busy_error_and_joining() {
    let env = Env::new().await;
    env.control(RpmOstreedCmd::HoldForeign { on: true }).await;
    assert_eq!(env.active_transaction().await.0, "Upgrade");
    let modifiers = rebase_to(env.rhel10());
    let options = Dict::new();
    let (name, message) = dbus_error(update_deployment(&env.client, &modifiers, &options).await);
    assert_eq!(name, GIO_BUSY);
    assert_eq!(
        message,
        "Transaction in progress: upgrade\n You can cancel the current transaction with `rpm-ostree cancel`"
    );
    let (name, _) = dbus_error(os_call(&env.client, "Cleanup", &(vec!["pending-deploy"],)).await);
    assert_eq!(name, GIO_BUSY);
    // The foreign transaction can be watched like `rpm-ostree` does: attach, Start, wait.
    let path = prop(&env.client, SYSROOT_PATH, SYSROOT, "ActiveTransactionPath").await;
    let mut watcher = Peer::connect(&String::try_from(path).expect("s")).await;
    assert!(!watcher.start().await, "someone else started it");
    env.control(RpmOstreedCmd::HoldForeign { on: false }).await;
    assert_eq!(
        watcher.until_finished().await.finished,
        Some((true, String::new()))
    );
    drop(watcher);
    env.wait_idle().await;

    // An identical request joins the running transaction.
    env.control(RpmOstreedCmd::Slow { ms: 400 }).await;
    let addr = update_deployment(&env.client, &modifiers, &options)
        .await
        .expect("UpdateDeployment");
    let mut first = Peer::connect(&addr).await;
    assert!(first.start().await);
    let other = connect(&env.bus.address).await;
    let joined = update_deployment(&other, &modifiers, &options)
        .await
        .expect("join");
    assert_eq!(joined, addr);
    let mut second = Peer::connect(&joined).await;
    assert!(!second.start().await, "joining does not start it again");
    // A different request is refused, naming the running transaction.
    let different = dict(&[("reboot", Value::from(false))]);
    let (name, message) = dbus_error(update_deployment(&other, &modifiers, &different).await);
    assert_eq!(name, GIO_BUSY);
    assert!(
        message.starts_with("Transaction in progress: rebase\n"),
        "{message}"
    );

    assert_eq!(
        first.until_finished().await.finished,
        Some((true, String::new()))
    );
    assert_eq!(
        second.until_finished().await.finished,
        Some((true, String::new()))
    );
    drop((first, second));
    env.wait_idle().await;
    let records = env.control(RpmOstreedCmd::Transactions).await;
    let ok: Vec<_> = records
        .as_array()
        .expect("array")
        .iter()
        .filter(|r| r["error"].is_null())
        .collect();
    assert_eq!(ok.len(), 1, "{records:#}");
    assert_eq!(ok[0]["joined"], 1);
}

#[tokio::test]
async fn caller_leaving_before_start_drops_the_transaction() {
    let env = Env::new().await;
    let caller = connect(&env.bus.address).await;
    let modifiers = rebase_to(env.rhel10());
    update_deployment(&caller, &modifiers, &Dict::new())
        .await
        .expect("UpdateDeployment");
    assert_eq!(env.active_transaction().await.0, "UpdateDeployment");
    caller.close().await.expect("close");
    env.wait_idle().await;

    let signals = env.rebase(&registry_ref(env.rhel10()), &Dict::new()).await;
    assert_eq!(signals.finished, Some((true, String::new())));
    let records = env.control(RpmOstreedCmd::Transactions).await;
    assert_eq!(records[0]["dropped"], true);
    assert_eq!(records[0]["started"], false);
    assert_eq!(records[1]["result"]["ok"], true);
}

#[tokio::test]
async fn failures_inside_transactions() {
    let env = Env::new().await;
    env.control(RpmOstreedCmd::FailNext {
        message: "injected failure".into(),
    })
    .await;
    let signals = env.rebase(&registry_ref(env.rhel10()), &Dict::new()).await;
    assert_eq!(
        signals.finished,
        Some((false, "injected failure".to_string()))
    );

    let unknown = format!(
        "ostree-unverified-registry:{DEFAULT_REGISTRY}/openshift/rhcos@sha256:{}",
        "0".repeat(64)
    );
    let signals = env.rebase(&unknown, &Dict::new()).await;
    let (ok, message) = signals.finished.expect("finished");
    assert!(!ok);
    assert!(
        message.ends_with(&format!(
            "reading manifest sha256:{} in 127.0.0.1:5000/openshift/rhcos: manifest unknown",
            "0".repeat(64)
        )),
        "{message}"
    );

    let signals = env.rebase(&registry_ref(env.rhel9()), &Dict::new()).await;
    assert_eq!(
        signals.finished,
        Some((
            false,
            format!("Old and new refs are equal: {}", registry_ref(env.rhel9()))
        ))
    );

    let signals = env
        .rebase("fedora:fedora/x86_64/coreos/stable", &Dict::new())
        .await;
    assert_eq!(
        signals.finished,
        Some((false, "Remote \"fedora\" not found".to_string()))
    );
    assert_eq!(env.deployments().await.len(), 1, "nothing was staged");
}

#[tokio::test]
async fn method_argument_errors() {
    let env = Env::new().await;
    // Two `ah` indices, one descriptor attached. zvariant gives every handle a descriptor of
    // its own, so serialize two and point the second index at the first descriptor.
    let files = [
        std::fs::File::open("/dev/null").expect("/dev/null"),
        std::fs::File::open("/dev/null").expect("/dev/null"),
    ];
    let handles = handles(&files);
    let modifiers: HashMap<&str, Value<'_>> =
        HashMap::from([("install-local-packages", Value::from(handles))]);
    let body = (modifiers, HashMap::<&str, Value<'_>>::new());
    let ctxt = zvariant::serialized::Context::new_dbus(zvariant::LE, 0);
    let data = zvariant::to_bytes(ctxt, &body).expect("serialize");
    assert_eq!(data.fds().len(), 2);
    let mut bytes = data.bytes().to_vec();
    // Layout: array length, padding, key, "ah" signature, array length 8, then the indices.
    assert_eq!(&bytes[40..52], &[8, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]);
    bytes[48] = 0;
    let fd = data.fds()[0].as_fd().try_clone_to_owned().expect("dup");
    let msg = Message::method_call(OS_PATH, "UpdateDeployment")
        .expect("call")
        .destination(BUS_NAME)
        .expect("destination")
        .interface(OS)
        .expect("interface")
        .endian(zvariant::LE);
    // SAFETY: the body was serialized for exactly this signature, endianness and descriptor.
    // A raw, malformed body is what this test sends: the one unsafe call of the testbed's tests.
    #[allow(unsafe_code)]
    let msg =
        unsafe { msg.build_raw_body(&bytes, "(a{sv}a{sv})", vec![fd.into()]) }.expect("build");
    let serial = msg.primary_header().serial_num();
    let mut replies = MessageStream::from(&env.client);
    env.client.send(&msg).await.expect("send");
    let reply = tokio::time::timeout(WAIT, async {
        while let Some(Ok(m)) = replies.next().await {
            if m.header().reply_serial() == Some(serial) {
                return m;
            }
        }
        panic!("no reply");
    })
    .await
    .expect("reply in time");
    // The real daemon validates in `deploy_transaction_execute`, after Start().
    assert_eq!(reply.header().error_name(), None, "{reply:?}");
    let addr = reply.body().deserialize::<String>().expect("address");
    let mut peer = Peer::connect(&addr).await;
    assert!(peer.start().await);
    assert_eq!(
        peer.until_finished().await.finished,
        Some((false, "Expected 2 fds but received 1".to_string()))
    );
    drop(peer);
    env.wait_idle().await;

    // A wrongly typed option is ignored (g_variant_dict_lookup with a mismatched type): a
    // `lock-finalization` sent as a string stages unlocked.
    let options = dict(&[("lock-finalization", Value::from("true"))]);
    assert_eq!(
        env.update(&rebase_to(env.rhel10()), &options)
            .await
            .finished,
        Some((true, String::new()))
    );
    let record = env.staged_record().expect("/run/ostree/staged-deployment");
    assert_eq!(record.get("locked"), None, "staged unlocked");
    env.cleanup_pending().await;

    let (name, message) = dbus_error(os_call(&env.client, "Cleanup", &(vec!["bogus"],)).await);
    assert_eq!(
        (name.as_str(), message.as_str()),
        (GIO_FAILED, "Invalid cleanup type: bogus")
    );

    let (name, message) = dbus_error(
        env.client
            .call_method(
                Some(BUS_NAME),
                SYSROOT_PATH,
                Some(SYSROOT),
                "GetOS",
                &("nope",),
            )
            .await,
    );
    assert_eq!(
        (name.as_str(), message.as_str()),
        (GIO_NOT_FOUND, "OS name \"nope\" not found")
    );
    let path = env
        .client
        .call_method(Some(BUS_NAME), SYSROOT_PATH, Some(SYSROOT), "GetOS", &("",))
        .await
        .expect("GetOS")
        .body()
        .deserialize::<zvariant::OwnedObjectPath>()
        .expect("o");
    assert_eq!(path.as_str(), OS_PATH);

    let (name, message) =
        dbus_error(os_call(&env.client, "GetDeploymentBootConfig", &("7", false)).await);
    assert_eq!(name, "org.projectatomic.rpmostreed.Error.Failed");
    assert_eq!(message, "Out of range deployment index 7, expected < 1");
    let records = env.control(RpmOstreedCmd::Transactions).await;
    let refused: Vec<&str> = records
        .as_array()
        .expect("records")
        .iter()
        .filter_map(|r| r["error"].as_str())
        .collect();
    assert!(
        refused.iter().any(|e| e.starts_with(GIO_FAILED)),
        "{refused:?}"
    );
}

#[tokio::test]
async fn daemon_crash_mid_transaction() {
    let env = Env::new().await;
    let dbus = zbus::fdo::DBusProxy::new(&env.client).await.expect("proxy");
    let owner = dbus
        .get_name_owner(BUS_NAME.try_into().expect("name"))
        .await
        .expect("owner");
    env.control(RpmOstreedCmd::ExitMidTransaction).await;
    let modifiers = rebase_to(env.rhel10());
    let addr = update_deployment(&env.client, &modifiers, &Dict::new())
        .await
        .expect("UpdateDeployment");
    let mut peer = Peer::connect(&addr).await;
    let started = Instant::now();
    assert!(peer.start().await);
    let signals = peer.until_finished().await;
    assert_eq!(
        signals.finished, None,
        "the peer connection closes without Finished"
    );
    loop {
        let now = dbus
            .get_name_owner(BUS_NAME.try_into().expect("name"))
            .await;
        if now.as_ref().is_ok_and(|o| *o != owner) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "name never re-owned"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(env.deployments().await.len(), 1, "nothing was staged");
    assert_eq!(env.active_transaction().await.0, "");
    assert_eq!(
        env.control(RpmOstreedCmd::Transactions).await[0]["crashed"],
        true
    );
    // The restarted daemon works.
    let signals = env.rebase(&registry_ref(env.rhel10()), &Dict::new()).await;
    assert_eq!(signals.finished, Some((true, String::new())));
}

#[tokio::test]
async fn cleanup_cancel_and_restart() {
    let mut env = Env::new().await;
    env.rebase(&registry_ref(env.rhel10()), &Dict::new()).await;
    assert_eq!(env.deployments().await.len(), 2);

    // The staged deployment survives a restart of the daemon.
    drop(env.fake.take());
    env.fake = Some(FakeRpmOstreed::start(env.config()).await.expect("restart"));
    let deployments = env.deployments().await;
    assert_eq!(deployments.len(), 2);
    assert!(bool_of(&deployments[0], "staged"));

    env.cleanup_pending().await;
    let deployments = env.deployments().await;
    assert_eq!(deployments.len(), 1);
    assert!(bool_of(&deployments[0], "booted"));

    // Reload() picks up an edit of state.json made behind the daemon's back.
    let state_file = env.dir.join("state/state.json");
    let mut on_disk = env.state_on_disk();
    on_disk["deployments"][0]["pinned"] = json!(true);
    std::fs::write(&state_file, on_disk.to_string()).expect("write");
    assert!(!bool_of(&env.deployments().await[0], "pinned"));
    env.client
        .call_method(Some(BUS_NAME), SYSROOT_PATH, Some(SYSROOT), "Reload", &())
        .await
        .expect("Reload");
    assert!(bool_of(&env.deployments().await[0], "pinned"));

    // Cancel stops a running transaction before it stages anything.
    env.control(RpmOstreedCmd::Slow { ms: 5000 }).await;
    let modifiers = rebase_to(env.rhel10());
    let addr = update_deployment(&env.client, &modifiers, &Dict::new())
        .await
        .expect("UpdateDeployment");
    let mut peer = Peer::connect(&addr).await;
    assert!(peer.start().await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let cancelled_at = Instant::now();
    peer.call("Cancel").await.expect("Cancel");
    let signals = peer.until_finished().await;
    assert_eq!(
        signals.finished,
        Some((false, "Operation was cancelled".to_string()))
    );
    assert!(cancelled_at.elapsed() < Duration::from_secs(2));
    assert_eq!(env.deployments().await.len(), 1);
}

#[tokio::test]
async fn finalize_deployment_checks_and_reboots() {
    let env = Env::new().await;
    let finalize = |options: Dict| {
        let client = env.client.clone();
        async move {
            let addr = os_call(&client, "FinalizeDeployment", &(options,))
                .await?
                .body()
                .deserialize::<String>()?;
            let mut peer = Peer::connect(&addr).await;
            assert!(peer.start().await);
            let finished = peer.until_finished().await.finished;
            drop(peer);
            Ok::<_, zbus::Error>(finished.expect("finished"))
        }
    };
    // FinalizeDeployment's options: the base checksum the caller expects to be staged.
    let expect_checksum = |checksum: &str| dict(&[("checksum", Value::from(checksum))]);
    let digest = env.rhel10().digest.clone();
    // rpm-ostreed asks logind for inhibitors before it reboots.
    let logind = testbed::fakes::logind::FakeLogind::start(&env.bus.address, Box::new(|| Ok(())))
        .await
        .expect("fake logind");

    assert_eq!(
        finalize(expect_checksum(&digest)).await.expect("finalize"),
        (false, "No pending staged deployment found".to_string())
    );
    env.wait_idle().await;
    env.rebase(&registry_ref(env.rhel10()), &Dict::new()).await;
    assert_eq!(
        finalize(expect_checksum(&digest)).await.expect("finalize"),
        (false, "Staged deployment already unlocked".to_string())
    );
    env.wait_idle().await;
    // Checksum, then inhibitors, then the lock (finalize_deployment_transaction_execute):
    // a block inhibitor is reported even for an unlocked deployment.
    logind
        .control(LogindCmd::Inhibit(Inhibitor {
            what: "shutdown".into(),
            who: "early".into(),
            why: "first".into(),
            mode: InhibitMode::Block,
            uid: 0,
            pid: 0,
        }))
        .await
        .expect("inhibit");
    assert_eq!(
        finalize(expect_checksum(&digest)).await.expect("finalize"),
        (
            false,
            "Reboot blocked by a systemd inhibitor lock in `block` mode\nHeld by: early\nReason: first"
                .to_string()
        )
    );
    env.wait_idle().await;
    logind
        .control(LogindCmd::Release {
            who: "early".into(),
        })
        .await
        .expect("release");

    // Another spelling of the same image is a different ref, so it can be staged (locked).
    let docker_ref = format!("ostree-unverified-image:docker://{}", env.rhel10().pullspec);
    let locked = dict(&[("lock-finalization", Value::from(true))]);
    assert_eq!(
        env.rebase(&docker_ref, &locked).await.finished,
        Some((true, String::new()))
    );
    assert_eq!(
        finalize(expect_checksum("sha256:wrong"))
            .await
            .expect("finalize"),
        (
            false,
            format!("Expected staged base checksum sha256:wrong, but found {digest}")
        )
    );
    env.wait_idle().await;
    assert_eq!(
        finalize(Dict::new()).await.expect("finalize"),
        (false, "Missing expected checksum".to_string())
    );
    env.wait_idle().await;
    // `vardict_lookup_ptr (options, "checksum", "&s")` finds nothing of another type: the
    // checksum must be a string (`s`), as streamd sends it; bytes count as missing.
    assert_eq!(
        finalize(dict(&[("checksum", Value::from(digest.as_bytes()))]))
            .await
            .expect("finalize"),
        (false, "Missing expected checksum".to_string())
    );
    env.wait_idle().await;
    // A block-mode shutdown inhibitor stops it with rpm-ostree's message; a delay one does not.
    for (who, mode) in [
        ("backup", InhibitMode::Block),
        ("updater", InhibitMode::Delay),
    ] {
        logind
            .control(LogindCmd::Inhibit(Inhibitor {
                what: "shutdown".into(),
                who: who.to_string(),
                why: "busy".into(),
                mode,
                uid: 0,
                pid: 0,
            }))
            .await
            .expect("inhibit");
    }
    assert_eq!(
        finalize(expect_checksum(&digest))
            .await
            .expect("finalize"),
        (
            false,
            "Reboot blocked by a systemd inhibitor lock in `block` mode\nHeld by: backup\nReason: busy"
                .to_string()
        )
    );
    env.wait_idle().await;
    logind
        .control(LogindCmd::Release {
            who: "backup".into(),
        })
        .await
        .expect("release");
    assert_eq!(
        finalize(expect_checksum(&digest)).await.expect("finalize"),
        (true, String::new())
    );
    env.wait_idle().await;

    let staged = &env.deployments().await[0];
    assert!(bool_of(staged, "staged"));
    assert!(!staged.contains_key("finalization-locked"), "unlocked");
    // ostree_sysroot_change_finalization rewrote the record unlocked.
    let record = env.staged_record().expect("/run/ostree/staged-deployment");
    assert_ne!(record.get("locked").map(|v| &**v), Some(&Value::Bool(true)));
    let on_disk = env.state_on_disk();
    assert_eq!(on_disk["reboot_requested"], true);
    let last = env.last_record().await;
    assert_eq!(last["method"], "FinalizeDeployment");
    assert_eq!(last["reboot_requested"], true);
    // A reboot is pending: the daemon takes no new transactions.
    let (name, message) =
        dbus_error(os_call(&env.client, "Cleanup", &(vec!["pending-deploy"],)).await);
    assert_eq!(
        (name.as_str(), message.as_str()),
        (GIO_FAILED, "Reboot initiated, cannot start new transaction")
    );
}

#[tokio::test]
async fn progress_at_a_thousand_signals_per_second() {
    let env = Env::new().await;
    env.control(RpmOstreedCmd::Progress {
        signals: 1000,
        per_second: 1000,
    })
    .await;
    let modifiers = rebase_to(env.rhel10());
    let addr = update_deployment(&env.client, &modifiers, &Dict::new())
        .await
        .expect("UpdateDeployment");
    let mut peer = Peer::connect(&addr).await;
    let started = Instant::now();
    assert!(peer.start().await);
    let signals = peer.until_finished().await;
    let elapsed = started.elapsed();
    assert_eq!(signals.finished, Some((true, String::new())));
    let percents = signals.percents();
    assert_eq!(percents.len(), 1000);
    assert!(percents.windows(2).all(|w| w[0] <= w[1]), "monotonic");
    assert_eq!(percents.last(), Some(&100));
    assert!(
        elapsed >= Duration::from_millis(900),
        "{elapsed:?}: paced at 1000/s"
    );
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
}

// ---------------------------------------------------------------------------------------
// The real ostree sysroot behind the deployments
// ---------------------------------------------------------------------------------------

/// `(checksum, serial)` of every deployment in boot order, as `ostree admin status` lists them.
fn ostree_status(sysroot: &Path) -> Vec<(String, i32)> {
    let out = Command::new("ostree")
        .args(["admin", "status"])
        .arg(format!("--sysroot={}", sysroot.display()))
        .output()
        .expect("ostree admin status");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("rhcos "))
        .map(|id| {
            let (csum, serial) = id.rsplit_once('.').expect("csum.serial");
            (csum.to_string(), serial.parse().expect("serial"))
        })
        .collect()
}

/// `ostree --repo=<sysroot>/ostree/repo <args>`: its standard output, trimmed.
fn ostree_repo(sysroot: &Path, args: &[&str]) -> String {
    let out = Command::new("ostree")
        .arg(format!("--repo={}", sysroot.join("ostree/repo").display()))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("ostree {args:?}: {e}"));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The bootloader entry options of the deployment `(checksum, serial)`.
fn entry_options(sysroot: &Path, checksum: &str, serial: i32) -> String {
    for entry in std::fs::read_dir(sysroot.join("boot/loader/entries")).expect("entries") {
        let text = std::fs::read_to_string(entry.expect("entry").path()).expect("read");
        let options = text
            .lines()
            .find_map(|l| l.strip_prefix("options "))
            .expect("options");
        let ostree = options
            .split_whitespace()
            .find_map(|a| a.strip_prefix("ostree="))
            .expect("ostree=");
        let target =
            std::fs::read_link(sysroot.join(ostree.trim_start_matches('/'))).expect("link");
        if target.ends_with(format!("{checksum}.{serial}")) {
            return options.to_string();
        }
    }
    panic!("no bootloader entry for {checksum}.{serial}");
}

/// Kernel arguments without the ones ostree manages.
fn user_kargs(options: &str) -> Vec<String> {
    options
        .split_whitespace()
        .filter(|a| !a.starts_with("ostree="))
        .map(str::to_string)
        .collect()
}

fn deploy_root(sysroot: &Path, checksum: &str, serial: i32) -> PathBuf {
    sysroot.join(format!("ostree/deploy/rhcos/deploy/{checksum}.{serial}"))
}

fn strv_of(d: &Dict, key: &str) -> Vec<String> {
    Vec::<String>::try_from(d.get(key).unwrap_or_else(|| panic!("no {key}")).clone())
        .unwrap_or_else(|e| panic!("{key} is not as: {e}"))
}

fn serial_of(d: &Dict) -> i32 {
    i32::try_from(d.get("serial").expect("serial").clone()).expect("i")
}

/// Writes fixture RPMs for `nevras` and opens them.
fn rpm_files(dir: &Path, nevras: &[&str]) -> Vec<std::fs::File> {
    nevras
        .iter()
        .map(|n| {
            let nevra = fixtures::packages::Nevra::parse(n).expect("nevra");
            let path = dir.join(format!("{n}.rpm"));
            std::fs::write(&path, fixtures::packages::fake_rpm(&nevra)).expect("write rpm");
            std::fs::File::open(&path).expect("open rpm")
        })
        .collect()
}

impl Env {
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

    /// `Cleanup(kinds)`: the address of its transaction.
    async fn cleanup_address(&self, kinds: &[&str]) -> String {
        os_call(&self.client, "Cleanup", &(kinds,))
            .await
            .expect("Cleanup")
            .body()
            .deserialize::<String>()
            .expect("address")
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
        let mut peer = Peer::connect(&addr).await;
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

#[tokio::test]
async fn deployments_are_real_ostree_deployments() {
    let env = Env::new().await;
    let sysroot = env.sysroot();

    // The booted deployment is on disk with its kernel arguments.
    let on_disk = ostree_status(&sysroot);
    let booted = &env.deployments().await[0];
    assert_eq!(
        on_disk,
        [(string_of(booted, "checksum"), serial_of(booted))]
    );
    let booted_options = entry_options(&sysroot, &on_disk[0].0, on_disk[0].1);
    assert!(booted_options.contains("root=UUID="), "{booted_options}");
    assert!(!booted_options.contains("fips=1"), "{booted_options}");
    let booted_root = deploy_root(&sysroot, &on_disk[0].0, on_disk[0].1);
    let os = std::fs::read_to_string(booted_root.join("usr/lib/os-release")).expect("os-release");
    assert!(os.contains("RHEL_VERSION=9.6"), "{os}");
    // GetDeploymentBootConfig reports the real entry.
    let config = env.boot_config("0").await;
    assert_eq!(string_of(&config, "options"), booted_options);
    assert!(
        string_of(&config, "linux").ends_with("/vmlinuz-5.14.0-570.60.1.el9_6.x86_64"),
        "{config:?}"
    );
    assert!(string_of(&config, "title").starts_with("Red Hat Enterprise Linux CoreOS 9.6"));

    // Staging writes a real deployment of the target, first in boot order.
    let signals = env.rebase(&registry_ref(env.rhel10()), &Dict::new()).await;
    assert_eq!(signals.finished, Some((true, String::new())));
    let deployments = env.deployments().await;
    let on_disk = ostree_status(&sysroot);
    assert_eq!(on_disk.len(), 2);
    for (d, (csum, serial)) in deployments.iter().zip(&on_disk) {
        assert_eq!((&string_of(d, "checksum"), serial_of(d)), (csum, *serial));
    }
    assert!(bool_of(&deployments[0], "staged"));
    let (csum, serial) = on_disk[0].clone();
    let root = deploy_root(&sysroot, &csum, serial);
    let os = std::fs::read_to_string(root.join("usr/lib/os-release")).expect("os-release");
    assert!(os.contains("RHEL_VERSION=10.1"), "{os}");
    assert!(
        root.join("usr/lib/modules/6.12.0-124.8.1.el10_1.x86_64/vmlinuz")
            .exists()
    );
    assert!(
        root.join("usr/share/crypto-policies/policies/FIPS.pol")
            .exists()
    );
    // The booted deployment's kernel arguments were carried.
    assert_eq!(
        user_kargs(&entry_options(&sysroot, &csum, serial)),
        user_kargs(&booted_options)
    );
    // The commit carries the image's manifest digest, as an ostree-ext import does.
    assert_eq!(
        ostree_repo(
            &sysroot,
            &["show", "--print-metadata-key=ostree.manifest-digest", &csum]
        ),
        format!("'{}'", env.rhel10().digest)
    );

    // Cleanup undeploys it for real.
    env.cleanup_pending().await;
    assert_eq!(ostree_status(&sysroot).len(), 1);
    assert!(!root.exists(), "the deployment directory is gone");
    assert_eq!(env.deployments().await.len(), 1);
    // Deployments are not immutable: a testbed directory can simply be deleted.
    std::fs::remove_dir_all(&sysroot).expect("the sysroot can be removed");
}

#[tokio::test]
async fn realtime_hosts_carry_el9_kernel_overrides_until_replaced() {
    let env = Env::with_host("fips-realtime").await;
    let sysroot = env.sysroot();
    let booted = &env.deployments().await[0];
    assert_eq!(
        strv_of(booted, "requested-local-packages"),
        [
            "kernel-rt-core-5.14.0-570.60.1.el9_6.x86_64",
            "kernel-rt-modules-5.14.0-570.60.1.el9_6.x86_64",
            "kernel-rt-modules-core-5.14.0-570.60.1.el9_6.x86_64",
            "kernel-rt-modules-extra-5.14.0-570.60.1.el9_6.x86_64"
        ]
    );
    assert_eq!(
        strv_of(booted, "requested-base-removals"),
        fixtures::DEFAULT_KERNEL_PACKAGES
    );
    assert!(booted.contains_key("base-checksum"), "layered");
    let booted_options = entry_options(&sysroot, &string_of(booted, "checksum"), serial_of(booted));
    assert!(booted_options.contains("fips=1"), "{booted_options}");
    let cmdline = std::fs::read_to_string(env.dir.join("host/proc/cmdline")).expect("cmdline");
    assert!(cmdline.trim_end().ends_with(&booted_options), "{cmdline}");

    // A plain rebase carries the el9 kernel-rt overrides onto el10: depsolve fails.
    let set_refspec = ("set-refspec", Value::from(registry_ref(env.rhel10())));
    let (ok, message) = env.deploy(&dict(std::slice::from_ref(&set_refspec))).await;
    assert!(!ok);
    assert!(
        message.starts_with("Could not depsolve transaction; 1 problem detected:\n Problem: "),
        "{message}"
    );
    assert!(
        message.contains("kernel-rt-core-5.14.0-570.60.1.el9_6.x86_64 from @commandline"),
        "{message}"
    );
    assert_eq!(ostree_status(&sysroot).len(), 1, "nothing staged");

    let uninstall = Value::from(vec![
        "kernel-rt-core",
        "kernel-rt-modules",
        "kernel-rt-modules-core",
        "kernel-rt-modules-extra",
    ]);
    // The el10 RPMs without -modules-core are not dependency-closed: the local packages
    // depsolve against the el10 base (its kernel removed) and each other, as the real daemon
    // does (testbed/src/fakes/rpmostreed/depsolve.rs), and fail before anything is staged.
    let open = [
        "kernel-rt-core-6.12.0-124.8.1.el10_1.x86_64",
        "kernel-rt-modules-6.12.0-124.8.1.el10_1.x86_64",
        "kernel-rt-modules-extra-6.12.0-124.8.1.el10_1.x86_64",
    ];
    let files = rpm_files(&env.dir, &open);
    let modifiers = dict(&[
        set_refspec.clone(),
        ("uninstall-packages", uninstall.clone()),
        ("install-local-packages", Value::from(handles(&files))),
    ]);
    let (ok, message) = env.deploy(&modifiers).await;
    assert!(!ok);
    let need = "kernel-rt-modules-core-uname-r = 6.12.0-124.8.1.el10_1.x86_64+rt";
    assert_eq!(
        message,
        format!(
            "Could not depsolve transaction; 3 problems detected:\n \
             Problem 1: conflicting requests\n  \
             - nothing provides {need} needed by {} from @commandline\n \
             Problem 2: conflicting requests\n  \
             - nothing provides {need} needed by {} from @commandline\n \
             Problem 3: conflicting requests\n  \
             - nothing provides {need} needed by {} from @commandline",
            open[0], open[1], open[2]
        )
    );
    assert_eq!(ostree_status(&sysroot).len(), 1, "nothing staged");

    // Replacing them with the closed el10 set in the same transaction works and boots +rt.
    let el10 = [
        "kernel-rt-core-6.12.0-124.8.1.el10_1.x86_64",
        "kernel-rt-modules-6.12.0-124.8.1.el10_1.x86_64",
        "kernel-rt-modules-core-6.12.0-124.8.1.el10_1.x86_64",
        "kernel-rt-modules-extra-6.12.0-124.8.1.el10_1.x86_64",
    ];
    let files = rpm_files(&env.dir, &el10);
    let fds = handles(&files);
    let modifiers = dict(&[
        set_refspec,
        ("uninstall-packages", uninstall),
        ("install-local-packages", Value::from(fds)),
    ]);
    assert_eq!(env.deploy(&modifiers).await, (true, String::new()));
    let staged = &env.deployments().await[0];
    assert!(bool_of(staged, "staged"));
    assert_eq!(strv_of(staged, "requested-local-packages"), el10);
    assert_eq!(
        strv_of(staged, "requested-base-removals"),
        fixtures::DEFAULT_KERNEL_PACKAGES
    );
    let (csum, serial) = (string_of(staged, "checksum"), serial_of(staged));
    assert_eq!(ostree_status(&sysroot)[0], (csum.clone(), serial));
    let root = deploy_root(&sysroot, &csum, serial);
    assert!(
        root.join("usr/lib/modules/6.12.0-124.8.1.el10_1.x86_64+rt/vmlinuz")
            .exists()
    );
    assert!(
        !root
            .join("usr/lib/modules/6.12.0-124.8.1.el10_1.x86_64")
            .exists(),
        "the default kernel was removed"
    );
    let options = entry_options(&sysroot, &csum, serial);
    assert!(options.contains("fips=1"), "FIPS carried: {options}");
    assert_eq!(user_kargs(&options), user_kargs(&booted_options));
    // The layered commit sits on the image's commit.
    let base = string_of(staged, "base-checksum");
    assert_eq!(
        ostree_repo(&sysroot, &["rev-parse", &format!("{csum}^")]),
        base
    );
    // The record shows the NEVRAs read from the descriptors.
    let record = env.last_record().await;
    assert_eq!(record["fds"], 4);
    assert_eq!(record["modifiers"]["install-local-packages"], json!(el10));
    assert_eq!(
        record["modifiers"]["uninstall-packages"],
        json!([
            "kernel-rt-core",
            "kernel-rt-modules",
            "kernel-rt-modules-core",
            "kernel-rt-modules-extra"
        ])
    );
}

#[tokio::test]
async fn package_failures_of_the_real_daemon() {
    let env = Env::new().await;
    let set_refspec = ("set-refspec", Value::from(registry_ref(env.rhel10())));

    // An el9 RPM onto an el10 target.
    let files = rpm_files(&env.dir, &["usbguard-1.1.3-1.el9.x86_64"]);
    let fds = handles(&files);
    let (ok, message) = env
        .deploy(&dict(&[
            set_refspec.clone(),
            ("install-local-packages", Value::from(fds)),
        ]))
        .await;
    assert!(!ok);
    assert!(
        message.starts_with("Could not depsolve transaction; 1 problem detected:\n"),
        "{message}"
    );
    assert!(message.contains("usbguard-1.1.3-1.el9.x86_64"), "{message}");
    assert_eq!(
        env.last_record().await["modifiers"]["install-local-packages"],
        json!(["usbguard-1.1.3-1.el9.x86_64"])
    );
    // The same RPM built for el10 is fine.
    let files = rpm_files(&env.dir, &["usbguard-1.1.3-1.el10.x86_64"]);
    let fds = handles(&files);
    let (ok, message) = env
        .deploy(&dict(&[
            set_refspec.clone(),
            ("install-local-packages", Value::from(fds)),
        ]))
        .await;
    assert!(ok, "{message}");
    env.cleanup_pending().await;

    // Removing a package the base does not have.
    let (ok, message) = env
        .deploy(&dict(&[
            set_refspec.clone(),
            ("override-remove-packages", Value::from(vec!["nano"])),
        ]))
        .await;
    assert_eq!(
        (ok, message.as_str()),
        (false, "Package \"nano\" not found")
    );
    let (ok, message) = env
        .deploy(&dict(&[
            set_refspec.clone(),
            ("override-reset-packages", Value::from(vec!["kernel"])),
        ]))
        .await;
    assert_eq!(
        (ok, message.as_str()),
        (false, "No overrides for package 'kernel'")
    );
    assert_eq!(ostree_status(&env.sysroot()).len(), 1, "nothing staged");
}

#[tokio::test]
async fn old_cpu_fails_the_el10_sanity_check() {
    let env = Env::with_host("old-cpu").await;
    let (ok, message) = env.deploy(&rebase_to(env.rhel10())).await;
    assert_eq!(
        (ok, message.as_str()),
        (
            false,
            "Sanity-checking final rootfs: bwrap(/usr/bin/true): Child process exited with code 127"
        )
    );
    assert_eq!(
        env.last_record().await["journal"],
        json!(["Fatal glibc error: CPU does not support x86-64-v3"])
    );
    assert_eq!(ostree_status(&env.sysroot()).len(), 1, "nothing staged");
    // An x86-64-v3 CPU passes (the host root is what the fake reads).
    let v3 = fixtures::fixture("default").expect("default").cpuinfo();
    std::fs::write(env.dir.join("host/proc/cpuinfo"), v3).expect("cpuinfo");
    let (ok, message) = env.deploy(&rebase_to(env.rhel10())).await;
    assert!(ok, "{message}");
}

#[tokio::test]
async fn low_disk_fails_the_import() {
    let env = Env::with_host("low-disk").await;
    let (ok, message) = env.deploy(&rebase_to(env.rhel10())).await;
    assert!(!ok);
    assert!(
        message.starts_with("Importing: Unencapsulating base: Layer sha256:"),
        "{message}"
    );
    assert!(
        message.ends_with(
            "Writing content object: min-free-space-percent '3%' would be exceeded, at least 20.5 kB requested"
        ),
        "{message}"
    );
    assert_eq!(ostree_status(&env.sysroot()).len(), 1, "nothing staged");
    std::fs::remove_file(env.dir.join("host/run/testbed/low-disk")).expect("marker");
    let (ok, message) = env.deploy(&rebase_to(env.rhel10())).await;
    assert!(ok, "{message}");
}

#[tokio::test]
async fn layered_packages_are_carried() {
    let env = Env::with_host("layered").await;
    let booted = &env.deployments().await[0];
    assert_eq!(strv_of(booted, "requested-packages"), ["usbguard"]);
    let (ok, message) = env.deploy(&rebase_to(env.rhel10())).await;
    assert!(ok, "{message}");
    let staged = &env.deployments().await[0];
    assert_eq!(strv_of(staged, "requested-packages"), ["usbguard"]);
    assert_eq!(strv_of(staged, "packages"), ["usbguard"]);
    assert!(staged.contains_key("base-checksum"));
    // A repo package the target's repositories lack.
    env.cleanup_pending().await;
    let (ok, message) = env
        .deploy(&dict(&[
            ("set-refspec", Value::from(registry_ref(env.rhel10()))),
            ("install-packages", Value::from(vec!["htop"])),
        ]))
        .await;
    assert_eq!((ok, message.as_str()), (false, "Packages not found: htop"));
}

#[tokio::test]
async fn every_fixture_starts() {
    for name in fixtures::NAMES {
        let env = Env::with_host(name).await;
        let f = fixtures::fixture(name).expect("fixture");
        let booted = &env.deployments().await[0];
        assert!(bool_of(booted, "booted"), "{name}");
        let config = env.boot_config("").await;
        let release = std::fs::read_to_string(env.dir.join("host/proc/sys/kernel/osrelease"))
            .expect("osrelease");
        assert!(
            string_of(&config, "linux").ends_with(&format!("/vmlinuz-{}", release.trim())),
            "{name}: {config:?}"
        );
        assert_eq!(
            string_of(&config, "options").contains("fips=1"),
            f.fips,
            "{name}"
        );
        assert_eq!(
            ostree_status(&env.sysroot()),
            [(string_of(booted, "checksum"), serial_of(booted))],
            "{name}"
        );
    }
}

#[tokio::test]
async fn testbed_start_takes_the_host_fixture() {
    let dir = ScratchDir::new("rpmostreed").expect("scratch dir");
    let tb = testbed::Testbed::start(testbed::Options {
        host: "64k-aarch64".into(),
        ..testbed::Options::new(dir.to_path_buf())
    })
    .await
    .expect("testbed starts");
    let read = |rel: &str| std::fs::read_to_string(dir.join(rel)).expect(rel);
    assert_eq!(read("host/proc/sys/kernel/arch"), "aarch64\n");
    assert_eq!(
        read("host/proc/sys/kernel/osrelease"),
        "5.14.0-570.60.1.el9_6.aarch64+64k\n"
    );
    let deployments = tb
        .control(RpmOstreedCmd::Deployments)
        .await
        .expect("deployments");
    assert_eq!(
        deployments[0]["requested-local-packages"][0],
        "kernel-64k-core-5.14.0-570.60.1.el9_6.aarch64"
    );
    assert!(
        testbed::Testbed::start(testbed::Options {
            host: "nope".into(),
            ..testbed::Options::new(dir.join("other"))
        })
        .await
        .is_err()
    );
}

/// rpm-ostree before v2024.6 (the `legacy-lock-file` knob): the lock is the legacy file,
/// `Deployments` says `finalization-locked`, and unlocking or cleaning up removes the file.
#[tokio::test]
async fn legacy_lock_file_mode_reports_the_lock_on_dbus() {
    let env = Env::new().await;
    env.control(RpmOstreedCmd::LegacyLockFile { on: true })
        .await;
    let options = dict(&[("lock-finalization", Value::from(true))]);
    assert_eq!(
        env.update(&rebase_to(env.rhel10()), &options)
            .await
            .finished,
        Some((true, String::new()))
    );
    let staged = &env.deployments().await[0];
    assert!(bool_of(staged, "finalization-locked"));
    assert!(env.legacy_lock_file().exists());
    let record = env.staged_record().expect("/run/ostree/staged-deployment");
    assert_eq!(record.get("locked"), None, "older libostree wrote no key");
    env.cleanup_pending().await;
    assert!(!env.legacy_lock_file().exists());
    assert!(env.staged_record().is_none());
    assert!(!env.deployments().await[0].contains_key("finalization-locked"));
}

/// rpm-ostree's build-time check: with `allow-downgrade: false` a rebase to an image built
/// before the booted one fails with libostree's message; without the option (a rebase allows
/// older bases by default) or with true it is staged.
#[tokio::test]
async fn allow_downgrade_false_checks_build_timestamps() {
    let env = Env::new().await;
    assert!(env.rhel10().created_unix() < env.rhel9().created_unix());
    let run = |options: Dict| {
        let env = &env;
        async move {
            let addr = update_deployment(&env.client, &rebase_to(env.rhel10()), &options)
                .await
                .expect("UpdateDeployment");
            let mut peer = Peer::connect(&addr).await;
            assert!(peer.start().await);
            let finished = peer.until_finished().await.finished.expect("Finished");
            drop(peer);
            env.wait_idle().await;
            finished
        }
    };
    let (ok, message) = run(dict(&[("allow-downgrade", Value::from(false))])).await;
    assert!(!ok);
    assert!(
        message
            .starts_with("While checking against deployment timestamp: Upgrade target revision '"),
        "{message}"
    );
    assert!(
        message.contains("' with timestamp 'Sun Nov 15 00:00:00 2026' is chronologically older than current revision '"),
        "{message}"
    );
    assert!(
        message.ends_with(
            "' with timestamp 'Fri Nov 20 00:00:00 2026'; use --allow-downgrade to permit"
        ),
        "{message}"
    );
    assert_eq!(env.deployments().await.len(), 1, "nothing staged");
    assert_eq!(run(dict(&[])).await, (true, String::new()));
    env.cleanup_pending().await;
    assert_eq!(
        run(dict(&[("allow-downgrade", Value::from(true))])).await,
        (true, String::new())
    );
}

/// The origin a deploy edits is the pending deployment's when there is one
/// (`rpmostree_syscore_get_origin_merge_deployment`); an override already there fails
/// (`add_packages_override_remove`), and removals the new base lacks are dropped, not failed
/// (`finalize_removal_overrides`).
#[tokio::test]
async fn overrides_are_edited_on_the_pending_origin_and_inactive_ones_dropped() {
    let env = Env::new().await;
    let remove = || dict(&[("override-remove-packages", Value::from(vec!["dhcp-client"]))]);
    // The booted rhel-9 with one base package removed: staged, not booted.
    assert_eq!(env.deploy(&remove()).await, (true, String::new()));
    let deployments = env.deployments().await;
    assert!(bool_of(&deployments[0], "staged"));
    assert_eq!(
        strv_of(&deployments[0], "requested-base-removals"),
        ["dhcp-client"]
    );
    assert!(strv_of(&deployments[1], "requested-base-removals").is_empty());
    // Asking again edits the pending origin, which already has it.
    assert_eq!(
        env.deploy(&remove()).await,
        (
            false,
            "Override already exists for package 'dhcp-client'".to_string()
        )
    );
    // rhel-10 has no dhcp-client: the inherited removal is reported and dropped.
    let signals = env.rebase(&registry_ref(env.rhel10()), &Dict::new()).await;
    assert_eq!(signals.finished, Some((true, String::new())));
    let messages = signals.strings("Message");
    let at = messages
        .iter()
        .position(|m| m == "Inactive base removals:")
        .unwrap_or_else(|| panic!("{messages:#?}"));
    assert_eq!(messages[at + 1], "  dhcp-client");
    let staged = &env.deployments().await[0];
    assert!(strv_of(staged, "requested-base-removals").is_empty());
    assert!(!staged.contains_key("base-checksum"), "nothing layered");
}

/// `ostree admin deploy` (no `--stage`) leaves a pending deployment that is not staged: it is
/// the origin rpm-ostree edits, libostree records nothing staged, and `Cleanup` removes it.
#[tokio::test]
async fn an_admin_deployed_pending_deployment_is_the_origin_but_not_staged() {
    let env = Env::with_host("layered").await;
    env.control(RpmOstreedCmd::AdminDeploy {
        image: env.rhel9().pullspec.clone(),
    })
    .await;
    let deployments = env.deployments().await;
    assert_eq!(deployments.len(), 2);
    assert!(!bool_of(&deployments[0], "staged"));
    assert!(!bool_of(&deployments[0], "booted"));
    assert!(strv_of(&deployments[0], "requested-packages").is_empty());
    assert_eq!(strv_of(&deployments[1], "requested-packages"), ["usbguard"]);
    assert_eq!(
        env.staged_record(),
        None,
        "libostree records no staged deployment"
    );

    // The booted origin layers usbguard; the pending one, which is edited, does not.
    let (ok, message) = env
        .deploy(&dict(&[
            ("set-refspec", Value::from(registry_ref(env.rhel10()))),
            ("uninstall-packages", Value::from(vec!["usbguard"])),
        ]))
        .await;
    assert_eq!(
        (ok, message.as_str()),
        (
            false,
            "Package/capability 'usbguard' is not currently requested"
        )
    );
    let signals = env.rebase(&registry_ref(env.rhel10()), &Dict::new()).await;
    assert_eq!(signals.finished, Some((true, String::new())));
    let deployments = env.deployments().await;
    assert_eq!(deployments.len(), 3, "staged, the admin's pending, booted");
    assert!(bool_of(&deployments[0], "staged"));
    assert!(strv_of(&deployments[0], "requested-packages").is_empty());
    assert!(!bool_of(&deployments[1], "staged"));
    env.cleanup_pending().await;
    let deployments = env.deployments().await;
    assert_eq!(deployments.len(), 1, "both pending deployments go");
    assert!(bool_of(&deployments[0], "booted"));
}

/// rpm-ostree leaves `container-image-reference-digest` out when it cannot read the image's
/// metadata back (coreos/rpm-ostree#4185), and `FinalizeDeployment` then compares the base
/// commit.
#[tokio::test]
async fn a_deployment_whose_image_metadata_is_lost_has_no_digest() {
    let env = Env::new().await;
    let booted = &env.deployments().await[0];
    assert!(booted.contains_key("container-image-reference-digest"));
    env.control(RpmOstreedCmd::LoseImageMetadata { index: 0 })
        .await;
    let booted = &env.deployments().await[0];
    assert!(!booted.contains_key("container-image-reference-digest"));
    assert_eq!(
        string_of(booted, "container-image-reference"),
        registry_ref(env.rhel9())
    );
}

/// A local RPM already in the origin fails (`filter_package_requests`), and `uninstall`
/// removes one entry per request: the repo request before a local package of that name
/// (`remove_packages`).
#[tokio::test]
async fn local_packages_are_layered_once_and_uninstalled_one_entry_at_a_time() {
    let env = Env::with_host("realtime").await;
    let core = "kernel-rt-core-5.14.0-570.60.1.el9_6.x86_64";
    let files = rpm_files(&env.dir, &[core]);
    let (ok, message) = env
        .deploy(&dict(&[(
            "install-local-packages",
            Value::from(handles(&files)),
        )]))
        .await;
    assert!(!ok);
    assert!(
        message.starts_with("Package '")
            && message.ends_with(&format!(":{core}' is already layered")),
        "{message}"
    );
    assert_eq!(ostree_status(&env.sysroot()).len(), 1, "nothing staged");

    let env = Env::with_host("layered").await;
    let local = "usbguard-1.1.3-1.el9.x86_64";
    let files = rpm_files(&env.dir, &[local]);
    let (ok, message) = env
        .deploy(&dict(&[(
            "install-local-packages",
            Value::from(handles(&files)),
        )]))
        .await;
    assert!(ok, "{message}");
    let uninstall = dict(&[("uninstall-packages", Value::from(vec!["usbguard"]))]);
    assert_eq!(env.deploy(&uninstall).await, (true, String::new()));
    let staged = &env.deployments().await[0];
    assert!(strv_of(staged, "requested-packages").is_empty());
    assert_eq!(strv_of(staged, "requested-local-packages"), [local]);
}

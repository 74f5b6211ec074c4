//! The control commands: what `testbed ctl` sends on `DIR/control.sock` as one JSON object per
//! line, and what tests pass to [`Testbed::control`](crate::Testbed::control) and
//! [`Fleet::control`](crate::Fleet::control). `docs/testbed.md` ("Control commands") lists them
//! with their effects.
//!
//! On the wire a command is flat: `target` names the component, `cmd` the command, the other
//! keys are its arguments, and a fleet's node-scoped commands carry `node`:
//! `{"target":"rpmostreed","cmd":"slow","ms":400,"node":"worker-1"}`. The types here are that
//! JSON, both ways: a [`Request`] serializes to it, and the testbed parses what arrives on the
//! socket into a [`Request`] before a fake sees it, so a fake never reads raw JSON.

use serde::{Deserialize, Serialize};

/// One control command and, in a fleet, the node it is for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// The command.
    #[serde(flatten)]
    pub command: Command,
    /// The fleet node a node-scoped command is for (the host's fakes, and the `testbed`
    /// target's `reboot`, `start-streamd`, `stop-streamd`); the single-node testbed ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// A control command, by the component it is for (`"target"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "target", rename_all = "kebab-case")]
pub enum Command {
    /// The testbed itself: reboots, a fleet's streamd processes.
    Testbed(TestbedCmd),
    /// The fake rpm-ostreed.
    Rpmostreed(RpmOstreedCmd),
    /// The fake systemd.
    Systemd(SystemdCmd),
    /// The fake logind.
    Logind(LogindCmd),
    /// The fake bootc.
    Bootc(BootcCmd),
    /// The fake API server.
    Apiserver(ApiServerCmd),
}

impl Command {
    /// This command for the fleet node `node`.
    pub fn on(self, node: impl Into<String>) -> Request {
        Request {
            command: self,
            node: Some(node.into()),
        }
    }
}

impl From<Command> for Request {
    fn from(command: Command) -> Request {
        Request {
            command,
            node: None,
        }
    }
}

/// `From` the per-target enums into [`Command`] and [`Request`], and `on(node)` for each, so a
/// call site passes `RpmOstreedCmd::Transactions` or `RpmOstreedCmd::Transactions.on(node)`.
macro_rules! target {
    ($($cmd:ident => $variant:ident),* $(,)?) => {$(
        impl From<$cmd> for Command {
            fn from(cmd: $cmd) -> Command {
                Command::$variant(cmd)
            }
        }

        impl From<$cmd> for Request {
            fn from(cmd: $cmd) -> Request {
                Command::$variant(cmd).into()
            }
        }

        impl $cmd {
            /// This command for the fleet node `node`.
            pub fn on(self, node: impl Into<String>) -> Request {
                Command::$variant(self).on(node)
            }
        }
    )*};
}

target! {
    TestbedCmd => Testbed,
    RpmOstreedCmd => Rpmostreed,
    SystemdCmd => Systemd,
    LogindCmd => Logind,
    BootcCmd => Bootc,
    ApiServerCmd => Apiserver,
}

/// `"target": "testbed"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum TestbedCmd {
    /// A simulated reboot of the host (of `node` in a fleet), what `testbed reboot` sends.
    Reboot {
        /// Finalization fails, so the old deployment boots again (single-node testbed only).
        #[serde(default, rename = "fail-finalize")]
        fail_finalize: bool,
    },
    /// Starts the node's streamd (a fleet).
    StartStreamd,
    /// Stops the node's streamd (a fleet).
    StopStreamd,
    /// The fleet's node names.
    Nodes,
}

/// `"target": "rpmostreed"`: knobs for the coming transactions and what the fake recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum RpmOstreedCmd {
    /// The next transaction ends with `Finished(false, message)`.
    FailNext {
        /// The `Finished` message.
        message: String,
    },
    /// A foreign, started `upgrade` transaction holds the daemon while `on`.
    HoldForeign {
        /// Hold (true) or release (false).
        on: bool,
    },
    /// Deploy transactions also emit `signals` `PercentProgress` signals at `per_second`.
    Progress {
        /// How many signals.
        signals: u32,
        /// At what rate (positive).
        #[serde(rename = "per-second")]
        per_second: u32,
    },
    /// Delay staging and `Finished` by `ms`.
    Slow {
        /// Milliseconds.
        ms: u64,
    },
    /// The next staged tree gets the default kernel even when a variant was layered.
    DropVariantNext,
    /// The next deploy's new root cannot run `/usr/bin/true` (a broken image): rpm-ostree's
    /// sanity check fails it, after staging when nothing is layered.
    BrokenRootNext,
    /// Record finalization locks in the legacy lock file (older rpm-ostree) while `on`.
    LegacyLockFile {
        /// Legacy (true) or current (false) rpm-ostree.
        on: bool,
    },
    /// polkit refuses every transaction method while `on`.
    DenyCalls {
        /// Refuse (true) or allow (false).
        on: bool,
    },
    /// The next peer connecting to a transaction socket is closed before authentication.
    DropPeerNext,
    /// The next `FinalizeDeployment` closes its peers after unlocking, without `Finished`.
    DropAfterUnlock,
    /// What `ostree admin deploy` (no `--stage`) of `image` does: a pending deployment.
    AdminDeploy {
        /// The image pullspec (`ostree-image-signed:docker://PULLSPEC`: from the verifying
        /// origin, as a signed install deploys it).
        image: String,
    },
    /// Deployment `index` loses its image metadata (`coreos/rpm-ostree#4185`).
    LoseImageMetadata {
        /// The deployment's index.
        index: usize,
    },
    /// The next transaction's daemon "crashes" after `Start()`.
    ExitMidTransaction,
    /// Owns (true) or releases (false) the daemon's bus name, as rpm-ostreed started or
    /// stopped (and not activatable) on a real host.
    Bus {
        /// On the bus (true) or off it (false).
        on: bool,
    },
    /// Every transaction method call so far.
    Transactions,
    /// The ids of the clients registered with `RegisterClient`.
    Clients,
    /// The `Deployments` property as JSON.
    Deployments,
    /// Forget the transaction records.
    ResetTransactions,
}

/// `"target": "systemd"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum SystemdCmd {
    /// Every unit started, with its spec and result.
    Units,
    /// The names of the units still loaded.
    Loaded,
}

/// `"target": "logind"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum LogindCmd {
    /// Adds an inhibitor lock.
    Inhibit(Inhibitor),
    /// Removes `who`'s inhibitors (replies how many).
    Release {
        /// The holder.
        who: String,
    },
    /// The inhibitors.
    Inhibitors,
    /// How many `Reboot` calls were accepted.
    Reboots,
}

/// One inhibitor lock, as the `inhibit` command adds it and `ListInhibitors` returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inhibitor {
    /// Colon-separated: `shutdown`, `sleep`, `idle`, …
    pub what: String,
    /// The program holding it.
    pub who: String,
    /// Its reason.
    pub why: String,
    /// How it inhibits.
    pub mode: InhibitMode,
    /// Holder's uid.
    #[serde(default)]
    pub uid: u32,
    /// Holder's pid.
    #[serde(default)]
    pub pid: u32,
}

/// An inhibitor's mode, as logind names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InhibitMode {
    /// Refuses the operation.
    Block,
    /// Refuses it unless the caller asks to ignore inhibitors.
    BlockWeak,
    /// Delays it for a while.
    Delay,
}

impl InhibitMode {
    /// logind's name of the mode.
    pub fn as_str(self) -> &'static str {
        match self {
            InhibitMode::Block => "block",
            InhibitMode::BlockWeak => "block-weak",
            InhibitMode::Delay => "delay",
        }
    }
}

/// `"target": "bootc"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum BootcCmd {
    /// Behave as bootc `version` (`X.Y.Z`), or only read the release when `None`.
    Version {
        /// The release to behave as.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        version: Option<String>,
    },
    /// The next `bootc switch` fails while pulling with `message`.
    FailNextSwitch {
        /// What the pull error says.
        message: String,
    },
    /// The next pulling `bootc upgrade` fails with `message`.
    FailNextUpgrade {
        /// What the pull error says.
        message: String,
    },
    /// The next `bootc switch` pulls for `ms` before it stages.
    DelayNextSwitch {
        /// Milliseconds.
        ms: u64,
    },
    /// The next staging `bootc switch` waits `ms` after staging before it exits.
    PauseAfterNextSwitch {
        /// Milliseconds.
        ms: u64,
    },
}

/// `"target": "apiserver"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum ApiServerCmd {
    /// Request counts, of the requests received in `since_ms <= t < until_ms` (Unix
    /// milliseconds) when either bound is given.
    Stats {
        /// Lower bound.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        since_ms: Option<u64>,
        /// Upper bound (exclusive).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        until_ms: Option<u64>,
    },
    /// Forget the counts and the request log.
    ResetStats,
    /// Every request since the last reset.
    Requests,
    /// Every 429/5xx the fault knobs answered.
    InjectedFaults,
    /// The server's record of unavailable nodes.
    Unavailable,
    /// Start a new record of unavailable nodes from the current set.
    ResetUnavailable,
    /// How long the stand-in kubelet takes to remove a gracefully deleted pod.
    PodRemoval {
        /// Milliseconds.
        delay_ms: u64,
    },
    /// A bearer token and a kubeconfig for a new user.
    AddUser {
        /// The user name.
        user: String,
    },
    /// Injects a fault.
    Fault(Fault),
    /// Serves the OSImageStream API as `version` (`v1`, `v1alpha1`) or not at all (`None`).
    ServeOsimagestreams {
        /// The served version.
        version: Option<String>,
    },
    /// A new client CA (the kubelet's certificate rotation).
    RotateClientCa,
    /// The Node.
    GetNode,
    /// The Node's annotations.
    NodeAnnotations,
}

impl ApiServerCmd {
    /// `stats` over every request since the last reset.
    pub const STATS: ApiServerCmd = ApiServerCmd::Stats {
        since_ms: None,
        until_ms: None,
    };
}

/// A fault of the API server (`{"cmd":"fault","kind":…}`). `throttle`, `error` and `delay` hit
/// every request, or only those of `user` and/or `verb` when given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Fault {
    /// End every open watch now.
    DropWatches,
    /// The next `count` watches get a 410 `ERROR` event, and the history is compacted.
    Gone {
        /// How many watches.
        #[serde(default = "one")]
        count: u64,
    },
    /// The next `count` requests get 429 with `Retry-After: retry_after`.
    Throttle {
        /// How many requests.
        #[serde(default = "one")]
        count: u64,
        /// Seconds.
        #[serde(default = "one")]
        retry_after: u64,
        /// Only this user's requests.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
        /// Only requests with this verb.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        verb: Option<String>,
    },
    /// The next `count` requests get `code` (500 or 503).
    Error {
        /// How many requests.
        #[serde(default = "one")]
        count: u64,
        /// 500 or 503.
        #[serde(default = "internal_error")]
        code: u16,
        /// Only this user's requests.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
        /// Only requests with this verb.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        verb: Option<String>,
    },
    /// Delay every response by `ms` (0 ends it).
    Delay {
        /// Milliseconds.
        ms: u64,
        /// Only this user's requests.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
        /// Only requests with this verb.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        verb: Option<String>,
    },
    /// Close (true) or reopen (false) the listening port, cutting open connections.
    Refuse {
        /// Closed while true.
        on: bool,
    },
    /// End all faults.
    Clear,
}

fn one() -> u64 {
    1
}

fn internal_error() -> u16 {
    500
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    /// A command and the JSON it is on the wire (as `docs/testbed.md` spells it).
    type Case = (Request, Value);

    fn case(request: impl Into<Request>, wire: Value) -> Case {
        (request.into(), wire)
    }

    /// Every variant, by target.
    fn cases() -> Vec<Case> {
        [
            testbed_cases(),
            rpmostreed_cases(),
            host_service_cases(),
            apiserver_cases(),
            fault_cases(),
        ]
        .concat()
    }

    fn testbed_cases() -> Vec<Case> {
        use TestbedCmd as T;
        vec![
            case(
                T::Reboot {
                    fail_finalize: true,
                },
                json!({"target": "testbed", "cmd": "reboot", "fail-finalize": true}),
            ),
            case(
                T::StartStreamd.on("worker-1"),
                json!({"target": "testbed", "cmd": "start-streamd", "node": "worker-1"}),
            ),
            case(
                T::StopStreamd.on("worker-1"),
                json!({"target": "testbed", "cmd": "stop-streamd", "node": "worker-1"}),
            ),
            case(T::Nodes, json!({"target": "testbed", "cmd": "nodes"})),
        ]
    }

    fn rpmostreed_cases() -> Vec<Case> {
        use RpmOstreedCmd as R;
        let wire = |cmd: &str, args: Value| {
            let mut v = json!({"target": "rpmostreed", "cmd": cmd});
            if let (Some(v), Value::Object(args)) = (v.as_object_mut(), args) {
                v.extend(args);
            }
            v
        };
        vec![
            case(
                R::FailNext {
                    message: "m".into(),
                },
                wire("fail-next", json!({"message": "m"})),
            ),
            case(
                R::HoldForeign { on: true },
                wire("hold-foreign", json!({"on": true})),
            ),
            case(
                R::Progress {
                    signals: 40,
                    per_second: 8,
                },
                wire("progress", json!({"signals": 40, "per-second": 8})),
            ),
            case(
                R::Slow { ms: 400 }.on("worker-0"),
                wire("slow", json!({"ms": 400, "node": "worker-0"})),
            ),
            case(R::DropVariantNext, wire("drop-variant-next", json!({}))),
            case(R::BrokenRootNext, wire("broken-root-next", json!({}))),
            case(
                R::LegacyLockFile { on: true },
                wire("legacy-lock-file", json!({"on": true})),
            ),
            case(
                R::DenyCalls { on: false },
                wire("deny-calls", json!({"on": false})),
            ),
            case(R::DropPeerNext, wire("drop-peer-next", json!({}))),
            case(R::DropAfterUnlock, wire("drop-after-unlock", json!({}))),
            case(
                R::AdminDeploy { image: "i".into() },
                wire("admin-deploy", json!({"image": "i"})),
            ),
            case(
                R::LoseImageMetadata { index: 1 },
                wire("lose-image-metadata", json!({"index": 1})),
            ),
            case(
                R::ExitMidTransaction,
                wire("exit-mid-transaction", json!({})),
            ),
            case(R::Bus { on: false }, wire("bus", json!({"on": false}))),
            case(R::Transactions, wire("transactions", json!({}))),
            case(R::Clients, wire("clients", json!({}))),
            case(R::Deployments, wire("deployments", json!({}))),
            case(R::ResetTransactions, wire("reset-transactions", json!({}))),
        ]
    }

    fn host_service_cases() -> Vec<Case> {
        use BootcCmd as B;
        use LogindCmd as L;
        use SystemdCmd as S;
        let inhibitor = Inhibitor {
            what: "shutdown:sleep".into(),
            who: "etcd-backup".into(),
            why: "snapshot".into(),
            mode: InhibitMode::BlockWeak,
            uid: 0,
            pid: 7,
        };
        vec![
            case(S::Units, json!({"target": "systemd", "cmd": "units"})),
            case(S::Loaded, json!({"target": "systemd", "cmd": "loaded"})),
            case(
                L::Inhibit(inhibitor),
                json!({"target": "logind", "cmd": "inhibit", "what": "shutdown:sleep",
                    "who": "etcd-backup", "why": "snapshot", "mode": "block-weak",
                    "uid": 0, "pid": 7}),
            ),
            case(
                L::Release { who: "x".into() },
                json!({"target": "logind", "cmd": "release", "who": "x"}),
            ),
            case(
                L::Inhibitors,
                json!({"target": "logind", "cmd": "inhibitors"}),
            ),
            case(L::Reboots, json!({"target": "logind", "cmd": "reboots"})),
            case(
                B::Version {
                    version: Some("1.2.0".into()),
                },
                json!({"target": "bootc", "cmd": "version", "version": "1.2.0"}),
            ),
            case(
                B::FailNextSwitch {
                    message: "m".into(),
                },
                json!({"target": "bootc", "cmd": "fail-next-switch", "message": "m"}),
            ),
            case(
                B::FailNextUpgrade {
                    message: "m".into(),
                },
                json!({"target": "bootc", "cmd": "fail-next-upgrade", "message": "m"}),
            ),
            case(
                B::DelayNextSwitch { ms: 3 },
                json!({"target": "bootc", "cmd": "delay-next-switch", "ms": 3}),
            ),
            case(
                B::PauseAfterNextSwitch { ms: 3 },
                json!({"target": "bootc", "cmd": "pause-after-next-switch", "ms": 3}),
            ),
        ]
    }

    fn apiserver_cases() -> Vec<Case> {
        use ApiServerCmd as A;
        vec![
            case(
                A::Stats {
                    since_ms: Some(1),
                    until_ms: Some(2),
                },
                json!({"target": "apiserver", "cmd": "stats", "since_ms": 1, "until_ms": 2}),
            ),
            case(
                A::ResetStats,
                json!({"target": "apiserver", "cmd": "reset-stats"}),
            ),
            case(
                A::Requests,
                json!({"target": "apiserver", "cmd": "requests"}),
            ),
            case(
                A::InjectedFaults,
                json!({"target": "apiserver", "cmd": "injected-faults"}),
            ),
            case(
                A::Unavailable,
                json!({"target": "apiserver", "cmd": "unavailable"}),
            ),
            case(
                A::ResetUnavailable,
                json!({"target": "apiserver", "cmd": "reset-unavailable"}),
            ),
            case(
                A::PodRemoval { delay_ms: 5 },
                json!({"target": "apiserver", "cmd": "pod-removal", "delay_ms": 5}),
            ),
            case(
                A::AddUser { user: "u".into() },
                json!({"target": "apiserver", "cmd": "add-user", "user": "u"}),
            ),
            case(
                A::ServeOsimagestreams { version: None },
                json!({"target": "apiserver", "cmd": "serve-osimagestreams", "version": null}),
            ),
            case(
                A::RotateClientCa,
                json!({"target": "apiserver", "cmd": "rotate-client-ca"}),
            ),
            case(
                A::GetNode,
                json!({"target": "apiserver", "cmd": "get-node"}),
            ),
            case(
                A::NodeAnnotations,
                json!({"target": "apiserver", "cmd": "node-annotations"}),
            ),
        ]
    }

    fn fault_cases() -> Vec<Case> {
        let fault = |f: Fault| ApiServerCmd::Fault(f);
        let some = |s: &str| Some(s.to_string());
        vec![
            case(
                fault(Fault::DropWatches),
                json!({"target": "apiserver", "cmd": "fault", "kind": "drop-watches"}),
            ),
            case(
                fault(Fault::Gone { count: 2 }),
                json!({"target": "apiserver", "cmd": "fault", "kind": "gone", "count": 2}),
            ),
            case(
                fault(Fault::Throttle {
                    count: 3,
                    retry_after: 2,
                    user: some("u"),
                    verb: None,
                }),
                json!({"target": "apiserver", "cmd": "fault", "kind": "throttle",
                    "count": 3, "retry_after": 2, "user": "u"}),
            ),
            case(
                fault(Fault::Error {
                    count: 1,
                    code: 503,
                    user: None,
                    verb: some("patch"),
                }),
                json!({"target": "apiserver", "cmd": "fault", "kind": "error",
                    "count": 1, "code": 503, "verb": "patch"}),
            ),
            case(
                fault(Fault::Delay {
                    ms: 9,
                    user: some("u"),
                    verb: some("get"),
                }),
                json!({"target": "apiserver", "cmd": "fault", "kind": "delay",
                    "ms": 9, "user": "u", "verb": "get"}),
            ),
            case(
                fault(Fault::Refuse { on: true }),
                json!({"target": "apiserver", "cmd": "fault", "kind": "refuse", "on": true}),
            ),
            case(
                fault(Fault::Clear),
                json!({"target": "apiserver", "cmd": "fault", "kind": "clear"}),
            ),
        ]
    }

    /// A distinct number per variant; no wildcard, so a new variant does not compile until it
    /// is numbered here, and [`VARIANTS`] then wants a table entry for it.
    fn ordinal(c: &Command) -> usize {
        use ApiServerCmd as A;
        use BootcCmd as B;
        use LogindCmd as L;
        use RpmOstreedCmd as R;
        use SystemdCmd as S;
        use TestbedCmd as T;
        match c {
            Command::Testbed(c) => match c {
                T::Reboot { .. } => 0,
                T::StartStreamd => 1,
                T::StopStreamd => 2,
                T::Nodes => 3,
            },
            Command::Rpmostreed(c) => match c {
                R::FailNext { .. } => 4,
                R::HoldForeign { .. } => 5,
                R::Progress { .. } => 6,
                R::Slow { .. } => 7,
                R::DropVariantNext => 8,
                R::LegacyLockFile { .. } => 9,
                R::DenyCalls { .. } => 10,
                R::DropPeerNext => 11,
                R::DropAfterUnlock => 12,
                R::AdminDeploy { .. } => 13,
                R::LoseImageMetadata { .. } => 14,
                R::ExitMidTransaction => 15,
                R::Transactions => 16,
                R::Clients => 17,
                R::Deployments => 18,
                R::ResetTransactions => 19,
                R::Bus { .. } => 50,
                R::BrokenRootNext => 51,
            },
            Command::Systemd(c) => match c {
                S::Units => 20,
                S::Loaded => 21,
            },
            Command::Logind(c) => match c {
                L::Inhibit(_) => 22,
                L::Release { .. } => 23,
                L::Inhibitors => 24,
                L::Reboots => 25,
            },
            Command::Bootc(c) => match c {
                B::Version { .. } => 26,
                B::FailNextSwitch { .. } => 27,
                B::FailNextUpgrade { .. } => 28,
                B::DelayNextSwitch { .. } => 29,
                B::PauseAfterNextSwitch { .. } => 30,
            },
            Command::Apiserver(c) => match c {
                A::Stats { .. } => 31,
                A::ResetStats => 32,
                A::Requests => 33,
                A::InjectedFaults => 34,
                A::Unavailable => 35,
                A::ResetUnavailable => 36,
                A::PodRemoval { .. } => 37,
                A::AddUser { .. } => 38,
                A::Fault(f) => match f {
                    Fault::DropWatches => 39,
                    Fault::Gone { .. } => 40,
                    Fault::Throttle { .. } => 41,
                    Fault::Error { .. } => 42,
                    Fault::Delay { .. } => 43,
                    Fault::Refuse { .. } => 44,
                    Fault::Clear => 45,
                },
                A::ServeOsimagestreams { .. } => 46,
                A::RotateClientCa => 47,
                A::GetNode => 48,
                A::NodeAnnotations => 49,
            },
        }
    }

    const VARIANTS: usize = 52;

    #[test]
    fn every_command_is_the_json_the_testbed_parses() {
        let table = cases();
        let mut seen: Vec<usize> = table.iter().map(|(r, _)| ordinal(&r.command)).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(
            seen,
            (0..VARIANTS).collect::<Vec<_>>(),
            "one entry per variant"
        );
        for (request, wire) in table {
            assert_eq!(serde_json::to_value(&request).unwrap(), wire, "{request:?}");
            // What `testbed ctl` sends is what the control socket turns back into the command.
            let line = wire.to_string();
            let parsed: Request =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
            assert_eq!(parsed, request, "{line}");
        }
    }

    #[test]
    fn omitted_arguments_take_their_defaults() {
        let parse = |v: Value| serde_json::from_value::<Request>(v).unwrap().command;
        assert_eq!(
            parse(json!({"target": "testbed", "cmd": "reboot", "node": "w"})),
            Command::Testbed(TestbedCmd::Reboot {
                fail_finalize: false
            })
        );
        assert_eq!(
            parse(json!({"target": "apiserver", "cmd": "fault", "kind": "throttle"})),
            Command::Apiserver(ApiServerCmd::Fault(Fault::Throttle {
                count: 1,
                retry_after: 1,
                user: None,
                verb: None
            }))
        );
        assert_eq!(
            parse(json!({"target": "apiserver", "cmd": "fault", "kind": "error", "count": 4})),
            Command::Apiserver(ApiServerCmd::Fault(Fault::Error {
                count: 4,
                code: 500,
                user: None,
                verb: None
            }))
        );
        assert_eq!(
            parse(json!({"target": "apiserver", "cmd": "serve-osimagestreams"})),
            Command::Apiserver(ApiServerCmd::ServeOsimagestreams { version: None })
        );
        assert_eq!(
            parse(json!({"target": "bootc", "cmd": "version"})),
            Command::Bootc(BootcCmd::Version { version: None })
        );
        assert_eq!(
            parse(json!({"target": "apiserver", "cmd": "stats"})),
            Command::Apiserver(ApiServerCmd::STATS)
        );
    }

    #[test]
    fn malformed_commands_are_refused() {
        for bad in [
            json!({"cmd": "transactions"}),
            json!({"target": "nope", "cmd": "units"}),
            json!({"target": "rpmostreed"}),
            json!({"target": "rpmostreed", "cmd": "nope"}),
            json!({"target": "rpmostreed", "cmd": "fail-next"}),
            json!({"target": "rpmostreed", "cmd": "progress", "signals": -1, "per-second": 1}),
            json!({"target": "rpmostreed", "cmd": "progress",
                "signals": 5_000_000_000u64, "per-second": 1}),
            json!({"target": "rpmostreed", "cmd": "hold-foreign", "on": "yes"}),
            json!({"target": "logind", "cmd": "inhibit",
                "what": "shutdown", "who": "w", "why": "y", "mode": "strict"}),
            json!({"target": "apiserver", "cmd": "stats", "since_ms": "now"}),
            json!({"target": "apiserver", "cmd": "fault", "kind": "nope"}),
            json!({"target": "apiserver", "cmd": "fault", "kind": "error", "user": 7}),
            json!({"target": "apiserver", "cmd": "fault", "kind": "throttle", "count": -1}),
            json!({"target": "apiserver", "cmd": "fault", "kind": "delay",
                "ms": 5, "verb": ["patch"]}),
            json!({"target": "apiserver", "cmd": "serve-osimagestreams", "version": 1}),
        ] {
            assert!(
                serde_json::from_value::<Request>(bad.clone()).is_err(),
                "{bad}"
            );
        }
    }
}

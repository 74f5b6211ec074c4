//! Journal logging: a child process logs through `streamd::logging::init_journal()` to a
//! datagram socket this test binds at the journald path; the test parses the native-protocol
//! datagrams it receives.

use std::collections::BTreeMap;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use streamd::cluster::protocol::State;
use streamd::logging;

const SOCKET: &str = "/run/systemd/journal/socket";
const CHILD: &str = "STREAMD_JOURNAL_TEST_CHILD";
const PASSWORD: &str = "hunter2-very-secret";
const NODE: &str = "worker-7";

/// One journal entry: field name → values (a field may repeat).
type Entry = BTreeMap<String, Vec<Vec<u8>>>;

/// Parses a native journal protocol payload: `NAME=value\n` or `NAME\n<u64 le length><value>\n`.
fn parse(mut data: &[u8]) -> Result<Entry, String> {
    let mut out = Entry::new();
    while !data.is_empty() {
        let end = data
            .iter()
            .position(|&b| b == b'\n' || b == b'=')
            .ok_or("field name without terminator")?;
        let name = String::from_utf8(data[..end].to_vec()).map_err(|e| e.to_string())?;
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b == b'_' || b.is_ascii_uppercase() || b.is_ascii_digit())
        {
            return Err(format!("invalid field name {name:?}"));
        }
        let value;
        if data[end] == b'=' {
            let rest = &data[end + 1..];
            let nl = rest
                .iter()
                .position(|&b| b == b'\n')
                .ok_or("value without newline")?;
            value = rest[..nl].to_vec();
            data = &rest[nl + 1..];
        } else {
            let rest = &data[end + 1..];
            if rest.len() < 8 {
                return Err(format!("{name}: truncated length"));
            }
            let len = u64::from_le_bytes(rest[..8].try_into().unwrap()) as usize;
            let rest = &rest[8..];
            if rest.len() < len + 1 || rest[len] != b'\n' {
                return Err(format!("{name}: bad binary value"));
            }
            value = rest[..len].to_vec();
            data = &rest[len + 1..];
        }
        out.entry(name).or_default().push(value);
    }
    Ok(out)
}

fn one<'a>(e: &'a Entry, name: &str) -> &'a str {
    match e.get(name).map(Vec::as_slice) {
        Some([v]) => std::str::from_utf8(v).unwrap(),
        other => panic!("{name}: expected one value, got {other:?} in {e:?}"),
    }
}

fn child_main(mode: &str) {
    let journal = logging::init_journal();
    if mode == "fallback" {
        assert!(!journal, "journal unexpectedly reachable");
        logging::log_state(State::Idle, "fallback", "s", "i", NODE);
        return;
    }
    assert!(journal, "journal socket not reachable from the child");
    logging::log_state(
        State::Refused,
        "two\nlines",
        "stable-4.20",
        "quay.io/os/rhel@sha256:abc",
        NODE,
    );
    logging::log_preflight_failed(
        streamd::cluster::protocol::CheckId::DiskSpace,
        "only 1 GiB free",
        "stable-4.20",
        "quay.io/os/rhel@sha256:abc",
        NODE,
    );
    let json = format!(r#"{{"auths":{{"quay.io":{{"username":"bot","password":"{PASSWORD}"}}}}}}"#);
    let secret = streamd::image::pullsecret::PullSecret::parse(&json).unwrap();
    let creds = secret.for_registry("quay.io").unwrap();
    tracing::info!(?creds, "credentials");
}

fn run_child(mode: &str) -> std::process::Output {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "journal_fields",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, mode)
        .env_remove("STREAMD_LOG")
        .output()
        .unwrap()
}

#[test]
fn journal_fields() {
    if let Ok(mode) = std::env::var(CHILD) {
        child_main(&mode);
        return;
    }
    let path = Path::new(SOCKET);
    if path.exists() {
        let probe = UnixDatagram::unbound().unwrap();
        if probe.send_to(&[], path).is_ok() {
            eprintln!("note: {SOCKET} is a live journal socket; skipping");
            return;
        }
        std::fs::remove_file(path).unwrap();
    }
    let dir = path.parent().unwrap();
    let created_dir = !dir.exists();
    std::fs::create_dir_all(dir).unwrap();

    // No socket: the child falls back to stderr with a warning instead of panicking.
    let out = run_child("fallback");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "fallback child failed: {stderr}");
    assert!(stderr.contains("cannot log to the journal"), "{stderr}");
    assert!(stderr.contains("state changed"), "{stderr}");

    let sock = UnixDatagram::bind(path).unwrap();
    struct Cleanup(bool);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(SOCKET);
            if self.0 {
                let _ = std::fs::remove_dir(Path::new(SOCKET).parent().unwrap());
            }
        }
    }
    let _cleanup = Cleanup(created_dir);
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();

    let started = Instant::now();
    let out = run_child("journal");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "journal child failed: {stderr}");

    let mut entries = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    while let Ok(n) = sock.recv(&mut buf) {
        if n == 0 {
            continue; // the layer's connectivity probe
        }
        let raw = &buf[..n];
        assert!(
            !raw.windows(PASSWORD.len())
                .any(|w| w == PASSWORD.as_bytes()),
            "password reached the journal"
        );
        let Ok(entry) = parse(raw) else {
            continue; // not ours: ours are checked by count and content below
        };
        // Other processes on this machine may log to the socket while it is bound.
        if entry.get("SYSLOG_IDENTIFIER") == Some(&vec![b"streamd".to_vec()]) {
            entries.push(entry);
        }
    }
    eprintln!("journal test took {:?}", started.elapsed());
    assert_eq!(entries.len(), 3, "{entries:?}");

    let state = &entries[0];
    assert_eq!(
        one(state, "MESSAGE_ID"),
        logging::message_id(State::Refused)
    );
    assert_eq!(one(state, "MESSAGE_ID"), "e0e3cc530e8f442582d19ef6d6b8e8dd");
    assert_eq!(one(state, "STREAMD_STATE"), "Refused");
    assert_eq!(one(state, "STREAMD_REASON"), "two\nlines");
    assert_eq!(one(state, "STREAMD_STREAM"), "stable-4.20");
    assert_eq!(one(state, "STREAMD_IMAGE"), "quay.io/os/rhel@sha256:abc");
    assert_eq!(one(state, "STREAMD_NODE"), NODE);
    assert_eq!(one(state, "PRIORITY"), "6");
    assert_eq!(
        one(state, "MESSAGE"),
        "state changed to Refused: two\nlines"
    );
    assert_eq!(one(state, "SYSLOG_IDENTIFIER"), "streamd");
    assert_eq!(one(state, "TARGET"), "streamd::agent");

    let pre = &entries[1];
    assert_eq!(one(pre, "MESSAGE_ID"), logging::PREFLIGHT_FAILED_MESSAGE_ID);
    assert_eq!(one(pre, "MESSAGE_ID"), "2a112241026c42db81625fa7b057ad16");
    assert_eq!(one(pre, "STREAMD_CHECK"), "disk-space");
    assert_eq!(one(pre, "STREAMD_REASON"), "only 1 GiB free");
    assert_eq!(one(pre, "STREAMD_NODE"), NODE);
    assert_eq!(one(pre, "PRIORITY"), "4");
    assert_eq!(
        one(pre, "MESSAGE"),
        "preflight check disk-space failed: only 1 GiB free"
    );

    let creds = &entries[2];
    assert_eq!(one(creds, "MESSAGE"), "credentials");
    assert!(one(creds, "CREDS").contains("<redacted>"), "{creds:?}");
    assert!(!creds.contains_key("MESSAGE_ID"));
}

#[test]
fn parser_reads_both_forms() {
    let mut d = b"A=1\nB\n".to_vec();
    d.extend_from_slice(&3u64.to_le_bytes());
    d.extend_from_slice(b"x\ny\n");
    let e = parse(&d).unwrap();
    assert_eq!(one(&e, "A"), "1");
    assert_eq!(one(&e, "B"), "x\ny");
    assert!(parse(b"B\n\x05\0\0\0\0\0\0\0ab\n").is_err());
}

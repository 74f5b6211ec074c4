//! systemd's notification protocol (`sd_notify`), sent without ever waiting: `READY=1`,
//! `STATUS=`, `WATCHDOG=1`, `STOPPING=1`.
//!
//! `sd_notify::notify` (like systemd's own `sd_notify`) sends on a blocking socket, and a
//! datagram to a receiver whose queue is full (`net.unix.max_dgram_qlen`) waits until it is read:
//! on the daemon's one-thread runtime that stopped everything, staging and SIGTERM included. Here
//! a message that does not fit is dropped; a lost `WATCHDOG=1` is one of many, while `READY=1`
//! and `STOPPING=1`, which systemd waits for, are sent again until one goes out
//! ([`send_until_sent`]).

use std::time::Duration;

use tracing::debug;

/// Sends `state` to the service manager's `NOTIFY_SOCKET`, if any, without waiting; `false`
/// when it was dropped (the queue was full, or the socket is gone).
pub fn send(state: &[sd_notify::NotifyState]) -> bool {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return true;
    };
    let msg: String = state.iter().map(|s| format!("{s}\n")).collect();
    match send_nonblocking(&path, msg.as_bytes()) {
        Ok(()) => true,
        Err(e) => {
            debug!(error = %e, message = msg.trim_end(), "sd_notify message dropped");
            false
        }
    }
}

/// Sends `STATUS=<line>` as one bounded line: sd_notify splits at newlines, so a reason carrying
/// registry text could otherwise inject `WATCHDOG=trigger`.
pub fn status(line: &str) {
    let line = crate::text::one_line_reason(line);
    send(&[sd_notify::NotifyState::Status(&line)]);
}

/// Sends `state` until it goes out: every 50 ms at first, backing off to 1 s, for at most
/// `within` (systemd stops waiting for `READY=1` at its start timeout anyway); `false`: it
/// never did.
pub async fn send_until_sent(state: &[sd_notify::NotifyState<'_>], within: Duration) -> bool {
    let mut backoff =
        crate::backoff::Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if send(state) {
            return true;
        }
        let delay = backoff.next_delay();
        if tokio::time::Instant::now() + delay > deadline {
            return false;
        }
        tokio::time::sleep(delay).await;
    }
}

/// Half the watchdog timeout systemd asked for (`WATCHDOG_USEC`), if any: how often to send
/// `WATCHDOG=1`.
pub fn watchdog_interval() -> Option<Duration> {
    let mut usec = 0u64;
    (sd_notify::watchdog_enabled(false, &mut usec) && usec > 0)
        .then(|| Duration::from_micros(usec / 2))
}

fn send_nonblocking(path: &std::ffi::OsStr, msg: &[u8]) -> std::io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};

    let sock = UnixDatagram::unbound()?;
    sock.set_nonblocking(true)?;
    // A leading `@` names an abstract socket, as in systemd's `sd_notify`.
    let addr = match path.as_bytes().strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name)?,
        None => SocketAddr::from_pathname(path)?,
    };
    sock.send_to_addr(msg, &addr)?;
    Ok(())
}

//! One rpm-ostree transaction, driven over the daemon's peer-to-peer socket.

use futures::StreamExt;
use zbus::message::Type as MessageType;

use super::RpmOstreeError;

const TXN_INTERFACE: &str = "org.projectatomic.rpmostree1.Transaction";

/// Progress of a running transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnEvent {
    /// `PercentProgress(text, percentage)`.
    Percent(String, u8),
    /// `Message(text)`.
    Message(String),
}

/// Connects to `address`, subscribes, calls `Start()` and waits for `Finished`.
///
/// The peer connection is closed as soon as the result is known: the daemon keeps the transaction
/// (and answers everyone else "Transaction in progress") while a peer stays connected.
/// Resolving `cancel` asks the daemon to `Cancel()` the transaction; the result still comes as
/// `Finished` (false), so the daemon decides what is left behind, never this process.
pub async fn run(
    address: &str,
    events: &tokio::sync::mpsc::Sender<TxnEvent>,
    cancel: Option<tokio::sync::watch::Receiver<bool>>,
) -> Result<(), RpmOstreeError> {
    let conn = zbus::connection::Builder::address(address)
        .map_err(|e| RpmOstreeError::Protocol(format!("transaction address {address:?}: {e}")))?
        .p2p()
        .build()
        .await
        .map_err(|e| RpmOstreeError::from_call("transaction connect", e))?;
    // Subscribe before Start(), so no signal can be missed.
    let mut stream = zbus::MessageStream::from(&conn);
    let start = conn
        .call_method(None::<&str>, "/", Some(TXN_INTERFACE), "Start", &())
        .await;
    let result = match start {
        Ok(_) => {
            tokio::select! {
                biased;
                r = wait_finished(&mut stream, events) => r,
                Ok(()) = wait_cancel(cancel) => {
                    // Cancel() replies at once; the outcome still arrives as Finished.
                    let _ = conn
                        .call_method(None::<&str>, "/", Some(TXN_INTERFACE), "Cancel", &())
                        .await;
                    match wait_finished(&mut stream, events).await {
                        Err(RpmOstreeError::Failed(_)) => Err(RpmOstreeError::Cancelled),
                        other => other,
                    }
                }
            }
        }
        Err(e) => Err(RpmOstreeError::from_call("Start", e)),
    };
    drop(stream);
    // Closing can only fail if the daemon already hung up, which changes nothing here.
    let _ = conn.close().await;
    result
}

/// [`run`] for at most `limit`: a daemon that takes the call and then never reports the end
/// (hung, or wedged in a hook) is [`RpmOstreeError::Stalled`] after it, so the state says so and
/// the step is tried again, instead of a wait without end. Dropping the peer connection leaves
/// the transaction to the daemon, which ends or cancels it itself.
pub async fn run_within(
    call: &'static str,
    limit: std::time::Duration,
    address: &str,
    events: &tokio::sync::mpsc::Sender<TxnEvent>,
) -> Result<(), RpmOstreeError> {
    match tokio::time::timeout(limit, run(address, events, None)).await {
        Ok(result) => result,
        Err(_) => Err(RpmOstreeError::Stalled {
            call,
            after_s: limit.as_secs(),
        }),
    }
}

/// Resolves once `cancel` turns true; never without a receiver or when the sender is gone.
async fn wait_cancel(cancel: Option<tokio::sync::watch::Receiver<bool>>) -> Result<(), ()> {
    match cancel {
        Some(mut rx) => {
            // The guard `wait_for` returns must not live across an await.
            let cancelled = rx.wait_for(|c| *c).await.is_ok();
            if cancelled {
                Ok(())
            } else {
                std::future::pending().await
            }
        }
        None => std::future::pending().await,
    }
}

/// How a daemon numbers the layers of a container pull in its "[k/N] Fetching ostree chunk …"
/// tasks (coreos/rpm-ostree:rust/src/sysroot_upgrade.rs `layer_progress_print`): k is the count
/// of layers already done up to v2026.1 (the first layer is `[0/N]`, since v2024.9) and the
/// layer starting from v2026.2 (the first is `[1/N]`, da4b4fa0). The first task of a pull says
/// which.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct LayerNumbering {
    zero_based: Option<bool>,
}

impl LayerNumbering {
    /// The share of layers done when `task` starts, if it is a layer task.
    fn percent(&mut self, task: &str) -> Option<u8> {
        let (counts, _) = task.strip_prefix('[')?.split_once("] ")?;
        let (k, total) = counts.split_once('/')?;
        let (k, total) = (k.parse::<u64>().ok()?, total.parse::<u64>().ok()?);
        if total == 0 || k > total {
            return None;
        }
        let zero_based = *self.zero_based.get_or_insert(k == 0);
        let done = if zero_based { k } else { k.checked_sub(1)? };
        u8::try_from(done.min(total) * 100 / total).ok()
    }
}

async fn wait_finished(
    stream: &mut zbus::MessageStream,
    events: &tokio::sync::mpsc::Sender<TxnEvent>,
) -> Result<(), RpmOstreeError> {
    let mut layers = LayerNumbering::default();
    while let Some(msg) = stream.next().await {
        let Ok(msg) = msg else { continue };
        let header = msg.header();
        if header.message_type() != MessageType::Signal
            || header.interface().map(|i| i.as_str()) != Some(TXN_INTERFACE)
        {
            continue;
        }
        let member = header.member().map(|m| m.to_string()).unwrap_or_default();
        let body = msg.body();
        match member.as_str() {
            "Finished" => {
                let (ok, text): (bool, String) = body
                    .deserialize()
                    .map_err(|e| RpmOstreeError::Protocol(format!("Finished signal body: {e}")))?;
                return if ok {
                    Ok(())
                } else {
                    Err(RpmOstreeError::Failed(crate::text::one_line_reason(&text)))
                };
            }
            "PercentProgress" => {
                if let Ok((text, pct)) = body.deserialize::<(String, u32)>() {
                    // A slow consumer must not stall the transaction: drop progress, keep the result.
                    let _ = events.try_send(TxnEvent::Percent(text, pct.min(100) as u8));
                }
            }
            "Message" => {
                if let Ok((text,)) = body.deserialize::<(String,)>() {
                    let _ = events.try_send(TxnEvent::Message(text));
                }
            }
            "TaskBegin" => {
                if let Ok((text,)) = body.deserialize::<(String,)>() {
                    let _ = events.try_send(match layers.percent(&text) {
                        Some(pct) => TxnEvent::Percent(text, pct),
                        None => TxnEvent::Message(text),
                    });
                }
            }
            _ => {}
        }
    }
    Err(RpmOstreeError::Interrupted)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The percentages a pull's tasks give, in order.
    fn pull(tasks: &[&str]) -> Vec<Option<u8>> {
        let mut n = LayerNumbering::default();
        tasks.iter().map(|t| n.percent(t)).collect()
    }

    #[test]
    fn layer_tasks_are_progress_on_either_numbering() {
        // v2026.2: the layer starting, from 1 (19 hex digits, as v2026.2 printed them beside the
        // project; a `sha256:` spelling is read the same).
        assert_eq!(
            pull(&[
                "[1/12] Fetching ostree chunk 5b8974d2e5d7040b984 (100.0 MB)",
                "[7/12] Fetching ostree chunk 5b8974d2e5d7040b984 (100.0 MB)",
                "[12/12] Fetching layer sha256:ab12 (5 MB)",
            ]),
            vec![Some(0), Some(50), Some(91)]
        );
        // v2024.9 to v2026.1: the layers done, from 0 — not one layer behind.
        assert_eq!(
            pull(&[
                "[0/12] Fetching ostree chunk 0123456789abcdef012 (100.0 MB)",
                "[6/12] Fetching ostree chunk 0123456789abcdef012 (100.0 MB)",
                "[11/12] Fetching ostree chunk 0123456789abcdef012 (100.0 MB)",
            ]),
            vec![Some(0), Some(50), Some(91)]
        );
        for other in [
            "Staging deployment",
            "[13/12] x",
            "[1/0] x",
            "[a/b] x",
            "[1/2]x",
            "",
        ] {
            assert_eq!(pull(&[other]), vec![None], "{other}");
        }
    }

    /// A transaction object whose `Start()` answers and which never sends `Finished`.
    struct Silent;

    #[zbus::interface(name = "org.projectatomic.rpmostree1.Transaction")]
    impl Silent {
        fn start(&self) -> bool {
            true
        }
    }

    #[tokio::test]
    async fn a_transaction_that_never_finishes_is_stalled_after_its_limit() {
        let dir = testbed::scratch::ScratchDir::new("txn").expect("scratch dir");
        let path = dir.join("t.sock");
        let listener = tokio::net::UnixListener::bind(&path).expect("bind");
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.expect("accept");
            let conn = zbus::connection::Builder::unix_stream(stream)
                .server(zbus::Guid::generate())
                .expect("guid")
                .p2p()
                .serve_at("/", Silent)
                .expect("serve")
                .build()
                .await
                .expect("peer");
            // Held open: the daemon keeps its side while the transaction "runs".
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(conn);
        });
        let (tx, _rx) = tokio::sync::mpsc::channel(1);
        let address = format!("unix:path={}", path.display());
        let got = run_within("Cleanup", Duration::from_millis(300), &address, &tx).await;
        server.abort();
        match got {
            Err(RpmOstreeError::Stalled { call, after_s }) => {
                assert_eq!((call, after_s), ("Cleanup", 0));
            }
            other => panic!("not stalled: {other:?}"),
        }
    }
}

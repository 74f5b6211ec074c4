//! `DIR/control.sock`: one JSON control command per line, one JSON reply per line.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tracing::warn;

use crate::control::Request;

/// Serves `DIR/control.sock`: one JSON command per line, parsed into a [`Request`] and
/// answered by `handle`.
pub(crate) fn serve_control<F, Fut>(path: &Path, handle: F) -> anyhow::Result<()>
where
    F: Fn(Request) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<Value>> + Send + 'static,
{
    let _ = std::fs::remove_file(path);
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    let handle = Arc::new(handle);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let handle = handle.clone();
            tokio::spawn(async move {
                if let Err(e) = control_session(stream, &*handle).await {
                    warn!(error = %e, "control session failed");
                }
            });
        }
    });
    Ok(())
}

async fn control_session<F, Fut>(stream: UnixStream, handle: &F) -> anyhow::Result<()>
where
    F: Fn(Request) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Value>>,
{
    let (r, mut w) = stream.into_split();
    let mut lines = BufReader::new(r).lines();
    while let Some(line) = lines.next_line().await? {
        let reply = match serde_json::from_str::<Value>(&line) {
            Ok(cmd) => match serde_json::from_value::<Request>(cmd) {
                Ok(request) => match handle(request).await {
                    Ok(result) => json!({ "ok": true, "result": result }),
                    Err(e) => json!({ "ok": false, "error": format!("{e:#}") }),
                },
                Err(e) => json!({ "ok": false, "error": format!("not a control command: {e}") }),
            },
            Err(e) => json!({ "ok": false, "error": format!("not JSON: {e}") }),
        };
        w.write_all(format!("{reply}\n").as_bytes()).await?;
    }
    Ok(())
}

/// Sends one command to a testbed's control socket (what `testbed ctl` does).
pub async fn control_client(dir: &Path, cmd: &Request) -> anyhow::Result<Value> {
    let path = dir.join("control.sock");
    let stream = UnixStream::connect(&path)
        .await
        .with_context(|| format!("connecting to {} (is the testbed up?)", path.display()))?;
    let (r, mut w) = stream.into_split();
    let line = serde_json::to_string(cmd).context("serializing the command")?;
    w.write_all(format!("{line}\n").as_bytes()).await?;
    let mut lines = BufReader::new(r).lines();
    let line = lines
        .next_line()
        .await?
        .context("the testbed closed the control socket")?;
    let reply: Value = serde_json::from_str(&line).context("bad reply from the testbed")?;
    if reply["ok"] == Value::Bool(true) {
        Ok(reply["result"].clone())
    } else {
        bail!("{}", reply["error"].as_str().unwrap_or("unknown error"))
    }
}

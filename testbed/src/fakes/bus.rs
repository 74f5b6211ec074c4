//! A private, real `dbus-daemon` configured like the system bus.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::io::AsyncReadExt as _;
use tokio::process::{Child, Command};

/// A running bus; the daemon is killed when this is dropped.
pub struct Bus {
    child: Child,
    address: String,
    policy_dir: PathBuf,
}

impl std::fmt::Debug for Bus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bus").finish_non_exhaustive()
    }
}

impl Bus {
    /// Starts `dbus-daemon` with a system-bus-like config below `dir`: `<type>system</type>`,
    /// EXTERNAL auth only, and every file in `dir/policy.d` included so a service's own policy
    /// (e.g. streamd's) can be loaded into it. The default policy lets root own and call anything,
    /// like the per-service policies of a real host; other users get only what the included
    /// policies give them.
    pub async fn start(dir: &Path) -> anyhow::Result<Bus> {
        let policy_dir = dir.join("policy.d");
        std::fs::create_dir_all(&policy_dir)
            .with_context(|| format!("creating {}", policy_dir.display()))?;
        let socket = dir.join("system_bus_socket");
        let _ = std::fs::remove_file(&socket);
        let conf = dir.join("system.conf");
        std::fs::write(&conf, config(&socket, &policy_dir))
            .with_context(|| format!("writing {}", conf.display()))?;
        let mut child = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", conf.display()))
            .arg("--nofork")
            .arg("--nopidfile")
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting dbus-daemon (is the dbus package installed?)")?;
        let mut stderr = child.stderr.take().context("dbus-daemon's stderr")?;
        let address = format!("unix:path={}", socket.display());
        for _ in 0..200 {
            if socket.exists() {
                // Its messages (reloads, denials) stay visible in the test's output.
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut stderr, &mut tokio::io::stderr()).await;
                });
                return Ok(Bus {
                    child,
                    address,
                    policy_dir,
                });
            }
            // A daemon that gave up (a socket path too long, a bad config) says why at once.
            if let Some(status) = child.try_wait().context("polling dbus-daemon")? {
                let mut said = String::new();
                let _ = stderr.read_to_string(&mut said).await;
                bail!(
                    "dbus-daemon exited ({status}) before creating {}: {}",
                    socket.display(),
                    said.trim()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!("dbus-daemon did not create {} within 4 s", socket.display())
    }

    /// The bus address (`unix:path=…`).
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Directory whose files the bus includes as policy.
    pub fn policy_dir(&self) -> &Path {
        &self.policy_dir
    }

    /// Asks the daemon to reload its configuration (after adding a policy file).
    pub fn reload(&self) -> anyhow::Result<()> {
        let pid = self.child.id().context("dbus-daemon has exited")?;
        let pid = rustix::process::Pid::from_raw(pid as i32).context("bad pid")?;
        rustix::process::kill_process(pid, rustix::process::Signal::HUP)
            .context("signalling dbus-daemon")?;
        Ok(())
    }
}

fn config(socket: &Path, policy_dir: &Path) -> String {
    format!(
        r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
  <!-- As on the real system bus: nobody owns names or calls methods unless a policy says so. -->
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Introspectable"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Properties"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Peer"/>
  </policy>
  <!-- Stands in for the per-service policy files that let root own and call each service. -->
  <policy user="root">
    <allow own="*"/>
    <allow send_type="method_call"/>
  </policy>
  <includedir>{policy}</includedir>
</busconfig>
"#,
        socket = socket.display(),
        policy = policy_dir.display(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_daemon_that_cannot_listen_is_reported_with_its_own_words() {
        let dir = crate::scratch::ScratchDir::new("bus-long").expect("scratch");
        // Past dbus-daemon's socket-name limit (sun_path, 108 bytes).
        let deep = dir.join("d".repeat(120));
        std::fs::create_dir_all(&deep).expect("mkdir");
        let e = Bus::start(&deep)
            .await
            .expect_err("no bus on a too-long path");
        let text = format!("{e:#}");
        assert!(text.contains("exited"), "{text}");
        assert!(text.contains("too long"), "{text}");
        // Reported as the daemon's exit, well before the 4 s socket timeout.
        assert!(!text.contains("within 4 s"), "{text}");
    }
}

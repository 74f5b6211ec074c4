//! A private, real `dbus-daemon` configured like the system bus.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
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
        let child = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", conf.display()))
            .arg("--nofork")
            .arg("--nopidfile")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting dbus-daemon (is the dbus package installed?)")?;
        let address = format!("unix:path={}", socket.display());
        for _ in 0..200 {
            if socket.exists() {
                return Ok(Bus {
                    child,
                    address,
                    policy_dir,
                });
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

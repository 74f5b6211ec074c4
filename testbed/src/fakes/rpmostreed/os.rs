//! `org.projectatomic.rpmostree1.OS` at `/org/projectatomic/rpmostree1/<osname>`.

use std::collections::HashMap;
use std::sync::Arc;

use zbus::fdo;
use zbus::interface;
use zbus::message::Header;
use zbus::zvariant::{self, OwnedValue, Str};

use super::deploy::{LocalRpm, PackageChanges};
use super::errors::DaemonError;
use super::model::{Deployment, State};
use super::rpm;
use super::transaction::{DeployPlan, FinalizePlan, TxnRequest, Work};
use super::vardict::{VarDict, value_to_json};
use super::{Daemon, lock};

/// The OS object of the configured osname.
pub(crate) struct OsIface {
    daemon: Arc<Daemon>,
}

impl OsIface {
    pub(crate) fn new(daemon: Arc<Daemon>) -> Self {
        OsIface { daemon }
    }

    fn dict(
        &self,
        pick: impl FnOnce(&State) -> Option<Deployment>,
    ) -> fdo::Result<HashMap<String, OwnedValue>> {
        let deployment = pick(&lock(&self.daemon.state));
        match deployment {
            Some(d) => self
                .daemon
                .dict_of(&d)
                .map_err(|e| fdo::Error::Failed(e.to_string())),
            None => Ok(HashMap::new()),
        }
    }
}

/// Serialize method parameters so a later call can be compared byte for byte.
fn encode<T>(params: &T) -> Result<Vec<u8>, DaemonError>
where
    T: serde::Serialize + zvariant::DynamicType,
{
    let ctxt = zvariant::serialized::Context::new_dbus(zvariant::LE, 0);
    zvariant::to_bytes(ctxt, params)
        .map(|data| data.bytes().to_vec())
        .map_err(|e| DaemonError::InvalidArgs(e.to_string()))
}

fn sender_of(hdr: &Header<'_>) -> String {
    hdr.sender().map(|s| s.to_string()).unwrap_or_default()
}

/// The work of a deploy request: its plan, or its refusal once started.
fn begin_deploy(modifiers: &VarDict, options: &VarDict, fds: u32) -> Work {
    deploy_work(modifiers, options, fds).unwrap_or_else(|e| Work::Invalid(e.to_string()))
}

/// Validate a deploy request the way `deploy_transaction_execute` does, in its order: only once
/// the transaction runs, so a refusal is `Finished(false, message)`, never a method error
/// (`begin_deploy`).
fn deploy_work(modifiers: &VarDict, options: &VarDict, fds: u32) -> Result<Work, DaemonError> {
    let refspec = modifiers.str("set-refspec")?;
    let revision = modifiers.str("set-revision")?;
    let expected_fds = modifiers
        .handle_count("install-local-packages")?
        .saturating_add(modifiers.handle_count("override-replace-local-packages")?)
        .saturating_add(u32::from(modifiers.has_handle("ex-local-repo-remote")?));
    if expected_fds != fds {
        return Err(DaemonError::GioFailed(format!(
            "Expected {expected_fds} fds but received {fds}"
        )));
    }
    let failed = |m: &str| Err(DaemonError::GioFailed(m.to_string()));
    if refspec.is_none() && options.bool_or("skip-purge", false)? {
        return failed("Can't specify skip-purge if not setting a new refspec");
    }
    if (refspec.is_some() || revision.is_some()) && options.bool_or("no-pull-base", false)? {
        return failed("Can't specify no-pull-base if setting a new refspec or revision");
    }
    let download_only = options.bool_or("download-only", false)?;
    if options.bool_or("cache-only", false)? && download_only {
        return failed("Can't specify cache-only and download-only");
    }
    if options.bool_or("dry-run", false)? && download_only {
        return failed("Can't specify dry-run and download-only");
    }
    if modifiers.has_strv("override-replace-packages")? {
        return failed("Non-local replacement overrides not implemented yet");
    }
    let no_overrides = options.bool_or("no-overrides", false)?;
    if no_overrides
        && (modifiers.has_strv("override-remove-packages")?
            || modifiers.has_strv("override-reset-packages")?
            || modifiers.handle_count("override-replace-local-packages")? > 0)
    {
        return failed("Can't specify no-overrides if setting override modifiers");
    }
    let changes = PackageChanges {
        install_packages: modifiers.strv("install-packages")?,
        uninstall_packages: modifiers.strv("uninstall-packages")?,
        install_local: modifiers.map_handles("install-local-packages", rpm::read_nevra)?,
        override_remove: modifiers.strv("override-remove-packages")?,
        override_reset: modifiers.strv("override-reset-packages")?,
        replace_local: modifiers.map_handles("override-replace-local-packages", rpm::read_nevra)?,
        no_layering: options.bool_or("no-layering", false)?,
        no_overrides,
        idempotent: options.bool_or("idempotent-layering", false)?,
    };
    let rebase_or_deploy = refspec.is_some() || revision.is_some();
    Ok(Work::Deploy(DeployPlan {
        changes,
        refspec,
        revision,
        // Allowed by default for a rebase or deploy, checked only when the client says false
        // (coreos/rpm-ostree:src/daemon/rpmostreed-transaction-types.cxx
        // `deploy_transaction_execute`: `vardict_lookup_bool (…, refspec_or_revision)`).
        allow_downgrade: options.bool_or("allow-downgrade", rebase_or_deploy)?,
        lock_finalization: options.bool_or("lock-finalization", false)?,
        reboot: options.bool_or("reboot", false)?,
        command_line: options.str("initiating-command-line")?,
    }))
}

/// The modifiers as JSON, with the local packages' descriptors shown as the NEVRAs read
/// from them (or why they could not be read).
fn modifiers_json(modifiers: &VarDict) -> serde_json::Value {
    let mut json = modifiers.to_json();
    for key in ["install-local-packages", "override-replace-local-packages"] {
        if let Ok(read) = modifiers.map_handles(key, rpm::read_nevra)
            && !read.is_empty()
            && let Some(obj) = json.as_object_mut()
        {
            let shown: Vec<String> = read
                .iter()
                .map(|r: &LocalRpm| match r {
                    Ok(n) => n.to_string(),
                    Err(e) => format!("<unreadable: {e}>"),
                })
                .collect();
            obj.insert(key.to_string(), serde_json::json!(shown));
        }
    }
    json
}

#[interface(name = "org.projectatomic.rpmostree1.OS")]
impl OsIface {
    /// Stage a new deployment (rebase, deploy or upgrade); returns the transaction address.
    /// FD indices in `ah` modifiers must match the number of attached descriptors.
    #[zbus(out_args("transaction_address"))]
    async fn update_deployment(
        &self,
        modifiers: VarDict,
        options: VarDict,
        #[zbus(header)] hdr: Header<'_>,
    ) -> Result<String, DaemonError> {
        let fds = hdr.unix_fds().unwrap_or(0);
        let req = TxnRequest {
            method: "UpdateDeployment",
            sender: sender_of(&hdr),
            params: encode(&(&modifiers, &options))?,
            title: "new-deployment".into(),
            modifiers: modifiers_json(&modifiers),
            options: options.to_json(),
            args: serde_json::json!([]),
            fds,
        };
        self.daemon
            .begin_txn(req, |_| Ok(begin_deploy(&modifiers, &options, fds)))
            .await
    }

    /// Legacy rebase: `set-refspec=refspec` (plus `set-revision` from option `revision`);
    /// `packages` is ignored like the real daemon ignores it.
    #[zbus(out_args("transaction_address"))]
    async fn rebase(
        &self,
        options: VarDict,
        refspec: String,
        packages: Vec<String>,
        #[zbus(header)] hdr: Header<'_>,
    ) -> Result<String, DaemonError> {
        let fds = hdr.unix_fds().unwrap_or(0);
        let mut modifiers = VarDict::default();
        modifiers.0.push((
            "set-refspec".into(),
            OwnedValue::from(Str::from(refspec.clone())),
        ));
        if let Some(revision) = options.str("revision")? {
            modifiers
                .0
                .push(("set-revision".into(), OwnedValue::from(Str::from(revision))));
        }
        let req = TxnRequest {
            method: "Rebase",
            sender: sender_of(&hdr),
            params: encode(&(&options, &refspec, &packages))?,
            title: "new-deployment".into(),
            modifiers: modifiers.to_json(),
            options: options.to_json(),
            args: serde_json::json!([refspec, packages]),
            fds,
        };
        self.daemon
            .begin_txn(req, |_| Ok(begin_deploy(&modifiers, &options, fds)))
            .await
    }

    /// Remove deployments or caches: `base`, `pending-deploy`, `rollback-deploy`, `repomd`.
    #[zbus(out_args("transaction_address"))]
    async fn cleanup(
        &self,
        elements: Vec<String>,
        #[zbus(header)] hdr: Header<'_>,
    ) -> Result<String, DaemonError> {
        let req = TxnRequest {
            method: "Cleanup",
            sender: sender_of(&hdr),
            params: encode(&(&elements,))?,
            title: "cleanup".into(),
            modifiers: serde_json::json!({}),
            options: serde_json::json!({}),
            args: serde_json::json!([elements]),
            fds: hdr.unix_fds().unwrap_or(0),
        };
        self.daemon
            .begin_txn(req, |_| {
                let (mut pending, mut rollback, mut base) = (false, false, false);
                for element in &elements {
                    match element.as_str() {
                        "pending-deploy" => pending = true,
                        "rollback-deploy" => rollback = true,
                        "base" => base = true,
                        // The fake has no rpm-md cache.
                        "repomd" => {}
                        other => {
                            return Err(DaemonError::GioFailed(format!(
                                "Invalid cleanup type: {other}"
                            )));
                        }
                    }
                }
                Ok(Work::Cleanup {
                    pending,
                    rollback,
                    base,
                })
            })
            .await
    }

    /// Unlock a finalization-locked staged deployment and reboot into it.
    #[zbus(out_args("transaction_address"))]
    async fn finalize_deployment(
        &self,
        options: VarDict,
        #[zbus(header)] hdr: Header<'_>,
    ) -> Result<String, DaemonError> {
        let plan = FinalizePlan {
            checksum: options.str("checksum")?,
            allow_missing_checksum: options.bool_or("allow-missing-checksum", false)?,
            allow_unlocked: options.bool_or("allow-unlocked", false)?,
        };
        let title = options
            .str("initiating-command-line")?
            .unwrap_or_else(|| "finalize-deployment".into());
        let req = TxnRequest {
            method: "FinalizeDeployment",
            sender: sender_of(&hdr),
            params: encode(&(&options,))?,
            title,
            modifiers: serde_json::json!({}),
            options: options.to_json(),
            args: serde_json::json!([]),
            fds: hdr.unix_fds().unwrap_or(0),
        };
        self.daemon
            .begin_txn(req, |_| Ok(Work::Finalize(plan)))
            .await
    }

    /// Boot configuration of a deployment. `deployid` is a decimal index into the
    /// deployment list; `""` is the merge deployment (pending if `is_pending`).
    #[zbus(out_args("bootconfig"))]
    async fn get_deployment_boot_config(
        &self,
        deployid: &str,
        is_pending: bool,
    ) -> Result<HashMap<String, OwnedValue>, DaemonError> {
        let state = lock(&self.daemon.state);
        let osname = &self.daemon.osname;
        let deployment = if deployid.is_empty() {
            let merge = if is_pending {
                state.default_for(osname)
            } else {
                state.booted().filter(|d| &d.osname == osname)
            };
            merge.ok_or_else(|| {
                DaemonError::GioFailed(format!("No deployments found for os {osname}"))
            })?
        } else {
            let index = deployid
                .bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| deployid.parse::<usize>().ok())
                .flatten()
                .ok_or_else(|| {
                    DaemonError::Failed(format!(
                        "Invalid deployment index {deployid}, must be a number and >= 0"
                    ))
                })?;
            state.deployments.get(index).ok_or_else(|| {
                DaemonError::Failed(format!(
                    "Out of range deployment index {index}, expected < {}",
                    state.deployments.len()
                ))
            })?
        };
        let s = |v: &str| OwnedValue::from(Str::from(v.to_string()));
        // The deployment's real bootloader entry.
        let entry = deployment.disk.clone().unwrap_or_else(|| {
            // Only a deployment that vanished from disk since the last reload lacks one.
            super::ostree::DiskDeployment {
                osname: deployment.osname.clone(),
                checksum: deployment.checksum.clone(),
                serial: deployment.serial,
                options: String::new(),
                title: String::new(),
                linux: String::new(),
                initrd: String::new(),
                version: String::new(),
                staged_locked: None,
            }
        });
        let mut config = HashMap::new();
        config.insert("staged".to_string(), OwnedValue::from(deployment.staged));
        config.insert("options".to_string(), s(&entry.options));
        // A staged deployment has no boot entry yet; only its kernel arguments are known.
        if !deployment.staged {
            config.insert("title".to_string(), s(&entry.title));
            config.insert("linux".to_string(), s(&entry.linux));
            config.insert("initrd".to_string(), s(&entry.initrd));
            config.insert("version".to_string(), s(&entry.version));
        }
        Ok(config)
    }

    /// The osname.
    #[zbus(property)]
    fn name(&self) -> String {
        self.daemon.osname.clone()
    }

    /// The booted deployment if it belongs to this osname, else an empty dict.
    #[zbus(property)]
    fn booted_deployment(&self) -> fdo::Result<HashMap<String, OwnedValue>> {
        let osname = self.daemon.osname.clone();
        self.dict(|s| s.booted().filter(|d| d.osname == osname).cloned())
    }

    /// The pending deployment, else the booted one.
    #[zbus(property)]
    fn default_deployment(&self) -> fdo::Result<HashMap<String, OwnedValue>> {
        let osname = self.daemon.osname.clone();
        self.dict(|s| s.default_for(&osname).cloned())
    }

    /// The rollback deployment, or an empty dict.
    #[zbus(property)]
    fn rollback_deployment(&self) -> fdo::Result<HashMap<String, OwnedValue>> {
        let osname = self.daemon.osname.clone();
        self.dict(|s| s.rollback(&osname).cloned())
    }

    /// Automatic updates are off, so there is never a cached update.
    #[zbus(property)]
    fn cached_update(&self) -> HashMap<String, OwnedValue> {
        HashMap::new()
    }

    /// See `CachedUpdate`.
    #[zbus(property)]
    fn has_cached_update_rpm_diff(&self) -> bool {
        false
    }
}

/// The JSON view of `Deployments`, for the `deployments` control command.
pub(crate) fn deployments_json(daemon: &Daemon) -> anyhow::Result<serde_json::Value> {
    let state = lock(&daemon.state);
    let mut out = Vec::new();
    for d in &state.deployments {
        let dict = daemon.dict_of(d)?;
        let mut obj = serde_json::Map::new();
        for (k, v) in &dict {
            obj.insert(k.clone(), value_to_json(v));
        }
        out.push(serde_json::Value::Object(obj));
    }
    Ok(serde_json::Value::Array(out))
}

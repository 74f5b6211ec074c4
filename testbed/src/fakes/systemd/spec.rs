//! The settings of a transient service (`StartTransientUnit`'s properties, as systemd's
//! `dbus-execute.c` and `dbus-service.c` read them) and where its output goes.

use std::path::PathBuf;
use std::process::Stdio;

use serde::Serialize;
use zbus::zvariant::OwnedValue;

use crate::fakes::dbus_error::{INVALID_ARGS, NOT_SUPPORTED, NamedError};

const PROPERTY_READ_ONLY: &str = "org.freedesktop.DBus.Error.PropertyReadOnly";
/// What sd-bus answers when a property value has another type than the one read (`-ENXIO`).
const ENXIO: &str = "System.Error.ENXIO";

/// Where a unit's standard output (or error) goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind", content = "path")]
pub(super) enum Output {
    /// Captured into the unit's record (standing in for the journal).
    Journal,
    Null,
    /// `file:` (opened for writing at offset 0, not truncated).
    File(PathBuf),
    /// `truncate:`.
    Truncate(PathBuf),
    /// `append:`.
    Append(PathBuf),
}

/// The settings of one transient service.
#[derive(Debug, Clone, Serialize)]
pub(super) struct ServiceSpec {
    pub(super) description: String,
    pub(super) service_type: String,
    /// `(path, argv, ignore-failure)`.
    pub(super) exec_start: Vec<(String, Vec<String>, bool)>,
    /// `ExecStopPost=`: run once the `ExecStart` lines ended, whatever their result.
    pub(super) exec_stop_post: Vec<(String, Vec<String>, bool)>,
    pub(super) add_ref: bool,
    pub(super) remain_after_exit: bool,
    /// `CollectMode=inactive-or-failed`: a failed unit is unloaded too.
    pub(super) collect_failed: bool,
    pub(super) stdout: Output,
    /// `StandardError*=`: the journal unless redirected.
    pub(super) stderr: Output,
    pub(super) environment: Vec<String>,
}

/// The file (or pipe, standing in for the journal) an output setting names.
pub(super) fn stdio(output: &Output) -> std::io::Result<Stdio> {
    Ok(match output {
        Output::Journal => Stdio::piped(),
        Output::Null => Stdio::null(),
        Output::File(p) => std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(p)?
            .into(),
        Output::Truncate(p) => std::fs::File::create(p)?.into(),
        Output::Append(p) => std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(p)?
            .into(),
    })
}

impl ServiceSpec {
    pub(super) fn new(name: &str) -> Self {
        ServiceSpec {
            description: name.to_string(),
            service_type: "simple".into(),
            exec_start: Vec::new(),
            exec_stop_post: Vec::new(),
            add_ref: false,
            remain_after_exit: false,
            collect_failed: false,
            stdout: Output::Journal,
            stderr: Output::Journal,
            environment: Vec::new(),
        }
    }

    /// One `(sv)` of `StartTransientUnit`, checked like `bus_service_set_property` and
    /// `bus_exec_context_set_transient_property` check it.
    pub(super) fn set(&mut self, name: &str, value: &OwnedValue) -> Result<(), NamedError> {
        let wrong_type = || NamedError::new(ENXIO, "No such device or address");
        let string = || -> Result<String, NamedError> {
            String::try_from(value.try_clone().map_err(|_| wrong_type())?).map_err(|_| wrong_type())
        };
        let boolean = || bool::try_from(value).map_err(|_| wrong_type());
        let absolute = |p: String| -> Result<PathBuf, NamedError> {
            if p.starts_with('/') {
                Ok(PathBuf::from(p))
            } else {
                Err(NamedError::new(
                    INVALID_ARGS,
                    format!("Path {p} is not absolute."),
                ))
            }
        };
        match name {
            "Description" => self.description = string()?,
            "Type" => {
                let t = string()?;
                if !["simple", "exec", "oneshot"].contains(&t.as_str()) {
                    return Err(NamedError::new(
                        NOT_SUPPORTED,
                        format!("the testbed's fake systemd does not model Type={t}"),
                    ));
                }
                self.service_type = t;
            }
            "ExecStart" | "ExecStopPost" => {
                let cmds: Vec<(String, Vec<String>, bool)> = value
                    .try_clone()
                    .map_err(|_| wrong_type())?
                    .try_into()
                    .map_err(|_| wrong_type())?;
                for (path, argv, _) in &cmds {
                    if !path.starts_with('/') {
                        return Err(NamedError::new(
                            INVALID_ARGS,
                            format!(
                                "\"{path}\" is neither a valid executable name nor an absolute path"
                            ),
                        ));
                    }
                    if argv.is_empty() {
                        return Err(NamedError::new(
                            INVALID_ARGS,
                            format!("\"{path}\" argv cannot be empty"),
                        ));
                    }
                }
                if name == "ExecStart" {
                    self.exec_start.extend(cmds);
                } else {
                    self.exec_stop_post.extend(cmds);
                }
            }
            "AddRef" => self.add_ref = boolean()?,
            "RemainAfterExit" => self.remain_after_exit = boolean()?,
            "CollectMode" => {
                self.collect_failed = match string()?.as_str() {
                    "inactive" => false,
                    "inactive-or-failed" => true,
                    other => {
                        return Err(NamedError::new(
                            INVALID_ARGS,
                            format!("Invalid collect mode: {other}"),
                        ));
                    }
                }
            }
            "Environment" => {
                let env: Vec<String> = value
                    .try_clone()
                    .map_err(|_| wrong_type())?
                    .try_into()
                    .map_err(|_| wrong_type())?;
                self.environment.extend(env);
            }
            "StandardOutput" => {
                self.stdout = match string()?.as_str() {
                    "journal" | "inherit" | "journal+console" => Output::Journal,
                    "null" => Output::Null,
                    other => {
                        return Err(NamedError::new(
                            INVALID_ARGS,
                            format!("Invalid standard output type: {other}"),
                        ));
                    }
                }
            }
            "StandardOutputFile" => self.stdout = Output::File(absolute(string()?)?),
            "StandardOutputFileToTruncate" => self.stdout = Output::Truncate(absolute(string()?)?),
            "StandardOutputFileToAppend" => self.stdout = Output::Append(absolute(string()?)?),
            "StandardErrorFile" => self.stderr = Output::File(absolute(string()?)?),
            "StandardErrorFileToTruncate" => self.stderr = Output::Truncate(absolute(string()?)?),
            "StandardErrorFileToAppend" => self.stderr = Output::Append(absolute(string()?)?),
            other => {
                return Err(NamedError::new(
                    PROPERTY_READ_ONLY,
                    format!("Cannot set property {other}, or unknown property."),
                ));
            }
        }
        Ok(())
    }
}

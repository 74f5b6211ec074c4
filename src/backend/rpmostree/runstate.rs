//! libostree's runtime record of the staged deployment, `/run/ostree/staged-deployment`: the
//! only place a current host records the finalization lock.
//!
//! Since rpm-ostree v2024.6 (coreos/rpm-ostree commit 37c7228d) the daemon stages with
//! `ostree_sysroot_stage_tree_with_options(.locked = TRUE)`, and libostree then writes the lock
//! only as the key `locked` (b) of this `a{sv}` GVariant
//! (ostreedev/ostree:src/libostree/ostree-sysroot-deploy.c
//! `ostree_sysroot_stage_tree_with_options`), never the legacy
//! `/run/ostree/staged-deployment-locked` file. rpm-ostreed's `Deployments` reports
//! `finalization-locked` only when that legacy file exists
//! (coreos/rpm-ostree:rust/src/daemon.rs `deployment_populate_variant`), so on such a host the
//! key is absent although `FinalizeDeployment` sees the deployment locked. This module reads the
//! lock the way libostree does (`_ostree_sysroot_reload_staged`).

use std::collections::HashMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use zvariant::serialized::{Context, Data, Format};
use zvariant::{OwnedValue, Value};

use crate::backend::Deployment;

/// The record's path below the host root.
const STAGED: &str = "run/ostree/staged-deployment";
/// libostree's record is a few hundred bytes; anything past this is not one.
const MAX_BYTES: u64 = 1 << 20;

/// The record could not be read or decoded.
#[derive(Debug, thiserror::Error)]
#[error("reading {path}: {problem}")]
pub struct RunstateError {
    /// The file.
    pub path: PathBuf,
    /// What went wrong.
    pub problem: String,
}

/// Whether libostree's record under `host_root` says `staged` is finalization-locked. A missing
/// record, one naming another deployment (`target.name` is `<checksum>.<serial>`), or a `locked`
/// key of another type (which `g_variant_dict_lookup` ignores too) mean "not locked".
pub fn staged_locked(host_root: &Path, staged: &Deployment) -> Result<bool, RunstateError> {
    let path = host_root.join(STAGED);
    let fail = |problem: String| RunstateError {
        path: path.clone(),
        problem,
    };
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(fail(e.to_string())),
    };
    let mut bytes = Vec::new();
    file.take(MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| fail(e.to_string()))?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(fail(format!("larger than {MAX_BYTES} bytes")));
    }
    let record = decode(&bytes).map_err(fail)?;
    let name = record
        .get("target")
        .and_then(|t| match &**t {
            Value::Dict(d) => d.get::<&str, Value<'_>>(&"name").ok().flatten(),
            _ => None,
        })
        .and_then(|v| match v {
            Value::Str(s) => Some(s.to_string()),
            _ => None,
        });
    if name.as_deref() != Some(format!("{}.{}", staged.checksum, staged.serial).as_str()) {
        return Ok(false);
    }
    Ok(matches!(
        record.get("locked").map(|v| &**v),
        Some(Value::Bool(true))
    ))
}

/// The GVariant encoding in the host's byte order (libostree writes `g_variant_get_data` as
/// is). zvariant's GVariant format is deprecated in favour of the `zgvariant` crate.
fn gvariant() -> Context {
    Context::new(Format::GVariant, zvariant::NATIVE_ENDIAN, 0)
}

/// Decodes an `a{sv}` GVariant.
fn decode(bytes: &[u8]) -> Result<HashMap<String, OwnedValue>, String> {
    let data = Data::new(bytes, gvariant());
    data.deserialize::<HashMap<String, OwnedValue>>()
        .map(|(record, _)| record)
        .map_err(|e| format!("not an a{{sv}} GVariant: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(name: &str, locked: Option<Value<'_>>) -> Vec<u8> {
        let mut target: HashMap<&str, Value<'_>> = HashMap::new();
        target.insert("name", Value::from(name));
        target.insert("osname", Value::from("rhcos"));
        target.insert("bootcsum", Value::from("b00c"));
        let mut r: HashMap<&str, Value<'_>> = HashMap::new();
        r.insert("target", Value::from(target));
        if let Some(l) = locked {
            r.insert("locked", l);
        }
        zvariant::to_bytes(gvariant(), &r).unwrap().bytes().to_vec()
    }

    fn staged() -> Deployment {
        Deployment {
            checksum: "abc".into(),
            serial: 1,
            staged: true,
            ..Deployment::default()
        }
    }

    fn with_file(bytes: Option<&[u8]>) -> Result<bool, RunstateError> {
        let root = testbed::scratch::ScratchDir::new("runstate").expect("scratch dir");
        std::fs::create_dir_all(root.join("run/ostree")).unwrap();
        if let Some(b) = bytes {
            std::fs::write(root.join(STAGED), b).unwrap();
        }
        staged_locked(&root, &staged())
    }

    #[test]
    fn the_locked_key_is_read_like_libostree() {
        assert!(with_file(Some(&record("abc.1", Some(Value::Bool(true))))).unwrap());
        assert!(!with_file(Some(&record("abc.1", Some(Value::Bool(false))))).unwrap());
        assert!(!with_file(Some(&record("abc.1", None))).unwrap());
        // g_variant_dict_lookup with "b" ignores a value of another type.
        assert!(!with_file(Some(&record("abc.1", Some(Value::from("true"))))).unwrap());
        // A record of another deployment says nothing about this one.
        assert!(!with_file(Some(&record("def.0", Some(Value::Bool(true))))).unwrap());
        assert!(!with_file(None).unwrap());
    }

    #[test]
    fn a_broken_record_is_a_clear_error() {
        let e = with_file(Some(b"\xff\x00garbage")).unwrap_err();
        assert!(
            e.to_string().contains("run/ostree/staged-deployment"),
            "{e}"
        );
    }
}

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

/// What libostree's record says of the staged deployment (absent keys, or keys of another
/// type, which `g_variant_dict_lookup` ignores too, are `None`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StagedRecord {
    /// `target.name`: `<checksum>.<serial>`.
    pub name: Option<String>,
    /// `target.osname`.
    pub osname: Option<String>,
    /// `kargs`: the kernel arguments the deployment was staged with.
    pub kargs: Option<Vec<String>>,
    /// `locked` is true.
    pub locked: bool,
}

/// Reads libostree's record under `host_root`; `None` when there is none.
pub fn read(host_root: &Path) -> Result<Option<StagedRecord>, RunstateError> {
    let path = host_root.join(STAGED);
    let fail = |problem: String| RunstateError {
        path: path.clone(),
        problem,
    };
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
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
    let target = |key: &str| {
        record
            .get("target")
            .and_then(|t| match &**t {
                Value::Dict(d) => d.get::<&str, Value<'_>>(&key).ok().flatten(),
                _ => None,
            })
            .and_then(|v| match v {
                Value::Str(s) => Some(s.to_string()),
                _ => None,
            })
    };
    let kargs = match record.get("kargs").map(|v| &**v) {
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| match v {
                Value::Str(s) => Some(s.to_string()),
                _ => None,
            })
            .collect(),
        _ => None,
    };
    Ok(Some(StagedRecord {
        name: target("name"),
        osname: target("osname"),
        kargs,
        locked: matches!(record.get("locked").map(|v| &**v), Some(Value::Bool(true))),
    }))
}

/// Whether libostree's record under `host_root` says `staged` is finalization-locked. A missing
/// record, one naming another deployment (`target.name` is `<checksum>.<serial>`), or a `locked`
/// key of another type mean "not locked".
pub fn staged_locked(host_root: &Path, staged: &Deployment) -> Result<bool, RunstateError> {
    let name = format!("{}.{}", staged.checksum, staged.serial);
    Ok(read(host_root)?.is_some_and(|r| r.locked && r.name.as_deref() == Some(name.as_str())))
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

    /// Records serialized by GLib 2.74's `GVariantBuilder` (little-endian) with the calls
    /// libostree v2025.7 makes in `ostree_sysroot_stage_tree_with_options` for what rpm-ostree
    /// v2025.5 passes (`rpmostree_sysroot_upgrader_deploy`: `locked`, the merge deployment's
    /// kernel arguments, an empty `overlay_initrds`); the second also has the `bootconfig-extra`
    /// (`a{ss}`) of ostree after v2025.7. An RHCOS node's kernel arguments take the `kargs`
    /// array past 255 bytes, so its framing offsets are 2 bytes wide.
    /// What both records start with: `target`, `locked`, `merge-deployment`, `kargs` and the
    /// key of `overlay-initrds`.
    const GLIB_COMMON: &[&str] = &[
        "74617267657400006e616d650000000064626631343532383834393861393261316232326561653364646131",
        "3336343232393238663862356666396162306433613266323338643430346131326531662e30000073050000",
        "6f736e616d6500007268636f730000730700000000000000626f6f746373756d000000000000000037616237",
        "6566363134306563613866313831613737613961386666303834626364336230303435343736393064346666",
        "38376637373965353262626638373163000073094e61bc00617b73767d0700006c6f636b6564000001006207",
        "000000006d657267652d6465706c6f796d656e7400000000000000006e616d65000000003132613365376164",
        "3531366237656637663732326562336332663234323135376564663730353539366131626665353038313636",
        "6230613562333837633937312e310000730500006f736e616d6500007268636f730000730700000000000000",
        "626f6f746373756d000000000000000061353631386135303062396563313939303437343766666165653336",
        "346333643739353932313934343332353633653232316230396534376234306434623637000073094e61bc00",
        "617b73767d1100006b6172677300000072770069676e6974696f6e2e706c6174666f726d2e69643d6d657461",
        "6c00726f6f743d555549443d39316231623466642d396133642d346637652d386634652d3063386630613361",
        "3561363200726f6f74666c6167733d70726a71756f746100626f6f743d555549443d38653264356233612d32",
        "6631632d346335652d396236612d336432663165306339623861006f73747265653d2f6f73747265652f626f",
        "6f742e312f7268636f732f376162376566363134306563613866313831613737613961386666303834626364",
        "336230303435343736393064346666383766373739653532626266383731632f300073797374656d642e756e",
        "69666965645f6367726f75705f6869657261726368793d31006367726f75705f6e6f5f76313d616c6c007073",
        "693d3000666970733d310003001e004d0060008f00ee001101220128012f0100617306006f7665726c61792d",
        "696e69747264730000617310",
    ];
    /// The rest of each record.
    const GLIB_RECORDS: [&[&str]; 2] = [
        &["ce00dc00be0110032403"],
        &[
            "00000000626f6f74636f6e6669672d6578747261000000000000000061626f6f74002f6f73747265652f6465",
            "706c6f792f7268636f732f61626f6f742e696d6700062600617b73737d11ce00dc00be01100324036e03",
        ],
    ];

    const STAGED_CSUM: &str = "dbf145288498a92a1b22eae3dda136422928f8b5ff9ab0d3a2f238d404a12e1f";
    const MERGE_CSUM: &str = "12a3e7ad516b7ef7f722eb3c2f242157edf705596a1bfe508166b0a5b387c971";

    fn unhex(parts: &[&str]) -> Vec<u8> {
        let h = parts.concat();
        (0..h.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn records_as_libostree_writes_them_for_rpm_ostree_are_decoded() {
        if !cfg!(target_endian = "little") {
            return;
        }
        for rest in GLIB_RECORDS {
            let bytes = unhex(&[GLIB_COMMON, rest].concat());
            let record = decode(&bytes).unwrap();
            let name = |key: &str| match record.get(key).map(|v| &**v) {
                Some(Value::Dict(d)) => d.get::<&str, String>(&"name").unwrap(),
                other => panic!("{key}: {other:?}"),
            };
            assert_eq!(
                name("target").as_deref(),
                Some(format!("{STAGED_CSUM}.0").as_str())
            );
            assert_eq!(
                name("merge-deployment").as_deref(),
                Some(format!("{MERGE_CSUM}.1").as_str())
            );
            let strs =
                |key: &str| -> Vec<String> { record[key].try_clone().unwrap().try_into().unwrap() };
            let kargs = strs("kargs");
            assert_eq!(kargs.len(), 10, "{kargs:?}");
            assert_eq!(kargs[0], "rw");
            assert!(
                kargs[5].starts_with("ostree=/ostree/boot.1/rhcos/"),
                "{kargs:?}"
            );
            assert_eq!(kargs[9], "fips=1");
            assert!(strs("overlay-initrds").is_empty());
            let root = testbed::scratch::ScratchDir::new("runstate-glib").expect("scratch dir");
            std::fs::create_dir_all(root.join("run/ostree")).unwrap();
            std::fs::write(root.join(STAGED), &bytes).unwrap();
            let dep = |checksum: &str, serial| Deployment {
                checksum: checksum.into(),
                serial,
                staged: true,
                ..Deployment::default()
            };
            assert!(staged_locked(&root, &dep(STAGED_CSUM, 0)).unwrap());
            // The merge deployment named in the record is not the staged one.
            assert!(!staged_locked(&root, &dep(MERGE_CSUM, 1)).unwrap());
        }
    }

    /// A record real libostree 2025.x wrote on a testbed sysroot (Debian trixie's `ostree`, in
    /// the root scripts/setup.sh makes; on CI a missing root fails the test): staged over the
    /// booted deployment with the lock, the way rpm-ostree stages, then unlocked and finalized by
    /// the same libostree. streamd reads the lock from it at each step.
    #[tokio::test]
    async fn records_real_libostree_2025_writes_are_decoded() {
        use testbed::fakes::rpmostreed::libostree::{BootedHost, Trixie};
        use testbed::fixtures::images::{DEFAULT_REGISTRY, catalog};
        let Some(trixie) = Trixie::for_test("records_real_libostree_2025_writes_are_decoded")
            .expect("the trixie root scripts/setup.sh makes")
        else {
            return;
        };
        assert!(
            trixie.version().starts_with("2025."),
            "{}",
            trixie.version()
        );
        let root = testbed::scratch::ScratchDir::new("real-ostree").expect("scratch dir");
        let images = catalog(DEFAULT_REGISTRY);
        let kargs: Vec<String> = ["rw", "root=UUID=91b1b4fd", "rootflags=prjquota", "fips=1"]
            .map(String::from)
            .to_vec();
        let host = BootedHost::create(&root, "rhcos", &images[0], &kargs)
            .await
            .expect("booted sysroot");
        let target = host.commit(&images[1]).await.expect("commit");
        // What rpm-ostree passes: the merge deployment's arguments (its `ostree=` among them).
        let stage_kargs = host.booted_options().to_vec();
        assert!(
            stage_kargs
                .iter()
                .any(|k| k.starts_with("ostree=/ostree/boot."))
        );
        let (staged, out) = host
            .stage(&trixie, &target, &stage_kargs, true)
            .await
            .expect("real libostree stages on the testbed sysroot");
        assert!(
            out.stderr
                .contains("systemctl stub: start ostree-finalize-staged.service"),
            "{}",
            out.stderr
        );
        let dep = |name: &testbed::fakes::rpmostreed::libostree::DeploymentName| Deployment {
            checksum: name.checksum.clone(),
            serial: name.serial,
            staged: true,
            ..Deployment::default()
        };
        let read = || decode(&std::fs::read(root.join(STAGED)).unwrap()).unwrap();
        let name =
            |record: &HashMap<String, OwnedValue>, key: &str| match record.get(key).map(|v| &**v) {
                Some(Value::Dict(d)) => d.get::<&str, String>(&"name").unwrap(),
                other => panic!("{key}: {other:?}"),
            };
        let record = read();
        assert_eq!(name(&record, "target"), Some(staged.to_string()));
        assert_eq!(
            name(&record, "merge-deployment"),
            Some(host.booted().to_string())
        );
        let written: Vec<String> = record["kargs"].try_clone().unwrap().try_into().unwrap();
        assert_eq!(written, stage_kargs);
        assert!(matches!(
            record.get("locked").map(|v| &**v),
            Some(Value::Bool(true))
        ));
        // rpm-ostree leaves no legacy file: the key is the whole lock.
        assert!(!root.join("run/ostree/staged-deployment-locked").exists());
        assert!(staged_locked(&root, &dep(&staged)).unwrap());
        assert!(!staged_locked(&root, &dep(host.booted())).unwrap());

        // libostree honours the key alone: a locked deployment is not finalized.
        let out = host
            .finalize_staged(&trixie)
            .await
            .expect("finalize-staged");
        assert!(root.join(STAGED).exists(), "{out:?}");
        assert!(staged_locked(&root, &dep(&staged)).unwrap());

        host.change_finalization(&trixie, true)
            .await
            .expect("unlock by real libostree");
        assert!(matches!(
            read().get("locked").map(|v| &**v),
            Some(Value::Bool(false))
        ));
        assert!(!staged_locked(&root, &dep(&staged)).unwrap());

        host.finalize_staged(&trixie)
            .await
            .expect("finalize-staged");
        assert!(!root.join(STAGED).exists());
        assert!(!staged_locked(&root, &dep(&staged)).unwrap());
        let status = host.status(&trixie).await.expect("status").stdout;
        let first = status
            .lines()
            .find(|l| l.contains("rhcos "))
            .unwrap_or_default();
        assert!(first.contains(&staged.to_string()), "{status}");
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

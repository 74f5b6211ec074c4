//! Property tests of bootc status, the attempt record and stream resolution.

use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use testbed::scratch::ScratchDir;

use super::{
    apply_edits, config, edit, fail, hex64, image_like, inputs, mutated, one_line, ref_image,
    stream_like,
};

/// A well-formed `bootc status --format=json` document (the shape of bootc-dev/bootc:crates/lib/src/spec.rs `Host`)
/// with the given entries (`None`: null).
fn bootc_doc(staged: Option<&str>, booted: Option<&str>) -> String {
    let entry = |digest: &str| {
        format!(
            r#"{{"image":{{"image":{{"image":"q.io/a/b@{digest}","transport":"registry"}},"version":"1","timestamp":null,"imageDigest":"{digest}","architecture":"amd64"}},"cachedUpdate":null,"incompatible":false,"pinned":false,"softRebootCapable":false,"downloadOnly":false,"store":"ostreeContainer","ostree":{{"stateroot":"rhcos","checksum":"{}","deploySerial":0}}}}"#,
            "c".repeat(64)
        )
    };
    let or_null = |d: Option<&str>| d.map_or_else(|| "null".to_string(), entry);
    format!(
        r#"{{"apiVersion":"org.containers.bootc/v1","kind":"BootcHost","metadata":{{"name":"host"}},"spec":{{"image":null,"bootOrder":"default"}},"status":{{"staged":{},"booted":{},"rollback":null,"rollbackQueued":false,"type":"bootcHost"}}}}"#,
        or_null(staged),
        or_null(booted)
    )
}

fn sha() -> impl Strategy<Value = String> {
    hex64().prop_map(|h| format!("sha256:{h}"))
}

proptest! {
    #![proptest_config(config(200))]

    #[test]
    fn bootc_status_never_panics_and_keeps_one_booted(
        staged in option::of(sha()),
        booted in option::of(sha()),
        edits in vec(edit(), 0..4),
    ) {
        let doc = bootc_doc(staged.as_deref(), booted.as_deref());
        // A host not booted through ostree (booted: null) is refused, never guessed at.
        if booted.is_none() {
            prop_assert!(streamd::backend::bootc::parse_status(&doc).is_err());
            return Ok(());
        }
        // Unmutated: parsed exactly as the model says.
        match streamd::backend::bootc::parse_status(&doc) {
            Ok(deps) => {
                prop_assert_eq!(deps.iter().filter(|d| d.booted).count(), usize::from(booted.is_some()));
                prop_assert_eq!(deps.iter().filter(|d| d.staged).count(), usize::from(staged.is_some()));
                if let Some(b) = &booted {
                    let d = deps.iter().find(|d| d.booted).ok_or_else(|| fail("no booted".into()))?;
                    prop_assert_eq!(d.container_image_reference_digest.as_deref(), Some(b.as_str()));
                }
            }
            Err(e) => return Err(fail(format!("a well-formed document was refused: {e}\n{doc}"))),
        }
        // Mutated: any answer but a panic; an error is one clear line.
        if let Err(e) = streamd::backend::bootc::parse_status(&apply_edits(&doc, &edits)) {
            prop_assert!(!e.to_string().is_empty());
        }
    }

    #[test]
    fn attempt_record_never_panics_and_names_its_file(
        text in prop_oneof![
            any::<String>(),
            mutated(Just(r#"{"version":1,"staged":null,"attempt":{"request":"r","osImage":"i","digest":"d","bootId":"b","attempts":1,"reportedBoot":null}}"#.to_string())),
        ],
    ) {
        let dir = ScratchDir::new("fuzz-attempt").map_err(|e| fail(e.to_string()))?;
        let store = streamd::host::attempt::Store::new(dir.path());
        std::fs::write(store.path(), &text).map_err(|e| fail(e.to_string()))?;
        let loaded = store.load();
        match loaded {
            // Read forward-compatibly: any layout from version 1 on loads as it was written.
            Ok(r) => prop_assert!(r.version >= 1, "version {}", r.version),
            Err(e) => prop_assert!(e.to_string().contains(streamd::host::attempt::FILE_NAME), "{}", e),
        }
    }

    #[test]
    fn stream_resolution_fills_in_only_a_stream_only_request(
        i in inputs(),
        names in vec(stream_like(), 0..4),
        images in vec(image_like(), 0..4),
    ) {
        use streamd::cluster::streams::{Catalog, StreamImages, resolve};
        let entries: Vec<StreamImages> = names
            .iter()
            .zip(images.iter().chain(std::iter::repeat(&String::new())))
            .map(|(n, img)| StreamImages {
                name: n.clone(),
                os_image: img.clone(),
                os_extensions_image: String::new(),
                written_by: None,
            })
            .collect();
        let catalog = Catalog::Available(entries.clone());
        let stream_only = i.stream.is_some() && i.os_image.is_none() && i.extensions_image.is_none();
        match resolve(&i, Some(&catalog)) {
            Ok(out) if !stream_only => prop_assert_eq!(out, i),
            Ok(out) => {
                let entry = entries
                    .iter()
                    .find(|e| Some(&e.name) == i.stream.as_ref())
                    .ok_or_else(|| fail("resolved a stream the catalog lacks".into()))?;
                prop_assert_eq!(out.os_image.as_ref(), Some(&entry.os_image));
                prop_assert!(ref_image(&entry.os_image), "only valid images are taken");
                prop_assert_eq!(out.reboot_approved, i.reboot_approved);
            }
            Err(e) => {
                prop_assert!(stream_only, "only stream-only requests are resolved");
                prop_assert!(one_line(&e.to_string()));
            }
        }
    }
}

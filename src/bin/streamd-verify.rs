//! `streamd-verify`: reads the ostree sysroot and repository through libostree, read-only, for
//! `streamd`.
//!
//! Without an argument it checks a staged deployment on disk: it reads one JSON request
//! (`streamd::host::verify::Request`) on stdin and prints the verdict as JSON (`{"Ok":null}` or
//! `{"Err":…}`) on stdout. With the argument `image-configs` it reads one
//! `streamd::backend::helper::ImageConfigs` request and prints each commit's stored image
//! configuration (`streamd::backend::helper::ImageConfigsAnswer`). It runs as a short-lived
//! child of the daemon so that libostree, glib and their libraries are never resident in it.
//! Exit codes: 0 an answer was printed, 2 the request (or the argument) was unreadable.

#![forbid(unsafe_code)]
// Functions fit on a screen (threshold 100 in clippy.toml); the tests' crates are not held to it.
#![warn(clippy::too_many_lines)]

use std::io::Read as _;
use std::process::ExitCode;

use streamd::backend::helper::{IMAGE_CONFIGS, ImageConfigs};
use streamd::host::verify::{Request, image_configs, verify_staged};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut input = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut input) {
        eprintln!("streamd-verify: reading the request: {e}");
        return ExitCode::from(2);
    }
    let answer = match args.as_slice() {
        [] => serde_json::from_str::<Request>(&input)
            .map_err(|e| format!("not a verification request: {e}"))
            .and_then(|req| {
                let verdict = verify_staged(&req.sysroot, &req.staged, &req.booted, &req.expect);
                serde_json::to_string(&verdict).map_err(|e| format!("encoding the verdict: {e}"))
            }),
        [a] if a == IMAGE_CONFIGS => serde_json::from_str::<ImageConfigs>(&input)
            .map_err(|e| format!("not an {IMAGE_CONFIGS} request: {e}"))
            .and_then(|req| {
                serde_json::to_string(&image_configs(&req))
                    .map_err(|e| format!("encoding the answer: {e}"))
            }),
        other => Err(format!(
            "unknown arguments {other:?} (none, or {IMAGE_CONFIGS})"
        )),
    };
    match answer {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("streamd-verify: {e}");
            ExitCode::from(2)
        }
    }
}

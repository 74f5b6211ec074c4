//! `streamd-verify`: checks a staged deployment on disk through libostree, for `streamd`.
//!
//! Reads one JSON request (`streamd::host::verify::Request`) on stdin and prints the verdict as JSON
//! (`{"Ok":null}` or `{"Err":…}`) on stdout. It runs as a short-lived child of the daemon so
//! that libostree, glib and their libraries are never resident in it. Exit codes: 0 a verdict
//! was printed, 2 the request was unreadable.

use std::io::Read as _;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut input = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut input) {
        eprintln!("streamd-verify: reading the request: {e}");
        return ExitCode::from(2);
    }
    let req: streamd::host::verify::Request = match serde_json::from_str(&input) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("streamd-verify: not a verification request: {e}");
            return ExitCode::from(2);
        }
    };
    let verdict =
        streamd::host::verify::verify_staged(&req.sysroot, &req.staged, &req.booted, &req.expect);
    match serde_json::to_string(&verdict) {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("streamd-verify: encoding the verdict: {e}");
            ExitCode::from(2)
        }
    }
}

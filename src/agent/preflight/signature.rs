//! The check of the OS image's signature: what the host's `policy.json` requires for it,
//! verified before anything is staged (`crate::host::sigpolicy`). A signature that is
//! required and not verified refuses the move; it is never only a warning.

use super::{CheckResult, Input, fail, pass};
use crate::cluster::protocol::CheckId;

pub(super) fn signature(i: &Input) -> CheckResult {
    match &i.signature {
        Ok(why) => pass(CheckId::Signature, why.clone()),
        Err(why) => fail(CheckId::Signature, why.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;

    /// A signature that is required and not verified fails the move; the old code only warned
    /// under os-pull-credentials.
    #[test]
    fn an_unverified_signature_fails_never_warns() {
        let mut c = base();
        c.signature = Err(crate::host::sigpolicy::Refused("/etc/containers/policy.json requires a signature for quay.io/o/r@…: a signature was required, but no signature exists".into()));
        assert_eq!(failed(&c), vec!["signature"]);
        let r = run(&c);
        assert!(r.iter().all(|x| x.result != Outcome::Warn), "{r:#?}");
        assert_eq!(result(&run(&base()), "signature").result, Outcome::Pass);
    }
}

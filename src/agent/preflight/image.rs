//! The checks of the OS image: its reference, the direction of the move, whether the OS
//! daemon can pull it, and what it is.

use super::advice::{self, Situation};
use super::needs::rebuilt_by_mco;
use super::{CheckResult, Input, Mover, fail, pass, target_major, warn};
use crate::backend::BackendKind;
use crate::cluster::policy::Verdict;
use crate::cluster::protocol::CheckId;
use crate::host::ospull::{AttemptOutcome, PolicyVerdict};
use crate::image::registry::LAYERED_FROM;

/// The image policy's verdict on the request (`crate::cluster::policy`): why it is allowed, or
/// why it is refused. Judged before anything is read, so a refusal is reported alone
/// ([`super::refused_by_image_policy`]); a request waiting for the cluster's streams is not
/// judged yet, so it cannot pass.
pub(super) fn image_policy(verdict: &Verdict) -> CheckResult {
    match verdict {
        Verdict::Allowed(why) => pass(CheckId::ImagePolicy, why.clone()),
        Verdict::Refused(why) => fail(CheckId::ImagePolicy, why.clone()),
        Verdict::Wait(wait) => fail(CheckId::ImagePolicy, wait.to_string()),
    }
}

pub(super) fn image_reference(i: &Input) -> CheckResult {
    // The annotation parser already refused anything unpinned; this records what is used.
    pass(
        CheckId::ImageReference,
        format!("{} (pinned by digest)", i.desired.os_image),
    )
}

/// A move to an older major is refused unless streamd's `allow-downgrade` allows it, which
/// governs only streamd's own moves: the machine-config operator's is refused either way.
pub(super) fn direction(i: &Input) -> CheckResult {
    let id = CheckId::Direction;
    let ours = i.mover == Mover::Streamd;
    match (i.booted_major, target_major(&i.desired, &i.os_image)) {
        (Some(from), Some(to)) if to < from && !(ours && i.policy.allow_downgrade) => fail(
            id,
            format!(
                "moving from major {from} to {to} is a downgrade, which is not supported; {}",
                advice::remedy(Situation::Downgrade, i.mover)
            ),
        ),
        (Some(from), Some(to)) if to < from => warn(
            id,
            format!("downgrade from major {from} to {to} allowed by config"),
        ),
        (Some(from), Some(to)) => pass(id, format!("major {from} -> {to}")),
        (None, _) => fail(
            id,
            "cannot tell the booted OS major from os-release; refusing to guess",
        ),
        (_, None) => fail(
            id,
            format!(
                "cannot tell the target major from stream {:?} or the image's ostree.linux label",
                i.desired.stream
            ),
        ),
    }
}

/// The daemon that pulls the OS image, as the reasons name it.
fn os_daemon(i: &Input) -> &'static str {
    match i.backend {
        BackendKind::RpmOstree => "rpm-ostreed",
        BackendKind::Bootc => "bootc",
    }
}

/// The OS daemon pulls with the host's ostree auth file, registries.conf and policy.json
/// (crate::host::ospull), not with streamd's pull secret: refused when that pull cannot
/// succeed for a reason of credentials or configuration. streamd never writes the auth file.
pub(super) fn os_pull_credentials(i: &Input) -> CheckResult {
    let id = CheckId::OsPullCredentials;
    let daemon = os_daemon(i);
    let p = &i.os_pull;
    let auth = p.auth_file.map_or_else(
        || "anonymously (none of /run/ostree/auth.json, /etc/ostree/auth.json, /usr/lib/ostree/auth.json exists)".to_string(),
        |f| format!("with the credentials in {f}"),
    );
    if let Some(problem) = &p.problem {
        return fail(id, format!("{daemon} cannot pull the OS image: {problem}"));
    }
    if let Some(a) = p.pulled() {
        let from = if a.mirror {
            format!("the mirror {}", a.source)
        } else {
            a.source.clone()
        };
        let msg = format!("{daemon} pulls from {from} {auth}");
        return match p.policy {
            // Verified (or refused) by the signature check, never only a warning here.
            Some((file, PolicyVerdict::NeedsSignature)) => pass(
                id,
                format!("{msg}; {file} requires a signature (see the signature check)"),
            ),
            _ => pass(id, msg),
        };
    }
    let refused: Vec<String> = p
        .attempts
        .iter()
        .filter_map(|a| match &a.outcome {
            AttemptOutcome::Blocked(prefix) => Some(format!(
                "{} is blocked (registries.conf entry {})",
                a.source,
                crate::text::quote(prefix)
            )),
            AttemptOutcome::Unauthorized => Some(format!(
                "{} answered unauthorized ({})",
                a.source,
                match (p.auth_file, a.credential) {
                    (None, _) => "no auth file".to_string(),
                    (Some(f), false) => format!("{f} has no credential for it"),
                    (Some(f), true) => format!("it rejected the credential in {f}"),
                }
            )),
            _ => None,
        })
        .collect();
    if refused.is_empty() {
        // Not a matter of credentials or configuration: os-image says what is wrong.
        return pass(id, format!("{daemon} would pull {auth}"));
    }
    let unauthorized = p
        .attempts
        .iter()
        .any(|a| a.outcome == AttemptOutcome::Unauthorized);
    let remedy = advice::remedy(
        if unauthorized {
            Situation::PullUnauthorized
        } else {
            Situation::PullBlocked
        },
        i.mover,
    );
    fail(
        id,
        format!(
            "{daemon} would pull {auth} and fail: {}; {remedy}",
            refused.join("; ")
        ),
    )
}

pub(super) fn os_image(i: &Input) -> CheckResult {
    let id = CheckId::OsImage;
    let info = match &i.os_image {
        Ok(info) => info,
        Err(e) => return fail(id, e.to_string()),
    };
    if !info.bootable {
        return fail(
            id,
            format!(
                "{} is not a bootable OS image (label containers.bootc is not 1/true)",
                i.desired.os_image
            ),
        );
    }
    if let Some(class) = &info.stream_class
        && class != &i.desired.stream
    {
        return fail(
            id,
            format!(
                "the image's stream class is {class:?} but the node was asked for stream {:?}",
                i.desired.stream
            ),
        );
    }
    if info.arch != i.arch {
        return fail(
            id,
            format!("the image is for {} but this node is {}", info.arch, i.arch),
        );
    }
    // The booted image's labels could not be read (bootc: from its commit), so it may be
    // on-cluster-layered; a base image does not replace it unseen.
    if let Some(why) = &i.booted.image_labels_error
        && info.layered_from.is_none()
    {
        return fail(
            id,
            format!(
                "the booted image's labels could not be read ({why}), so streamd cannot tell whether the node runs an on-cluster-layered image; {} is a base image, which would drop anything layered",
                i.desired.os_image
            ),
        );
    }
    // A base image in place of an on-cluster-layered one would drop whatever was layered (in
    // resolve mode the stream's image always is a base image), unless the machine-config
    // operator makes the move: it builds the new layered image from that base.
    if let Some(base) = i.booted.image_labels.get(LAYERED_FROM)
        && info.layered_from.is_none()
    {
        if rebuilt_by_mco(&i.booted, i.mover) {
            return pass(
                id,
                format!(
                    "the node runs an on-cluster-layered image (built from {base}); the machine-config operator rebuilds it from this base image (stream {}, {})",
                    info.stream_class.as_deref().unwrap_or("(unlabelled)"),
                    info.arch
                ),
            );
        }
        return fail(
            id,
            format!(
                "the node runs an on-cluster-layered image (built from {base}); {} is a base image, which would drop what was layered: request the layered image built for the target stream",
                i.desired.os_image
            ),
        );
    }
    pass(
        id,
        format!(
            "bootable, stream {}, {}, version {}",
            info.stream_class.as_deref().unwrap_or("(unlabelled)"),
            info.arch,
            info.version.as_deref().unwrap_or("?")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use crate::cluster::policy::Verdict;
    use crate::cluster::protocol::CheckId;
    use crate::host::ospull::AttemptOutcome;

    /// Each reason os-image, os-pull-credentials and direction refuse for.
    #[test]
    fn refusals_by_table() {
        let mut cases: Vec<(&str, Input)> = Vec::new();
        // A base image for a node on an on-cluster-layered image.
        let mut c = base();
        ocl(&mut c);
        cases.push(("os-image", c));
        let mut c = base();
        if let Ok(o) = &mut c.os_image {
            o.bootable = false;
        }
        cases.push(("os-image", c));
        let mut c = base();
        if let Ok(o) = &mut c.os_image {
            o.stream_class = Some("rhel-9".into());
        }
        cases.push(("os-image", c));
        let mut c = base();
        c.os_image = Err(FactError::OsImage(Cause::new(
            "pull secret rejected by quay.io",
        )));
        cases.push(("os-image", c));
        let mut c = base();
        c.desired = desired("rhel-9");
        c.booted_major = Some(10);
        if let Ok(o) = &mut c.os_image {
            o.stream_class = Some("rhel-9".into());
        }
        cases.push(("direction", c));
        for outcome in [
            AttemptOutcome::Unauthorized,
            AttemptOutcome::Blocked("quay.io".into()),
        ] {
            let mut c = base();
            c.os_pull.attempts[0].outcome = outcome;
            c.os_image = Err(FactError::OsImage(Cause::new("refused")));
            cases.push(("os-pull-credentials", c));
        }
        let mut c = base();
        c.os_pull.problem = Some("/etc/containers/policy.json rejects it".into());
        c.os_pull.attempts.clear();
        cases.push(("os-pull-credentials", c));
        let mut c = base();
        c.image_policy =
            Verdict::Refused("allowed-repositories: the OS image's repository is not in it".into());
        cases.push(("image-policy", c));
        assert_refused(cases);
    }

    #[test]
    fn an_image_policy_refusal_is_reported_alone() {
        let why = "resolved-only: the OS image is not the stream's";
        let checks = super::super::refused_by_image_policy(why.into());
        assert_eq!(checks.len(), 1);
        assert_eq!(
            (checks[0].id, checks[0].result, checks[0].message.as_str()),
            (CheckId::ImagePolicy, Outcome::Fail, why)
        );
        assert_eq!(result(&run(&base()), "image-policy").result, Outcome::Pass);
    }

    #[test]
    fn downgrade_allowed_by_policy_warns() {
        let mut c = base();
        c.desired = desired("rhel-9");
        c.booted_major = Some(10);
        if let Ok(o) = &mut c.os_image {
            o.stream_class = Some("rhel-9".into());
        }
        c.policy.allow_downgrade = true;
        assert_eq!(result(&run(&c), "direction").result, Outcome::Warn);
    }

    /// The machine-config operator's move is not streamd's to allow: a downgrade is refused
    /// whatever `allow-downgrade` says, and the reason does not suggest it (on the old code it
    /// said "set allow-downgrade = true", and with it set only warned).
    #[test]
    fn a_downgrade_the_mco_would_make_does_not_advise_allow_downgrade() {
        let mut c = base();
        c.desired = desired("rhel-9");
        c.booted_major = Some(10);
        if let Ok(o) = &mut c.os_image {
            o.stream_class = Some("rhel-9".into());
        }
        c.mover = Mover::MachineConfigOperator;
        for allow in [false, true] {
            c.policy.allow_downgrade = allow;
            let r = run(&c);
            let d = result(&r, "direction");
            assert_eq!(d.result, Outcome::Fail, "allow-downgrade = {allow}");
            assert!(
                !d.message.contains("allow-downgrade")
                    && d.message.contains("spec.osImageStream.name"),
                "{}",
                d.message
            );
        }
        c.mover = Mover::Streamd;
        c.policy.allow_downgrade = false;
        assert!(message(&c, "direction").contains("set allow-downgrade = true"));
    }

    /// Readiness of a node the machine-config daemon manages: the machine-config operator
    /// rebuilds an on-cluster-layered image from the stream's base image, so the base image
    /// passes there, and only there (a request for a base image is still refused).
    #[test]
    fn a_base_image_for_a_layered_node_passes_only_for_the_mco() {
        let mut c = base();
        ocl(&mut c);
        c.mover = Mover::MachineConfigOperator;
        assert_eq!(failed(&c), Vec::<&str>::new(), "{:#?}", run(&c));
        let r = run(&c);
        let os = result(&r, "os-image");
        assert!(
            os.message.contains("machine-config operator rebuilds"),
            "{}",
            os.message
        );
        c.mover = Mover::Streamd;
        assert_eq!(failed(&c), vec!["os-image"]);
        // The other reasons of os-image still refuse the machine-config operator's move.
        let mut c = base();
        ocl(&mut c);
        c.mover = Mover::MachineConfigOperator;
        if let Ok(o) = &mut c.os_image {
            o.stream_class = Some("rhel-9".into());
        }
        assert_eq!(failed(&c), vec!["os-image"]);
        let mut c = base();
        ocl(&mut c);
        c.mover = Mover::MachineConfigOperator;
        c.arch = "aarch64".into();
        assert!(failed(&c).contains(&"os-image"));
    }
}

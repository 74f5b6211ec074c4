//! Refspecs as rpm-ostree classifies them, and container image references as ostree-ext
//! parses and prints them; shared by the model (origins) and the ostree layer (image refs).

use std::fmt;

use crate::fixtures::images::TestImage;

/// Where a container image comes from (containers-image transports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    Registry,
    OciDir,
    OciArchive,
    DockerArchive,
    ContainerStorage,
    Dir,
}

impl Transport {
    pub(crate) fn parse(s: &str) -> Option<Transport> {
        Some(match s {
            "registry" => Transport::Registry,
            "oci" => Transport::OciDir,
            "oci-archive" => Transport::OciArchive,
            "docker-archive" => Transport::DockerArchive,
            "containers-storage" => Transport::ContainerStorage,
            "dir" => Transport::Dir,
            _ => return None,
        })
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Transport::Registry => "registry",
            Transport::OciDir => "oci",
            Transport::OciArchive => "oci-archive",
            Transport::DockerArchive => "docker-archive",
            Transport::ContainerStorage => "containers-storage",
            Transport::Dir => "dir",
        }
    }
}

/// How the image signature is checked (the ostree-ext refspec prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SigVerify {
    Unverified,
    Signed,
    Remote(String),
}

/// A container image refspec (`ostree_ext::container::OstreeImageReference`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ImageRef {
    pub(crate) sig: SigVerify,
    pub(crate) transport: Transport,
    pub(crate) name: String,
}

/// What `set-refspec` names, classified like `refspec_classify()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refspec {
    Container(ImageRef),
    Checksum(String),
    Ostree {
        remote: Option<String>,
        branch: String,
    },
}

impl Refspec {
    /// Classify a refspec; a leading `ostree://` is stripped first.
    pub(crate) fn classify(refspec: &str) -> Refspec {
        let refspec = refspec.strip_prefix("ostree://").unwrap_or(refspec);
        if let Some(img) = ImageRef::parse(refspec) {
            return Refspec::Container(img);
        }
        if refspec.len() == 64 && refspec.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Refspec::Checksum(refspec.to_string());
        }
        match refspec.split_once(':') {
            Some((remote, branch)) => Refspec::Ostree {
                remote: Some(remote.to_string()),
                branch: branch.to_string(),
            },
            None => Refspec::Ostree {
                remote: None,
                branch: refspec.to_string(),
            },
        }
    }
}

impl ImageRef {
    pub(crate) fn parse(s: &str) -> Option<ImageRef> {
        let (sig, transport, name) =
            if let Some(rest) = s.strip_prefix("ostree-unverified-registry:") {
                (SigVerify::Unverified, Transport::Registry, rest)
            } else if let Some(rest) = s.strip_prefix("ostree-unverified-image:") {
                let (t, n) = Self::parse_transport(rest)?;
                (SigVerify::Unverified, t, n)
            } else if let Some(rest) = s.strip_prefix("ostree-image-signed:") {
                let (t, n) = Self::parse_transport(rest)?;
                (SigVerify::Signed, t, n)
            } else if let Some(rest) = s.strip_prefix("ostree-remote-registry:") {
                let (remote, n) = rest.split_once(':')?;
                (
                    SigVerify::Remote(remote.to_string()),
                    Transport::Registry,
                    n,
                )
            } else if let Some(rest) = s.strip_prefix("ostree-remote-image:") {
                let (remote, rest) = rest.split_once(':')?;
                let (t, n) = Self::parse_transport(rest)?;
                (SigVerify::Remote(remote.to_string()), t, n)
            } else {
                return None;
            };
        if name.is_empty() {
            return None;
        }
        Some(ImageRef {
            sig,
            transport,
            name: name.to_string(),
        })
    }

    /// The image reference without its signature policy, as ostree-ext's `ImageReference`
    /// prints it: `docker://NAME` for the registry transport, `TRANSPORT:NAME` otherwise.
    pub(crate) fn image_reference(&self) -> String {
        match self.transport {
            Transport::Registry => format!("docker://{}", self.name),
            t => format!("{}:{}", t.as_str(), self.name),
        }
    }

    /// `docker://NAME` or `TRANSPORT:NAME`; `docker:NAME` (no `//`) is invalid.
    fn parse_transport(s: &str) -> Option<(Transport, &str)> {
        if let Some(name) = s.strip_prefix("docker://") {
            return Some((Transport::Registry, name));
        }
        let (t, name) = s.split_once(':')?;
        Some((Transport::parse(t)?, name))
    }

    /// Find the image this reference names; `revision` overrides the manifest digest like
    /// `set-revision` does for container origins. The error is the pull error the real
    /// daemon reports.
    pub(crate) fn resolve<'a>(
        &self,
        images: &'a [TestImage],
        revision: Option<&str>,
    ) -> Result<&'a TestImage, String> {
        const OPEN_IMAGE: &str = "Creating importer: failed to invoke method OpenImage: \
                                  failed to invoke method OpenImage";
        if self.transport != Transport::Registry {
            return Err(format!(
                "{OPEN_IMAGE}: opening {}:{}: no such file or directory",
                self.transport.as_str(),
                self.name
            ));
        }
        let (repo, pinned) = match self.name.split_once('@') {
            Some((repo, digest)) => (repo, digest),
            None => {
                // A tag is what follows the last ':' after the last '/'.
                let slash = self.name.rfind('/').map_or(0, |i| i + 1);
                match self.name[slash..].rfind(':') {
                    Some(i) => (&self.name[..slash + i], &self.name[slash + i + 1..]),
                    None => (self.name.as_str(), "latest"),
                }
            }
        };
        let reference = revision.unwrap_or(pinned);
        let wanted = format!("{repo}@{reference}");
        images
            .iter()
            .find(|img| img.pullspec == wanted)
            .ok_or_else(|| {
                format!("{OPEN_IMAGE}: reading manifest {reference} in {repo}: manifest unknown")
            })
    }
}

impl fmt::Display for ImageRef {
    /// The form ostree-ext prints in "Pulling manifest: …".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let imgref = self.image_reference();
        match (&self.sig, self.transport) {
            (SigVerify::Unverified, Transport::Registry) => {
                write!(f, "ostree-unverified-registry:{}", self.name)
            }
            (SigVerify::Unverified, _) => write!(f, "ostree-unverified-image:{imgref}"),
            (SigVerify::Signed, _) => write!(f, "ostree-image-signed:{imgref}"),
            (SigVerify::Remote(r), Transport::Registry) => {
                write!(f, "ostree-remote-registry:{r}:{}", self.name)
            }
            (SigVerify::Remote(r), _) => write!(f, "ostree-remote-image:{r}:{imgref}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::images::{DEFAULT_REGISTRY, catalog};

    #[test]
    fn refspecs_classify_and_resolve() {
        let images = catalog(DEFAULT_REGISTRY);
        let rhel10 = &images[1];
        for prefix in [
            "ostree-unverified-registry:",
            "ostree-unverified-image:registry:",
            "ostree-unverified-image:docker://",
            "ostree-image-signed:docker://",
            "ostree-remote-registry:fedora:",
        ] {
            let spec = format!("{prefix}{}", rhel10.pullspec);
            let Refspec::Container(img) = Refspec::classify(&spec) else {
                panic!("{spec} is a container refspec");
            };
            assert_eq!(img.resolve(&images, None), Ok(rhel10), "{spec}");
        }
        assert!(matches!(
            Refspec::classify("docker://quay.io/x/y:1"),
            Refspec::Ostree { remote: Some(r), .. } if r == "docker"
        ));
        assert!(matches!(
            Refspec::classify("ostree-unverified-image:docker:blah"),
            Refspec::Ostree { .. }
        ));
        let Refspec::Container(tagged) =
            Refspec::classify("ostree-unverified-registry:127.0.0.1:5000/openshift/rhcos:4.19")
        else {
            panic!("tagged refspec");
        };
        let err = tagged.resolve(&images, None).expect_err("no tags");
        assert!(
            err.ends_with(
                "reading manifest 4.19 in 127.0.0.1:5000/openshift/rhcos: manifest unknown"
            ),
            "{err}"
        );
        assert_eq!(tagged.resolve(&images, Some(&rhel10.digest)), Ok(rhel10));
    }
}

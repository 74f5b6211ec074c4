//! Images: digest-pinned references, what a registry says about an image, the extensions
//! image's RPMs, the pull secret, the host's registries configuration and RPM names.

pub mod extensions;
pub mod pullsecret;
pub mod reference;
pub mod registries;
pub mod registry;
pub mod rpm;
pub mod signature;
pub mod sigstore;

//! A signature found for an image, in either format, before it is checked.

use gkm_core::policy::Format;

use super::tlog;

/// One signature found for the image, in either format, before any key or
/// certificate is checked.
#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    /// Where it was stored.
    pub format: Format,
    /// The bytes the signature covers.
    pub message: Vec<u8>,
    /// The signature.
    pub signature: Vec<u8>,
    /// The image digest the signed content names (checked after the signature).
    pub signed_digest: Result<String, String>,
    /// The signing certificate (DER), when there is one.
    pub certificate: Option<Vec<u8>>,
    /// A hint naming the key (a bundle's `publicKey.hint`).
    pub key_hint: Option<String>,
    /// Transparency log entries recorded with the signature.
    pub tlog: Vec<tlog::Entry>,
}

//! Cache and namespace names checked to be Kubernetes object names before
//! they become parts of a path.

use gkm_core::CacheKey;

use crate::error::{Error, Result};

/// Checks that a key's names are Kubernetes names.
pub fn check_key(key: &CacheKey) -> Result<()> {
    let bad = |what: String| Err(Error::InvalidName(what));
    if let Some(ns) = key.namespace()
        && !is_dns1123_label(ns)
    {
        return bad(format!(
            "namespace {ns:?} is not a valid namespace name (a DNS-1123 label)"
        ));
    }
    if !is_dns1123_subdomain(key.name()) {
        return bad(format!(
            "cache name {:?} is not a valid object name (a DNS-1123 subdomain)",
            key.name()
        ));
    }
    Ok(())
}

/// A DNS-1123 label: at most 63 of `[a-z0-9-]`, alphanumeric at both ends.
pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 subdomain: at most 253, dot-separated DNS-1123 labels.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

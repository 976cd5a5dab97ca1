//! Patterns the apiserver checks in gkm's CRDs (RE2 syntax, anchored).

/// An OCI image reference: `[registry[:port]/]path[:tag][@digest]`, as the
/// distribution reference grammar defines it.
pub const IMAGE_REFERENCE: &str = concat!(
    r"^(?:(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?))*",
    r"(?::[0-9]+)?/)?",
    r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*)*",
    r"(?::[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127})?",
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$",
);

/// A DNS-1123 label: a namespace name.
pub const DNS1123_LABEL: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// A DNS-1123 subdomain: a Kubernetes object name (StorageClass, Secret…).
pub const DNS1123_SUBDOMAIN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// A Go-style duration made of whole units: `90s`, `5m`, `1h30m`.
pub const DURATION: &str = r"^([0-9]+(ms|s|m|h))+$";

/// An image manifest digest as gkm resolves them: `sha256:` and 64
/// lowercase hex digits.
pub const MANIFEST_DIGEST: &str = r"^sha256:[0-9a-f]{64}$";

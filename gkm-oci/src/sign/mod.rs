//! Signing cache images: sigstore bundles (default) and cosign v2 signatures.

//! Signature verification as the operator sees it: a policy in, a
//! [`VerificationStatus`] out.

use std::sync::Arc;

use async_trait::async_trait;
use gkm_core::policy::{Identity, Policy, PublicKey, Signer, SubjectMatch, TrustedRoot};
use gkm_oci::verify::VerifyError;
use gkm_oci::{Digest, ImageRef};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};

use crate::metrics::{Metrics, RegistryOperation};
use gkm_k8s_api::cache_object::CacheKey;
use gkm_k8s_api::crd::{ConfigMapKeyRef, SecretKeyRef, SignaturePolicy, VerificationStatus};

/// Verifies image digests: resolving a cache's policy (its Secret and
/// ConfigMap references) and checking signatures are separate steps, so the
/// operator can key what it remembers on the resolved policy.
#[async_trait]
pub trait ImageVerifier: Send + Sync {
    /// `policy` with every reference resolved, for `cache` (which decides
    /// the namespaces references may name), or why it cannot be.
    async fn resolve(&self, cache: &CacheKey, policy: &SignaturePolicy) -> Result<Policy, String>;

    /// What verifying `digest` of `image` against `policy` proved, or why
    /// not. The policy's mode is not applied here.
    async fn verify(&self, image: &str, digest: &str, policy: &Policy) -> VerificationStatus;
}

/// Verifies against the registry with [`gkm_oci::verify`], resolving the
/// policy's Secret and ConfigMap references through the apiserver.
pub struct RegistryVerifier {
    client: kube::Client,
    registry: gkm_oci::RegistryOptions,
    /// Where references of cluster caches without a namespace are looked up.
    operator_namespace: String,
    /// Where its registry requests are counted.
    metrics: Option<Arc<Metrics>>,
    /// Where each registry's signatures were found before: each
    /// verification looks there first, saving the lookups that find
    /// nothing (cosign v2's `.sig` tag where images carry bundles, the
    /// referrers API where the registry has none).
    hints: gkm_oci::verify::SignatureHints,
}

impl RegistryVerifier {
    /// A verifier reading keys with `client` and images with `registry`.
    pub fn new(
        client: kube::Client,
        registry: gkm_oci::RegistryOptions,
        operator_namespace: &str,
    ) -> Self {
        RegistryVerifier {
            client,
            registry,
            operator_namespace: operator_namespace.into(),
            metrics: None,
            hints: gkm_oci::verify::SignatureHints::default(),
        }
    }

    /// Counts its registry requests in `metrics` (`operation="verify"`).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The namespace a reference is looked up in: a namespaced cache may
    /// name only its own namespace, a cluster cache only the operator's.
    /// A reference elsewhere is refused without reading anything, in words
    /// that say nothing about what exists there.
    fn namespace_for(
        &self,
        cache: &CacheKey,
        explicit: Option<&String>,
        what: &str,
    ) -> Result<String, String> {
        let allowed = cache
            .namespace()
            .unwrap_or(&self.operator_namespace)
            .to_string();
        match explicit {
            Some(ns) if *ns != allowed => Err(format!(
                "{what} in namespace {ns:?}: a {} may only reference objects in {allowed:?}",
                if cache.namespace().is_some() {
                    "GKMCache"
                } else {
                    "ClusterGKMCache"
                }
            )),
            _ => Ok(allowed),
        }
    }

    /// The public key in a Secret: the same words whether the Secret is
    /// missing, lacks the key, or holds no usable public key there.
    async fn secret_key(&self, cache: &CacheKey, r: &SecretKeyRef) -> Result<PublicKey, String> {
        let ns = self.namespace_for(cache, r.namespace.as_ref(), "Secret")?;
        let unusable = || {
            format!(
                "Secret {ns}/{} key {:?} is missing or not usable",
                r.name, r.key
            )
        };
        let api: kube::Api<Secret> = kube::Api::namespaced(self.client.clone(), &ns);
        let secret = api.get_opt(&r.name).await.map_err(|e| {
            tracing::warn!(secret = %r.name, namespace = %ns, error = %e, "reading a Secret");
            unusable()
        })?;
        let bytes = secret
            .and_then(|s| s.data)
            .and_then(|d| d.get(&r.key).cloned())
            .ok_or_else(unusable)?;
        let pem = String::from_utf8(bytes.0).map_err(|_| unusable())?;
        PublicKey::from_pem(&pem).map_err(|_| unusable())
    }

    async fn config_map_value(
        &self,
        cache: &CacheKey,
        r: &ConfigMapKeyRef,
    ) -> Result<String, String> {
        let ns = self.namespace_for(cache, r.namespace.as_ref(), "ConfigMap")?;
        let unusable = || {
            format!(
                "ConfigMap {ns}/{} key {:?} is missing or not usable",
                r.name, r.key
            )
        };
        let api: kube::Api<ConfigMap> = kube::Api::namespaced(self.client.clone(), &ns);
        let map = api.get_opt(&r.name).await.map_err(|e| {
            tracing::warn!(config_map = %r.name, namespace = %ns, error = %e, "reading a ConfigMap");
            unusable()
        })?;
        map.and_then(|m| m.data)
            .and_then(|d| d.get(&r.key).cloned())
            .ok_or_else(unusable)
    }

    /// The policy as gkm-core states it, with every reference resolved.
    async fn core_policy(
        &self,
        cache: &CacheKey,
        policy: &SignaturePolicy,
    ) -> Result<Policy, String> {
        let mut signers = Vec::new();
        for (i, signer) in policy.signers.iter().flatten().enumerate() {
            let at = format!("spec.signature.signers[{i}]");
            match (&signer.key, &signer.keyless) {
                (Some(key), _) => {
                    let key = match (&key.public_key, &key.secret_ref) {
                        (Some(pem), _) => {
                            PublicKey::from_pem(pem).map_err(|e| format!("{at}.key: {e}"))?
                        }
                        (None, Some(r)) => self
                            .secret_key(cache, r)
                            .await
                            .map_err(|e| format!("{at}.key: {e}"))?,
                        (None, None) => return Err(format!("{at}.key names no public key")),
                    };
                    signers.push(Signer::Key(key));
                }
                (None, Some(keyless)) => {
                    let subject = match (&keyless.subject, &keyless.subject_regexp) {
                        (Some(s), _) => SubjectMatch::Exact(s.clone()),
                        (None, Some(p)) => {
                            SubjectMatch::regexp(p).map_err(|e| format!("{at}.keyless: {e}"))?
                        }
                        (None, None) => return Err(format!("{at}.keyless names no subject")),
                    };
                    let identity = Identity::new(&keyless.issuer, subject)
                        .map_err(|e| format!("{at}.keyless: {e}"))?;
                    signers.push(Signer::Keyless(identity));
                }
                (None, None) => return Err(format!("{at} names no signer")),
            }
        }
        let trusted_root = match &policy.trusted_root {
            Some(r) => {
                let json = self.config_map_value(cache, r).await?;
                Some(
                    TrustedRoot::from_json(json.as_bytes())
                        .map_err(|e| format!("spec.signature.trustedRoot: {e}"))?,
                )
            }
            None => None,
        };
        let core = Policy::new(
            policy.mode.into(),
            signers,
            trusted_root,
            policy.require_tlog.unwrap_or(false),
        )
        .map_err(|e| e.to_string())?;
        // Keyless signatures need a log entry unless the policy says
        // `requireTlog: false` in so many words.
        Ok(if policy.require_tlog == Some(false) {
            core.allowing_unlogged_keyless()
        } else {
            core
        })
    }
}

#[async_trait]
impl ImageVerifier for RegistryVerifier {
    async fn resolve(&self, cache: &CacheKey, policy: &SignaturePolicy) -> Result<Policy, String> {
        self.core_policy(cache, policy).await
    }

    async fn verify(&self, image: &str, digest: &str, policy: &Policy) -> VerificationStatus {
        let refused = |message: String| VerificationStatus {
            verified: false,
            digest: Some(digest.to_string()),
            message: Some(message),
            ..VerificationStatus::default()
        };
        let (reference, parsed_digest) = match (image.parse::<ImageRef>(), digest.parse::<Digest>())
        {
            (Ok(r), Ok(d)) => (r, d),
            (Err(e), _) => return refused(format!("{image}: {e}")),
            (_, Err(e)) => return refused(format!("{digest}: {e}")),
        };
        let began = std::time::Instant::now();
        let outcome = gkm_oci::verify::verify_with_hints(
            &reference,
            &self.registry,
            &parsed_digest,
            policy,
            &self.hints,
        )
        .await;
        if let Some(metrics) = &self.metrics {
            // A rejected signature is an answer; only a failed read is an error.
            let read = !matches!(outcome, Err(VerifyError::Image(_)));
            metrics.registry_request(RegistryOperation::Verify, read, began.elapsed());
        }
        match outcome {
            Ok(verified) => VerificationStatus {
                verified: true,
                digest: Some(verified.digest.clone()),
                format: Some(verified.format.to_string()),
                signer: Some(verified.signed_by.to_string()),
                message: Some(verified.to_string()),
                ..VerificationStatus::default()
            },
            Err(VerifyError::Rejected(why)) => refused(why.to_string()),
            Err(VerifyError::Image(e)) => refused(format!("reading signatures: {e}")),
            Err(e) => refused(e.to_string()),
        }
    }
}

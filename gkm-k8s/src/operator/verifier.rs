//! Signature verification as the operator sees it: a policy in, a
//! [`VerificationStatus`] out.

use async_trait::async_trait;
use gkm_core::policy::{Identity, Mode, Policy, PublicKey, Signer, SubjectMatch, TrustedRoot};
use gkm_oci::verify::VerifyError;
use gkm_oci::{Digest, ImageRef};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};

use crate::cache_object::CacheKey;
use crate::crd::{
    ConfigMapKeyRef, SecretKeyRef, SignatureMode, SignaturePolicy, VerificationStatus,
};

/// Verifies an image digest against a cache's signature policy.
#[async_trait]
pub trait ImageVerifier: Send + Sync {
    /// What verifying `digest` of `image` against `policy` proved, or why not.
    async fn verify(
        &self,
        cache: &CacheKey,
        image: &str,
        digest: &str,
        policy: &SignaturePolicy,
    ) -> VerificationStatus;
}

/// Whether a verification outcome lets the cache be delivered under `mode`.
pub fn deliverable(mode: SignatureMode, status: &VerificationStatus) -> bool {
    match mode {
        SignatureMode::Enforce => status.verified,
        SignatureMode::Audit | SignatureMode::Off => true,
    }
}

/// Verifies against the registry with [`gkm_oci::verify`], resolving the
/// policy's Secret and ConfigMap references through the apiserver.
pub struct RegistryVerifier {
    client: kube::Client,
    registry: gkm_oci::RegistryOptions,
    /// Where references of cluster caches without a namespace are looked up.
    operator_namespace: String,
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
        }
    }

    /// The namespace a reference without one is looked up in.
    fn namespace_for(&self, cache: &CacheKey, explicit: Option<&String>) -> String {
        explicit
            .cloned()
            .or_else(|| cache.namespace.clone())
            .unwrap_or_else(|| self.operator_namespace.clone())
    }

    async fn secret_value(&self, cache: &CacheKey, r: &SecretKeyRef) -> Result<String, String> {
        let ns = self.namespace_for(cache, r.namespace.as_ref());
        let api: kube::Api<Secret> = kube::Api::namespaced(self.client.clone(), &ns);
        let secret = api
            .get(&r.name)
            .await
            .map_err(|e| format!("Secret {ns}/{}: {e}", r.name))?;
        let bytes = secret
            .data
            .and_then(|d| d.get(&r.key).cloned())
            .ok_or_else(|| format!("Secret {ns}/{} has no key {:?}", r.name, r.key))?;
        String::from_utf8(bytes.0)
            .map_err(|_| format!("Secret {ns}/{} key {:?} is not text", r.name, r.key))
    }

    async fn config_map_value(
        &self,
        cache: &CacheKey,
        r: &ConfigMapKeyRef,
    ) -> Result<String, String> {
        let ns = self.namespace_for(cache, r.namespace.as_ref());
        let api: kube::Api<ConfigMap> = kube::Api::namespaced(self.client.clone(), &ns);
        let map = api
            .get(&r.name)
            .await
            .map_err(|e| format!("ConfigMap {ns}/{}: {e}", r.name))?;
        map.data
            .and_then(|d| d.get(&r.key).cloned())
            .ok_or_else(|| format!("ConfigMap {ns}/{} has no key {:?}", r.name, r.key))
    }

    /// The policy as gkm-core states it, with every reference resolved.
    async fn policy(&self, cache: &CacheKey, policy: &SignaturePolicy) -> Result<Policy, String> {
        let mut signers = Vec::new();
        for (i, signer) in policy.signers.iter().flatten().enumerate() {
            let at = format!("spec.signature.signers[{i}]");
            match (&signer.key, &signer.keyless) {
                (Some(key), _) => {
                    let pem = match (&key.public_key, &key.secret_ref) {
                        (Some(pem), _) => pem.clone(),
                        (None, Some(r)) => self.secret_value(cache, r).await?,
                        (None, None) => return Err(format!("{at}.key names no public key")),
                    };
                    let key = PublicKey::from_pem(&pem).map_err(|e| format!("{at}.key: {e}"))?;
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
        let mode = match policy.mode {
            SignatureMode::Enforce => Mode::Enforce,
            SignatureMode::Audit => Mode::Audit,
            SignatureMode::Off => Mode::Off,
        };
        Policy::new(
            mode,
            signers,
            trusted_root,
            policy.require_tlog.unwrap_or(false),
        )
        .map_err(|e| e.to_string())
    }
}

#[async_trait]
impl ImageVerifier for RegistryVerifier {
    async fn verify(
        &self,
        cache: &CacheKey,
        image: &str,
        digest: &str,
        policy: &SignaturePolicy,
    ) -> VerificationStatus {
        let refused = |message: String| VerificationStatus {
            verified: false,
            digest: Some(digest.to_string()),
            message: Some(message),
            ..VerificationStatus::default()
        };
        if policy.mode == SignatureMode::Off {
            return refused("signature verification is off for this cache".into());
        }
        let core = match self.policy(cache, policy).await {
            Ok(p) => p,
            Err(e) => return refused(format!("signature policy: {e}")),
        };
        let (reference, parsed_digest) = match (image.parse::<ImageRef>(), digest.parse::<Digest>())
        {
            (Ok(r), Ok(d)) => (r, d),
            (Err(e), _) => return refused(format!("{image}: {e}")),
            (_, Err(e)) => return refused(format!("{digest}: {e}")),
        };
        match gkm_oci::verify::verify(&reference, &self.registry, &parsed_digest, &core).await {
            Ok(verified) => VerificationStatus {
                verified: true,
                digest: Some(verified.digest.clone()),
                format: Some(verified.format.to_string()),
                signer: Some(verified.signed_by.to_string()),
                message: Some(verified.to_string()),
            },
            Err(VerifyError::Rejected(why)) => refused(why.to_string()),
            Err(VerifyError::Image(e)) => refused(format!("reading signatures: {e}")),
        }
    }
}

//! What a cache image's signature must prove: `spec.signature`.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// How a signature policy is applied.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum SignatureMode {
    /// An image that does not verify is never delivered.
    #[default]
    Enforce,
    /// Verification runs and is reported, but does not block delivery.
    Audit,
    /// No verification.
    Off,
}

/// `spec.signature.mode` as the domain's [`gkm_core::policy::Mode`]: the one
/// place the CRD's mode and gkm-core's are mapped.
impl From<SignatureMode> for gkm_core::policy::Mode {
    fn from(mode: SignatureMode) -> Self {
        match mode {
            SignatureMode::Enforce => gkm_core::policy::Mode::Enforce,
            SignatureMode::Audit => gkm_core::policy::Mode::Audit,
            SignatureMode::Off => gkm_core::policy::Mode::Off,
        }
    }
}

/// A word that is not a [`SignatureMode`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a signature mode: use Enforce, Audit or Off")]
pub struct UnknownSignatureMode(pub String);

/// Parses the YAML spelling (`Enforce`, `Audit`, `Off`), as operator flags
/// name modes.
impl std::str::FromStr for SignatureMode {
    type Err = UnknownSignatureMode;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "Enforce" => Ok(SignatureMode::Enforce),
            "Audit" => Ok(SignatureMode::Audit),
            "Off" => Ok(SignatureMode::Off),
            other => Err(UnknownSignatureMode(other.to_string())),
        }
    }
}

/// The signers a cache image must be signed by; any one suffices.
///
/// When a cache has no `signature`, the operator's default policy applies.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.mode == 'Off' || (has(self.signers) && size(self.signers) > 0)")
    .message("signers must name at least one signer unless mode is Off")
    .field_path(".signers"))]
pub struct SignaturePolicy {
    /// Enforce (default), Audit or Off.
    #[serde(default)]
    pub mode: SignatureMode,
    /// Accepted signers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub signers: Option<Vec<Signer>>,
    /// A `trusted_root.json` (Fulcio roots, Rekor, CT log and TSA keys) for
    /// keyless signers. Nothing is fetched from the internet implicitly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trusted_root: Option<ConfigMapKeyRef>,
    /// Require a transparency-log entry (a Rekor SET or inclusion proof).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_tlog: Option<bool>,
}

/// One accepted signer: a public key or a keyless identity.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.key) != has(self.keyless)")
    .message("a signer sets exactly one of key or keyless"))]
pub struct Signer {
    /// A public key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<KeySigner>,
    /// A keyless (Fulcio certificate) identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyless: Option<KeylessSigner>,
}

/// A public key signer: PEM inline or in a Secret.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.publicKey) != has(self.secretRef)")
    .message("a key sets exactly one of publicKey or secretRef"))]
pub struct KeySigner {
    /// PEM public key (ECDSA P-256/P-384, Ed25519 or RSA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.startsWith('-----BEGIN PUBLIC KEY-----')")
        .message("publicKey must be a PEM public key (-----BEGIN PUBLIC KEY-----)"))]
    #[schemars(length(max = 16384))]
    pub public_key: Option<String>,
    /// A Secret key holding the PEM public key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretKeyRef>,
}

/// A keyless signer: the OIDC issuer and subject in its Fulcio certificate.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.subject) != has(self.subjectRegExp)")
    .message("a keyless signer sets exactly one of subject or subjectRegExp"))]
pub struct KeylessSigner {
    /// The OIDC issuer URL, matched exactly.
    #[schemars(length(min = 1, max = 1024))]
    pub issuer: String,
    /// The certificate subject (email or URI), matched exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub subject: Option<String>,
    /// A regular expression (RE2) the subject must match in full.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "subjectRegExp"
    )]
    #[schemars(length(min = 1, max = 1024))]
    pub subject_regexp: Option<String>,
}

/// A key of a Secret.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253), regex(pattern = super::validation::DNS1123_SUBDOMAIN))]
    pub name: String,
    /// Its namespace; defaults to the cache's namespace (the operator's for a
    /// cluster cache).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = super::validation::DNS1123_LABEL))]
    pub namespace: Option<String>,
    /// The key within the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// A key of a ConfigMap.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapKeyRef {
    /// The ConfigMap's name.
    #[schemars(length(min = 1, max = 253), regex(pattern = super::validation::DNS1123_SUBDOMAIN))]
    pub name: String,
    /// Its namespace; defaults as for [`SecretKeyRef::namespace`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = super::validation::DNS1123_LABEL))]
    pub namespace: Option<String>,
    /// The key within the ConfigMap.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

#[cfg(test)]
mod tests {
    use gkm_core::policy::{Mode, Rejection};

    use super::{SignatureMode, UnknownSignatureMode};

    #[test]
    fn a_mode_parses_from_its_yaml_spelling() {
        for mode in [
            SignatureMode::Enforce,
            SignatureMode::Audit,
            SignatureMode::Off,
        ] {
            let word = format!("{mode:?}");
            assert_eq!(word.parse::<SignatureMode>(), Ok(mode));
            assert_eq!(format!(" {word} ").parse::<SignatureMode>(), Ok(mode));
            let yaml: SignatureMode =
                serde_json::from_value(serde_json::json!(word)).expect("yaml");
            assert_eq!(yaml, mode);
        }
    }

    #[test]
    fn another_word_is_refused_naming_the_accepted_modes() {
        for word in ["enforce", "Sometimes", ""] {
            let err = word.parse::<SignatureMode>().expect_err(word);
            assert_eq!(err, UnknownSignatureMode(word.to_string()));
            assert_eq!(
                err.to_string(),
                format!("{word:?} is not a signature mode: use Enforce, Audit or Off")
            );
        }
    }

    #[test]
    fn each_mode_maps_to_the_domain_mode_of_the_same_name() {
        for (crd, domain) in [
            (SignatureMode::Enforce, Mode::Enforce),
            (SignatureMode::Audit, Mode::Audit),
            (SignatureMode::Off, Mode::Off),
        ] {
            assert_eq!(Mode::from(crd), domain);
            // The YAML spelling is the same on both sides.
            assert_eq!(
                serde_json::to_value(crd).expect("crd mode"),
                serde_json::to_value(domain).expect("domain mode")
            );
        }
        assert_eq!(Mode::from(SignatureMode::default()), Mode::default());
        let unsigned: Result<(), Rejection> = Err(Rejection::NoSignature);
        assert!(!Mode::from(SignatureMode::Enforce).admits(&unsigned));
        assert!(Mode::from(SignatureMode::Audit).admits(&unsigned));
    }
}

//! What a signature must prove: accepted signers (keys, keyless identities) and a mode.
//!
//! A [`Policy`] lists the [`Signer`]s whose signature is accepted (any one
//! suffices): PEM public keys (ECDSA P-256/P-384, Ed25519, RSA) and keyless
//! identities (an OIDC issuer and a subject or subject pattern, proven by a
//! Fulcio-style certificate chaining to a [`TrustedRoot`]). Nothing here
//! touches the network or does cryptography: this module parses and
//! validates, and describes outcomes ([`Verified`], [`Rejection`]); the
//! verifier lives in `gkm-oci`.
//!
//! It maps one to one onto a cache's `spec.signature`: `mode` →
//! [`Mode`], `signers[].key.publicKey` → [`PublicKey::from_pem`],
//! `signers[].keyless` → [`Identity`], `trustedRoot` →
//! [`TrustedRoot::from_json`], `requireTlog` → [`Policy::require_tlog`].
//!
//! ```
//! use gkm_core::policy::{Identity, Mode, Policy, Signer, SubjectMatch, TrustedRoot};
//! let root = TrustedRoot::from_json(br#"{
//!   "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
//!   "certificateAuthorities": [{"uri": "https://fulcio.example",
//!     "certChain": {"certificates": [{"rawBytes": "MAA="}]}}]
//! }"#).unwrap();
//! let who = Identity::new(
//!     "https://token.actions.githubusercontent.com",
//!     SubjectMatch::regexp(r"https://github.com/acme/.*").unwrap(),
//! ).unwrap();
//! let policy = Policy::new(Mode::Enforce, vec![Signer::Keyless(who)], Some(root), false).unwrap();
//! assert_eq!(policy.signers().len(), 1);
//! assert!(Policy::new(Mode::Enforce, vec![], None, false).is_err());
//! ```

mod identity;
mod keys;
mod outcome;
mod trusted_root;

pub use identity::{Identity, Signer, SubjectMatch};
pub use keys::{KeyAlgorithm, PemError, PublicKey, fingerprint, pem_block, pem_blocks, to_pem};
pub use outcome::{Format, Rejection, SignedBy, Verified};
pub use trusted_root::{Authority, LogKey, TrustedRoot, Validity, parse_rfc3339};

/// Why a policy, key, identity or trusted root was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// A PEM public key could not be read.
    #[error("public key: {0}")]
    PublicKey(String),
    /// A subject pattern is not a valid regular expression.
    #[error("subject pattern {pattern:?}: {reason}")]
    SubjectPattern {
        /// The pattern.
        pattern: String,
        /// What the regex engine said.
        reason: String,
    },
    /// A keyless identity names an empty issuer or subject.
    #[error("keyless signer: {0}")]
    Identity(String),
    /// The `trusted_root.json` could not be read.
    #[error("trusted root: {0}")]
    TrustedRoot(String),
    /// The policy as a whole is inconsistent.
    #[error("signature policy: {0}")]
    Policy(String),
}

/// How a policy is applied (`spec.signature.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum Mode {
    /// An image that does not verify is never delivered.
    #[default]
    Enforce,
    /// Verification runs and is reported, but does not block delivery.
    Audit,
    /// No verification.
    Off,
}

impl Mode {
    /// Whether an image with this verification outcome may be delivered.
    ///
    /// ```
    /// use gkm_core::policy::{Mode, Rejection};
    /// let refused: Result<(), Rejection> = Err(Rejection::NoSignature);
    /// assert!(!Mode::Enforce.admits(&refused));
    /// assert!(Mode::Audit.admits(&refused));
    /// ```
    pub fn admits<T>(self, outcome: &Result<T, Rejection>) -> bool {
        self.delivers(outcome.is_ok())
    }

    /// Whether an image may be delivered when its signatures were `verified`
    /// (or not): always, unless the mode is [`Mode::Enforce`].
    ///
    /// ```
    /// use gkm_core::policy::Mode;
    /// assert!(Mode::Enforce.delivers(true));
    /// assert!(!Mode::Enforce.delivers(false));
    /// assert!(Mode::Audit.delivers(false));
    /// ```
    pub fn delivers(self, verified: bool) -> bool {
        match self {
            Mode::Enforce => verified,
            Mode::Audit | Mode::Off => true,
        }
    }

    /// Whether verification runs at all.
    pub fn verifies(self) -> bool {
        self != Mode::Off
    }
}

/// What a cache image's signature must prove.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    mode: Mode,
    signers: Vec<Signer>,
    trusted_root: Option<TrustedRoot>,
    require_tlog: bool,
    unlogged_keyless: bool,
}

impl Policy {
    /// A policy. Unless `mode` is [`Mode::Off`] it must name a signer, and
    /// keyless signers need a trusted root naming a certificate authority.
    pub fn new(
        mode: Mode,
        signers: Vec<Signer>,
        trusted_root: Option<TrustedRoot>,
        require_tlog: bool,
    ) -> Result<Policy, PolicyError> {
        if mode != Mode::Off && signers.is_empty() {
            return Err(PolicyError::Policy(
                "no signers: name at least one key or keyless identity".into(),
            ));
        }
        let keyless = signers.iter().any(|s| matches!(s, Signer::Keyless(_)));
        let has_ca = trusted_root
            .as_ref()
            .is_some_and(|r| !r.certificate_authorities.is_empty());
        if keyless && !has_ca {
            return Err(PolicyError::Policy(
                "keyless signers need a trusted root naming at least one certificate authority"
                    .into(),
            ));
        }
        if require_tlog && trusted_root.as_ref().is_none_or(|r| r.tlogs.is_empty()) {
            return Err(PolicyError::Policy(
                "requireTlog needs a trusted root naming a transparency log key".into(),
            ));
        }
        Ok(Policy {
            mode,
            signers,
            trusted_root,
            require_tlog,
            unlogged_keyless: false,
        })
    }

    /// This policy accepting keyless signatures that no transparency-log
    /// entry proves were made while their short-lived certificate was valid.
    /// By default a keyless signature needs one: without it, nothing shows
    /// when the signature was made, and the certificate is checked against
    /// the current time only.
    pub fn allowing_unlogged_keyless(mut self) -> Policy {
        self.unlogged_keyless = true;
        self
    }

    /// Whether a keyless signature needs a verified transparency-log entry
    /// (the default; keys need one only under [`Policy::require_tlog`]).
    pub fn keyless_needs_tlog(&self) -> bool {
        !self.unlogged_keyless
    }

    /// A policy accepting signatures by any of `keys`.
    pub fn keys(keys: Vec<PublicKey>) -> Result<Policy, PolicyError> {
        Policy::new(
            Mode::Enforce,
            keys.into_iter().map(Signer::Key).collect(),
            None,
            false,
        )
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The accepted signers.
    pub fn signers(&self) -> &[Signer] {
        &self.signers
    }

    /// The trust material for keyless signers.
    pub fn trusted_root(&self) -> Option<&TrustedRoot> {
        self.trusted_root.as_ref()
    }

    /// Whether a transparency-log entry is required.
    pub fn require_tlog(&self) -> bool {
        self.require_tlog
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyless_signers_need_a_certificate_authority() {
        let who = Identity::new(
            "https://issuer",
            SubjectMatch::Exact("me@example.com".into()),
        )
        .expect("identity");
        let err = Policy::new(Mode::Enforce, vec![Signer::Keyless(who)], None, false).unwrap_err();
        assert!(err.to_string().contains("certificate authority"), "{err}");
        assert!(Policy::new(Mode::Off, vec![], None, false).is_ok());
    }
}

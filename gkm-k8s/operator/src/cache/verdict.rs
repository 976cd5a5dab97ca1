//! The signature verdict the operator records in a cache's status: the mode
//! in force under the cluster admin's floor, what was proven, and whether the
//! image may be delivered. Agents and the CSI driver act on this verdict and
//! decide nothing themselves.

use std::time::Duration;

use gkm_core::policy::Policy;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::EventType;

use super::Context;
use gkm_k8s_api::cache_object::{CacheKey, CacheObject};
use gkm_k8s_api::crd::{CacheStatus, SignatureMode, SignaturePolicy, VerificationStatus};

/// What cluster admins require of every cache, whatever its spec says: a
/// cache can tighten it, never loosen it.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyFloor {
    /// The modes a cache (or the default policy) may choose; any other is
    /// tightened to `Enforce`, which is always allowed.
    pub allowed_modes: Vec<SignatureMode>,
    /// Signers every image must be signed by, on top of the cache's own,
    /// with their trust material; its references are read in the operator's
    /// namespace. `None`: no such requirement.
    pub required: Option<SignaturePolicy>,
}

impl Default for PolicyFloor {
    /// Only `Enforce`, no required signers.
    fn default() -> Self {
        PolicyFloor {
            allowed_modes: vec![SignatureMode::Enforce],
            required: None,
        }
    }
}

impl PolicyFloor {
    /// The mode in force when a cache asks for `asked`, with a note when the
    /// floor tightened it.
    pub fn mode(&self, asked: SignatureMode) -> (SignatureMode, Option<String>) {
        if asked == SignatureMode::Enforce || self.allowed_modes.contains(&asked) {
            return (asked, None);
        }
        let allowed: Vec<String> = self
            .allowed_modes
            .iter()
            .map(|m| format!("{m:?}"))
            .collect();
        (
            SignatureMode::Enforce,
            Some(format!(
                "mode {asked:?} is not allowed by the operator (allowed: {}); Enforce applies",
                allowed.join(", ")
            )),
        )
    }
}

/// The verdict for `digest` of `cache`, and whether signatures were checked
/// now (rather than the recorded verdict reused). The recorded verdict is
/// reused only while the digest, the mode, the policy in force and its key
/// material are unchanged, and for at most the operator's re-verify interval.
pub(super) async fn verdict<K: CacheObject>(
    cache: &K,
    ctx: &Context,
    digest: &str,
    old: &CacheStatus,
) -> (VerificationStatus, bool) {
    let spec = cache.cache_spec();
    let (asked, set_aside) = ctx.config.tenant_signers.policy_for(
        &cache.key(),
        spec.signature.as_ref(),
        ctx.config.default_policy.as_ref(),
    );
    let (mode, tightened) = ctx
        .config
        .floor
        .mode(asked.as_ref().map_or(SignatureMode::Enforce, |p| p.mode));
    let notes: Vec<String> = [set_aside, tightened].into_iter().flatten().collect();
    let note = (!notes.is_empty()).then(|| notes.join("; "));
    let outcome = |verified: bool, message: String| VerificationStatus {
        verified,
        deliverable: Some(gkm_core::policy::Mode::from(mode).delivers(verified)),
        mode: Some(mode),
        digest: Some(digest.to_string()),
        message: Some(with_note(message, note.as_deref())),
        ..VerificationStatus::default()
    };
    if mode == SignatureMode::Off {
        return (
            outcome(false, "signature verification is off for this cache".into()),
            false,
        );
    }
    let policies = match policies_in_force(cache.key(), ctx, asked).await {
        Ok(p) if p.is_empty() => {
            return (
                outcome(
                    false,
                    "no signature policy: set spec.signature, or start the operator with a default policy or required signers".into(),
                ),
                false,
            );
        }
        Ok(p) => p,
        Err(message) => return (outcome(false, message), false),
    };
    let fingerprint = fingerprint(mode, &policies);
    if let Some(previous) = &old.verification
        && previous.verified
        && previous.digest.as_deref() == Some(digest)
        && previous.mode == Some(mode)
        && previous.policy.as_deref() == Some(fingerprint.as_str())
        && previous
            .checked_at
            .as_ref()
            .is_some_and(|t| younger_than(&t.0, ctx.config.reverify_interval))
    {
        return (previous.clone(), false);
    }
    let mut signers = Vec::new();
    let mut proven = None;
    for (what, policy) in &policies {
        let checked = ctx.verifier.verify(&spec.image, digest, policy).await;
        if !checked.verified {
            let why = checked.message.clone().unwrap_or_default();
            // No time on a refusal: it is checked again at every reconcile
            // anyway, and a status that changes at each would trigger the
            // next reconcile itself.
            let mut refused = outcome(false, format!("{what}: {why}"));
            refused.policy = Some(fingerprint);
            return (refused, true);
        }
        signers.extend(checked.signer.clone());
        proven.get_or_insert(checked);
    }
    let mut verified = proven.unwrap_or_default();
    let message = verified.message.take().unwrap_or_default();
    verified.signer = Some(signers.join(" and "));
    verified.deliverable = Some(true);
    verified.mode = Some(mode);
    verified.policy = Some(fingerprint);
    verified.checked_at = Some(Time(Timestamp::now()));
    verified.message = Some(with_note(message, note.as_deref()));
    (verified, true)
}

/// The policies an image must satisfy, each with words naming it: the
/// cache's (or the default) signers, and the floor's required signers.
async fn policies_in_force(
    key: CacheKey,
    ctx: &Context,
    asked: Option<SignaturePolicy>,
) -> Result<Vec<(&'static str, Policy)>, String> {
    let mut out = Vec::new();
    let has_signers = |p: &SignaturePolicy| p.signers.as_ref().is_some_and(|s| !s.is_empty());
    if let Some(policy) = asked.filter(has_signers) {
        let core = ctx
            .verifier
            .resolve(&key, &policy)
            .await
            .map_err(|e| format!("signature policy: {e}"))?;
        out.push(("the signers in force", core));
    }
    if let Some(required) = ctx
        .config
        .floor
        .required
        .as_ref()
        .filter(|p| has_signers(p))
    {
        // The floor's references are the operator's own.
        let operator = CacheKey::cluster(key.name().to_string());
        let core = ctx
            .verifier
            .resolve(&operator, required)
            .await
            .map_err(|e| format!("the operator's required signers: {e}"))?;
        out.push(("the operator's required signers", core));
    }
    Ok(out)
}

/// The event to publish for `new`, the verdict of this reconcile, given the
/// verdict recorded before: only when signatures were `checked` now and the
/// outcome is news (another digest, mode or policy, or the other result).
/// A refusal is checked again at every reconcile and a proof again after
/// the re-verify interval; repeating the same outcome publishes nothing.
pub(super) fn verdict_event(
    old: Option<&VerificationStatus>,
    new: &VerificationStatus,
    checked: bool,
) -> Option<(EventType, &'static str)> {
    if !checked {
        return None;
    }
    let same = old.is_some_and(|old| {
        old.verified == new.verified
            && old.digest == new.digest
            && old.mode == new.mode
            && old.policy == new.policy
    });
    if same {
        return None;
    }
    Some(if new.verified {
        (EventType::Normal, "Verified")
    } else {
        (EventType::Warning, "VerificationFailed")
    })
}

/// A fingerprint of everything that decides a verdict besides the image:
/// the mode and each policy with its keys, identities and trust material.
fn fingerprint(mode: SignatureMode, policies: &[(&str, Policy)]) -> String {
    let text = format!("{mode:?}|{policies:?}");
    gkm_oci::Digest::of(text.as_bytes()).to_string()
}

fn younger_than(at: &Timestamp, limit: Duration) -> bool {
    let age = Timestamp::now().as_second().saturating_sub(at.as_second());
    age >= 0 && (age as u64) < limit.as_secs()
}

fn with_note(message: String, note: Option<&str>) -> String {
    match note {
        Some(note) if message.is_empty() => note.to_string(),
        Some(note) => format!("{message} ({note})"),
        None => message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cache_can_tighten_the_floor_but_not_loosen_it() {
        let floor = PolicyFloor::default();
        assert_eq!(
            floor.mode(SignatureMode::Enforce),
            (SignatureMode::Enforce, None)
        );
        let (mode, note) = floor.mode(SignatureMode::Off);
        assert_eq!(mode, SignatureMode::Enforce);
        assert!(note.is_some_and(|n| n.contains("Off is not allowed")));
        let lenient = PolicyFloor {
            allowed_modes: vec![SignatureMode::Audit],
            required: None,
        };
        assert_eq!(
            lenient.mode(SignatureMode::Audit),
            (SignatureMode::Audit, None)
        );
        assert_eq!(lenient.mode(SignatureMode::Off).0, SignatureMode::Enforce);
        assert_eq!(
            lenient.mode(SignatureMode::Enforce),
            (SignatureMode::Enforce, None)
        );
    }

    #[test]
    fn a_verdict_is_announced_once_per_digest_policy_and_outcome() {
        let refused = VerificationStatus {
            verified: false,
            deliverable: Some(false),
            mode: Some(SignatureMode::Enforce),
            policy: Some("sha256:p1".into()),
            digest: Some("sha256:a".into()),
            message: Some("no signature".into()),
            ..VerificationStatus::default()
        };
        let proven = VerificationStatus {
            verified: true,
            deliverable: Some(true),
            checked_at: Some(Time(Timestamp::now())),
            message: Some("signed".into()),
            ..refused.clone()
        };
        let warning = Some((EventType::Warning, "VerificationFailed"));
        let normal = Some((EventType::Normal, "Verified"));
        let other = |f: fn(&mut VerificationStatus)| {
            let mut v = refused.clone();
            f(&mut v);
            v
        };
        for (what, old, new, checked, event) in [
            ("first refusal", None, &refused, true, warning),
            (
                "the same refusal again",
                Some(&refused),
                &refused,
                true,
                None,
            ),
            ("first proof", None, &proven, true, normal),
            (
                "refused, then proven",
                Some(&refused),
                &proven,
                true,
                normal,
            ),
            (
                "proven, then refused",
                Some(&proven),
                &refused,
                true,
                warning,
            ),
            (
                "re-verified, still proven",
                Some(&proven),
                &proven,
                true,
                None,
            ),
            ("the recorded verdict reused", None, &proven, false, None),
            (
                "refused for a new digest",
                Some(&refused),
                &other(|v| v.digest = Some("sha256:b".into())),
                true,
                warning,
            ),
            (
                "refused under a new key",
                Some(&refused),
                &other(|v| v.policy = Some("sha256:p2".into())),
                true,
                warning,
            ),
            (
                "refused under another mode",
                Some(&refused),
                &other(|v| v.mode = Some(SignatureMode::Audit)),
                true,
                warning,
            ),
        ] {
            assert_eq!(verdict_event(old, new, checked), event, "{what}");
        }
    }

    #[test]
    fn the_fingerprint_changes_with_the_key_and_the_mode() {
        let policy = || {
            let (key, _) = gkm_oci::sign::SigningKey::generate_p256().expect("key");
            Policy::new(
                gkm_core::policy::Mode::Enforce,
                vec![gkm_core::policy::Signer::Key(key.public_key().clone())],
                None,
                false,
            )
            .expect("policy")
        };
        let (a, b) = (policy(), policy());
        let fp = |mode, p: &Policy| fingerprint(mode, &[("x", p.clone())]);
        assert_eq!(
            fp(SignatureMode::Enforce, &a),
            fp(SignatureMode::Enforce, &a)
        );
        assert_ne!(fp(SignatureMode::Enforce, &a), fp(SignatureMode::Audit, &a));
        assert_ne!(
            fp(SignatureMode::Enforce, &a),
            fp(SignatureMode::Enforce, &b)
        );
    }
}

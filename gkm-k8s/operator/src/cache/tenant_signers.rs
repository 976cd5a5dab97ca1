//! Whose signers count for a cache. Pure.
//!
//! The rule: the signers an administrator named (the operator's default
//! policy, and its required signers on top) are the ones that count. A
//! `GKMCache`'s own `spec.signature` signers (and the trust material that
//! qualifies them) count only in the namespaces the operator's
//! configuration lists; a `ClusterGKMCache` is a cluster administrator's, so
//! its own signers count. Elsewhere the cache's mode still applies (within
//! the operator's floor), but its signers are replaced by the
//! administrator's, and the verdict says so.
//!
//! The opt-in is a list in the operator's own configuration, not something
//! on the namespace: only whoever deploys the operator can change it,
//! whatever rights tenants have been given over their namespaces.

use std::collections::BTreeSet;

use gkm_k8s_api::cache_object::CacheKey;
use gkm_k8s_api::crd::SignaturePolicy;
use gkm_k8s_node::names::is_dns1123_label;

/// A name that cannot name a namespace.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a namespace name")]
pub struct NotANamespace(pub String);

/// The namespaces whose caches' own signers count.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantSigners {
    namespaces: BTreeSet<String>,
}

impl TenantSigners {
    /// Tenant signers count in `namespaces` only.
    pub fn in_namespaces<I, S>(namespaces: I) -> TenantSigners
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        TenantSigners {
            namespaces: namespaces.into_iter().map(Into::into).collect(),
        }
    }

    /// Tenant signers count in `namespaces` (trimmed; empty entries
    /// skipped, as a comma-separated flag gives them), each of which must
    /// be able to name a namespace (a DNS-1123 label).
    pub fn parse_namespaces<'a>(
        namespaces: impl IntoIterator<Item = &'a str>,
    ) -> Result<TenantSigners, NotANamespace> {
        let namespaces: Vec<&str> = namespaces
            .into_iter()
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .collect();
        if let Some(bad) = namespaces.iter().find(|n| !is_dns1123_label(n)) {
            return Err(NotANamespace(bad.to_string()));
        }
        Ok(TenantSigners::in_namespaces(namespaces))
    }

    /// Whether the own signers of the cache `key` count.
    pub fn count_for(&self, key: &CacheKey) -> bool {
        match key.namespace() {
            None => true,
            Some(namespace) => self.namespaces.contains(namespace),
        }
    }

    /// The policy that applies to the cache `key` whose spec says `own`,
    /// given the administrator's `default`; with a note when the cache's
    /// own signers were set aside.
    pub fn policy_for(
        &self,
        key: &CacheKey,
        own: Option<&SignaturePolicy>,
        default: Option<&SignaturePolicy>,
    ) -> (Option<SignaturePolicy>, Option<String>) {
        let Some(own) = own else {
            return (default.cloned(), None);
        };
        if self.count_for(key) {
            return (Some(own.clone()), None);
        }
        let admin = default.cloned().unwrap_or_default();
        let policy = SignaturePolicy {
            mode: own.mode,
            ..admin
        };
        let names_signers = own.signers.as_ref().is_some_and(|s| !s.is_empty());
        let note = names_signers.then(|| {
            format!(
                "spec.signature.signers are not counted: the operator counts a cache's own signers only in the namespaces it is configured to (--tenant-signer-namespaces), and {} is not one; the administrator's signers apply",
                key.namespace().unwrap_or_default()
            )
        });
        (Some(policy), note)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_from_a_flag_are_trimmed_and_checked() {
        assert_eq!(
            TenantSigners::parse_namespaces([" team-a", "", "b "]),
            Ok(TenantSigners::in_namespaces(["team-a", "b"]))
        );
        for bad in ["Team", "-a", "a-", "a.b", &"x".repeat(64)] {
            assert_eq!(
                TenantSigners::parse_namespaces([bad]),
                Err(NotANamespace(bad.to_string())),
                "{bad}"
            );
        }
    }
    use gkm_k8s_api::crd::{KeySigner, SignatureMode, Signer};

    fn signed_by(pem: &str) -> SignaturePolicy {
        SignaturePolicy {
            signers: Some(vec![Signer {
                key: Some(KeySigner {
                    public_key: Some(pem.into()),
                    ..KeySigner::default()
                }),
                ..Signer::default()
            }]),
            ..SignaturePolicy::default()
        }
    }

    #[test]
    fn only_the_administrators_signers_count_unless_a_namespace_is_opted_in() {
        let tenants = TenantSigners::in_namespaces(["opted"]);
        let admin = signed_by("ADMIN");
        let own = SignaturePolicy {
            mode: SignatureMode::Audit,
            ..signed_by("TENANT")
        };
        let plain = CacheKey::namespaced("plain", "c");

        let (policy, note) = tenants.policy_for(&plain, Some(&own), Some(&admin));
        assert_eq!(
            policy,
            Some(SignaturePolicy {
                mode: SignatureMode::Audit,
                ..admin.clone()
            }),
            "the administrator's signers, the cache's mode"
        );
        assert!(note.is_some_and(|n| n.contains("plain") && n.contains("not counted")));

        // No administrator's policy: nothing to verify against.
        let (policy, _) = tenants.policy_for(&plain, Some(&own), None);
        assert_eq!(policy.and_then(|p| p.signers), None);

        let opted = CacheKey::namespaced("opted", "c");
        assert_eq!(
            tenants.policy_for(&opted, Some(&own), Some(&admin)),
            (Some(own.clone()), None)
        );
        let cluster = CacheKey::cluster("c");
        assert_eq!(
            tenants.policy_for(&cluster, Some(&own), Some(&admin)),
            (Some(own.clone()), None)
        );
        // Without a policy of its own, every cache gets the administrator's.
        assert_eq!(
            tenants.policy_for(&plain, None, Some(&admin)),
            (Some(admin.clone()), None)
        );
        // The default counts in no namespace.
        assert!(!TenantSigners::default().count_for(&opted));
    }
}

//! Which claims, volumes and fill Jobs a PVC-mode cache should have. Pure:
//! tests feed it specs, verdicts, node reports and namespaces; the operator
//! applies what it returns.

use std::collections::BTreeSet;

use gkm_k8s_api::cache_object::{CacheKey, Scope};
use gkm_k8s_api::crd::{AccessMode, CacheSpec};

/// How the claims of a cache are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PvcMode {
    /// `accessModes` contains `ReadOnlyMany`: one claim per namespace, named
    /// like the cache, filled once and read by every node.
    ReadOnlyMany,
    /// A claim per compatible node, filled by a Job pinned to that node;
    /// pods labelled `gkm.io/pvc-mutation: "true"` are pointed at their
    /// node's claim by the webhook.
    ReadWriteOnce,
}

impl PvcMode {
    /// The mode a spec asks for; `None` when the cache is delivered through
    /// the CSI driver (no `storageClassName`).
    pub fn of(spec: &CacheSpec) -> Option<PvcMode> {
        spec.storage_class_name.as_ref()?;
        let rox = spec
            .access_modes
            .as_ref()
            .is_some_and(|m| m.contains(&AccessMode::ReadOnlyMany));
        Some(if rox {
            PvcMode::ReadOnlyMany
        } else {
            PvcMode::ReadWriteOnce
        })
    }

    /// The access mode its claims carry.
    pub fn access_mode(self) -> &'static str {
        match self {
            PvcMode::ReadOnlyMany => "ReadOnlyMany",
            PvcMode::ReadWriteOnce => "ReadWriteOnce",
        }
    }
}

/// What the plan is made from.
#[derive(Debug, Clone)]
pub struct PlanInput<'a> {
    /// The cache.
    pub key: &'a CacheKey,
    /// Its spec.
    pub spec: &'a CacheSpec,
    /// The digest the tag resolves to now, if resolved.
    pub digest: Option<&'a str>,
    /// The operator's recorded verdict: may this digest be delivered?
    pub deliverable: bool,
    /// The namespaces that exist (only the cache's own ones matter).
    pub existing_namespaces: &'a BTreeSet<String>,
    /// Nodes whose agents report the resolved digest compatible with their
    /// GPUs: where ReadWriteOnce claims go; a ReadOnlyMany claim is filled
    /// only when there is at least one.
    pub compatible_nodes: &'a BTreeSet<String>,
    /// Whether gkm makes the PersistentVolumes itself (no provisioner).
    pub make_volumes: bool,
}

/// One claim to exist.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClaimPlan {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The node it is for (ReadWriteOnce).
    pub node: Option<String>,
    /// The gkm-made volume it binds to, when gkm makes volumes.
    pub volume: Option<String>,
    /// The fill Job for the resolved digest, when it may be filled.
    pub job: Option<String>,
}

/// Everything a cache should have.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// The claims, with their volumes and Jobs.
    pub claims: Vec<ClaimPlan>,
    /// Workload namespaces that do not exist (the `NoNamespace` state).
    pub missing_namespaces: Vec<String>,
    /// Why nothing is filled, when the digest may not be delivered.
    pub withheld: Option<String>,
}

/// The namespaces a cache's claims go to, sorted and once each: a
/// `GKMCache`'s own, a `ClusterGKMCache`'s `workloadNamespaces`.
pub fn served_namespaces(key: &CacheKey, spec: &CacheSpec) -> Vec<String> {
    match key.scope() {
        Scope::Namespaced => key.namespace().map(str::to_string).into_iter().collect(),
        Scope::Cluster => spec
            .workload_namespaces
            .iter()
            .flatten()
            .map(|n| n.0.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect(),
    }
}

/// The plan for a PVC-mode cache; an empty plan for a CSI-mode one.
///
/// Claims exist for every existing namespace (and, in ReadWriteOnce, every
/// compatible node) as soon as the cache asks for them; a Job filling them
/// exists only for a resolved digest the operator's verdict allows and at
/// least one node's GPUs fit, so an unverified or incompatible digest is
/// never put on a claim.
pub fn plan(input: &PlanInput<'_>) -> Plan {
    let Some(mode) = PvcMode::of(input.spec) else {
        return Plan::default();
    };
    let (present, missing): (Vec<String>, Vec<String>) = served_namespaces(input.key, input.spec)
        .into_iter()
        .partition(|n| input.existing_namespaces.contains(n));
    let withheld = match (input.digest, input.deliverable) {
        (None, _) => Some("the image is not resolved yet".to_string()),
        (Some(_), false) => Some("the operator's verdict does not allow the digest".to_string()),
        (Some(_), true) if input.compatible_nodes.is_empty() => {
            Some("no node's agent reports the digest compatible with its GPUs".to_string())
        }
        (Some(_), true) => None,
    };
    let fill = |claim: &str| match (withheld.is_none(), input.digest) {
        (true, Some(digest)) => Some(names::job(claim, digest, input.spec.pod_template.as_ref())),
        _ => None,
    };
    let mut claims = Vec::new();
    for namespace in &present {
        match mode {
            PvcMode::ReadOnlyMany => {
                let name = input.key.name().to_string();
                claims.push(ClaimPlan {
                    volume: input
                        .make_volumes
                        .then(|| names::volume(input.key, namespace, None)),
                    job: fill(&name),
                    namespace: namespace.clone(),
                    node: None,
                    name,
                });
            }
            PvcMode::ReadWriteOnce => {
                for node in input.compatible_nodes {
                    let name = names::node_claim(input.key.name(), node);
                    claims.push(ClaimPlan {
                        volume: input
                            .make_volumes
                            .then(|| names::volume(input.key, namespace, Some(node))),
                        job: fill(&name),
                        namespace: namespace.clone(),
                        node: Some(node.clone()),
                        name,
                    });
                }
            }
        }
    }
    claims.sort();
    Plan {
        claims,
        missing_namespaces: missing,
        withheld,
    }
}

/// The names gkm gives the objects it makes: stable, valid, and short
/// enough for a label value (63 characters).
pub mod names {
    use gkm_k8s_api::cache_object::{CacheKey, Scope};
    use gkm_k8s_api::crd::PodTemplate;

    const MAX: usize = 63;

    /// The first 10 hex digits of `text`'s SHA-256.
    pub(crate) fn short_hash(text: &str) -> String {
        let digest = gkm_oci::Digest::of(text.as_bytes()).to_string();
        digest
            .rsplit(':')
            .next()
            .unwrap_or_default()
            .chars()
            .take(10)
            .collect()
    }

    /// `prefix-suffix`, with `prefix` cut and a hash of the whole added when
    /// it would pass 63 characters.
    pub fn joined(prefix: &str, suffix: &str) -> String {
        let whole = format!("{prefix}-{suffix}");
        if whole.len() <= MAX {
            return whole;
        }
        let hash = short_hash(&whole);
        let room = MAX.saturating_sub(suffix.len() + hash.len() + 2);
        let cut: String = prefix.chars().take(room).collect();
        format!("{}-{hash}-{suffix}", cut.trim_end_matches(['-', '.']))
    }

    /// The claim of `node` in ReadWriteOnce mode.
    pub fn node_claim(cache: &str, node: &str) -> String {
        joined(cache, &short_hash(node))
    }

    /// The Job filling `claim` with `digest` from pods made after
    /// `template`: a Job's pod template cannot change, so a changed
    /// `podTemplate` names a new Job (and the old one is removed).
    pub fn job(claim: &str, digest: &str, template: Option<&PodTemplate>) -> String {
        let hex = digest.rsplit(':').next().unwrap_or(digest);
        let mut suffix: String = hex.chars().take(12).collect();
        if let Some(template) = template {
            let text = serde_json::to_string(template).unwrap_or_default();
            suffix.push('-');
            suffix.extend(short_hash(&text).chars().take(5));
        }
        joined(claim, &suffix)
    }

    /// The gkm-made PersistentVolume for the claim of `cache` in `namespace`
    /// (for `node` in ReadWriteOnce mode).
    pub fn volume(cache: &CacheKey, namespace: &str, node: Option<&str>) -> String {
        let kind = match cache.scope() {
            Scope::Namespaced => "ns",
            Scope::Cluster => "cl",
        };
        let whole = format!(
            "{kind}/{}/{}/{namespace}/{}",
            cache.namespace().unwrap_or_default(),
            cache.name(),
            node.unwrap_or_default()
        );
        format!("gkm-{}", short_hash(&whole))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gkm_k8s_api::crd::NamespaceName;

    fn spec(class: Option<&str>, modes: &[AccessMode], namespaces: &[&str]) -> CacheSpec {
        CacheSpec {
            image: "registry.example/cache:v1".into(),
            storage_class_name: class.map(String::from),
            access_modes: (!modes.is_empty()).then(|| modes.to_vec()),
            workload_namespaces: (!namespaces.is_empty()).then(|| {
                namespaces
                    .iter()
                    .map(|n| NamespaceName(n.to_string()))
                    .collect()
            }),
            ..CacheSpec::default()
        }
    }

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn modes_follow_gkm() {
        use AccessMode::*;
        let cases = [
            (None, vec![ReadOnlyMany], None),
            (Some("standard"), vec![], Some(PvcMode::ReadWriteOnce)),
            (
                Some("standard"),
                vec![ReadWriteOnce],
                Some(PvcMode::ReadWriteOnce),
            ),
            (
                Some("standard"),
                vec![ReadWriteOnce, ReadOnlyMany],
                Some(PvcMode::ReadOnlyMany),
            ),
        ];
        for (class, modes, want) in cases {
            assert_eq!(
                PvcMode::of(&spec(class, &modes, &[])),
                want,
                "{class:?} {modes:?}"
            );
        }
    }

    #[test]
    fn plans_by_scope_mode_verdict_and_namespaces() {
        struct Case {
            what: &'static str,
            key: CacheKey,
            spec: CacheSpec,
            digest: Option<&'static str>,
            deliverable: bool,
            nodes: &'static [&'static str],
            claims: &'static [(&'static str, Option<&'static str>, bool)],
            missing: &'static [&'static str],
        }
        let rox = [AccessMode::ReadOnlyMany];
        let cases = [
            Case {
                what: "csi mode has no claims",
                key: CacheKey::named(Some("a"), "c"),
                spec: spec(None, &rox, &[]),
                digest: Some(DIGEST),
                deliverable: true,
                nodes: &["n1"],
                claims: &[],
                missing: &[],
            },
            Case {
                what: "rox namespaced: one filled claim",
                key: CacheKey::named(Some("a"), "c"),
                spec: spec(Some("sc"), &rox, &[]),
                digest: Some(DIGEST),
                deliverable: true,
                nodes: &["n1"],
                claims: &[("a", None, true)],
                missing: &[],
            },
            Case {
                what: "rox, no node's GPUs fit: claim made, never filled",
                key: CacheKey::named(Some("a"), "c"),
                spec: spec(Some("sc"), &rox, &[]),
                digest: Some(DIGEST),
                deliverable: true,
                nodes: &[],
                claims: &[("a", None, false)],
                missing: &[],
            },
            Case {
                what: "unverified: claim made, never filled",
                key: CacheKey::named(Some("a"), "c"),
                spec: spec(Some("sc"), &rox, &[]),
                digest: Some(DIGEST),
                deliverable: false,
                nodes: &[],
                claims: &[("a", None, false)],
                missing: &[],
            },
            Case {
                what: "unresolved: claim made, never filled",
                key: CacheKey::named(Some("a"), "c"),
                spec: spec(Some("sc"), &rox, &[]),
                digest: None,
                deliverable: true,
                nodes: &[],
                claims: &[("a", None, false)],
                missing: &[],
            },
            Case {
                what: "rox cluster: a claim per existing namespace, the missing one named",
                key: CacheKey::named(None, "c"),
                spec: spec(Some("sc"), &rox, &["b", "a", "gone", "a"]),
                digest: Some(DIGEST),
                deliverable: true,
                nodes: &["n1"],
                claims: &[("a", None, true), ("b", None, true)],
                missing: &["gone"],
            },
            Case {
                what: "rwo: a claim per compatible node",
                key: CacheKey::named(Some("a"), "c"),
                spec: spec(Some("sc"), &[], &[]),
                digest: Some(DIGEST),
                deliverable: true,
                nodes: &["n1", "n2"],
                claims: &[("a", Some("n1"), true), ("a", Some("n2"), true)],
                missing: &[],
            },
            Case {
                what: "rwo without compatible nodes: nothing",
                key: CacheKey::named(Some("a"), "c"),
                spec: spec(Some("sc"), &[], &[]),
                digest: Some(DIGEST),
                deliverable: true,
                nodes: &[],
                claims: &[],
                missing: &[],
            },
        ];
        let namespaces = set(&["a", "b"]);
        for case in cases {
            let nodes = set(case.nodes);
            let got = plan(&PlanInput {
                key: &case.key,
                spec: &case.spec,
                digest: case.digest,
                deliverable: case.deliverable,
                existing_namespaces: &namespaces,
                compatible_nodes: &nodes,
                make_volumes: true,
            });
            let mut claims: Vec<(&str, Option<&str>, bool)> = got
                .claims
                .iter()
                .map(|c| (c.namespace.as_str(), c.node.as_deref(), c.job.is_some()))
                .collect();
            claims.sort();
            assert_eq!(claims, case.claims, "{}", case.what);
            assert_eq!(got.missing_namespaces, case.missing, "{}", case.what);
            let withheld = PvcMode::of(&case.spec).is_some()
                && (case.digest.is_none() || !case.deliverable || nodes.is_empty());
            assert_eq!(got.withheld.is_some(), withheld, "{}", case.what);
            for c in &got.claims {
                assert!(c.volume.is_some(), "{}", case.what);
                if c.node.is_none() {
                    assert_eq!(c.name, case.key.name(), "{}", case.what);
                }
            }
        }
    }

    #[test]
    fn names_are_stable_distinct_and_short() {
        let long = "a".repeat(253);
        let job = names::job(&long, DIGEST, None);
        assert!(job.len() <= 63, "{job}");
        assert!(job.ends_with("-0123456789ab"), "{job}");
        assert_eq!(job, names::job(&long, DIGEST, None));
        let template = |selector: &str| -> gkm_k8s_api::crd::PodTemplate {
            serde_json::from_value(
                serde_json::json!({"spec": {"nodeSelector": {"pool": selector}}}),
            )
            .expect("template")
        };
        let (a, b) = (template("a"), template("b"));
        let with_a = names::job(&long, DIGEST, Some(&a));
        assert!(with_a.len() <= 63, "{with_a}");
        assert_eq!(with_a, names::job(&long, DIGEST, Some(&a)));
        assert_ne!(
            with_a,
            names::job(&long, DIGEST, Some(&b)),
            "a changed template is a new Job"
        );
        assert_ne!(names::node_claim("c", "n1"), names::node_claim("c", "n2"));
        let (ns, cl) = (CacheKey::named(Some("a"), "c"), CacheKey::named(None, "c"));
        assert_ne!(names::volume(&ns, "a", None), names::volume(&cl, "a", None));
        assert_ne!(
            names::volume(&ns, "a", Some("n1")),
            names::volume(&ns, "a", Some("n2"))
        );
        assert_eq!(names::job("c", DIGEST, None), "c-0123456789ab");
    }
}

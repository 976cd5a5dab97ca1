//! Which claims, volumes and fill Jobs a PVC-mode cache should have. Pure:
//! tests feed it specs, verdicts, node reports and namespaces; the operator
//! applies what it returns.

use std::collections::{BTreeMap, BTreeSet};

use crate::cache::rollup::variant_key;
use crate::names;
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
    /// GPUs, each with the variant it reports holding ([`variant_key`] of
    /// its digest, of a multi-target image): where ReadWriteOnce claims go;
    /// a ReadOnlyMany claim is filled only when there is at least one.
    pub compatible_nodes: &'a BTreeMap<String, Option<u64>>,
    /// What the resolved digest is: one image, or an index of variants.
    pub variants: ImageVariants<'a>,
    /// Whether gkm makes the PersistentVolumes itself (no provisioner).
    pub make_volumes: bool,
}

/// What is known of the resolved digest's variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageVariants<'a> {
    /// A single-target image: every fill extracts the resolved digest.
    Single,
    /// A multi-target image (an index): each fill extracts the variant of
    /// the nodes it serves; these are the variants' digests.
    MultiTarget(&'a [String]),
    /// The variants could not be read (why): nothing is filled.
    Unread(&'a str),
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
    /// The digest that Job extracts: the resolved digest, or of a
    /// multi-target image the variant of the node(s) the claim serves.
    pub fill_digest: Option<String>,
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
    let withheld = match (input.digest, input.deliverable, input.variants) {
        (None, _, _) => Some("the image is not resolved yet".to_string()),
        (Some(_), false, _) => Some("the operator's verdict does not allow the digest".to_string()),
        (Some(_), true, _) if input.compatible_nodes.is_empty() => {
            Some("no node's agent reports the digest compatible with its GPUs".to_string())
        }
        (Some(_), true, ImageVariants::Unread(why)) => {
            Some(format!("the image's variants could not be read: {why}"))
        }
        (Some(digest), true, variants) => match mode {
            PvcMode::ReadOnlyMany => shared_fill(digest, variants, input.compatible_nodes).err(),
            PvcMode::ReadWriteOnce => None,
        },
    };
    // The digest a claim serving `nodes` is filled with, when it may be.
    let fill_digest = |nodes: &BTreeMap<String, Option<u64>>| -> Option<String> {
        if withheld.is_some() {
            return None;
        }
        shared_fill(input.digest?, input.variants, nodes).ok()
    };
    let fill = |claim: &str, digest: Option<String>| {
        let job = digest
            .as_deref()
            .map(|d| names::job(claim, d, input.spec.pod_template.as_ref()));
        (job, digest)
    };
    let mut claims = Vec::new();
    for namespace in &present {
        match mode {
            PvcMode::ReadOnlyMany => {
                let name = input.key.name().to_string();
                let (job, fill_digest) = fill(&name, fill_digest(input.compatible_nodes));
                claims.push(ClaimPlan {
                    volume: input
                        .make_volumes
                        .then(|| names::volume(input.key, namespace, None)),
                    job,
                    fill_digest,
                    namespace: namespace.clone(),
                    node: None,
                    name,
                });
            }
            PvcMode::ReadWriteOnce => {
                for (node, variant) in input.compatible_nodes {
                    let name = names::node_claim(input.key.name(), node);
                    let one = BTreeMap::from([(node.clone(), *variant)]);
                    let (job, fill_digest) = fill(&name, fill_digest(&one));
                    claims.push(ClaimPlan {
                        volume: input
                            .make_volumes
                            .then(|| names::volume(input.key, namespace, Some(node))),
                        job,
                        fill_digest,
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

/// The one digest a claim serving `nodes` (each with the variant its agent
/// reports) is filled with: `digest` itself for a single-target image; of a
/// multi-target image, the variant every node holds, or why there is none
/// (a node has not reported its variant yet, or the nodes need different
/// ones: a claim holds one tree).
fn shared_fill(
    digest: &str,
    variants: ImageVariants<'_>,
    nodes: &BTreeMap<String, Option<u64>>,
) -> Result<String, String> {
    let variants = match variants {
        ImageVariants::Single => return Ok(digest.to_string()),
        ImageVariants::Unread(why) => {
            return Err(format!("the image's variants could not be read: {why}"));
        }
        ImageVariants::MultiTarget(variants) => variants,
    };
    let mut needed: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut unknown = Vec::new();
    for (node, key) in nodes {
        let variant = key.and_then(|k| variants.iter().find(|v| variant_key(v) == Some(k)));
        match variant {
            Some(variant) => needed.entry(variant).or_default().push(node),
            None => unknown.push(node.as_str()),
        }
    }
    if !unknown.is_empty() {
        return Err(format!(
            "{digest} is a multi-target image, and the agents of nodes {} have not reported \
             their variant yet",
            unknown.join(", ")
        ));
    }
    match needed.len() {
        1 => Ok(needed.into_keys().next().unwrap_or_default().to_string()),
        _ => Err(format!(
            "a ReadOnlyMany claim serves one tree, but its nodes need different variants of \
             the multi-target image {digest}: {}; use ReadWriteOnce (a claim per node) or the \
             CSI driver",
            needed
                .iter()
                .map(|(variant, nodes)| format!("{variant} for {}", nodes.join(", ")))
                .collect::<Vec<_>>()
                .join("; ")
        )),
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
            let nodes: BTreeMap<String, Option<u64>> =
                case.nodes.iter().map(|n| (n.to_string(), None)).collect();
            let got = plan(&PlanInput {
                key: &case.key,
                spec: &case.spec,
                digest: case.digest,
                deliverable: case.deliverable,
                existing_namespaces: &namespaces,
                compatible_nodes: &nodes,
                variants: ImageVariants::Single,
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

    const INDEX: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const SM80: &str = "sha256:8080808080808080808080808080808080808080808080808080808080808080";
    const SM90: &str = "sha256:9090909090909090909090909090909090909090909090909090909090909090";

    #[test]
    fn each_fill_takes_the_variant_of_the_nodes_its_claim_serves() {
        struct Case {
            what: &'static str,
            modes: &'static [AccessMode],
            digest: &'static str,
            multi: bool,
            /// Each node and the variant its agent reports.
            nodes: &'static [(&'static str, Option<&'static str>)],
            /// Per claim (node, in RWO): the digest it is filled with.
            fills: &'static [(Option<&'static str>, Option<&'static str>)],
            /// What the withheld reason says, when nothing is filled.
            withheld: Option<&'static str>,
        }
        let rox = &[AccessMode::ReadOnlyMany];
        let cases = [
            Case {
                what: "a single image: the resolved digest",
                modes: rox,
                digest: DIGEST,
                multi: false,
                nodes: &[("n1", None), ("n2", None)],
                fills: &[(None, Some(DIGEST))],
                withheld: None,
            },
            Case {
                what: "rox, an index whose nodes all need one variant: that variant",
                modes: rox,
                digest: INDEX,
                multi: true,
                nodes: &[("n1", Some(SM80)), ("n2", Some(SM80))],
                fills: &[(None, Some(SM80))],
                withheld: None,
            },
            Case {
                what: "rox, an index whose nodes need several variants: no fill, and why",
                modes: rox,
                digest: INDEX,
                multi: true,
                nodes: &[("n1", Some(SM80)), ("n2", Some(SM90))],
                fills: &[(None, None)],
                withheld: Some("nodes need different variants"),
            },
            Case {
                what: "rox, an index with a node whose variant is not reported yet",
                modes: rox,
                digest: INDEX,
                multi: true,
                nodes: &[("n1", Some(SM80)), ("n2", None)],
                fills: &[(None, None)],
                withheld: Some("nodes n2 have not reported their variant"),
            },
            Case {
                what: "rwo, an index: each node's claim gets its own variant",
                modes: &[],
                digest: INDEX,
                multi: true,
                nodes: &[("n1", Some(SM80)), ("n2", Some(SM90)), ("n3", None)],
                fills: &[
                    (Some("n1"), Some(SM80)),
                    (Some("n2"), Some(SM90)),
                    (Some("n3"), None),
                ],
                withheld: None,
            },
        ];
        let key = CacheKey::named(Some("a"), "c");
        let namespaces = set(&["a"]);
        let variants = [SM80.to_string(), SM90.to_string()];
        for case in cases {
            let nodes: BTreeMap<String, Option<u64>> = case
                .nodes
                .iter()
                .map(|(n, v)| (n.to_string(), v.and_then(variant_key)))
                .collect();
            let spec = spec(Some("sc"), case.modes, &[]);
            let got = plan(&PlanInput {
                key: &key,
                spec: &spec,
                digest: Some(case.digest),
                deliverable: true,
                existing_namespaces: &namespaces,
                compatible_nodes: &nodes,
                variants: if case.multi {
                    ImageVariants::MultiTarget(&variants)
                } else {
                    ImageVariants::Single
                },
                make_volumes: false,
            });
            let mut fills: Vec<(Option<&str>, Option<&str>)> = got
                .claims
                .iter()
                .map(|c| (c.node.as_deref(), c.fill_digest.as_deref()))
                .collect();
            fills.sort();
            assert_eq!(fills, case.fills, "{}", case.what);
            for c in &got.claims {
                assert_eq!(c.job.is_some(), c.fill_digest.is_some(), "{}", case.what);
                if let (Some(job), Some(d)) = (&c.job, &c.fill_digest) {
                    assert_eq!(*job, names::job(&c.name, d, None), "{}", case.what);
                }
            }
            match case.withheld {
                Some(why) => {
                    let got = got.withheld.expect(case.what);
                    assert!(got.contains(why), "{}: {got}", case.what);
                }
                None => assert_eq!(got.withheld, None, "{}", case.what),
            }
        }
    }

    #[test]
    fn a_shared_claim_names_each_variant_and_its_nodes() {
        let variants = [SM80.to_string(), SM90.to_string()];
        let nodes = BTreeMap::from([
            ("n1".to_string(), variant_key(SM80)),
            ("n2".to_string(), variant_key(SM90)),
            ("n3".to_string(), variant_key(SM80)),
        ]);
        let why = shared_fill(INDEX, ImageVariants::MultiTarget(&variants), &nodes)
            .expect_err("different variants");
        assert!(
            why.contains(&format!("{SM80} for n1, n3; {SM90} for n2")),
            "{why}"
        );
        assert!(why.contains("use ReadWriteOnce"), "{why}");
        let unread = shared_fill(INDEX, ImageVariants::Unread("registry down"), &nodes);
        assert_eq!(
            unread,
            Err("the image's variants could not be read: registry down".into())
        );
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

    #[test]
    fn label_values_keep_short_names_and_cut_long_ones_stably() {
        let at_most = "a".repeat(63);
        assert_eq!(names::label_value(&at_most), at_most, "63 characters fit");
        let over = "a".repeat(64);
        let cut = names::label_value(&over);
        assert_eq!(cut.len(), 63, "{cut}");
        assert_ne!(cut, at_most);
        assert_eq!(cut, names::label_value(&over), "stable");
        // Names alike up to the cut still differ; a dot or dash at the cut
        // is dropped, since a label value ends with a letter or digit.
        let prefix = format!("{}.", "b".repeat(51));
        let (a, b) = (format!("{prefix}x"), format!("{prefix}y"));
        let (la, lb) = (names::label_value(&a), names::label_value(&b));
        assert_ne!(la, lb);
        let longest = "c".repeat(253);
        for name in ["vector-add", &over, &a, &b, &longest] {
            let value = names::label_value(name);
            let alphanumeric = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
            assert!(
                value.len() <= 63
                    && value.starts_with(alphanumeric)
                    && value.ends_with(alphanumeric)
                    && value
                        .chars()
                        .all(|c| alphanumeric(c) || c == '-' || c == '.'),
                "{name} gave {value}"
            );
        }
    }
}

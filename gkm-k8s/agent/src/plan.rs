//! What one cache should look like on this node: pure, so tests feed it
//! caches, GPUs and mounts without a cluster.

use std::collections::BTreeMap;

use gkm_core::Gpu;
use gkm_core::compat::{CheckOptions, Report, cpu_mismatch};
use gkm_core::variant::choose_variant;
use gkm_oci::Digest;
use kube::core::{Selector, SelectorExt};

use gkm_k8s_api::crd::{
    CacheRelease, CacheState, ImageVariant, IncompatibleGpu, NodeCacheStatus, PodData,
    WorkloadUsage,
};
use gkm_k8s_node::delivery::{Delivery, Verdict, incompatibility_reason};
use gkm_k8s_node::mount_records::PodRef;

/// This node, as planning sees it.
pub struct NodeView<'a> {
    /// The Node's labels (for `spec.nodeSelector`).
    pub labels: &'a BTreeMap<String, String>,
    /// The node's GPUs that can run kernels.
    pub gpus: &'a [Gpu],
    /// How compatibility is checked.
    pub check: &'a CheckOptions,
    /// The vector ISA PyTorch Inductor picks on the node's CPU, what caches
    /// of C++ kernels only are judged by; `None` when unknown.
    pub cpu_isa: Option<&'a str>,
}

/// One cache, with what the agent knows of its image on this node.
pub struct CacheInput<'a> {
    /// What the agent reads of the cache: its release, where the operator
    /// publishes the digest, its verdict and the image's variants.
    pub release: &'a CacheRelease,
    /// Whether the digest this node holds (`held_digest`) is in the
    /// store, or why extracting it failed.
    pub stored: Result<bool, &'a str>,
    /// Bytes of the stored tree, when known.
    pub size: Option<i64>,
    /// Pods mounting this cache, per digest (from the mount records).
    pub pods: &'a BTreeMap<Digest, Vec<PodRef>>,
    /// What the workloads whose writable views of this cache ended
    /// compiled into them, per digest viewed (from the usage records).
    pub usage: &'a BTreeMap<Digest, Vec<WorkloadUsage>>,
    /// The digest the delivery index delivers for this cache now, when the
    /// store holds it: served on while a new digest is pulled, or while
    /// pulling it fails.
    pub serving: Option<&'a Digest>,
}

/// What to do with the delivery index entry of a cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryChange {
    /// Write this decision.
    Publish(Delivery),
    /// Remove the entry: nothing may be mounted any more.
    Remove,
    /// Leave the entry as it is: the operator has not published the
    /// image's variants yet, and the decision waits for them.
    Unchanged,
}

/// The plan for one cache on this node.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The node report entries, per digest (empty: no entry at all).
    pub entries: BTreeMap<String, NodeCacheStatus>,
    /// The delivery index change.
    pub delivery: DeliveryChange,
    /// A digest to pull and extract.
    pub extract: Option<Digest>,
    /// A stored digest served on until the one this node should hold is in
    /// the store: garbage collection keeps it, whatever its grace.
    pub keep: Option<Digest>,
}

impl Plan {
    /// This plan with `digest` refused (`verdict`, `reason` for the CSI
    /// driver) and its entry Incompatible or in error (`message` for the node
    /// report).
    fn refused(
        mut self,
        digest: Digest,
        mut entry: NodeCacheStatus,
        verdict: Verdict,
        reason: String,
        message: String,
    ) -> Plan {
        // Not fitting this node's GPUs is a fact about the node, not a fault.
        entry.state = Some(if verdict == Verdict::Incompatible {
            CacheState::Incompatible
        } else {
            CacheState::Error
        });
        entry.message = Some(message);
        self.entries.insert(digest.to_string(), entry);
        self.delivery = DeliveryChange::Publish(Delivery::refused(digest, verdict, reason));
        self
    }

    /// This plan, for a `held` digest not in the store yet (being pulled,
    /// or failing to be), delivering the `serving` one meanwhile when there
    /// is one: a node that served a verified tree keeps serving it until
    /// its successor is whole, as a claim keeps its tree until a refill
    /// switches it, rather than refusing pods for as long as the registry
    /// fails.
    /// The node's report names the served digest too, `Outdated`, so that
    /// what the report says is on the node is what the node serves.
    fn serving_meanwhile(mut self, serving: Option<&Digest>, held: &Digest) -> Plan {
        if let Some(previous) = serving.filter(|d| *d != held) {
            self.delivery = DeliveryChange::Publish(Delivery::deliverable(previous.clone()));
            self.keep = Some(previous.clone());
            self.entries
                .entry(previous.to_string())
                .or_insert_with(|| NodeCacheStatus {
                    state: Some(CacheState::Outdated),
                    message: Some(format!("served until {held} is extracted")),
                    ..NodeCacheStatus::default()
                });
        }
        self
    }
}

/// Plans one cache on this node. Call again after extracting, with the new
/// facts. Whether the image fits the node's GPUs is decided from the
/// targets the operator published, without reading the registry.
///
/// A published decision carries the cache's `workloadNamespaces`, so the
/// CSI driver mounts a `ClusterGKMCache` only into pods of those namespaces.
pub fn plan_cache(cache: &CacheInput<'_>, node: &NodeView<'_>) -> Plan {
    let mut plan = plan_delivery(cache, node);
    if let DeliveryChange::Publish(delivery) = &mut plan.delivery {
        delivery.workload_namespaces = cache
            .release
            .workload_namespaces
            .as_ref()
            .map(|namespaces| namespaces.iter().map(|n| n.0.clone()).collect());
        delivery.image = Some(cache.release.image.clone());
    }
    plan
}

fn plan_delivery(cache: &CacheInput<'_>, node: &NodeView<'_>) -> Plan {
    let mut plan = Plan {
        entries: BTreeMap::new(),
        delivery: DeliveryChange::Remove,
        extract: None,
        keep: None,
    };
    let release = cache.release;
    let resolved: Option<Digest> = release.resolved();

    // Pods keep their digests' entries, whatever else happens: outdated when
    // the digest is no longer the resolved one, deleting when the cache goes.
    for (digest, pods) in cache.pods {
        let current = Some(digest) == resolved.as_ref() || release.variant(digest).is_some();
        if pods.is_empty() || current && !release.deleting {
            continue;
        }
        let state = if release.deleting {
            CacheState::Deleting
        } else {
            CacheState::Outdated
        };
        plan.entries.insert(
            digest.to_string(),
            NodeCacheStatus {
                state: Some(state),
                pods: Some(pod_data(pods, digest)),
                workloads: cache.usage.get(digest).cloned(),
                ..Default::default()
            },
        );
    }
    if release.deleting {
        return plan;
    }
    if let Some(selector) = &release.node_selector {
        let matches = Selector::try_from(selector.clone()).map(|s| s.matches(node.labels));
        if !matches.unwrap_or(false) {
            return plan;
        }
    }
    let Some(digest) = resolved else {
        return plan;
    };
    let mut entry = NodeCacheStatus::default();
    // The operator's recorded verdict decides, never the spec: the spec's
    // mode is only what the cache asked for, not what the floor allows.
    if !release.deliverable {
        let why = release.refusal.as_deref().unwrap_or("not verified yet");
        let reason = format!("signature of {digest} not verified: {why}");
        return plan.refused(digest, entry, Verdict::NotVerified, reason.clone(), reason);
    }
    let held = match pick_variant(release, &digest, node) {
        Pick::Pending => {
            plan.delivery = DeliveryChange::Unchanged;
            entry.state = Some(CacheState::Pending);
            plan.entries.insert(digest.to_string(), entry);
            return plan;
        }
        Pick::Unreadable(reason) => {
            return plan.refused(digest, entry, Verdict::NotExtracted, reason.clone(), reason);
        }
        Pick::Incompatible(reports, reason) => {
            record_compatibility(&mut entry, &reports);
            let message = format!("not compatible with any GPU of this node: {reason}");
            return plan.refused(digest, entry, Verdict::Incompatible, reason, message);
        }
        Pick::CpuMismatch(reason) => {
            let message = format!("not compatible with this node's CPU: {reason}");
            return plan.refused(digest, entry, Verdict::Incompatible, reason, message);
        }
        Pick::Held(held, report) => {
            if let Some(report) = report {
                record_compatibility(&mut entry, &[report]);
            }
            if held != digest {
                entry.variant = Some(held.to_string());
            }
            held
        }
    };
    match cache.stored {
        Err(why) => {
            let reason = format!("extracting {held}: {why}");
            return plan
                .refused(digest, entry, Verdict::NotExtracted, reason.clone(), reason)
                .serving_meanwhile(cache.serving, &held);
        }
        Ok(false) => {
            entry.state = Some(CacheState::Downloading);
            plan.extract = Some(held.clone());
            plan.delivery = DeliveryChange::Publish(Delivery::refused(
                held.clone(),
                Verdict::NotExtracted,
                format!("{held} is being pulled and extracted"),
            ));
            plan = plan.serving_meanwhile(cache.serving, &held);
        }
        Ok(true) => {
            let pods = cache.pods.get(&held).filter(|p| !p.is_empty());
            entry.state = Some(if pods.is_some() {
                CacheState::Running
            } else {
                CacheState::Extracted
            });
            entry.pods = pods.map(|p| pod_data(p, &held));
            entry.workloads = cache.usage.get(&held).cloned();
            entry.volume_size = cache.size;
            plan.delivery = DeliveryChange::Publish(Delivery::deliverable(held.clone()));
        }
    }
    plan.entries.insert(digest.to_string(), entry);
    plan
}

/// What the node makes of the image's variants.
enum Pick {
    /// The operator has not published them yet.
    Pending,
    /// They cannot be used: why.
    Unreadable(String),
    /// None fits the node's GPUs: each variant's report, and why.
    Incompatible(Vec<Report>, String),
    /// The image holds C++ kernels only, built for another CPU ISA than the
    /// node's (as the operator published it: read from the kernels or
    /// declared): why.
    CpuMismatch(String),
    /// The node holds this variant (the resolved digest itself for a
    /// single-target image), which fits as the report says (no report: a
    /// cache of C++ kernels only, whose CPU ISA is the node's).
    Held(Digest, Option<Report>),
}

/// Which variant of the resolved `digest` this node holds, decided from the
/// variants the operator published ([`gkm_core::variant::choose_variant`]
/// for a multi-target image, whose variants are not `digest` itself).
fn pick_variant(release: &CacheRelease, digest: &Digest, node: &NodeView<'_>) -> Pick {
    let variants = match (&release.variants, &release.variants_error) {
        (_, Some(why)) if release.variant(digest).is_none() => {
            return Pick::Unreadable(format!("reading image {digest}: {why}"));
        }
        (None, _) => return Pick::Pending,
        (Some(variants), _) => variants,
    };
    // A single-target image is its own one variant.
    let candidates: Vec<&ImageVariant> = match release.variant(digest) {
        Some(own) => vec![own],
        None => variants.iter().collect(),
    };
    if candidates.is_empty() {
        return Pick::Unreadable(format!("the operator published no variant of {digest}"));
    }
    if let [only] = candidates.as_slice()
        && only.targets.is_empty()
        && let Some(declared) = &only.cpu_isa
    {
        return pick_by_cpu(digest, declared, node);
    }
    let mut summaries = Vec::new();
    for variant in &candidates {
        match variant.summary() {
            Ok(summary) => summaries.push(summary),
            Err(e) => {
                return Pick::Unreadable(format!(
                    "a target the operator published for {}: {e}",
                    variant.digest
                ));
            }
        }
    }
    let mut choice = choose_variant(&summaries, node.gpus, node.check);
    let Some(chosen) = choice.chosen else {
        let reason = match choice.reports.as_slice() {
            [only] => incompatibility_reason(only),
            _ => choice.to_string(),
        };
        return Pick::Incompatible(choice.reports, reason);
    };
    match candidates[chosen].digest.parse::<Digest>() {
        Ok(held) => Pick::Held(held, Some(choice.reports.swap_remove(chosen))),
        Err(e) => Pick::Unreadable(format!(
            "a variant digest the operator published for {digest}: {e}"
        )),
    }
}

/// Whether the node holds `digest`, an image of C++ kernels only built for
/// the CPU ISA `isa` (the operator publishes it for a cache judged by the
/// CPU, `gkm_core::cache::Fit::judged_by_cpu`): by the rule `gkm check`
/// applies ([`cpu_mismatch`]), when the node's CPU ISA is that one.
fn pick_by_cpu(digest: &Digest, isa: &str, node: &NodeView<'_>) -> Pick {
    match cpu_mismatch(isa, node.cpu_isa) {
        None => Pick::Held(digest.clone(), None),
        Some(reason) => Pick::CpuMismatch(reason),
    }
}

/// The digest this node holds for `release`: the variant its GPUs get of a
/// multi-target image, the resolved digest of a single-target one; `None`
/// while nothing is to be held (unresolved, not deliverable, variants
/// unknown or none fitting).
pub fn held_digest(release: &CacheRelease, node: &NodeView<'_>) -> Option<Digest> {
    let digest = release.resolved()?;
    if !release.deliverable || release.deleting {
        return None;
    }
    match pick_variant(release, &digest, node) {
        Pick::Held(held, _) => Some(held),
        _ => None,
    }
}

/// Records which GPUs fit and why the others do not: a GPU fits when one
/// of `reports` (one per variant considered) says so, and one that does
/// not lists every variant's reasons.
fn record_compatibility(entry: &mut NodeCacheStatus, reports: &[Report]) {
    let Some(first) = reports.first() else {
        return;
    };
    let mut compatible = Vec::new();
    let mut incompatible = Vec::new();
    let mut reasons = Vec::new();
    for (g, gpu) in first.gpus.iter().enumerate() {
        let of = |r: &'_ Report| r.gpus.get(g).cloned();
        let per_gpu: Vec<_> = reports.iter().filter_map(of).collect();
        if per_gpu.iter().any(|r| r.compatible) {
            compatible.push(gpu.index as i32);
            continue;
        }
        incompatible.push(gpu.index as i32);
        reasons.push(IncompatibleGpu {
            id: gpu.index as i32,
            reasons: per_gpu
                .iter()
                .flat_map(|r| r.all_reasons().map(ToString::to_string).collect::<Vec<_>>())
                .collect(),
        });
    }
    entry.compatible_gpus = Some(compatible);
    entry.incompatible_gpus = Some(incompatible);
    entry.incompatible_reasons = (!reasons.is_empty()).then_some(reasons);
}

fn pod_data(pods: &[PodRef], digest: &Digest) -> Vec<PodData> {
    pods.iter()
        .map(|p| PodData {
            pod_namespace: p.namespace.clone(),
            pod_name: p.name.clone(),
            volume_id: None,
            digest: Some(digest.to_string()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gkm_core::cache::Summary;
    use gkm_core::{Arch, Backend, Vendor};
    use gkm_k8s_api::crd::ImageVariant;

    const DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const OLD: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";
    const SM75: &str = r#"{"targets":[{"backend":"cuda","arch":75,"warp_size":32}]}"#;

    fn t4() -> Gpu {
        Gpu {
            vendor: Vendor::Nvidia,
            product: "Tesla T4".into(),
            backend: Some(Backend::Cuda),
            arch: Some("75".parse::<Arch>().unwrap()),
            warp_size: Some(32),
            toolkit_version: Some("12.4".into()),
            ..Gpu::default()
        }
    }

    fn variants(label: &str) -> Option<Vec<ImageVariant>> {
        let digest: Digest = DIGEST.parse().unwrap();
        Some(vec![ImageVariant::new(
            &digest,
            &Summary::from_label(label).unwrap(),
        )])
    }

    /// What the operator publishes for a deliverable sm75 image.
    fn release() -> CacheRelease {
        CacheRelease {
            image: "r/c:v1".into(),
            digest: Some(DIGEST.into()),
            deliverable: true,
            variants: variants(SM75),
            ..CacheRelease::default()
        }
    }

    struct Case {
        release: CacheRelease,
        stored: Result<bool, String>,
        pods: BTreeMap<Digest, Vec<PodRef>>,
        usage: BTreeMap<Digest, Vec<WorkloadUsage>>,
        gpus: Vec<Gpu>,
        cpu_isa: Option<&'static str>,
        serving: Option<Digest>,
    }

    impl Case {
        fn new() -> Case {
            Case {
                release: release(),
                stored: Ok(true),
                pods: BTreeMap::new(),
                usage: BTreeMap::new(),
                gpus: vec![t4()],
                cpu_isa: None,
                serving: None,
            }
        }

        fn plan(&self) -> Plan {
            let labels = BTreeMap::new();
            let check = gkm_core::compat::NODE_CHECK;
            let node = NodeView {
                labels: &labels,
                gpus: &self.gpus,
                check: &check,
                cpu_isa: self.cpu_isa,
            };
            let input = CacheInput {
                release: &self.release,
                stored: self.stored.as_ref().map(|b| *b).map_err(String::as_str),
                size: Some(42),
                pods: &self.pods,
                usage: &self.usage,
                serving: self.serving.as_ref(),
            };
            plan_cache(&input, &node)
        }
    }

    fn pod(name: &str) -> PodRef {
        PodRef {
            namespace: "ml".into(),
            name: name.into(),
            uid: None,
        }
    }

    fn message(plan: &Plan) -> String {
        plan.entries[DIGEST].message.clone().unwrap_or_default()
    }

    #[test]
    fn a_verified_compatible_stored_cache_is_deliverable() {
        let plan = Case::new().plan();
        assert!(matches!(&plan.delivery, DeliveryChange::Publish(d) if d.is_deliverable()));
        let entry = &plan.entries[DIGEST];
        assert_eq!(entry.state, Some(CacheState::Extracted));
        assert_eq!(entry.compatible_gpus.as_deref(), Some(&[0][..]));
        assert_eq!(entry.volume_size, Some(42));
        assert_eq!(plan.extract, None);
    }

    /// A release of C++ kernels only, declared built for `isa`.
    fn cpu_only(isa: &str) -> Case {
        let mut case = Case::new();
        case.gpus.clear();
        case.release.variants = Some(vec![
            ImageVariant::new(&DIGEST.parse().unwrap(), &Summary::default())
                .with_cpu_isa(Some(isa.into())),
        ]);
        case
    }

    #[test]
    fn a_cache_of_cpu_kernels_is_held_where_the_cpu_isa_is_the_declared_one() {
        let mut case = cpu_only("avx2");
        case.cpu_isa = Some("avx2");
        let plan = case.plan();
        assert!(matches!(&plan.delivery, DeliveryChange::Publish(d) if d.is_deliverable()));
        assert_eq!(plan.entries[DIGEST].state, Some(CacheState::Extracted));
        case.stored = Ok(false);
        assert_eq!(case.plan().extract, Some(DIGEST.parse().unwrap()));
    }

    #[test]
    fn a_cache_of_cpu_kernels_is_incompatible_with_another_or_an_unknown_cpu_isa() {
        let mut case = cpu_only("avx2");
        case.cpu_isa = Some("avx512");
        case.stored = Ok(false);
        let plan = case.plan();
        assert_eq!(plan.entries[DIGEST].state, Some(CacheState::Incompatible));
        assert_eq!(plan.extract, None);
        let why = message(&plan);
        assert!(why.contains("CPU") && why.contains("avx512"), "{why}");
        case.cpu_isa = None;
        assert!(message(&case.plan()).contains("unknown"));
    }

    #[test]
    fn a_node_serves_its_previous_tree_while_the_next_is_pulled_or_fails_to_be() {
        let previous: Digest = format!("sha256:{}", "b".repeat(64)).parse().unwrap();
        let mut case = Case::new();
        case.serving = Some(previous.clone());
        for stored in [Ok(false), Err("registry answered 503".to_string())] {
            case.stored = stored;
            let plan = case.plan();
            assert!(
                matches!(&plan.delivery, DeliveryChange::Publish(d)
                    if d.is_deliverable() && d.digest == previous),
                "{plan:?}"
            );
            assert_eq!(plan.keep.as_ref(), Some(&previous), "{plan:?}");
            let served = &plan.entries[&previous.to_string()];
            assert_eq!(served.state, Some(CacheState::Outdated), "{plan:?}");
        }
        // Nothing served before: pods wait for the pull, as they always did.
        case.serving = None;
        case.stored = Ok(false);
        let plan = case.plan();
        assert!(
            matches!(&plan.delivery, DeliveryChange::Publish(d) if d.verdict == Verdict::NotExtracted),
            "{plan:?}"
        );
        assert_eq!(plan.keep, None);
        assert_eq!(plan.entries.len(), 1, "{plan:?}");
        // Once the next is stored, it is served and the previous is let go.
        case.serving = Some(previous);
        case.stored = Ok(true);
        let plan = case.plan();
        assert!(
            matches!(&plan.delivery, DeliveryChange::Publish(d) if d.digest.to_string() == DIGEST),
            "{plan:?}"
        );
        assert_eq!(plan.keep, None);
        assert_eq!(plan.entries.len(), 1, "{plan:?}");
    }

    #[test]
    fn an_unverified_cache_is_never_extracted() {
        let mut case = Case::new();
        case.release.deliverable = false;
        case.release.refusal = Some("no signature".into());
        case.stored = Ok(false);
        let plan = case.plan();
        assert_eq!(plan.extract, None);
        assert!(
            matches!(&plan.delivery, DeliveryChange::Publish(d) if d.verdict == Verdict::NotVerified)
        );
        let message = message(&plan);
        assert!(
            message.contains("not verified") && message.contains("no signature"),
            "{message}"
        );
    }

    #[test]
    fn the_operators_verdict_decides_not_the_variants() {
        // Variants published, but the verdict refuses: not delivered.
        let mut case = Case::new();
        case.release.deliverable = false;
        assert!(
            matches!(&case.plan().delivery, DeliveryChange::Publish(d) if d.verdict == Verdict::NotVerified)
        );
        assert!(message(&case.plan()).contains("not verified yet"));
    }

    #[test]
    fn an_incompatible_cache_is_refused_with_the_reason_and_not_extracted() {
        let mut case = Case::new();
        case.release.variants =
            variants(r#"{"targets":[{"backend":"hip","arch":"gfx90a","warp_size":64}]}"#);
        case.stored = Ok(false);
        let plan = case.plan();
        assert_eq!(plan.extract, None);
        let entry = &plan.entries[DIGEST];
        assert_eq!(entry.state, Some(CacheState::Incompatible));
        assert_eq!(entry.incompatible_gpus.as_deref(), Some(&[0][..]));
        assert!(
            entry
                .incompatible_reasons
                .as_ref()
                .is_some_and(|r| !r[0].reasons.is_empty())
        );
        assert!(
            matches!(&plan.delivery, DeliveryChange::Publish(d) if d.verdict == Verdict::Incompatible)
        );
    }

    #[test]
    fn a_node_without_gpus_has_no_compatible_gpu() {
        let mut case = Case::new();
        case.gpus.clear();
        let plan = case.plan();
        assert_eq!(plan.entries[DIGEST].state, Some(CacheState::Incompatible));
        assert!(message(&plan).contains("no GPUs"));
    }

    #[test]
    fn the_published_targets_decide_then_the_image_is_extracted() {
        let mut case = Case::new();
        // Deliverable, but the operator has not published the variants yet.
        case.release.variants = None;
        case.stored = Ok(false);
        let plan = case.plan();
        assert_eq!(plan.extract, None);
        assert_eq!(plan.delivery, DeliveryChange::Unchanged);
        assert_eq!(plan.entries[DIGEST].state, Some(CacheState::Pending));
        case.release.variants = variants(SM75);
        let plan = case.plan();
        assert_eq!(plan.extract.as_ref().map(Digest::as_str), Some(DIGEST));
        assert_eq!(plan.entries[DIGEST].state, Some(CacheState::Downloading));
        assert!(
            matches!(&plan.delivery, DeliveryChange::Publish(d) if d.verdict == Verdict::NotExtracted)
        );
        case.stored = Err("layer digest mismatch".into());
        let plan = case.plan();
        assert_eq!(plan.entries[DIGEST].state, Some(CacheState::Error));
        assert!(message(&plan).contains("layer digest mismatch"));
    }

    #[test]
    fn variants_the_operator_could_not_read_or_publish_are_errors() {
        let mut case = Case::new();
        case.release.variants = None;
        case.release.variants_error = Some("manifest unknown".into());
        let plan = case.plan();
        assert_eq!(plan.entries[DIGEST].state, Some(CacheState::Error));
        assert!(message(&plan).contains("manifest unknown"));
        assert_eq!(plan.extract, None);

        // An empty list of variants.
        case.release.variants_error = None;
        case.release.variants = Some(Vec::new());
        assert!(message(&case.plan()).contains("no variant"));

        // A target this agent cannot read.
        case.release.variants = variants(SM75);
        if let Some(v) = case.release.variants.as_mut() {
            v[0].targets[0].backend = "quantum".into();
        }
        let plan = case.plan();
        assert_eq!(plan.entries[DIGEST].state, Some(CacheState::Error));
        assert!(message(&plan).contains("quantum"), "{}", message(&plan));
    }

    #[test]
    fn pods_on_an_old_digest_are_outdated_and_on_the_new_one_running() {
        let mut case = Case::new();
        case.pods.insert(OLD.parse().unwrap(), vec![pod("old")]);
        case.pods.insert(DIGEST.parse().unwrap(), vec![pod("new")]);
        let plan = case.plan();
        assert_eq!(plan.entries[OLD].state, Some(CacheState::Outdated));
        assert_eq!(plan.entries[DIGEST].state, Some(CacheState::Running));
        assert_eq!(plan.entries[DIGEST].pods.as_ref().map(Vec::len), Some(1));
    }

    #[test]
    fn a_deleted_cache_keeps_only_entries_with_pods_and_stops_delivery() {
        let mut case = Case::new();
        case.release.deleting = true;
        assert!(case.plan().entries.is_empty());
        assert_eq!(case.plan().delivery, DeliveryChange::Remove);
        case.pods
            .insert(DIGEST.parse().unwrap(), vec![pod("still")]);
        let plan = case.plan();
        assert_eq!(plan.entries[DIGEST].state, Some(CacheState::Deleting));
        assert_eq!(plan.delivery, DeliveryChange::Remove);
    }

    #[test]
    fn a_node_selector_that_does_not_match_leaves_no_entry() {
        let mut case = Case::new();
        case.release.node_selector = Some(
            serde_json::from_value(serde_json::json!({"matchLabels": {"gpu": "h100"}})).unwrap(),
        );
        let plan = case.plan();
        assert!(plan.entries.is_empty());
        assert_eq!(plan.delivery, DeliveryChange::Remove);
    }

    #[test]
    fn a_cluster_cache_delivers_to_its_workload_namespaces_only() {
        let mut case = Case::new();
        case.release.workload_namespaces =
            Some(vec![gkm_k8s_api::crd::NamespaceName("team-a".into())]);
        let plan = case.plan();
        assert!(matches!(
            &plan.delivery,
            DeliveryChange::Publish(d) if d.workload_namespaces == Some(vec!["team-a".to_string()])
        ));
    }

    #[test]
    fn a_node_holds_the_variant_of_a_multi_target_image_its_gpus_get() {
        // The resolved digest is the index; its variants are sm80 and sm75.
        let v80 = "sha256:8080808080808080808080808080808080808080808080808080808080808080";
        let v75 = "sha256:7575757575757575757575757575757575757575757575757575757575757575";
        let variant = |digest: &str, arch: &str| {
            let label =
                format!(r#"{{"targets":[{{"backend":"cuda","arch":"{arch}","warp_size":32}}]}}"#);
            ImageVariant::new(
                &digest.parse().unwrap(),
                &Summary::from_label(&label).unwrap(),
            )
        };
        let mut case = Case::new();
        case.release.variants = Some(vec![variant(v80, "80"), variant(v75, "75")]);
        case.stored = Ok(false);
        let plan = case.plan();
        assert_eq!(plan.extract.as_ref().map(Digest::as_str), Some(v75));
        let entry = &plan.entries[DIGEST];
        assert_eq!(entry.variant.as_deref(), Some(v75));
        assert_eq!(entry.state, Some(CacheState::Downloading));

        // Stored, with a pod on it: running, and delivered from the variant.
        case.stored = Ok(true);
        case.pods.insert(v75.parse().unwrap(), vec![pod("reader")]);
        let plan = case.plan();
        assert_eq!(plan.entries[DIGEST].state, Some(CacheState::Running));
        assert!(
            !plan.entries.contains_key(v75),
            "a current variant is not outdated"
        );
        assert!(
            matches!(&plan.delivery, DeliveryChange::Publish(d) if d.is_deliverable() && d.digest.as_str() == v75)
        );
        // What the workloads compiled into views of the variant is reported
        // under the index, the digest the cache resolves to.
        let compiled = WorkloadUsage {
            pods_ended: 1,
            new_entries: 2,
            ..WorkloadUsage::of(
                "ml",
                "Job/warmup",
                "triton",
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
            )
        };
        case.usage
            .insert(v75.parse().unwrap(), vec![compiled.clone()]);
        let plan = case.plan();
        assert_eq!(plan.entries[DIGEST].workloads, Some(vec![compiled]));

        // A GPU no variant fits: incompatible, saying why for each variant.
        case.gpus[0].arch = Some("gfx90a".parse().unwrap());
        case.gpus[0].backend = Some(Backend::Hip);
        let plan = case.plan();
        assert_eq!(plan.entries[DIGEST].state, Some(CacheState::Incompatible));
        let message = message(&plan);
        assert!(
            message.contains("no variant fits any GPU") && message.contains("variant 1"),
            "{message}"
        );
        assert_eq!(plan.extract, None);
    }
}

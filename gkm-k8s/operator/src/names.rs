//! The names and labels gkm gives the objects it makes, and the field
//! manager of its writes: stable, valid, and short enough for a label value
//! (63 characters). Every controller and webhook names objects here, so a
//! PVC fill Job, a capture Job and the webhook finding a claim agree.

use gkm_k8s_api::cache_object::{CacheKey, Scope};
use gkm_k8s_api::crd::PodTemplate;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The field manager of every object the operator applies (claims,
/// volumes, fill Jobs, releases, DeviceClasses, webhook configurations).
pub const FIELD_MANAGER: &str = "gkm-operator";

/// The field manager of the capture controller's writes (capture status,
/// the cache a capture points at).
pub const CAPTURE_FIELD_MANAGER: &str = "gkm-capture";

/// The user and group the operator's Jobs run as (and the `fsGroup` a
/// fill Job's claim is given): not root, so they pass Pod Security
/// `restricted`.
pub const FILL_UID: i64 = 65532;

/// The label naming the cache an object belongs to (its name as a
/// [`label_value`]: cut past 63 characters; [`CACHE_NAME_ANNOTATION`] holds
/// it whole).
pub const CACHE_LABEL: &str = "gkm.io/cache";
/// The annotation holding the whole name of the cache an object belongs to.
pub const CACHE_NAME_ANNOTATION: &str = "gkm.io/cache-name";
/// The label naming the cache's kind (`GKMCache`, `ClusterGKMCache`).
pub const KIND_LABEL: &str = "gkm.io/cache-kind";
/// The label naming a namespaced cache's namespace (on cluster-scoped volumes).
pub const NAMESPACE_LABEL: &str = "gkm.io/cache-namespace";
/// The label naming the node a ReadWriteOnce claim serves (as a
/// [`label_value`]; [`NODE_NAME_ANNOTATION`] holds it whole).
pub const NODE_LABEL: &str = "gkm.io/node";
/// The annotation holding the whole name of the node a claim serves.
pub const NODE_NAME_ANNOTATION: &str = "gkm.io/node-name";
/// Who made the object.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "gkm-operator");

const MAX: usize = 63;

/// The first 10 hex digits of `text`'s SHA-256.
fn short_hash(text: &str) -> String {
    let digest = gkm_oci::Digest::of(text.as_bytes()).to_string();
    digest
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .chars()
        .take(10)
        .collect()
}

/// `name` as a label value (at most 63 characters): the name itself
/// when it fits, so objects labelled before keep matching; else cut and
/// followed by a hash of the whole, so distinct names stay distinct.
/// Object names (DNS subdomains: lowercase letters, digits, `-`, `.`)
/// give valid values; every label of gkm's that holds a name (and every
/// selector on one) is made here.
///
/// ```
/// use gkm_k8s_operator::names::label_value;
/// assert_eq!(label_value("vector-add"), "vector-add");
/// assert_eq!(label_value(&"x".repeat(80)).len(), 63);
/// ```
pub fn label_value(name: &str) -> String {
    if name.len() <= MAX {
        return name.to_string();
    }
    let hash = short_hash(name);
    let cut: String = name.chars().take(MAX - hash.len() - 1).collect();
    format!("{}-{hash}", cut.trim_end_matches(['-', '.']))
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

/// The name `label` stands for on an object gkm made: the whole name in
/// its `annotation` when the label is that name's [`label_value`], else the
/// label itself (an object made before the annotation, whose name was
/// short enough to be its label); `None` without the label, or when the
/// two disagree.
pub fn labelled_name(meta: &ObjectMeta, label: &str, annotation: &str) -> Option<String> {
    let value = meta.labels.as_ref()?.get(label)?;
    match meta.annotations.as_ref().and_then(|a| a.get(annotation)) {
        Some(name) => (label_value(name) == *value).then(|| name.clone()),
        None => Some(value.clone()),
    }
}

//! One DeviceClass per cache (with `--dra-device-classes`): claims that name
//! it get only gpu.gkm.io devices the cache's kernels fit, so no scheduler
//! extender is needed for DRA workloads.
//!
//! The class's selector is generated from the targets of the cache's
//! release (every variant of the resolved digest) by the rule the nodes
//! check with ([`gkm_core::compat::requirement`] under the nodes' options,
//! [`gkm_core::compat::NODE_CHECK`], rendered by
//! [`gkm_k8s_api::dra::selector::fits`]); it follows the release when the tag
//! moves. A cache whose digest may not be delivered (not verified, not
//! resolved, targets unread) keeps its class with a selector that no device
//! meets: claims wait rather than fail on a missing class, the class name
//! stays what quotas and claims name, and its annotation says why.
//!
//! The class is cluster-scoped and the cache may be namespaced, so no owner
//! reference can tie them: the operator deletes it when the cache's deletion
//! starts (new claims stop landing; allocated ones keep their devices), and
//! its label is what the `gkm-operator-scope` policy lets the operator write.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};

use gkm_core::CacheKey;
use gkm_core::compat::{NODE_CHECK, Requirement, requirement};
use gkm_k8s_api::crd::CacheRelease;
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, DeviceClass, DeviceClassSpec, DeviceSelector,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};

use crate::error::Result;
use crate::names::FIELD_MANAGER;

/// The label on every class the operator makes; the only classes it may
/// write or delete.
pub const CLASS_LABEL: &str = "gkm.io/cache-device-class";

/// The annotation naming the cache a class is for (`GKMCache ns/name`).
pub const CACHE_ANNOTATION: &str = "gkm.io/cache";

/// The annotation naming the digest whose targets a class selects.
pub const DIGEST_ANNOTATION: &str = "gkm.io/cache-digest";

/// The annotation saying why a class selects no device.
pub const NOTHING_ANNOTATION: &str = "gkm.io/selects-nothing";

/// The class of `cache`: `gkm-cache.<namespace>.<name>` for a GKMCache,
/// `gkm-clustercache.<name>` for a ClusterGKMCache (a namespace has no dot,
/// so no two caches share a name); past 63 characters (the longest label
/// value, and what the class's quota resource
/// `<class>.deviceclass.resource.k8s.io/devices` allows), cut and followed
/// by a hash of the whole ([`label_value`](crate::names::label_value)).
///
/// ```
/// use gkm_core::CacheKey;
/// use gkm_k8s_operator::cache::device_class::class_name;
/// assert_eq!(class_name(&CacheKey::named(Some("team-a"), "llama")), "gkm-cache.team-a.llama");
/// assert_eq!(class_name(&CacheKey::named(None, "llama")), "gkm-clustercache.llama");
/// assert_eq!(class_name(&CacheKey::named(Some("t"), &"x".repeat(80))).len(), 63);
/// ```
pub fn class_name(cache: &CacheKey) -> String {
    let whole = match cache {
        CacheKey::Namespaced { namespace, name } => format!("gkm-cache.{namespace}.{name}"),
        CacheKey::Cluster { name } => format!("gkm-clustercache.{name}"),
    };
    crate::names::label_value(&whole)
}

/// What a GPU must be for some variant of `release` to fit it, or why no
/// GPU is selected.
fn requirements(release: &CacheRelease) -> std::result::Result<Vec<Requirement>, String> {
    let digest = release.digest.as_deref().unwrap_or_default();
    if release.deleting {
        return Err("the cache is being deleted".to_string());
    }
    if !release.deliverable {
        let why = release.refusal.as_deref().unwrap_or("not resolved yet");
        return Err(format!("the digest {digest} may not be delivered: {why}"));
    }
    let Some(variants) = &release.variants else {
        let why = release.variants_error.as_deref().unwrap_or("not read yet");
        return Err(format!("the targets of {digest}: {why}"));
    };
    let mut found = Vec::new();
    for variant in variants {
        let summary = variant
            .summary()
            .map_err(|e| format!("the targets of {}: {e}", variant.digest))?;
        found.extend(
            summary
                .targets
                .iter()
                .filter_map(|t| requirement(t, &NODE_CHECK)),
        );
    }
    if found.is_empty() {
        return Err(format!("no GPU fits the targets of {digest}"));
    }
    Ok(found)
}

/// What a class says about why it selects nothing. DeviceClasses are
/// cluster-scoped and every user may read them, so a namespaced cache's
/// class only points at the cache, whose status (readable in its namespace)
/// holds `why`: a refusal names registries, signers and errors of that
/// namespace. A ClusterGKMCache's reason is the cluster's, and published.
fn published_why(cache: &CacheKey, why: String) -> String {
    match cache {
        CacheKey::Cluster { .. } => why,
        CacheKey::Namespaced { .. } => {
            format!("the cache cannot be delivered now; the status of {cache} says why")
        }
    }
}

/// The DeviceClass of `cache` for its `release`.
pub fn device_class(cache: &CacheKey, release: &CacheRelease) -> DeviceClass {
    let mut annotations = BTreeMap::from([(CACHE_ANNOTATION.to_string(), cache.to_string())]);
    if let Some(digest) = &release.digest {
        annotations.insert(DIGEST_ANNOTATION.to_string(), digest.clone());
    }
    let expression = match requirements(release) {
        Ok(found) => gkm_k8s_api::dra::selector::fits(&found),
        Err(why) => {
            annotations.insert(NOTHING_ANNOTATION.to_string(), published_why(cache, why));
            gkm_k8s_api::dra::selector::NOTHING.to_string()
        }
    };
    DeviceClass {
        metadata: ObjectMeta {
            name: Some(class_name(cache)),
            labels: Some(BTreeMap::from([(
                CLASS_LABEL.to_string(),
                "true".to_string(),
            )])),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: DeviceClassSpec {
            // The driver alone first: the `gkm-operator-scope` policy checks
            // that every class the operator writes has it, so no class of
            // its selects another driver's devices.
            selectors: Some(
                [
                    gkm_k8s_api::dra::selector::THIS_DRIVER.to_string(),
                    expression,
                ]
                .map(|expression| DeviceSelector {
                    cel: Some(CELDeviceSelector { expression }),
                })
                .to_vec(),
            ),
            ..DeviceClassSpec::default()
        },
    }
}

/// The classes written last, by name: a reconcile that wants what was
/// written last writes nothing.
#[derive(Default)]
pub struct DeviceClasses {
    written: Mutex<HashMap<String, DeviceClass>>,
}

impl DeviceClasses {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, DeviceClass>> {
        self.written.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies `cache`'s class for `release` (server-side) unless it is
    /// what was written last; whether it wrote.
    pub async fn write(
        &self,
        client: &kube::Client,
        cache: &CacheKey,
        release: &CacheRelease,
    ) -> Result<bool> {
        let class = device_class(cache, release);
        let name = class_name(cache);
        if self.lock().get(&name) == Some(&class) {
            return Ok(false);
        }
        let api: Api<DeviceClass> = Api::all(client.clone());
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&class),
        )
        .await?;
        self.lock().insert(name, class);
        Ok(true)
    }

    /// Deletes `cache`'s class (gone already is fine).
    pub async fn remove(&self, client: &kube::Client, cache: &CacheKey) -> Result<()> {
        let name = class_name(cache);
        let api: Api<DeviceClass> = Api::all(client.clone());
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        self.lock().remove(&name);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gkm_k8s_api::crd::{ImageTarget, ImageVariant};

    const DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

    fn release(targets: &[(&str, &str, u32)]) -> CacheRelease {
        CacheRelease {
            image: "r/c:v1".into(),
            digest: Some(DIGEST.into()),
            deliverable: true,
            variants: Some(vec![ImageVariant {
                digest: DIGEST.into(),
                targets: targets
                    .iter()
                    .map(|(backend, arch, warp)| ImageTarget {
                        backend: backend.to_string(),
                        arch: arch.to_string(),
                        warp_size: *warp,
                        ..ImageTarget::default()
                    })
                    .collect(),
                cpu_isa: None,
            }]),
            ..CacheRelease::default()
        }
    }

    fn expression(class: &DeviceClass) -> &str {
        let selectors = class.spec.selectors.as_ref().unwrap();
        assert_eq!(selectors.len(), 2);
        assert_eq!(
            selectors[0].cel.as_ref().unwrap().expression,
            "device.driver == 'gpu.gkm.io'"
        );
        &selectors[1].cel.as_ref().unwrap().expression
    }

    #[test]
    fn names_are_unambiguous_and_valid() {
        // Dashes alone would give both "gkm-cache-a-b-c".
        let a = class_name(&CacheKey::named(Some("a-b"), "c"));
        let b = class_name(&CacheKey::named(Some("a"), "b-c"));
        assert_ne!(a, b);
        let long = class_name(&CacheKey::named(
            Some("team"),
            &format!("{}.x", "y".repeat(70)),
        ));
        let other = class_name(&CacheKey::named(
            Some("team"),
            &format!("{}.z", "y".repeat(70)),
        ));
        assert_ne!(long, other);
        for name in [a, b, long, other] {
            assert!(name.len() <= 63, "{name}");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
                    && !name.ends_with(['-', '.']),
                "{name}"
            );
        }
    }

    #[test]
    fn a_deliverable_release_selects_its_targets() {
        let cache = CacheKey::named(Some("team"), "llama");
        let class = device_class(
            &cache,
            &release(&[("cuda", "90", 32), ("hip", "gfx942", 64)]),
        );
        assert_eq!(class.metadata.name.as_deref(), Some("gkm-cache.team.llama"));
        let e = expression(&class);
        assert!(e.starts_with("device.driver == 'gpu.gkm.io' && ("), "{e}");
        assert!(
            e.contains("semver('9.0.0')") && e.contains("== 'gfx942'"),
            "{e}"
        );
        let annotations = class.metadata.annotations.unwrap();
        assert_eq!(annotations[CACHE_ANNOTATION], "GKMCache team/llama");
        assert_eq!(annotations[DIGEST_ANNOTATION], DIGEST);
        assert!(!annotations.contains_key(NOTHING_ANNOTATION));
        assert_eq!(class.metadata.labels.unwrap()[CLASS_LABEL], "true");
    }

    #[test]
    fn an_undeliverable_release_selects_nothing_and_says_why() {
        let cache = CacheKey::named(None, "shared");
        let mut refused = release(&[("cuda", "90", 32)]);
        refused.deliverable = false;
        refused.variants = None;
        refused.refusal = Some("no signature".into());
        let class = device_class(&cache, &refused);
        assert_eq!(expression(&class), "false");
        assert_eq!(
            class.metadata.annotations.unwrap()[NOTHING_ANNOTATION],
            format!("the digest {DIGEST} may not be delivered: no signature")
        );
        let namespaced = device_class(&CacheKey::named(Some("team-b"), "llama"), &refused);
        let said = &namespaced.metadata.annotations.unwrap()[NOTHING_ANNOTATION];
        assert_eq!(
            said,
            "the cache cannot be delivered now; the status of GKMCache team-b/llama says why"
        );
        assert!(!said.contains("no signature") && !said.contains(DIGEST));
        let mut unread = release(&[]);
        unread.variants = None;
        unread.variants_error = Some("unreachable".into());
        assert_eq!(
            requirements(&unread).unwrap_err(),
            format!("the targets of {DIGEST}: unreachable")
        );
        assert_eq!(
            requirements(&release(&[])).unwrap_err(),
            format!("no GPU fits the targets of {DIGEST}")
        );
        let mut bad = release(&[("cuda", "ampere", 32)]);
        bad.variants.as_mut().unwrap()[0].digest = "sha256:2".into();
        assert!(
            requirements(&bad)
                .unwrap_err()
                .starts_with("the targets of sha256:2: invalid value \"ampere\"")
        );
    }
}

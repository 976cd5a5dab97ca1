//! What the agent's tests share.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use gkm_k8s_api::crd::{CacheRelease, GKMCacheRelease, ImageVariant};
use gkm_oci::{Digest, Image, ImageRef, RegistryOptions, Repo};
use kube::api::{Api, Patch, PatchParams};

/// The repository's `deploy/` directory.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// The variants of `digest` of `image` (a registry or an OCI layout), read
/// as the operator reads them (the manifest, the config only when the
/// manifest lacks the cache labels).
pub async fn variants_of(
    image: &ImageRef,
    digest: &Digest,
    registry: &RegistryOptions,
) -> anyhow::Result<Vec<ImageVariant>> {
    let repo = Repo::open(&image.with_digest(digest), registry)?;
    let read = Image::fetch_annotated(&repo).await?;
    Ok(vec![ImageVariant::new(
        &read.digest,
        &read.cache()?.summary,
    )])
}

/// Publishes what the operator would for the GKMCache `name` in
/// `namespace` (no operator runs in these tests): its release, naming
/// `image` resolved to `digest`, deliverable with `variants`, or refused
/// for `refusal`.
pub async fn publish_release(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    image: &str,
    digest: &str,
    verdict: Result<Vec<ImageVariant>, &str>,
) -> anyhow::Result<()> {
    let (deliverable, refusal, variants) = match verdict {
        Ok(variants) => (true, None, Some(variants)),
        Err(why) => (false, Some(why.to_string()), None),
    };
    let mut release = GKMCacheRelease::new(
        name,
        gkm_k8s_api::crd::GKMCacheReleaseSpec {
            release: CacheRelease {
                image: image.to_string(),
                digest: Some(digest.to_string()),
                deliverable,
                refusal,
                variants,
                ..CacheRelease::default()
            },
        },
    );
    release.metadata.namespace = Some(namespace.to_string());
    Api::<GKMCacheRelease>::namespaced(client.clone(), namespace)
        .patch(
            name,
            &PatchParams::apply("gkm-operator").force(),
            &Patch::Apply(&release),
        )
        .await?;
    Ok(())
}

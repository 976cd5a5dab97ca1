//! Capturing a warmed kernel cache: a directory a workload compiled into
//! becomes a signed, verified cache image in a registry, in one call.
//!
//! [`capture`] runs, in order, stopping at the first failure:
//!
//! 1. the safety rules ([`crate::store::tree_check`]: the rules extraction applies,
//!    on the tree as it is on disk), before anything is read or packed;
//! 2. the scan ([`gkm_core::cache::scan`]): a tree that is not a Triton or
//!    vLLM cache is refused with what was expected;
//! 3. a deterministic build ([`crate::build()`]) into a temporary OCI layout,
//!    once the registry answered (so an unreachable one costs no packing);
//! 4. the push, by digest: blobs, then the manifest at its digest, so no tag
//!    ever names a half-pushed image;
//! 5. the signature, with the given key, over that digest;
//! 6. the verification of what the registry now serves: the manifest at the
//!    digest, and a signature by the key's public key over it;
//! 7. the tag, last, checked to resolve to the digest.
//!
//! The temporary layout is removed whatever happens. Nothing is pushed
//! when steps 1-3 fail; a failure from step 4 on leaves at most untagged
//! content in the target repository, which a retry reuses.
//!
//! The on-cluster capture runs this same function (through `gkm capture`)
//! in a Job, so both flows refuse and sign alike. A writable view's upper
//! is captured as a delta image over its base by [`delta`].

pub mod delta;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gkm_core::cache::{CacheError, CacheManifest};
use gkm_core::digest::Digest;
use gkm_core::policy::{Policy, Verified};

use crate::error::Error;
use crate::image::build::build_scanned_into_layout;
use crate::image::copy::copy_image;
use crate::image::labels::Compression;
use crate::image::layer::LayerInfo;
use crate::progress::{Progress, step};
use crate::registry::layout::{Layout, tmp_name};
use crate::registry::reference::{ImageRef, Selector};
use crate::registry::repo::{RawManifest, RegistryOptions, Repo};
use crate::sign::{SignFormat, SigningKey, sign};
use crate::store::extract::ExtractPolicy;
use crate::store::rejection::Rejection;
use crate::store::tree_check::{TreeStats, check_prefixed_paths, check_tree};
use crate::verify::{VerifyError, verify};

/// The image label recording the GPU a captured cache was compiled on, when
/// known (`gkm capture --gpu`).
pub const COMPILED_ON_LABEL: &str = "io.gkm.compiled-on-gpu";

/// How to capture.
#[derive(Debug, Clone, Default)]
pub struct CaptureOptions {
    /// The limits the tree must keep: the extraction policy, whose
    /// `max_total_size` (the sum of file sizes) and `max_entries` (files and
    /// directories) a capture usually lowers.
    pub limits: ExtractPolicy,
    /// Layer compression.
    pub compression: Compression,
    /// The title label (default: the repository's last path component).
    pub title: Option<String>,
    /// The signature format.
    pub format: SignFormat,
    /// The GPU the cache was compiled on, when known; recorded in the
    /// [`COMPILED_ON_LABEL`] label.
    pub gpu: Option<String>,
    /// The GPUs of the machine the cache was compiled on: without
    /// [`gpu`](Self::gpu), the label records those that fit the cache's
    /// targets ([`compiled_on`]).
    pub gpus: Vec<gkm_core::gpu::Gpu>,
    /// Where to write the temporary layout (default: the system's temporary
    /// directory).
    pub work_dir: Option<PathBuf>,
    /// What the capturer declares about a PyTorch cache (the torch
    /// version, the CPU ISA), as for `gkm build`.
    pub declared: gkm_core::cache::Declared,
}

/// What a delta capture ([`delta::capture_delta`]) added to its base.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeltaOf {
    /// The base, pinned.
    pub base: String,
    /// The base's digest.
    pub base_digest: Digest,
    /// How many layers are the base's.
    pub base_layers: usize,
    /// The delta layer's files, relative to the cache root, sorted.
    pub files: Vec<String>,
    /// The upper's scratch left out (lock files, Triton temporaries).
    pub dropped: Vec<String>,
}

/// What a capture produced.
#[derive(Debug, Clone)]
pub struct Captured {
    /// The target, as given (its tag now names `digest`).
    pub target: ImageRef,
    /// The target pinned to the digest.
    pub pinned: ImageRef,
    /// The image (manifest) digest.
    pub digest: Digest,
    /// What the safety check counted.
    pub tree: TreeStats,
    /// The scanned cache.
    pub cache: CacheManifest,
    /// The layer.
    pub layer: LayerInfo,
    /// Where the signature was stored.
    pub signature: String,
    /// What verifying the pushed image proved.
    pub verified: Verified,
    /// The GPU recorded, when known.
    pub gpu: Option<String>,
    /// For a delta image ([`crate::capture::delta::capture_delta`]): its base, and
    /// what the upper held. `tree` and `layer` are then the delta layer's,
    /// `cache` the whole image's.
    pub delta: Option<DeltaOf>,
}

/// The step a capture failed in, as a stable reason (the on-cluster
/// capture's status reasons).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum FailureReason {
    /// The target is not a registry repository with a tag.
    InvalidTarget,
    /// The tree broke a safety rule, or is torn (a Triton group naming a
    /// missing, empty or misplaced file).
    UnsafeTree,
    /// The tree is not a Triton or vLLM cache.
    NotACache,
    /// The tree could not be read or the image not written locally.
    LocalError,
    /// The registry could not be reached, or refused a request.
    RegistryError,
    /// The pushed image did not verify (digest or signature), or the base
    /// of a delta did not.
    NotVerified,
    /// The upper of a delta deletes or changes something of its base (a
    /// whiteout, an opaque directory, a changed copy-up).
    DeltaChangesBase,
}

impl FailureReason {
    /// The reason's name, as printed.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::InvalidTarget => "InvalidTarget",
            FailureReason::UnsafeTree => "UnsafeTree",
            FailureReason::NotACache => "NotACache",
            FailureReason::LocalError => "LocalError",
            FailureReason::RegistryError => "RegistryError",
            FailureReason::NotVerified => "NotVerified",
            FailureReason::DeltaChangesBase => "DeltaChangesBase",
        }
    }

    /// Whether trying again later may succeed (a registry outage), as
    /// opposed to a tree or target that will fail the same way.
    pub fn is_transient(self) -> bool {
        self == FailureReason::RegistryError
    }
}

impl std::fmt::Display for FailureReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a capture failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// The target cannot be captured to.
    #[error("target {target}: {reason}")]
    Target {
        /// The target as given.
        target: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The tree broke a safety rule; nothing was packed or pushed.
    #[error(
        "refused before packing: entry {:?}: {}: {}",
        .0.entry,
        .0.rule,
        .0.detail
    )]
    Unsafe(Rejection),
    /// Scanning, building, pushing or signing failed.
    #[error(transparent)]
    Image(Error),
    /// The pushed image did not verify.
    #[error("the pushed image {pinned} did not verify: {source}")]
    NotVerified {
        /// The image, by digest.
        pinned: String,
        /// Why.
        source: VerifyError,
    },
    /// The base of a delta did not verify; nothing was packed or pushed.
    #[error("the base image {base} did not verify: {source}")]
    BaseNotVerified {
        /// The base, by digest.
        base: String,
        /// Why.
        source: VerifyError,
    },
    /// The upper of a delta cannot be harvested; nothing was packed or
    /// pushed.
    #[error("refused before packing: {0}")]
    Delta(gkm_core::delta::DeltaRefusal),
}

impl From<Error> for CaptureError {
    fn from(e: Error) -> CaptureError {
        match e {
            Error::Rejected(r) => CaptureError::Unsafe(r),
            other => CaptureError::Image(other),
        }
    }
}

impl CaptureError {
    /// The step it failed in.
    pub fn reason(&self) -> FailureReason {
        match self {
            CaptureError::Target { .. } => FailureReason::InvalidTarget,
            CaptureError::Unsafe(_) => FailureReason::UnsafeTree,
            CaptureError::Image(Error::Cache(
                CacheError::NotACache { .. } | CacheError::BadMetadata { .. },
            )) => FailureReason::NotACache,
            CaptureError::Image(
                Error::Unpackable { .. } | Error::Cache(CacheError::TornGroup { .. }),
            ) => FailureReason::UnsafeTree,
            CaptureError::Image(Error::Registry { .. } | Error::NotFound { .. }) => {
                FailureReason::RegistryError
            }
            CaptureError::Image(Error::DigestMismatch { .. }) => FailureReason::NotVerified,
            CaptureError::Image(_) => FailureReason::LocalError,
            CaptureError::NotVerified {
                source: VerifyError::Image(_),
                ..
            } => FailureReason::RegistryError,
            CaptureError::NotVerified { .. } => FailureReason::NotVerified,
            CaptureError::BaseNotVerified {
                source: VerifyError::Image(_),
                ..
            } => FailureReason::RegistryError,
            CaptureError::BaseNotVerified { .. } => FailureReason::NotVerified,
            CaptureError::Delta(refusal) => match refusal.kind {
                gkm_core::delta::RefusalKind::ChangesBase => FailureReason::DeltaChangesBase,
                gkm_core::delta::RefusalKind::Unsafe => FailureReason::UnsafeTree,
            },
        }
    }
}

/// The GPU a cache with `summary` was compiled on, from the `gpus` of the
/// machine it was compiled on: the products of those whose backend,
/// architecture and warp size are one of the cache's targets, without
/// repeats, joined by `, ` (`None` when no GPU matches).
///
/// ```
/// use gkm_core::cache::{Summary, Target};
/// use gkm_core::gpu::{Arch, Backend, Gpu};
/// let summary = Summary::new([Target {
///     backend: Backend::Cuda, arch: Arch::from_compute_capability(7, 5), warp_size: 32,
///     ptx_version: None, cuda_version: None, triton_version: None,
/// }]);
/// let t4 = Gpu {
///     product: "Tesla T4".into(), backend: Some(Backend::Cuda),
///     arch: Some(Arch::from_compute_capability(7, 5)), warp_size: Some(32), ..Gpu::default()
/// };
/// let a100 = Gpu { product: "A100".into(), arch: Some(Arch::from_compute_capability(8, 0)), ..t4.clone() };
/// assert_eq!(gkm_oci::capture::compiled_on(&summary, &[a100.clone(), t4.clone(), t4]).as_deref(), Some("Tesla T4"));
/// assert_eq!(gkm_oci::capture::compiled_on(&summary, &[a100]), None);
/// ```
pub fn compiled_on(
    summary: &gkm_core::cache::Summary,
    gpus: &[gkm_core::gpu::Gpu],
) -> Option<String> {
    let mut products: Vec<&str> = Vec::new();
    for gpu in gpus {
        let fits = summary.targets.iter().any(|t| {
            gpu.backend == Some(t.backend)
                && gpu.arch.as_ref() == Some(&t.arch)
                && gpu.warp_size == Some(t.warp_size)
        });
        if fits && !products.contains(&gpu.product.as_str()) {
            products.push(&gpu.product);
        }
    }
    (!products.is_empty()).then(|| products.join(", "))
}

/// Checks that `target` is a registry repository with a tag (or none, for
/// `latest`), which is all a capture may push to.
pub fn check_target(target: &ImageRef) -> Result<(), CaptureError> {
    let bad = |reason| {
        Err(CaptureError::Target {
            target: target.to_string(),
            reason,
        })
    };
    match target {
        ImageRef::Layout { .. } => bad("a capture pushes to a registry, not an OCI layout"),
        ImageRef::Registry(r) if r.digest().is_some() => {
            bad("name a tag, not a digest: the digest is what the capture produces")
        }
        ImageRef::Registry(_) => Ok(()),
    }
}

/// Captures the cache in `dir` into `target`, signed with `key`; see the
/// [module documentation](self) for the steps. `progress` is told each.
pub async fn capture(
    dir: &Path,
    target: &ImageRef,
    key: &SigningKey,
    options: &CaptureOptions,
    registry: &RegistryOptions,
    progress: Option<Progress>,
) -> Result<Captured, CaptureError> {
    in_work_dir(target, options, "gkm-capture-", move |work| async move {
        let p = progress.as_ref();
        step(
            p,
            &format!("checking {} against the safety rules", dir.display()),
            None,
        );
        let (tree, cache) = {
            let dir = dir.to_path_buf();
            let limits = options.limits.clone();
            let progress = progress.clone();
            tokio::task::spawn_blocking(move || inspect(&dir, &limits, progress))
                .await
                .map_err(Error::from)??
        };
        reach(target, registry, p).await?;
        step(
            p,
            &format!("packing {} files, {} bytes", tree.files, tree.bytes),
            None,
        );
        let (built, gpu) = {
            let dir = dir.to_path_buf();
            let work = work.clone();
            let options = options.clone();
            let title = options
                .title
                .clone()
                .unwrap_or_else(|| target.default_title());
            tokio::task::spawn_blocking(move || pack(&dir, cache, &work, &title, &options))
                .await
                .map_err(Error::from)??
        };
        let digest = built.digest.clone();
        let published = publish(
            &work,
            &built.manifest,
            target,
            key,
            options,
            registry,
            progress.clone(),
        )
        .await?;
        Ok(Captured {
            target: target.clone(),
            pinned: published.pinned,
            digest,
            tree,
            cache: built.cache,
            layer: built.layer,
            signature: published.signature,
            verified: published.verified,
            gpu,
            delta: None,
        })
    })
    .await
}

/// Checks `target`, then runs `run` with a fresh work directory path (named
/// from `prefix`, under [`CaptureOptions::work_dir`]) and removes that
/// directory whatever `run` returned.
pub(crate) async fn in_work_dir<F, Fut>(
    target: &ImageRef,
    options: &CaptureOptions,
    prefix: &str,
    run: F,
) -> Result<Captured, CaptureError>
where
    F: FnOnce(PathBuf) -> Fut,
    Fut: std::future::Future<Output = Result<Captured, CaptureError>>,
{
    check_target(target)?;
    let work = options
        .work_dir
        .clone()
        .unwrap_or_else(std::env::temp_dir)
        .join(tmp_name(prefix));
    let result = run(work.clone()).await;
    let _ = tokio::fs::remove_dir_all(&work).await;
    result
}

/// Asks `target`'s registry for a blob, before the longest local step (the
/// packing), so an unreachable registry or missing credentials cost no
/// packing.
pub(crate) async fn reach(
    target: &ImageRef,
    registry: &RegistryOptions,
    progress: Option<&Progress>,
) -> Result<(), CaptureError> {
    step(progress, &format!("reaching {target}"), None);
    Repo::create(target, registry)?
        .has_blob(&Digest::of(b"{}"))
        .await?;
    Ok(())
}

/// What publishing an image built into a layout did.
pub(crate) struct Published {
    /// The target pinned to the image's digest.
    pub(crate) pinned: ImageRef,
    /// Where the signature was stored.
    pub(crate) signature: String,
    /// What verifying the pushed image proved.
    pub(crate) verified: Verified,
}

/// Steps 4-7: push the image `manifest` names from the layout at `work` to
/// `target` by digest, sign it, verify what the registry serves, then tag.
pub(crate) async fn publish(
    work: &Path,
    manifest: &RawManifest,
    target: &ImageRef,
    key: &SigningKey,
    options: &CaptureOptions,
    registry: &RegistryOptions,
    progress: Option<Progress>,
) -> Result<Published, CaptureError> {
    let p = progress.as_ref();
    let digest = &manifest.digest;
    let pinned = target.with_digest(digest);
    let source = Repo::open(
        &ImageRef::Layout {
            path: work.to_path_buf(),
            selector: Selector::Digest(digest.clone()),
        },
        registry,
    )?;
    copy_image(&source, &Repo::create(&pinned, registry)?, progress.clone()).await?;

    step(p, &format!("signing {digest}"), None);
    let signed = sign(&pinned, registry, digest, key, options.format).await?;

    step(p, &format!("verifying {pinned}"), None);
    let served = Repo::open(&pinned, registry)?.fetch_manifest().await?;
    let policy = Policy::keys(vec![key.public_key().clone()])
        .map_err(|e| Error::format("signing key", e))?;
    let verified = verify(&pinned, registry, &served.digest, &policy)
        .await
        .map_err(|source| CaptureError::NotVerified {
            pinned: pinned.to_string(),
            source,
        })?;

    step(p, &format!("tagging {target}"), None);
    tag(target, registry, manifest).await?;
    Ok(Published {
        pinned,
        signature: signed.location,
        verified,
    })
}

/// Steps 1-2: check and scan. Blocking.
fn inspect(
    dir: &Path,
    limits: &ExtractPolicy,
    progress: Option<Progress>,
) -> Result<(TreeStats, CacheManifest), Error> {
    let tree = check_tree(dir, limits)?;
    step(
        progress.as_ref(),
        &format!("scanning {}", dir.display()),
        None,
    );
    let cache = gkm_core::cache::scan(dir)?;
    check_prefixed_paths(&tree, &crate::image::layer::tree_root(dir, &cache)?, limits)?;
    Ok((tree, cache))
}

/// Step 3: build the scanned `cache` into the layout at `work`, recording
/// the GPU. Blocking.
fn pack(
    dir: &Path,
    cache: CacheManifest,
    work: &Path,
    title: &str,
    options: &CaptureOptions,
) -> Result<(crate::Built, Option<String>), Error> {
    let mut cache = cache;
    cache.declare(dir, &options.declared)?;
    let gpu = options
        .gpu
        .clone()
        .or_else(|| compiled_on(&cache.summary(), &options.gpus));
    let mut labels = BTreeMap::new();
    if let Some(gpu) = &gpu {
        labels.insert(COMPILED_ON_LABEL.to_string(), gpu.clone());
    }
    let layout = Layout::create(work)?;
    let built = build_scanned_into_layout(
        dir,
        cache,
        &layout,
        None,
        title,
        &options.compression.into(),
        &labels,
    )?;
    // The tree may have grown between the check and the packing.
    crate::store::extract::check_total(
        0,
        built.layer.cache_size_bytes,
        &options.limits,
        "(packed tree)",
    )?;
    Ok((built, gpu))
}

/// Points `target`'s tag at `manifest`, then checks the tag resolves to it.
async fn tag(
    target: &ImageRef,
    registry: &RegistryOptions,
    manifest: &RawManifest,
) -> Result<(), Error> {
    Repo::create(target, registry)?
        .put_manifest(manifest)
        .await?;
    let now = Repo::open(target, registry)?.fetch_manifest().await?;
    if now.digest != manifest.digest {
        return Err(Error::DigestMismatch {
            what: format!("the tag {target} just pushed"),
            expected: manifest.digest.to_string(),
            actual: now.digest.to_string(),
        });
    }
    Ok(())
}

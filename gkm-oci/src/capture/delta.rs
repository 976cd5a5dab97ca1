//! Delta cache images: what a workload compiled on top of a delivered cache
//! (the upper of its writable view), as a new image made of the base
//! image's layers, unchanged and referenced by digest, and one more layer
//! holding exactly the new files.
//!
//! The format: the manifest lists the base's layers in the base's order,
//! then the delta layer; the delta layer holds the new files under the
//! kind's cache directory (`io.triton.cache/…`) and no cache manifest (the
//! base layer's `io.*.manifest/manifest.json` stays the only one, so no
//! layer overwrites another's file). The config and manifest annotations
//! carry the cache labels of the whole tree (entry count, size, targets,
//! build path), as a single-layer image's do, plus [`BASE_LABEL`] and
//! [`BASE_LAYERS_LABEL`] naming the base. Readers apply the layers in order
//! into one tree, each later layer only adding files
//! ([`crate::store::pipeline`]).
//!
//! [`capture_delta`] runs, stopping at the first failure:
//!
//! 1. the base, named by digest, is read and checked as [`BaseCheck`] says
//!    (its signature by a policy, `NotVerified` when it does not verify; or
//!    its digest only, for a base the node delivered), then extracted;
//! 2. the upper is harvested against it ([`gkm_core::delta`]): whiteouts,
//!    opaque directories and changed copy-ups are refused
//!    (`DeltaChangesBase`), links and special files too (`UnsafeTree`),
//!    scratch is dropped, new files are copied out;
//! 3. the new Triton group files are rewritten to the base's build path
//!    (where the pod saw the tree is not where the base was built), and
//!    the delta is checked against the capture's limits;
//! 4. the delta layer, config and manifest are written to a temporary
//!    layout; the base's layers are copied to the target repository when
//!    it lacks them; then push, sign, verify and tag as
//!    [`crate::capture::capture`] does.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use gkm_core::cache::{CacheKind, CacheManifest};
use gkm_core::delta::{Harvest, InLower, Observed, UpperKind, harvest};
use gkm_core::digest::Digest;
use gkm_core::policy::Policy;
use oci_spec::image::{Descriptor, ImageManifestBuilder, MediaType};

pub use crate::capture::DeltaOf;
use crate::capture::{
    COMPILED_ON_LABEL, CaptureError, CaptureOptions, Captured, compiled_on, in_work_dir, publish,
    reach,
};
use crate::error::Error;
use crate::image::Image;
use crate::image::labels::{KindLayout, cache_labels};
use crate::image::layer::{LayerInfo, write_delta_layer};
use crate::image::manifest::Manifest;
use crate::progress::{Progress, step};
use crate::registry::layout::Layout;
use crate::registry::reference::ImageRef;
use crate::registry::repo::{RawManifest, RegistryOptions, Repo};
use crate::sign::SigningKey;
use crate::store::extract::{ExtractPolicy, check_entry_count, check_total, components};
use crate::store::tree_check::{TreeStats, check_prefixed_paths, check_tree};
use crate::store::unpack::{UnpackOptions, extract_to_dir};
use crate::verify::verify;

/// The label naming a delta image's base, pinned
/// (`<registry>/<repo>@sha256:<hex>`).
pub const BASE_LABEL: &str = "io.gkm.delta.base";
/// The label counting a delta image's layers that are its base's (the
/// first ones).
pub const BASE_LAYERS_LABEL: &str = "io.gkm.delta.base-layers";

/// What harvesting an upper copied out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Harvested {
    /// The new files, relative to the upper, sorted.
    pub files: Vec<String>,
    /// The scratch entries left out.
    pub dropped: Vec<String>,
}

/// Harvests the overlay `upper` made over `lower` into `into` (an empty
/// directory): every new file is copied there, scratch is left out, and
/// an upper that deletes or changes anything of `lower` is refused naming
/// the entry ([`gkm_core::delta`]). `limits` bound the entries walked and
/// the bytes copied. Blocking.
pub fn harvest_upper(
    upper: &Path,
    lower: &Path,
    into: &Path,
    limits: &ExtractPolicy,
) -> Result<Harvested, CaptureError> {
    let mut walk = Walk {
        upper,
        lower,
        into,
        limits,
        entries: 0,
        bytes: 0,
        out: Harvested::default(),
    };
    walk.dir("")?;
    walk.out.files.sort();
    walk.out.dropped.sort();
    Ok(walk.out)
}

struct Walk<'a> {
    upper: &'a Path,
    lower: &'a Path,
    into: &'a Path,
    limits: &'a ExtractPolicy,
    entries: u64,
    bytes: u64,
    out: Harvested,
}

impl Walk<'_> {
    fn dir(&mut self, rel: &str) -> Result<(), CaptureError> {
        let dir = self.upper.join(rel);
        let mut names = Vec::new();
        for entry in fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))? {
            let name = entry.map_err(|e| Error::io(&dir, e))?.file_name();
            let Some(name) = name.to_str().map(str::to_string) else {
                let shown = dir.join(&name).display().to_string();
                return Err(Error::Rejected(crate::store::rejection::Rejection::new(
                    &shown,
                    crate::store::rejection::Rule::NonUtf8Name,
                    "path is not UTF-8",
                ))
                .into());
            };
            names.push(name);
        }
        names.sort();
        for name in names {
            let rel = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            self.entries += 1;
            check_entry_count(self.entries, self.limits, &rel)?;
            components(&rel, &rel, self.limits).map_err(Error::Rejected)?;
            let path = self.upper.join(&rel);
            let meta = fs::symlink_metadata(&path).map_err(|e| Error::io(&path, e))?;
            let kind = observe(&path, &meta);
            let lower = in_lower(&self.lower.join(&rel), &path, &meta)?;
            let observed = Observed {
                path: rel.clone(),
                kind,
                lower,
            };
            match (harvest(&observed), kind) {
                (Harvest::Refuse(refusal), _) => return Err(CaptureError::Delta(refusal)),
                (Harvest::Drop(_), _) => self.out.dropped.push(rel),
                (Harvest::Unchanged, UpperKind::Directory { .. }) => self.dir(&rel)?,
                (Harvest::Unchanged, _) => {}
                (Harvest::Keep, UpperKind::Directory { .. }) => {
                    let made = self.into.join(&rel);
                    fs::create_dir_all(&made).map_err(|e| Error::io(&made, e))?;
                    self.dir(&rel)?;
                }
                (Harvest::Keep, _) => {
                    check_total(self.bytes, meta.len(), self.limits, &rel)?;
                    self.bytes += meta.len();
                    copy_file(&path, &self.into.join(&rel), &meta)?;
                    self.out.files.push(rel);
                }
            }
        }
        Ok(())
    }
}

/// What an upper entry is, from its metadata and overlay attributes.
fn observe(path: &Path, meta: &fs::Metadata) -> UpperKind {
    let ft = meta.file_type();
    if ft.is_dir() {
        UpperKind::Directory {
            opaque: overlay_xattr(path, "opaque").is_some_and(|v| v == b"y"),
            redirect: overlay_xattr(path, "redirect").is_some(),
        }
    } else if ft.is_file() {
        UpperKind::File {
            whiteout_xattr: overlay_xattr(path, "whiteout").is_some(),
            linked: meta.nlink() > 1,
        }
    } else if ft.is_char_device() && meta.rdev() == 0 {
        UpperKind::Whiteout
    } else if ft.is_symlink() {
        UpperKind::Symlink
    } else {
        UpperKind::Special
    }
}

/// The value of overlayfs' attribute `name`, in its `trusted.` form (the
/// default) or `user.` form (unprivileged and `userxattr` mounts); `None`
/// when neither is set or readable. A value longer than a path is
/// returned empty.
fn overlay_xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    ["trusted", "user"].iter().find_map(|ns| {
        let mut buf = vec![0u8; 4096];
        match rustix::fs::lgetxattr(path, format!("{ns}.overlay.{name}").as_str(), &mut buf[..]) {
            Ok(len) => {
                buf.truncate(len);
                Some(buf)
            }
            Err(rustix::io::Errno::RANGE) => Some(Vec::new()),
            Err(_) => None,
        }
    })
}

/// What the lower holds where the upper has `upper` (with `meta`).
fn in_lower(lower: &Path, upper: &Path, meta: &fs::Metadata) -> Result<InLower, Error> {
    let there = match fs::symlink_metadata(lower) {
        Ok(there) => there,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(InLower::Absent),
        Err(e) => return Err(Error::io(lower, e)),
    };
    Ok(if there.is_dir() {
        InLower::Directory
    } else if !there.is_file() {
        InLower::Other
    } else if meta.is_file() && there.len() == meta.len() && same_content(lower, upper)? {
        InLower::SameFile
    } else {
        InLower::OtherFile
    })
}

/// Whether two regular files hold the same bytes.
fn same_content(a: &Path, b: &Path) -> Result<bool, Error> {
    let open = |p: &Path| {
        fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(p)
            .map_err(|e| Error::io(p, e))
    };
    let (mut fa, mut fb) = (open(a)?, open(b)?);
    let (mut ba, mut bb) = (vec![0u8; 1 << 16], vec![0u8; 1 << 16]);
    loop {
        let na = read_full(&mut fa, &mut ba).map_err(|e| Error::io(a, e))?;
        let nb = read_full(&mut fb, &mut bb).map_err(|e| Error::io(b, e))?;
        if na != nb || ba[..na] != bb[..nb] {
            return Ok(false);
        }
        if na == 0 {
            return Ok(true);
        }
    }
}

fn read_full(f: &mut fs::File, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match io::Read::read(f, &mut buf[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

/// Copies the regular file `from` (not through a link) to `to`, keeping
/// whether it is executable and its mtime (which a kind whose tool
/// compares them carries in its layers, `Kind::keeps_mtimes`); its parents
/// are made.
fn copy_file(from: &Path, to: &Path, meta: &fs::Metadata) -> Result<(), Error> {
    if let Some(parent) = to.parent() {
        fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    }
    let mut src = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(from)
        .map_err(|e| Error::io(from, e))?;
    let mode = if meta.permissions().mode() & 0o111 != 0 {
        0o755
    } else {
        0o644
    };
    let mut dst = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(to)
        .map_err(|e| Error::io(to, e))?;
    io::copy(&mut src, &mut dst).map_err(|e| Error::io(to, e))?;
    if let Ok(mtime) = meta.modified() {
        dst.set_modified(mtime).map_err(|e| Error::io(to, e))?;
    }
    Ok(())
}

/// Rewrites the files of the delta at `delta` that bind to an absolute
/// path (Triton's group files), by the rules of the base's `kind`, so they
/// record `build_path`, the base's, instead of where the pod saw the tree.
/// Blocking.
fn relocate_to_base(kind: CacheKind, delta: &Path, build_path: &Path) -> Result<(), Error> {
    for (rel, bytes) in kind.rules().relocated(delta, build_path)? {
        let path = delta.join(rel);
        fs::write(&path, bytes).map_err(|e| Error::io(&path, e))?;
    }
    Ok(())
}

/// The base of a delta, as read and verified.
struct Base {
    pinned: ImageRef,
    repo: Repo,
    image: Image,
    config: Vec<u8>,
}

/// How the base of a delta is trusted before its layers are signed into
/// the delta image.
#[derive(Debug, Clone, Copy)]
pub enum BaseCheck<'a> {
    /// Its signature must verify by this policy (a base named by hand).
    Signed(&'a Policy),
    /// Its digest only: a base a node delivered, which the cache's own
    /// signature policy already allowed before delivery. The delta's
    /// signer vouches for the whole image, base layers included, as a
    /// capture's signer vouches for every file of its tree.
    Delivered,
}

/// Reads the base `base` names (by digest), and checks it as `check` says.
async fn read_base(
    base: &ImageRef,
    check: BaseCheck<'_>,
    registry: &RegistryOptions,
) -> Result<Base, CaptureError> {
    let Some(digest) = base.pinned_digest() else {
        return Err(CaptureError::Target {
            target: base.to_string(),
            reason: "the base of a delta is named by digest (REPO@sha256:…)",
        });
    };
    let repo = Repo::open(base, registry)?;
    let image = Image::fetch(&repo).await?;
    if image.digest != digest {
        return Err(Error::DigestMismatch {
            what: format!("the base {base}"),
            expected: digest.to_string(),
            actual: image.digest.to_string(),
        }
        .into());
    }
    let pinned = base.with_digest(&digest);
    if let BaseCheck::Signed(policy) = check {
        verify(&pinned, registry, &digest, policy)
            .await
            .map_err(|source| CaptureError::BaseNotVerified {
                base: pinned.to_string(),
                source,
            })?;
    }
    let config = repo.fetch_small_blob(&image.manifest.config.digest).await?;
    Ok(Base {
        pinned,
        repo,
        image,
        config,
    })
}

/// Captures the upper `upper` of a writable view of `base` (a cache image
/// named by digest, checked as `base_check` says) as a delta image in
/// `target`, signed with `key`; see the [module documentation](self).
/// `base_build_path` is where the base was built when its labels do not
/// say (the [`gkm_core::delta::DeltaBase`] record's).
#[allow(clippy::too_many_arguments)]
pub async fn capture_delta(
    upper: &Path,
    base: &ImageRef,
    base_build_path: Option<&Path>,
    base_check: BaseCheck<'_>,
    target: &ImageRef,
    key: &SigningKey,
    options: &CaptureOptions,
    registry: &RegistryOptions,
    progress: Option<Progress>,
) -> Result<Captured, CaptureError> {
    in_work_dir(target, options, "gkm-delta-", move |work| async move {
        fs::create_dir_all(&work).map_err(|e| Error::io(&work, e))?;
        let p = progress.as_ref();
        step(p, &format!("reading and verifying the base {base}"), None);
        let base = read_base(base, base_check, registry).await?;
        let labels = base.image.cache()?;
        let layout = KindLayout::of(labels.kind);
        let build_path = labels
            .build_path
            .as_deref()
            .map(PathBuf::from)
            .or_else(|| base_build_path.map(Path::to_path_buf));
        let tree = work.join("tree");
        let unpack = UnpackOptions {
            policy: ExtractPolicy::default(),
            no_sync: true,
            progress: progress.clone(),
        };
        extract_to_dir(&base.repo, &base.image, &tree, &unpack).await?;

        step(
            p,
            &format!("harvesting {} against the base", upper.display()),
            None,
        );
        let delta = work.join("delta");
        let (harvested, stats) = {
            let (upper, tree, delta) = (upper.to_path_buf(), tree.clone(), delta.clone());
            let limits = options.limits.clone();
            let build_path = build_path.clone();
            let root = layout.cache_dir;
            let kind = labels.kind;
            tokio::task::spawn_blocking(move || -> Result<_, CaptureError> {
                fs::create_dir(&delta).map_err(|e| Error::io(&delta, e))?;
                let harvested = harvest_upper(&upper, &tree, &delta, &limits)?;
                if harvested.files.is_empty() {
                    return Err(Error::Cache(gkm_core::cache::CacheError::NotACache {
                        path: upper.clone(),
                        expected: "new cache files on top of the base".into(),
                    })
                    .into());
                }
                if let Some(to) = &build_path {
                    relocate_to_base(kind, &delta, to)?;
                }
                let stats = check_tree(&delta, &limits)?;
                check_prefixed_paths(&stats, root, &limits)?;
                Ok((harvested, stats))
            })
            .await
            .map_err(Error::from)??
        };

        reach(target, registry, p).await?;
        step(
            p,
            &format!(
                "packing {} new files, {} bytes, on {} base layer(s)",
                stats.files,
                stats.bytes,
                base.image.manifest.layers.len()
            ),
            None,
        );
        let packed = {
            let title = options
                .title
                .clone()
                .unwrap_or_else(|| target.default_title());
            let input = PackInput {
                work: work.to_path_buf(),
                tree,
                delta,
                layout,
                base_pinned: base.pinned.to_string(),
                base_manifest: base.image.manifest.clone(),
                base_labels: base.image.labels.clone(),
                base_config: base.config.clone(),
                title,
                options: options.clone(),
            };
            tokio::task::spawn_blocking(move || pack(input))
                .await
                .map_err(Error::from)??
        };

        let pinned = target.with_digest(&packed.manifest.digest);
        let dest = Repo::create(&pinned, registry)?;
        step(p, &format!("sharing the base's layers with {target}"), None);
        for layer in &base.image.manifest.layers {
            if !dest.has_blob(&layer.digest).await? {
                let (source, _) = base.repo.open_blob_from(&layer.digest, 0).await?;
                dest.put_blob(&layer.digest, layer.size, source).await?;
            }
        }
        let published = publish(
            &work.join("layout"),
            &packed.manifest,
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
            digest: packed.manifest.digest.clone(),
            tree: stats,
            cache: packed.cache,
            layer: packed.layer,
            signature: published.signature,
            verified: published.verified,
            gpu: packed.gpu,
            delta: Some(DeltaOf {
                base: base.pinned.to_string(),
                base_digest: base.image.digest.clone(),
                base_layers: base.image.manifest.layers.len(),
                files: harvested.files,
                dropped: harvested.dropped,
            }),
        })
    })
    .await
}

/// What packing a delta needs.
struct PackInput {
    work: PathBuf,
    /// The base's tree, which becomes the whole's.
    tree: PathBuf,
    /// The delta's files.
    delta: PathBuf,
    /// The cache directory of the layer (`io.triton.cache`).
    layout: KindLayout,
    base_pinned: String,
    base_manifest: Manifest,
    base_labels: BTreeMap<String, String>,
    base_config: Vec<u8>,
    title: String,
    options: CaptureOptions,
}

/// What packing a delta wrote.
struct Packed {
    manifest: RawManifest,
    layer: LayerInfo,
    cache: CacheManifest,
    gpu: Option<String>,
}

fn spec_err(what: &'static str) -> impl Fn(oci_spec::OciSpecError) -> Error {
    move |e| Error::format(what, e)
}

fn descriptor(media_type: &str, size: u64, digest: &Digest) -> Result<Descriptor, Error> {
    let digest: oci_spec::image::Digest = digest
        .as_str()
        .parse()
        .map_err(|e| Error::format("digest", e))?;
    Ok(Descriptor::new(MediaType::from(media_type), size, digest))
}

/// Writes the delta layer, merges the delta into the base's tree to label
/// the whole, and writes the config and manifest. Blocking.
fn pack(input: PackInput) -> Result<Packed, CaptureError> {
    let layout = Layout::create(input.work.join("layout"))?;
    let tmp = layout.temp_path();
    let compression = input.options.compression;
    let layer = match write_delta_layer(&input.delta, input.layout, compression, &tmp) {
        Ok(layer) => layer,
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            return Err(e.into());
        }
    };
    layout.commit_file(&tmp, &layer.digest)?;
    crate::store::extract::check_total(
        0,
        layer.cache_size_bytes,
        &input.options.limits,
        "(packed delta)",
    )?;

    crate::store::pipeline::add_layer(&input.delta, &input.tree, Path::new(""))?;
    let cache = gkm_core::cache::scan(&input.tree).map_err(Error::from)?;
    let build_path = gkm_core::cache::tree_build_path(&input.tree).map_err(Error::from)?;
    let whole: TreeStats = check_tree(&input.tree, &ExtractPolicy::default())?;
    let gpu = input
        .options
        .gpu
        .clone()
        .or_else(|| compiled_on(&cache.summary(), &input.options.gpus))
        .or_else(|| input.base_labels.get(COMPILED_ON_LABEL).cloned());

    let mut labels = input.base_labels.clone();
    labels.extend(cache_labels(
        &input.title,
        &cache,
        whole.bytes,
        build_path.as_deref(),
    ));
    if let Some(gpu) = &gpu {
        labels.insert(COMPILED_ON_LABEL.to_string(), gpu.clone());
    }
    labels.insert(BASE_LABEL.to_string(), input.base_pinned.clone());
    labels.insert(
        BASE_LAYERS_LABEL.to_string(),
        input.base_manifest.layers.len().to_string(),
    );

    let what = format!("config of the base {}", input.base_pinned);
    let mut config: serde_json::Value =
        serde_json::from_slice(&input.base_config).map_err(|e| Error::format(&what, e))?;
    let Some(doc) = config.as_object_mut() else {
        return Err(Error::format(&what, "not a JSON object").into());
    };
    let section = doc.entry("config").or_insert_with(|| serde_json::json!({}));
    if let Some(section) = section.as_object_mut() {
        section.insert(
            "Labels".into(),
            serde_json::to_value(&labels).map_err(|e| Error::format("labels", e))?,
        );
    }
    let rootfs = doc
        .entry("rootfs")
        .or_insert_with(|| serde_json::json!({"type": "layers", "diff_ids": []}));
    match rootfs.get_mut("diff_ids").and_then(|d| d.as_array_mut()) {
        Some(ids) => ids.push(serde_json::Value::String(layer.diff_id.to_string())),
        None => return Err(Error::format(&what, "no rootfs.diff_ids").into()),
    }
    let config_bytes = crate::json::canonical(&config)?;
    let config_digest = layout.write_blob(&config_bytes)?;

    let mut layers = Vec::new();
    for l in &input.base_manifest.layers {
        layers.push(descriptor(&l.media_type, l.size, &l.digest)?);
    }
    layers.push(descriptor(
        compression.media_type(),
        layer.size,
        &layer.digest,
    )?);
    let annotations: std::collections::HashMap<String, String> = labels.into_iter().collect();
    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(descriptor(
            crate::image::labels::OCI_CONFIG,
            config_bytes.len() as u64,
            &config_digest,
        )?)
        .layers(layers)
        .annotations(annotations)
        .build()
        .map_err(spec_err("image manifest"))?;
    let bytes = crate::json::canonical(&manifest)?;
    let digest = layout.write_blob(&bytes)?;
    Ok(Packed {
        manifest: RawManifest {
            digest,
            media_type: crate::image::labels::OCI_MANIFEST.into(),
            bytes,
        },
        layer,
        cache,
        gpu,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(upper: &Path, lower: &Path) -> gkm_core::delta::DeltaRefusal {
        let into = tempfile::tempdir().expect("tempdir");
        match harvest_upper(upper, lower, into.path(), &ExtractPolicy::default()) {
            Err(CaptureError::Delta(refusal)) => refusal,
            other => panic!("expected a delta refusal, got {other:?}"),
        }
    }

    fn set(path: &Path, name: &str, value: &[u8]) {
        rustix::fs::lsetxattr(path, name, value, rustix::fs::XattrFlags::empty())
            .expect("user extended attributes on the temporary directory's filesystem");
    }

    #[test]
    fn the_unprivileged_xattr_forms_of_whiteouts_and_opaque_directories_are_refused() {
        let work = tempfile::tempdir().expect("tempdir");
        let (upper, lower) = (work.path().join("upper"), work.path().join("lower"));
        fs::create_dir_all(lower.join("KEY")).expect("lower");
        fs::write(lower.join("KEY/k.cubin"), b"kernel").expect("lower file");
        fs::create_dir_all(upper.join("KEY")).expect("upper");

        fs::write(upper.join("KEY/k.cubin"), b"").expect("whiteout");
        set(&upper.join("KEY/k.cubin"), "user.overlay.whiteout", b"");
        let refusal = refused(&upper, &lower);
        assert_eq!(refusal.entry, "KEY/k.cubin");
        assert_eq!(refusal.kind, gkm_core::delta::RefusalKind::ChangesBase);

        fs::remove_file(upper.join("KEY/k.cubin")).expect("rm");
        set(&upper.join("KEY"), "user.overlay.opaque", b"y");
        let refusal = refused(&upper, &lower);
        assert_eq!(refusal.entry, "KEY");
        assert_eq!(refusal.kind, gkm_core::delta::RefusalKind::ChangesBase);
    }

    #[test]
    fn new_files_are_copied_out_and_scratch_and_identical_copy_ups_left() {
        let work = tempfile::tempdir().expect("tempdir");
        let (upper, lower, into) = (
            work.path().join("upper"),
            work.path().join("lower"),
            work.path().join("into"),
        );
        fs::create_dir_all(lower.join("OLD")).expect("lower");
        fs::write(lower.join("OLD/a.json"), b"same").expect("lower file");
        fs::create_dir_all(upper.join("OLD")).expect("upper");
        fs::write(upper.join("OLD/a.json"), b"same").expect("copy-up");
        fs::write(upper.join("OLD/b.json"), b"new").expect("new beside");
        fs::create_dir_all(upper.join("NEW/tmp.pid_1_2")).expect("tmp");
        fs::write(upper.join("NEW/k.cubin"), b"kernel").expect("new");
        fs::write(upper.join("NEW/tmp.pid_1_2/x"), b"half").expect("tmp file");
        fs::write(upper.join("NEW.lock"), b"").expect("lock");
        fs::create_dir(&into).expect("into");
        let harvested =
            harvest_upper(&upper, &lower, &into, &ExtractPolicy::default()).expect("harvest");
        assert_eq!(harvested.files, ["NEW/k.cubin", "OLD/b.json"]);
        assert_eq!(harvested.dropped, ["NEW.lock", "NEW/tmp.pid_1_2"]);
        assert!(!into.join("OLD/a.json").exists());
        assert_eq!(
            fs::read(into.join("NEW/k.cubin")).expect("copied"),
            b"kernel"
        );
    }
}

//! Building a cache image: scan, deterministic layer, config with labels,
//! OCI manifest with the summary in its annotations.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use gkm_core::cache::{CacheManifest, Declared};
use oci_spec::image::{
    Arch, ConfigBuilder, Descriptor, ImageConfigurationBuilder, ImageManifestBuilder, MediaType,
    Os, RootFsBuilder,
};

use crate::error::{Error, Result};
use crate::image::copy::copy_image;
use crate::image::erofs::ErofsLayer;
use crate::image::erofs::write::{ErofsWriter, write_twin};
use crate::image::labels::{Compression, cache_labels};
use crate::image::layer::{LayerInfo, write_layer};
use crate::json;
use crate::progress::{Progress, step};
use crate::registry::layout::{Layout, tmp_name};
use crate::registry::reference::{ImageRef, Selector};
use crate::registry::repo::{RawManifest, RegistryOptions, Repo};
use gkm_core::digest::Digest;

/// How to build an image.
#[derive(Debug, Clone, Default)]
pub struct BuildOptions {
    /// Layer compression (gzip by default, which MCV and GKM's extractor
    /// read; zstd on request).
    pub compression: Compression,
    /// The `org.opencontainers.image.title` label; defaults to the last
    /// component of the destination's repository or layout directory.
    pub title: Option<String>,
    /// What the builder declares about a PyTorch cache (Inductor,
    /// Mega-Cache) that its tree does not state: labelled `declared-*`.
    pub declared: Declared,
    /// Also write each layer's EROFS twin with this writer
    /// ([`crate::image::erofs`]); `None` (the default): the tar layer only.
    pub erofs: Option<ErofsWriter>,
}

/// The layer formats a build writes: the tar layer's compression and,
/// when a writer is given, its EROFS twin.
#[derive(Debug, Clone, Default)]
pub struct Formats {
    /// The tar layer's compression.
    pub compression: Compression,
    /// The EROFS twin's writer, if one is written.
    pub erofs: Option<ErofsWriter>,
}

impl From<Compression> for Formats {
    fn from(compression: Compression) -> Formats {
        Formats {
            compression,
            erofs: None,
        }
    }
}

impl BuildOptions {
    fn formats(&self) -> Formats {
        Formats {
            compression: self.compression,
            erofs: self.erofs.clone(),
        }
    }
}

/// What a build produced.
#[derive(Debug, Clone)]
pub struct Built {
    /// The image (manifest) digest.
    pub digest: Digest,
    /// The manifest as written.
    pub manifest: RawManifest,
    /// The layer.
    pub layer: LayerInfo,
    /// The layer's EROFS twin, when one was written.
    pub erofs: Option<ErofsLayer>,
    /// The config labels (also the manifest annotations).
    pub labels: BTreeMap<String, String>,
    /// The scanned cache manifest stored in the layer.
    pub cache: CacheManifest,
}

fn oci_digest(d: &Digest) -> Result<oci_spec::image::Digest> {
    d.as_str().parse().map_err(|e| Error::format("digest", e))
}

fn spec_err(what: &'static str) -> impl Fn(oci_spec::OciSpecError) -> Error {
    move |e| Error::format(what, e)
}

/// Build the image of `cache_dir` into `layout`, tagged `tag` when given.
/// Blocking: call from a blocking thread.
pub fn build_into_layout(
    cache_dir: &Path,
    layout: &Layout,
    tag: Option<&str>,
    title: &str,
    compression: Compression,
) -> Result<Built> {
    build_declared_into_layout(
        cache_dir,
        &Declared::default(),
        layout,
        tag,
        title,
        &compression.into(),
    )
}

/// The manifest of the cache at `cache_dir` (a directory, or one
/// Mega-Cache blob) with what its builder declared.
fn scan_declared(cache_dir: &Path, declared: &Declared) -> Result<CacheManifest> {
    let mut cache = gkm_core::cache::scan(cache_dir)?;
    cache.declare(cache_dir, declared)?;
    Ok(cache)
}

/// [`build_into_layout`] with what the builder declares about a PyTorch
/// cache. Blocking: call from a blocking thread.
fn build_declared_into_layout(
    cache_dir: &Path,
    declared: &Declared,
    layout: &Layout,
    tag: Option<&str>,
    title: &str,
    formats: &Formats,
) -> Result<Built> {
    let cache = scan_declared(cache_dir, declared)?;
    build_scanned_into_layout(
        cache_dir,
        cache,
        layout,
        tag,
        title,
        formats,
        &BTreeMap::new(),
    )
}

/// [`build_into_layout`] of a cache already scanned into `cache`, in
/// `formats`, with `extra_labels` added to the config labels and manifest
/// annotations (the cache's own labels win a clash). Blocking: call from a
/// blocking thread.
pub fn build_scanned_into_layout(
    cache_dir: &Path,
    cache: CacheManifest,
    layout: &Layout,
    tag: Option<&str>,
    title: &str,
    formats: &Formats,
    extra_labels: &BTreeMap<String, String>,
) -> Result<Built> {
    let compression = formats.compression;
    if cache_dir.is_file() {
        let staged = stage_file(cache_dir, layout)?;
        let result =
            build_scanned_into_layout(&staged, cache, layout, tag, title, formats, extra_labels);
        let _ = std::fs::remove_dir_all(&staged);
        return result;
    }
    if formats.erofs.is_some() && cache.kind().rules().keeps_mtimes() {
        return Err(Error::Unpackable {
            path: cache_dir.to_path_buf(),
            reason: format!(
                "{} cache is found again only with its files' modification times (ninja \
                 compares them), which an EROFS twin (timestamps 0) does not keep: build it \
                 without --erofs",
                cache.kind().rules().title()
            ),
        });
    }
    let build_path = gkm_core::cache::tree_build_path(cache_dir)?;
    let tmp = layout.temp_path();
    let layer = match write_layer(cache_dir, &cache, compression, &tmp) {
        Ok(layer) => layer,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    layout.commit_file(&tmp, &layer.digest)?;
    let erofs = match &formats.erofs {
        Some(writer) => Some(write_layout_twin(writer, layout, &layer)?),
        None => None,
    };

    let mut labels = extra_labels.clone();
    labels.extend(cache_labels(
        title,
        &cache,
        layer.cache_size_bytes,
        build_path.as_deref(),
    ));
    let hash_labels: HashMap<String, String> = labels.clone().into_iter().collect();
    let config = ImageConfigurationBuilder::default()
        .architecture(Arch::Amd64)
        .os(Os::Linux)
        .config(
            ConfigBuilder::default()
                .labels(hash_labels.clone())
                .build()
                .map_err(spec_err("image config"))?,
        )
        .rootfs(
            RootFsBuilder::default()
                .typ("layers")
                .diff_ids(vec![layer.diff_id.to_string()])
                .build()
                .map_err(spec_err("image config"))?,
        )
        .build()
        .map_err(spec_err("image config"))?;
    let config_bytes = json::canonical(&config)?;
    let config_digest = layout.write_blob(&config_bytes)?;

    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(Descriptor::new(
            MediaType::ImageConfig,
            config_bytes.len() as u64,
            oci_digest(&config_digest)?,
        ))
        .layers(vec![layer_descriptor(&layer, erofs.as_ref())?])
        .annotations(hash_labels)
        .build()
        .map_err(spec_err("image manifest"))?;
    let bytes = json::canonical(&manifest)?;
    let digest = layout.write_blob(&bytes)?;
    let raw = RawManifest {
        digest: digest.clone(),
        media_type: crate::image::labels::OCI_MANIFEST.into(),
        bytes,
    };
    if let Some(tag) = tag {
        let desc = Descriptor::new(
            MediaType::ImageManifest,
            raw.bytes.len() as u64,
            oci_digest(&digest)?,
        );
        layout.tag(tag, &desc)?;
    }
    Ok(Built {
        digest,
        manifest: raw,
        layer,
        erofs,
        labels,
        cache,
    })
}

/// The descriptor of `layer`, naming its EROFS twin when it has one.
fn layer_descriptor(layer: &LayerInfo, erofs: Option<&ErofsLayer>) -> Result<Descriptor> {
    let mut d = Descriptor::new(
        MediaType::from(layer.compression.media_type()),
        layer.size,
        oci_digest(&layer.digest)?,
    );
    if let Some(twin) = erofs {
        d.set_annotations(Some(twin.annotations().into_iter().collect()));
    }
    Ok(d)
}

/// Writes the EROFS twin of `layer`, a blob of `layout`, into `layout`.
fn write_layout_twin(
    writer: &ErofsWriter,
    layout: &Layout,
    layer: &LayerInfo,
) -> Result<ErofsLayer> {
    let tmp = layout.temp_path();
    let twin = write_twin(
        writer,
        &layout.blob_path(&layer.digest),
        layer.compression,
        &layer.diff_id,
        &layout.temp_path(),
        &tmp,
    )?;
    if let Err(e) = layout.commit_file(&tmp, &twin.digest) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(twin)
}

/// Stages a cache that is one file (a Mega-Cache blob) alone in a new
/// directory of the layout, so the image holds it under its own name
/// (`io.megacache.cache/<name>`); the directory, which the caller removes.
fn stage_file(file: &Path, layout: &Layout) -> Result<PathBuf> {
    let name = file.file_name().ok_or_else(|| Error::Unpackable {
        path: file.to_path_buf(),
        reason: "a cache file needs a name".into(),
    })?;
    let staged = layout.temp_path();
    std::fs::create_dir(&staged).map_err(|e| Error::io(&staged, e))?;
    let inside = staged.join(name);
    let linked = std::fs::hard_link(file, &inside)
        .or_else(|_| std::fs::copy(file, &inside).map(drop))
        .map_err(|e| Error::io(&inside, e));
    if let Err(e) = linked {
        let _ = std::fs::remove_dir_all(&staged);
        return Err(e);
    }
    Ok(staged)
}

/// Build the image of `cache_dir` and write it to `dest`: an OCI layout
/// directly, a registry through a temporary layout.
pub async fn build(
    cache_dir: &Path,
    dest: &ImageRef,
    options: &BuildOptions,
    registry: &RegistryOptions,
) -> Result<Built> {
    build_with_progress(cache_dir, dest, options, registry, None).await
}

/// [`build`], telling `progress` its steps: scanning and compressing, then
/// (to a registry) the bytes sent.
pub async fn build_with_progress(
    cache_dir: &Path,
    dest: &ImageRef,
    options: &BuildOptions,
    registry: &RegistryOptions,
    progress: Option<Progress>,
) -> Result<Built> {
    step(
        progress.as_ref(),
        &format!("scanning and compressing {}", cache_dir.display()),
        None,
    );
    let title = options
        .title
        .clone()
        .unwrap_or_else(|| dest.default_title());
    let cache_dir = cache_dir.to_path_buf();
    let formats = options.formats();
    let declared = options.declared.clone();
    match dest {
        ImageRef::Layout { path, selector } => {
            let tag = match selector {
                Selector::Tag(t) => t.clone(),
                Selector::Digest(_) => {
                    return Err(Error::Reference {
                        input: dest.to_string(),
                        reason: "a build destination needs a tag, not a digest".into(),
                    });
                }
            };
            let path = path.clone();
            tokio::task::spawn_blocking(move || {
                // Scanned first, so that a tree refused leaves no layout.
                let cache = scan_declared(&cache_dir, &declared)?;
                let layout = Layout::create(&path)?;
                build_scanned_into_layout(
                    &cache_dir,
                    cache,
                    &layout,
                    Some(&tag),
                    &title,
                    &formats,
                    &BTreeMap::new(),
                )
            })
            .await?
        }
        ImageRef::Registry(_) => {
            let tmp = std::env::temp_dir().join(tmp_name("gkm-build-"));
            let result = build_via(
                &tmp, cache_dir, declared, title, formats, dest, registry, progress,
            )
            .await;
            let _ = tokio::fs::remove_dir_all(&tmp).await;
            result
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn build_via(
    tmp: &Path,
    cache_dir: PathBuf,
    declared: Declared,
    title: String,
    formats: Formats,
    dest: &ImageRef,
    registry: &RegistryOptions,
    progress: Option<Progress>,
) -> Result<Built> {
    let tmp_path = tmp.to_path_buf();
    let built = tokio::task::spawn_blocking(move || {
        let layout = Layout::create(&tmp_path)?;
        build_declared_into_layout(
            &cache_dir,
            &declared,
            &layout,
            Some("build"),
            &title,
            &formats,
        )
    })
    .await??;
    let src = Repo::open(
        &ImageRef::Layout {
            path: tmp.to_path_buf(),
            selector: Selector::Tag("build".into()),
        },
        registry,
    )?;
    let dst = Repo::create(dest, registry)?;
    copy_image(&src, &dst, progress).await?;
    Ok(built)
}

/// Builds one image per cache directory of `cache_dirs` and assembles them
/// into one multi-target image at `dest` ([`crate::assemble`]), the
/// variants in the order given. Nothing is written to `dest` when a
/// directory cannot be built or the variants cannot be one image (two of
/// them sharing a target, say).
pub async fn build_multi(
    cache_dirs: &[PathBuf],
    dest: &ImageRef,
    options: &BuildOptions,
    registry: &RegistryOptions,
    progress: Option<Progress>,
) -> Result<crate::image::multi::MultiTarget> {
    let tmp = std::env::temp_dir().join(tmp_name("gkm-build-multi-"));
    let result = build_multi_via(&tmp, cache_dirs, dest, options, registry, progress).await;
    let _ = tokio::fs::remove_dir_all(&tmp).await;
    result
}

async fn build_multi_via(
    tmp: &Path,
    cache_dirs: &[PathBuf],
    dest: &ImageRef,
    options: &BuildOptions,
    registry: &RegistryOptions,
    progress: Option<Progress>,
) -> Result<crate::image::multi::MultiTarget> {
    let title = options
        .title
        .clone()
        .unwrap_or_else(|| dest.default_title());
    let mut sources = Vec::new();
    for (n, dir) in cache_dirs.iter().enumerate() {
        step(
            progress.as_ref(),
            &format!("scanning and compressing {}", dir.display()),
            None,
        );
        let (path, dir, title, formats, declared) = (
            tmp.to_path_buf(),
            dir.clone(),
            title.clone(),
            options.formats(),
            options.declared.clone(),
        );
        let tag = format!("variant-{n}");
        let built_tag = tag.clone();
        tokio::task::spawn_blocking(move || {
            let layout = Layout::create(&path)?;
            build_declared_into_layout(&dir, &declared, &layout, Some(&built_tag), &title, &formats)
        })
        .await??;
        sources.push(ImageRef::Layout {
            path: tmp.to_path_buf(),
            selector: Selector::Tag(tag),
        });
    }
    crate::image::assemble::assemble(&sources, dest, Some(&title), registry, progress).await
}

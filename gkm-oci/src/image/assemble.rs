//! Assembling single-target cache images into one multi-target image
//! ([`assemble`]), and completing a read one's variants from their
//! manifests ([`MultiTarget::complete`]).

use std::collections::{BTreeMap, HashMap};

use oci_spec::image::{Arch, Descriptor, ImageIndexBuilder, MediaType, Os, PlatformBuilder};

use crate::error::{Error, Result};
use crate::image::Image;
use crate::image::copy::copy_image;
use crate::image::labels::{CacheLabels, OCI_INDEX, TITLE};
use crate::image::multi::{MultiTarget, check_variants};
use crate::json;
use crate::progress::Progress;
use crate::registry::reference::ImageRef;
use crate::registry::repo::{RawManifest, RegistryOptions, Repo};
use gkm_core::digest::Digest;
use gkm_core::image_layout::KindLayout;

impl MultiTarget {
    /// Reads, from `image`'s repository, the cache labels of the variants whose
    /// descriptors carry none (one manifest request each, and its config
    /// when its manifest lacks them too).
    pub async fn complete(&mut self, image: &ImageRef, registry: &RegistryOptions) -> Result<()> {
        for variant in self.variants.iter_mut().filter(|v| v.cache.is_none()) {
            let pinned = Repo::open(&image.with_digest(&variant.digest), registry)?;
            let read = Image::fetch_annotated(&pinned).await?;
            if read.index_digest.is_some() {
                return Err(Error::format(
                    format!("variant {} of {image}", variant.digest),
                    "nested indexes are not supported",
                ));
            }
            variant.cache = Some(read.cache()?);
        }
        Ok(())
    }
}

/// The annotations a variant's descriptor carries: its cache labels and
/// title, from its manifest annotations or, failing those, its config
/// labels.
fn descriptor_annotations(image: &Image) -> BTreeMap<String, String> {
    let source = if CacheLabels::read(&image.manifest.annotations).is_ok() {
        &image.manifest.annotations
    } else {
        &image.labels
    };
    let prefixes: Vec<String> = KindLayout::from_labels(source)
        .map(|l| format!("{}/", l.label_prefix))
        .into_iter()
        .collect();
    source
        .iter()
        .filter(|(k, _)| k.as_str() == TITLE || prefixes.iter().any(|p| k.starts_with(p)))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Assembles the single-target cache images `sources` into one multi-target
/// image at `dest`: each variant's blobs and manifest are copied into
/// `dest`'s repository (by digest, byte for byte, so each keeps its digest),
/// then the index, annotated with each variant's cache labels, is written
/// under `dest`'s tag. `title` goes into the index's annotations.
///
/// Refused, before anything is written: no source, a source that is an
/// index or not a cache image, sources of different cache kinds, the same
/// image twice, or two variants sharing a target (a GPU would have no one
/// variant to get).
pub async fn assemble(
    sources: &[ImageRef],
    dest: &ImageRef,
    title: Option<&str>,
    registry: &RegistryOptions,
    progress: Option<Progress>,
) -> Result<MultiTarget> {
    if sources.is_empty() {
        return Err(Error::format(
            "multi-target image",
            "no variants: name at least one image",
        ));
    }
    let mut read = Vec::new();
    for source in sources {
        let repo = Repo::open(source, registry)?;
        let image = Image::fetch(&repo).await?;
        if image.index_digest.is_some() {
            return Err(Error::format(
                format!("variant {source}"),
                "is an index: name single-target cache images",
            ));
        }
        let cache = image
            .cache()
            .map_err(|e| Error::format(format!("variant {source}"), e))?;
        read.push((source, image, cache));
    }
    check_variants(
        &read
            .iter()
            .map(|(s, i, c)| (*s, &i.digest, c))
            .collect::<Vec<_>>(),
    )?;

    let mut descriptors = Vec::new();
    for (source, image, _) in &read {
        let src = Repo::open(&source.with_digest(&image.digest), registry)?;
        let dst = Repo::create(&dest.with_digest(&image.digest), registry)?;
        copy_image(&src, &dst, progress.clone()).await?;
        let annotations: HashMap<String, String> =
            descriptor_annotations(image).into_iter().collect();
        let mut d = Descriptor::new(
            MediaType::from(image.raw.media_type.as_str()),
            image.raw.bytes.len() as u64,
            oci_digest(&image.digest)?,
        );
        d.set_annotations(Some(annotations));
        d.set_platform(Some(
            PlatformBuilder::default()
                .architecture(Arch::Amd64)
                .os(Os::Linux)
                .build()
                .map_err(|e| Error::format("index platform", e))?,
        ));
        descriptors.push(d);
    }
    let mut builder = ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageIndex)
        .manifests(descriptors);
    if let Some(title) = title {
        builder = builder.annotations(HashMap::from([(TITLE.to_string(), title.to_string())]));
    }
    let index = builder
        .build()
        .map_err(|e| Error::format("image index", e))?;
    let bytes = json::canonical(&index)?;
    let raw = RawManifest {
        digest: Digest::of(&bytes),
        media_type: OCI_INDEX.to_string(),
        bytes,
    };
    Repo::create(dest, registry)?.put_manifest(&raw).await?;
    MultiTarget::parse(&raw)?.ok_or_else(|| {
        Error::format(
            "multi-target image",
            "the index written carries no cache labels",
        )
    })
}

fn oci_digest(d: &Digest) -> Result<oci_spec::image::Digest> {
    d.as_str().parse().map_err(|e| Error::format("digest", e))
}

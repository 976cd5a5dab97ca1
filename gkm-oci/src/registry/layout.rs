//! OCI image layout directories (`oci-layout`, `index.json`, `blobs/sha256/`).

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use oci_spec::image::{Descriptor, ImageIndex, ImageIndexBuilder, MediaType, OciLayoutBuilder};

use crate::error::{Error, Result};
use crate::json;
use crate::registry::reference::Selector;
use crate::registry::request::MAX_DOCUMENT_SIZE;
use gkm_core::digest::{Digest, HashingWriter};

/// The annotation an OCI layout names its images by.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// An OCI image layout directory.
#[derive(Debug, Clone)]
pub struct Layout {
    root: PathBuf,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A unique temporary name for this process.
pub(crate) fn tmp_name(prefix: &str) -> String {
    let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{prefix}{}-{n}-{nanos}", std::process::id())
}

impl Layout {
    /// Open an existing layout; fails if `root` has no `oci-layout` file.
    pub fn open(root: impl Into<PathBuf>) -> Result<Layout> {
        let root = root.into();
        let marker = root.join("oci-layout");
        if !marker.is_file() {
            return Err(Error::NotFound {
                what: "oci-layout file".into(),
                location: root.display().to_string(),
            });
        }
        Ok(Layout { root })
    }

    /// Open a layout, creating the directory and its skeleton if missing.
    pub fn create(root: impl Into<PathBuf>) -> Result<Layout> {
        let root = root.into();
        let blobs = root.join("blobs").join("sha256");
        fs::create_dir_all(&blobs).map_err(|e| Error::io(&blobs, e))?;
        let layout = Layout { root };
        let marker = layout.root.join("oci-layout");
        if !marker.exists() {
            let doc = OciLayoutBuilder::default()
                .image_layout_version("1.0.0")
                .build()
                .map_err(|e| Error::format("oci-layout", e))?;
            layout.write_atomic(&marker, &json::canonical(&doc)?)?;
        }
        let index = layout.root.join("index.json");
        if !index.exists() {
            layout.write_index(&empty_index()?)?;
        }
        Ok(layout)
    }

    /// The layout directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the blob `digest` lives.
    pub fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.root.join("blobs").join("sha256").join(digest.hex())
    }

    /// Whether the layout holds the blob `digest`.
    pub fn has_blob(&self, digest: &Digest) -> bool {
        self.blob_path(digest).is_file()
    }

    /// Read a whole blob of at most [`MAX_DOCUMENT_SIZE`] bytes (a manifest
    /// or config), checking its digest.
    pub fn read_blob(&self, digest: &Digest) -> Result<Vec<u8>> {
        use std::io::Read as _;
        let path = self.blob_path(digest);
        let file = File::open(&path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => Error::NotFound {
                what: format!("blob {digest}"),
                location: self.root.display().to_string(),
            },
            _ => Error::io(&path, e),
        })?;
        let mut bytes = Vec::new();
        file.take(MAX_DOCUMENT_SIZE as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| Error::io(&path, e))?;
        if bytes.len() > MAX_DOCUMENT_SIZE {
            return Err(Error::format(format!("blob {digest}"), "larger than 4 MiB"));
        }
        let actual = Digest::of(&bytes);
        if &actual != digest {
            return Err(Error::DigestMismatch {
                what: path.display().to_string(),
                expected: digest.to_string(),
                actual: actual.to_string(),
            });
        }
        Ok(bytes)
    }

    /// Store `bytes` as a blob; returns its digest.
    pub fn write_blob(&self, bytes: &[u8]) -> Result<Digest> {
        let mut w = self.blob_writer()?;
        w.write_all(bytes).map_err(|e| Error::io(&w.path, e))?;
        w.commit(None)
    }

    /// A writer for a new blob, committed under its digest.
    pub fn blob_writer(&self) -> Result<BlobWriter> {
        let path = self.root.join(tmp_name(".gkm-tmp-"));
        let file = File::create(&path).map_err(|e| Error::io(&path, e))?;
        Ok(BlobWriter {
            inner: Some(HashingWriter::new(io::BufWriter::with_capacity(
                1 << 20,
                file,
            ))),
            path,
            layout: self.clone(),
        })
    }

    /// A path for a temporary file to be moved in with [`Layout::commit_file`].
    pub fn temp_path(&self) -> PathBuf {
        self.root.join(tmp_name(".gkm-tmp-"))
    }

    /// Move a finished temporary file in as the blob `digest`.
    pub fn commit_file(&self, tmp: &Path, digest: &Digest) -> Result<()> {
        let dest = self.blob_path(digest);
        fs::rename(tmp, &dest).map_err(|e| Error::io(&dest, e))
    }

    /// Read `index.json`.
    pub fn index(&self) -> Result<ImageIndex> {
        let path = self.root.join("index.json");
        let bytes = fs::read(&path).map_err(|e| Error::io(&path, e))?;
        serde_json::from_slice(&bytes).map_err(|e| Error::format(path.display().to_string(), e))
    }

    /// The manifest descriptor `selector` names.
    pub fn resolve(&self, selector: &Selector) -> Result<Descriptor> {
        let index = self.index()?;
        let found = index.manifests().iter().find(|d| match selector {
            Selector::Tag(tag) => {
                d.annotations()
                    .as_ref()
                    .and_then(|a| a.get(REF_NAME))
                    .map(String::as_str)
                    == Some(tag.as_str())
            }
            Selector::Digest(digest) => d.digest().to_string() == digest.as_str(),
        });
        match (found, selector) {
            (Some(d), _) => Ok(d.clone()),
            // A digest that is not listed may still be a stored manifest.
            (None, Selector::Digest(digest)) if self.has_blob(digest) => {
                let size = fs::metadata(self.blob_path(digest))
                    .map(|m| m.len())
                    .unwrap_or(0);
                let d: oci_spec::image::Digest = digest
                    .as_str()
                    .parse()
                    .map_err(|e| Error::format("digest", e))?;
                Ok(Descriptor::new(MediaType::ImageManifest, size, d))
            }
            (None, _) => Err(Error::NotFound {
                what: format!("image {selector}"),
                location: self.root.display().to_string(),
            }),
        }
    }

    /// Record `descriptor` in `index.json` under `tag` (replacing what the
    /// tag named before).
    pub fn tag(&self, tag: &str, descriptor: &Descriptor) -> Result<()> {
        let index = self.index()?;
        let mut manifests: Vec<Descriptor> = index
            .manifests()
            .iter()
            .filter(|d| {
                d.annotations()
                    .as_ref()
                    .and_then(|a| a.get(REF_NAME))
                    .map(String::as_str)
                    != Some(tag)
            })
            .cloned()
            .collect();
        let mut d = descriptor.clone();
        let mut annotations: HashMap<String, String> = d.annotations().clone().unwrap_or_default();
        annotations.insert(REF_NAME.to_string(), tag.to_string());
        d.set_annotations(Some(annotations));
        manifests.push(d);
        let mut index = index;
        index.set_manifests(manifests);
        self.write_index(&index)
    }

    fn write_index(&self, index: &ImageIndex) -> Result<()> {
        self.write_atomic(&self.root.join("index.json"), &json::canonical(index)?)
    }

    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> Result<()> {
        let tmp = self.temp_path();
        fs::write(&tmp, bytes).map_err(|e| Error::io(&tmp, e))?;
        fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
    }
}

fn empty_index() -> Result<ImageIndex> {
    ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageIndex)
        .manifests(Vec::<Descriptor>::new())
        .build()
        .map_err(|e| Error::format("index.json", e))
}

/// A blob being written into a layout; see [`Layout::blob_writer`].
pub struct BlobWriter {
    inner: Option<HashingWriter<io::BufWriter<File>>>,
    path: PathBuf,
    layout: Layout,
}

impl BlobWriter {
    /// Finish the blob: check it against `expected` (when given) and move it
    /// into place. Returns its digest.
    pub fn commit(mut self, expected: Option<&Digest>) -> Result<Digest> {
        let Some(inner) = self.inner.take() else {
            return Err(Error::Task("blob writer already committed".into()));
        };
        let (buf, digest, _) = inner.finish();
        let file = buf
            .into_inner()
            .map_err(|e| Error::io(&self.path, e.into_error()))?;
        file.sync_all().map_err(|e| Error::io(&self.path, e))?;
        if let Some(expected) = expected
            && expected != &digest
        {
            return Err(Error::DigestMismatch {
                what: "blob".into(),
                expected: expected.to_string(),
                actual: digest.to_string(),
            });
        }
        self.layout.commit_file(&self.path, &digest)?;
        Ok(digest)
    }
}

impl Write for BlobWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.inner.as_mut() {
            Some(w) => w.write(buf),
            None => Err(io::Error::other("blob writer already committed")),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self.inner.as_mut() {
            Some(w) => w.flush(),
            None => Ok(()),
        }
    }
}

impl Drop for BlobWriter {
    fn drop(&mut self) {
        if self.inner.is_some() {
            let _ = fs::remove_file(&self.path);
        }
    }
}

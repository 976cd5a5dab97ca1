//! The `--json` documents of the commands that had none of their own
//! library type to print: one struct per command, camelCase keys, printed
//! as one pretty JSON document on standard output. Their shapes are listed
//! in docs/cli.md (`--json`); fields are only ever added.

use serde::Serialize;

/// Prints `doc` as one JSON document on standard output.
pub fn print<T: Serialize>(doc: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(doc)?);
    Ok(())
}

/// `gkm build --json`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Built {
    /// Where the image was written.
    pub reference: String,
    /// The image (manifest) digest.
    pub digest: String,
    /// The number of kernels (cache entries).
    pub entry_count: usize,
    /// The total size of the cache files.
    pub cache_size_bytes: u64,
    /// The compressed layer.
    pub layer: Blob,
    /// The layer's EROFS twin (`--erofs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub erofs: Option<ErofsBlob>,
    /// The targets, as `gkm inspect` names them.
    pub targets: Vec<String>,
}

/// An EROFS twin: its blob and how its files are compressed.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ErofsBlob {
    /// The blob.
    #[serde(flatten)]
    pub blob: Blob,
    /// How its files are compressed (`lz4hc`).
    pub compression: String,
}

/// A blob: its digest, size and media type.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Blob {
    /// The blob digest.
    pub digest: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its media type.
    pub media_type: String,
}

/// `gkm push --json` and `gkm pull IMAGE oci:PATH --json`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Copied {
    /// The image copied.
    pub source: String,
    /// Where it was copied to.
    pub destination: String,
    /// The image (manifest) digest, the same at both ends.
    pub digest: String,
}

/// `gkm pull IMAGE --store DIR --json`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stored {
    /// The image pulled.
    pub image: String,
    /// Its digest.
    pub digest: String,
    /// The tree in the store.
    pub path: String,
    /// Whether this pull extracted it (false: it was already stored).
    pub extracted: bool,
    /// Of a multi-target image, the index digest (`digest` is then the
    /// stored variant's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index_digest: Option<String>,
    /// Of a multi-target image, the stored variant's position in the index.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant: Option<usize>,
}

/// `gkm extract --json`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Extracted {
    /// The image extracted.
    pub image: String,
    /// Its digest.
    pub digest: String,
    /// The directory filled.
    pub output: String,
    /// Regular files written.
    pub files: u64,
    /// Bytes written.
    pub bytes: u64,
    /// Entries of the layer read (files, directories, links).
    pub entries: u64,
}

/// `gkm sign --json`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Signed {
    /// The image as given.
    pub image: String,
    /// The digest signed.
    pub digest: String,
    /// The signature format: `v2` or `v3`.
    pub format: String,
    /// The key's algorithm.
    pub algorithm: String,
    /// The key's fingerprint.
    pub fingerprint: String,
    /// Where the signature was written.
    pub signature: String,
}

/// `gkm build DIR... --json` (several directories) and `gkm index --json`:
/// a multi-target image.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Indexed {
    /// Where the index was written.
    pub reference: String,
    /// The index digest (what is signed).
    pub digest: String,
    /// The variants, in the index's order.
    pub variants: Vec<IndexedVariant>,
}

/// One variant of [`Indexed`].
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IndexedVariant {
    /// The variant's manifest digest.
    pub digest: String,
    /// Its targets, as `gkm inspect` names them.
    pub targets: Vec<String>,
    /// Its number of kernels, when labelled.
    pub entry_count: Option<u64>,
}

impl Indexed {
    /// The document for `multi`, written to `reference`.
    pub fn new(reference: &gkm_oci::ImageRef, multi: &gkm_oci::MultiTarget) -> Indexed {
        Indexed {
            reference: reference.to_string(),
            digest: multi.digest().to_string(),
            variants: multi
                .variants
                .iter()
                .map(|v| IndexedVariant {
                    digest: v.digest.to_string(),
                    targets: v
                        .summary()
                        .targets
                        .iter()
                        .map(ToString::to_string)
                        .collect(),
                    entry_count: v.cache.as_ref().and_then(|c| c.entry_count),
                })
                .collect(),
        }
    }

    /// Prints it: the whole document with `json`, else one line per variant
    /// on standard error and the index digest on standard output.
    pub fn print(&self, json: bool) -> anyhow::Result<()> {
        if json {
            return print(self);
        }
        eprintln!(
            "wrote {} with {} variant(s):",
            self.reference,
            self.variants.len()
        );
        for v in &self.variants {
            eprintln!("  {} {}", v.digest, v.targets.join(", "));
        }
        println!("{}", self.digest);
        Ok(())
    }
}

//! A tar layer's EROFS twin as its descriptor names it (see the [parent
//! module](super)): the annotations, the compression, [`ErofsLayer`].
//! Apart from the referrer, which reads image manifests, so that a
//! manifest's layers can name their twins.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::error::{Error, Result};
use gkm_core::digest::Digest;

/// The media type of an EROFS blob (an EROFS filesystem image; its
/// compression, if any, is inside it).
pub const MEDIA_TYPE: &str = "application/vnd.erofs";
/// The layer descriptor annotation naming its EROFS twin's digest.
pub const DIGEST_ANNOTATION: &str = "io.gkm.erofs.digest";
/// The layer descriptor annotation giving its EROFS twin's size in bytes.
pub const SIZE_ANNOTATION: &str = "io.gkm.erofs.size";
/// The layer descriptor annotation naming its EROFS twin's compression.
pub const COMPRESSION_ANNOTATION: &str = "io.gkm.erofs.compression";
/// The referrer's layer annotation naming the tar layer a twin is of.
pub const LAYER_ANNOTATION: &str = "io.gkm.erofs.layer";
/// The media type of the empty config of the referrer.
pub const EMPTY_CONFIG_TYPE: &str = "application/vnd.oci.empty.v1+json";
/// The empty config's bytes.
pub const EMPTY_CONFIG: &[u8] = b"{}";

/// How an EROFS twin's files are compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ErofsCompression {
    /// lz4hc: lz4's format, compressed harder at build time; the kernel
    /// decompresses it as fast as lz4.
    #[default]
    Lz4hc,
    /// Files stored uncompressed.
    None,
}

impl ErofsCompression {
    /// The name in the annotation.
    pub fn as_str(self) -> &'static str {
        match self {
            ErofsCompression::Lz4hc => "lz4hc",
            ErofsCompression::None => "none",
        }
    }
}

impl fmt::Display for ErofsCompression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ErofsCompression {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "lz4hc" => Ok(ErofsCompression::Lz4hc),
            "none" => Ok(ErofsCompression::None),
            other => Err(Error::format(
                format!("annotation {COMPRESSION_ANNOTATION}"),
                format!("{other:?}: expected lz4hc or none"),
            )),
        }
    }
}

/// A layer's EROFS twin, as its descriptor's annotations name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ErofsLayer {
    /// The blob's digest.
    pub digest: Digest,
    /// The blob's size in bytes.
    pub size: u64,
    /// How its files are compressed.
    pub compression: ErofsCompression,
}

impl ErofsLayer {
    /// The annotations a layer descriptor carries for this twin.
    pub fn annotations(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (DIGEST_ANNOTATION.to_string(), self.digest.to_string()),
            (SIZE_ANNOTATION.to_string(), self.size.to_string()),
            (
                COMPRESSION_ANNOTATION.to_string(),
                self.compression.to_string(),
            ),
        ])
    }

    /// The twin a layer descriptor's annotations name: `None` when they
    /// name none (no [`DIGEST_ANNOTATION`]); an error naming the annotation
    /// when one is missing or malformed. Never panics.
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Result<Option<ErofsLayer>> {
        let Some(digest) = annotations.get(DIGEST_ANNOTATION) else {
            return Ok(None);
        };
        let bad = |key: &str, reason: String| Error::format(format!("annotation {key}"), reason);
        let digest: Digest = digest
            .parse()
            .map_err(|e| bad(DIGEST_ANNOTATION, format!("{e}")))?;
        let size = annotations.get(SIZE_ANNOTATION).ok_or_else(|| {
            bad(
                SIZE_ANNOTATION,
                format!("missing beside {DIGEST_ANNOTATION}"),
            )
        })?;
        let size = size
            .parse::<u64>()
            .map_err(|e| bad(SIZE_ANNOTATION, format!("{size:?}: {e}")))?;
        let compression = annotations
            .get(COMPRESSION_ANNOTATION)
            .map(|c| c.parse())
            .transpose()?
            .unwrap_or_default();
        Ok(Some(ErofsLayer {
            digest,
            size,
            compression,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

    #[test]
    fn annotations_round_trip_and_a_partial_twin_is_an_error_naming_the_key() {
        let twin = ErofsLayer {
            digest: D.parse().unwrap(),
            size: 8192,
            compression: ErofsCompression::Lz4hc,
        };
        let mut a = twin.annotations();
        assert_eq!(ErofsLayer::from_annotations(&a).unwrap(), Some(twin));
        assert_eq!(
            ErofsLayer::from_annotations(&BTreeMap::new()).unwrap(),
            None
        );
        a.insert(SIZE_ANNOTATION.into(), "-1".into());
        let err = ErofsLayer::from_annotations(&a).unwrap_err().to_string();
        assert!(err.contains(SIZE_ANNOTATION), "{err}");
        a.remove(SIZE_ANNOTATION);
        let err = ErofsLayer::from_annotations(&a).unwrap_err().to_string();
        assert!(err.contains("missing"), "{err}");
        a.insert(SIZE_ANNOTATION.into(), "1".into());
        a.insert(COMPRESSION_ANNOTATION.into(), "zstd".into());
        let err = ErofsLayer::from_annotations(&a).unwrap_err().to_string();
        assert!(err.contains("zstd"), "{err}");
    }
}

//! Image references: a registry reference or an OCI image layout directory.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::error::Error;
use gkm_core::digest::Digest;

/// The prefix of OCI image layout references.
pub const LAYOUT_PREFIX: &str = "oci:";

/// The tag used when a reference names none.
pub const DEFAULT_TAG: &str = "latest";

/// Which image of a repository or layout a reference selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// A tag (in a layout: the `org.opencontainers.image.ref.name` annotation).
    Tag(String),
    /// A manifest digest.
    Digest(Digest),
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Selector::Tag(t) => write!(f, ":{t}"),
            Selector::Digest(d) => write!(f, "@{d}"),
        }
    }
}

/// Where an image lives.
///
/// Parsed from `oci:PATH[:TAG|@DIGEST]` for an OCI image layout directory,
/// and from anything else as a registry reference (`registry/repo[:tag][@digest]`,
/// Docker Hub names normalised as Docker does).
///
/// ```
/// use gkm_oci::{ImageRef, Selector};
/// let r: ImageRef = "oci:/tmp/cache:v1".parse().unwrap();
/// assert!(matches!(&r, ImageRef::Layout { selector: Selector::Tag(t), .. } if t == "v1"));
/// let r: ImageRef = "127.0.0.1:5000/caches/vector-add:cuda".parse().unwrap();
/// assert_eq!(r.to_string(), "127.0.0.1:5000/caches/vector-add:cuda");
/// assert!("oci:".parse::<ImageRef>().is_err());
/// assert!("Caches/x".parse::<ImageRef>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageRef {
    /// An image in a registry.
    Registry(oci_client::Reference),
    /// An image in an OCI image layout directory.
    Layout {
        /// The layout directory.
        path: PathBuf,
        /// Which image of the layout.
        selector: Selector,
    },
}

impl ImageRef {
    /// The name an image's title label defaults to: the last path component
    /// of the repository or layout directory.
    pub fn default_title(&self) -> String {
        match self {
            ImageRef::Registry(r) => r
                .repository()
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_string(),
            ImageRef::Layout { path, .. } => path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        }
    }

    /// The same image, selected by `digest`.
    pub fn with_digest(&self, digest: &Digest) -> ImageRef {
        match self {
            ImageRef::Registry(r) => ImageRef::Registry(oci_client::Reference::with_digest(
                r.registry().to_string(),
                r.repository().to_string(),
                digest.to_string(),
            )),
            ImageRef::Layout { path, .. } => ImageRef::Layout {
                path: path.clone(),
                selector: Selector::Digest(digest.clone()),
            },
        }
    }

    /// The digest the reference pins, if it pins one.
    pub fn pinned_digest(&self) -> Option<Digest> {
        match self {
            ImageRef::Registry(r) => r.digest().and_then(|d| d.parse().ok()),
            ImageRef::Layout {
                selector: Selector::Digest(d),
                ..
            } => Some(d.clone()),
            ImageRef::Layout { .. } => None,
        }
    }
}

fn valid_tag(tag: &str) -> bool {
    let mut chars = tag.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric() || c == '_')
        && tag.len() <= 128
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

impl FromStr for ImageRef {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason: &str| Error::Reference {
            input: s.to_string(),
            reason: reason.to_string(),
        };
        if let Some(rest) = s.strip_prefix(LAYOUT_PREFIX) {
            let (path, selector) = if let Some((path, digest)) = rest.rsplit_once('@') {
                (
                    path,
                    Selector::Digest(digest.parse().map_err(|_| bad("invalid digest after @"))?),
                )
            } else {
                // A tag follows the last ':' after the last '/'.
                let last = rest.rsplit('/').next().unwrap_or(rest);
                match last.rsplit_once(':') {
                    Some((_, tag)) => {
                        if !valid_tag(tag) {
                            return Err(bad(
                                "invalid tag: expected [A-Za-z0-9_][A-Za-z0-9._-]{0,127}",
                            ));
                        }
                        (
                            &rest[..rest.len() - tag.len() - 1],
                            Selector::Tag(tag.to_string()),
                        )
                    }
                    None => (rest, Selector::Tag(DEFAULT_TAG.to_string())),
                }
            };
            if path.is_empty() {
                return Err(bad("expected oci:PATH[:TAG] with a directory path"));
            }
            return Ok(ImageRef::Layout {
                path: PathBuf::from(path),
                selector,
            });
        }
        if s.is_empty() || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(bad(
                "expected REGISTRY/REPOSITORY[:TAG][@DIGEST] or oci:PATH[:TAG]",
            ));
        }
        let r: oci_client::Reference = s
            .parse()
            .map_err(|e: oci_client::ParseError| bad(&e.to_string()))?;
        // The parser normalises some names it would not read back (an
        // upper-case first component becomes a Docker Hub repository).
        if r.whole().parse::<oci_client::Reference>().is_err() {
            return Err(bad("repository names must be lowercase"));
        }
        if let Some(d) = r.digest() {
            d.parse::<Digest>()
                .map_err(|_| bad("only sha256 digests are supported"))?;
        }
        Ok(ImageRef::Registry(r))
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImageRef::Registry(r) => write!(f, "{}", r.whole()),
            ImageRef::Layout { path, selector } => {
                write!(f, "{LAYOUT_PREFIX}{}{selector}", path.display())
            }
        }
    }
}

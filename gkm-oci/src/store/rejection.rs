//! Why a layer is refused: the [`Rule`] an entry broke, the [`Rejection`]
//! naming it, and how a rejection travels through an `io::Read`.

use std::fmt;

/// The rule an entry broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// The path is absolute.
    AbsolutePath,
    /// The path contains `..`.
    ParentDir,
    /// The path is not UTF-8.
    NonUtf8Name,
    /// The path or a component is too long.
    NameTooLong,
    /// The path is outside the cache layout (`io.triton.cache/`, …).
    OutsideLayout,
    /// A device node, fifo, socket or other special entry.
    SpecialFile,
    /// A link, and links are not allowed.
    LinkNotAllowed,
    /// A link that points outside the tree.
    LinkEscape,
    /// The path goes through a link.
    ThroughLink,
    /// setuid, setgid or sticky bit, and the policy rejects them.
    SpecialBits,
    /// The same path appears twice, or clashes with an earlier entry.
    Duplicate,
    /// The entry is larger than `max_entry_size`.
    EntryTooLarge,
    /// The files add up to more than `max_total_size`.
    TotalTooLarge,
    /// More than `max_entries` entries.
    TooManyEntries,
    /// The layer decompresses to more than `max_compression_ratio` times its size.
    CompressionRatio,
    /// A long-name, long-link or PAX header larger than `max_header_size`.
    OversizedHeader,
    /// The archive is corrupt or truncated, or its headers contradict each other.
    Malformed,
    /// A layer after the first would overwrite an entry of an earlier one
    /// (a later layer may only add files).
    OverwritesEarlierLayer,
    /// A layer after the first holds a whiteout (`.wh.*`): it would delete
    /// an entry of an earlier one.
    DeletesEarlierLayer,
}

impl Rule {
    /// The rule's stable name, as printed.
    pub fn name(self) -> &'static str {
        match self {
            Rule::AbsolutePath => "absolute-path",
            Rule::ParentDir => "parent-dir",
            Rule::NonUtf8Name => "non-utf8-name",
            Rule::NameTooLong => "name-too-long",
            Rule::OutsideLayout => "outside-layout",
            Rule::SpecialFile => "special-file",
            Rule::LinkNotAllowed => "link-not-allowed",
            Rule::LinkEscape => "link-escape",
            Rule::ThroughLink => "through-link",
            Rule::SpecialBits => "special-bits",
            Rule::Duplicate => "duplicate",
            Rule::EntryTooLarge => "entry-too-large",
            Rule::TotalTooLarge => "total-too-large",
            Rule::TooManyEntries => "too-many-entries",
            Rule::CompressionRatio => "compression-ratio",
            Rule::OversizedHeader => "oversized-header",
            Rule::Malformed => "malformed",
            Rule::OverwritesEarlierLayer => "overwrites-earlier-layer",
            Rule::DeletesEarlierLayer => "deletes-earlier-layer",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a layer was refused: the entry, the rule, and details.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize)]
#[error("layer rejected: entry {entry:?}: {rule}: {detail}")]
pub struct Rejection {
    /// The entry's path as in the archive (non-UTF-8 bytes escaped).
    pub entry: String,
    /// The rule it broke.
    pub rule: Rule,
    /// What exactly was wrong.
    pub detail: String,
}

impl Rejection {
    pub(crate) fn new(entry: &str, rule: Rule, detail: impl Into<String>) -> Rejection {
        Rejection {
            entry: entry.to_string(),
            rule,
            detail: detail.into(),
        }
    }
}

/// An error that travels through `io::Read` as an `io::Error`.
#[derive(Debug)]
pub(crate) enum Carried {
    Rejected(Rejection),
    Source(String),
}

impl fmt::Display for Carried {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Carried::Rejected(r) => r.fmt(f),
            Carried::Source(s) => f.write_str(s),
        }
    }
}

impl std::error::Error for Carried {}

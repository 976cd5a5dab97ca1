//! Disk space: the free-space reserve and byte budget an extraction keeps,
//! checked once before it starts and again while it writes.
//!
//! The check before extraction estimates the tree from the image's
//! `cache-size-bytes` label, which the image's author controls. The label
//! can only raise that estimate above the compressed layer size, never
//! lower it; and a layer of a few kilobytes can still decompress to
//! gigabytes, so the estimate is only a first check. What bounds the tree
//! actually written is the extraction itself: it counts every entry and
//! byte as it is written, refusing the entry that would exceed the budget,
//! and asks the filesystem how much is free (`statvfs`) at least every
//! [`RECHECK_BYTES`], stopping before the reserve is reached, so that other
//! writers on the same filesystem count too.

use std::fmt;
use std::io;
use std::path::Path;

use gkm_core::bytes::InvalidBytes;

use crate::error::{Error, Result};
use crate::image::Image;

/// Every file's data is counted in blocks of this size, and every
/// directory and link as one block, as most filesystems allocate them.
pub const BLOCK: u64 = 4096;

/// The most bytes written between two looks at the filesystem's free space.
pub const RECHECK_BYTES: u64 = 4 << 20;

/// Why a size did not parse; each names the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidSize {
    /// Not a number of bytes.
    #[error("{0:?}: expected a number of bytes, with an optional KiB, MiB, GiB or TiB suffix")]
    NotBytes(String),
    /// More bytes than a `u64` holds.
    #[error("{0:?}: more bytes than 64 bits hold")]
    TooLarge(String),
}

/// Parses a number of bytes ([`gkm_core::bytes::parse_bytes`]): `1073741824`,
/// `1GiB`, `512 KiB`, `20Gi`.
///
/// ```
/// assert_eq!(gkm_oci::disk::parse_bytes("64GiB"), Ok(64 << 30));
/// assert_eq!(gkm_oci::disk::parse_bytes("4096"), Ok(4096));
/// assert!(gkm_oci::disk::parse_bytes("64GB").is_err());
/// ```
pub fn parse_bytes(s: &str) -> Result<u64, InvalidSize> {
    gkm_core::bytes::parse_bytes(s).map_err(InvalidSize::from)
}

pub use gkm_core::bytes::format_bytes;
pub use gkm_core::free_space::{FreeSpaceReserve, InvalidReserve};

impl From<InvalidBytes> for InvalidSize {
    fn from(e: InvalidBytes) -> InvalidSize {
        match e {
            InvalidBytes::TooLarge(s) => InvalidSize::TooLarge(s),
            InvalidBytes::NotBytes(s) => InvalidSize::NotBytes(s),
            // A kind gkm-core adds later reads as not bytes.
            _ => InvalidSize::NotBytes(e.to_string()),
        }
    }
}

/// The disk limit an extraction stopped at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpaceLimit {
    /// The caller's byte budget for the tree
    /// ([`crate::ExtractPolicy::byte_budget`]).
    Budget {
        /// The budget, in bytes.
        budget: u64,
    },
    /// The space that must stay free on the filesystem
    /// ([`crate::ExtractPolicy::free_space_reserve`]).
    Reserve {
        /// The reserve as configured.
        reserve: FreeSpaceReserve,
        /// The reserve in bytes on this filesystem.
        reserve_bytes: u64,
        /// Bytes free (to unprivileged writers) when extraction stopped.
        free: u64,
    },
}

/// An extraction stopped, or was refused before it began, to stay within a
/// disk limit. It is the source of an [`Error::Io`] of kind
/// [`io::ErrorKind::StorageFull`] naming the path being written;
/// [`Error::space_exceeded`] finds it. Nothing of the tree is kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct SpaceExceeded {
    /// Refused before extraction began, from the image's estimated size.
    pub estimated: bool,
    /// Bytes of file data written before extraction stopped.
    pub written: u64,
    /// Bytes the refused step needed: the entry or write, or the whole
    /// estimate before extraction.
    pub needed: u64,
    /// The limit it would have crossed.
    pub limit: SpaceLimit,
}

impl fmt::Display for SpaceExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.estimated {
            write!(
                f,
                "refused before extracting: the image's estimated {} bytes",
                self.needed
            )?;
        } else {
            write!(
                f,
                "stopped after writing {} bytes: {} more bytes",
                self.written, self.needed
            )?;
        }
        match &self.limit {
            SpaceLimit::Budget { budget } => {
                write!(f, " would exceed the tree's byte budget of {budget} bytes")
            }
            SpaceLimit::Reserve {
                reserve,
                reserve_bytes,
                free,
            } => write!(
                f,
                " would leave less than the free-space reserve of {reserve_bytes} bytes \
                 ({reserve} of the filesystem) free: {free} bytes free"
            ),
        }
    }
}

impl Error {
    /// The disk limit this error stopped at, when it is one.
    pub fn space_exceeded(&self) -> Option<&SpaceExceeded> {
        match self {
            Error::Io { source, .. } if source.kind() == io::ErrorKind::StorageFull => {
                source.get_ref()?.downcast_ref::<SpaceExceeded>()
            }
            _ => None,
        }
    }
}

/// The error for `exceeded` while writing `path`.
fn storage_full(path: &Path, exceeded: SpaceExceeded) -> Error {
    Error::io(path, io::Error::new(io::ErrorKind::StorageFull, exceeded))
}

/// The size and free space of a filesystem, in bytes.
#[derive(Debug, Clone, Copy)]
struct Space {
    /// Bytes free to unprivileged writers (`f_bavail`), as the kubelet
    /// counts `nodefs.available`.
    free: u64,
    /// The filesystem's size.
    size: u64,
}

/// The filesystem holding `dir`: its free space and size.
fn space(dir: &Path) -> Result<Space> {
    let st = rustix::fs::statvfs(dir).map_err(|e| Error::io(dir, e.into()))?;
    Ok(Space {
        free: st.f_bavail.saturating_mul(st.f_frsize),
        size: st.f_blocks.saturating_mul(st.f_frsize),
    })
}

/// `bytes` rounded up to whole blocks, and at least one block.
pub(crate) fn blocks(bytes: u64) -> u64 {
    bytes.div_ceil(BLOCK).max(1).saturating_mul(BLOCK)
}

/// The bytes the tree below `root` takes, counted as an extraction counts
/// them against its byte budget: each file's data in whole [`BLOCK`]s (a
/// file with several names once, then one block per further name), one
/// block per directory and link; `root` itself is not counted. What a node
/// agent sums to know how much of a node's or a namespace's budget its
/// stored trees use.
pub fn tree_usage(root: &Path) -> Result<u64> {
    use std::os::unix::fs::MetadataExt as _;
    let mut total = 0u64;
    let mut seen_inodes = std::collections::HashSet::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))? {
            let entry = entry.map_err(|e| Error::io(&dir, e))?;
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path).map_err(|e| Error::io(&path, e))?;
            let bytes = if meta.is_dir() {
                dirs.push(path);
                BLOCK
            } else if meta.is_file()
                && (meta.nlink() == 1 || seen_inodes.insert((meta.dev(), meta.ino())))
            {
                blocks(meta.len())
            } else {
                BLOCK
            };
            total = total.saturating_add(bytes);
        }
    }
    Ok(total)
}

/// Before extraction into `dir`: refuses `image` when its estimated tree
/// (its size label when it has one, and at least its compressed layer)
/// exceeds the policy's byte budget or would leave less than the reserve
/// free. See the module docs for why this estimate is only a first check.
pub(crate) fn check_free_space(
    dir: &Path,
    image: &Image,
    byte_budget: Option<u64>,
    reserve: FreeSpaceReserve,
) -> Result<()> {
    let layer: u64 = image.cache_layers()?.iter().map(|l| l.size).sum();
    let label = image
        .cache()
        .ok()
        .and_then(|labels| labels.cache_size_bytes)
        .unwrap_or(0);
    let needed = label.max(layer);
    let refuse = |limit| {
        storage_full(
            dir,
            SpaceExceeded {
                estimated: true,
                written: 0,
                needed,
                limit,
            },
        )
    };
    if let Some(budget) = byte_budget
        && needed > budget
    {
        return Err(refuse(SpaceLimit::Budget { budget }));
    }
    let space = space(dir)?;
    let reserve_bytes = reserve.bytes_of(space.size);
    if space.free.saturating_sub(needed) < reserve_bytes || space.free < needed {
        return Err(refuse(SpaceLimit::Reserve {
            reserve,
            reserve_bytes,
            free: space.free,
        }));
    }
    Ok(())
}

/// Counts what an extraction writes against its byte budget and keeps the
/// free-space reserve; see the module docs.
pub(crate) struct DiskGuard {
    /// Where the tree is written: the filesystem asked about.
    dir: std::path::PathBuf,
    budget: Option<u64>,
    reserve: FreeSpaceReserve,
    /// Bytes counted against the budget (whole blocks).
    counted: u64,
    /// Bytes of file data written.
    written: u64,
    /// Bytes that may still be written before the next look at the free
    /// space.
    allowance: u64,
}

impl DiskGuard {
    /// A guard for a tree written below `dir` within `budget` bytes,
    /// keeping `reserve` free.
    pub(crate) fn new(dir: &Path, budget: Option<u64>, reserve: FreeSpaceReserve) -> DiskGuard {
        DiskGuard {
            dir: dir.to_path_buf(),
            budget,
            reserve,
            counted: 0,
            written: 0,
            // The first write looks at the filesystem.
            allowance: 0,
        }
    }

    /// Admits an entry at `path` holding `data` bytes (0 for a directory
    /// or link) before anything of it is written: counts it against the
    /// budget, and its metadata block against the reserve.
    pub(crate) fn admit(&mut self, data: u64, path: &Path) -> Result<()> {
        self.count(blocks(data), path)?;
        self.room(BLOCK, path)
    }

    /// Admits `n` directories created implicitly for an entry at `path`.
    pub(crate) fn admit_dirs(&mut self, n: u64, path: &Path) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let bytes = n.saturating_mul(BLOCK);
        self.count(bytes, path)?;
        self.room(bytes, path)
    }

    /// Before `n` bytes of an admitted file's data are written to `path`.
    pub(crate) fn write(&mut self, n: u64, path: &Path) -> Result<()> {
        self.room(n, path)?;
        self.written += n;
        Ok(())
    }

    /// Bytes counted against the budget so far.
    pub(crate) fn counted(&self) -> u64 {
        self.counted
    }

    fn count(&mut self, bytes: u64, path: &Path) -> Result<()> {
        let total = self.counted.saturating_add(bytes);
        if let Some(budget) = self.budget
            && total > budget
        {
            return Err(storage_full(
                path,
                SpaceExceeded {
                    estimated: false,
                    written: self.written,
                    needed: bytes,
                    limit: SpaceLimit::Budget { budget },
                },
            ));
        }
        self.counted = total;
        Ok(())
    }

    /// Makes sure `n` more bytes leave the reserve free, looking at the
    /// filesystem when the allowance from the last look is spent.
    fn room(&mut self, n: u64, path: &Path) -> Result<()> {
        if n > self.allowance {
            let space = space(&self.dir)?;
            let reserve_bytes = self.reserve.bytes_of(space.size);
            let headroom = space.free.saturating_sub(reserve_bytes);
            if n > headroom {
                return Err(storage_full(
                    path,
                    SpaceExceeded {
                        estimated: false,
                        written: self.written,
                        needed: n,
                        limit: SpaceLimit::Reserve {
                            reserve: self.reserve,
                            reserve_bytes,
                            free: space.free,
                        },
                    },
                ));
            }
            self.allowance = headroom.min(RECHECK_BYTES.max(n));
        }
        self.allowance -= n;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_counts_whole_blocks_and_refuses_before_writing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut guard = DiskGuard::new(dir.path(), Some(3 * BLOCK), FreeSpaceReserve::NONE);
        let file = dir.path().join("f");
        guard.admit(1, &file).expect("one block");
        guard.write(1, &file).expect("written");
        guard.admit(0, &file).expect("a directory: one block");
        let err = guard.admit(BLOCK + 1, &file).expect_err("two blocks");
        let exceeded = err.space_exceeded().expect("a disk limit");
        assert_eq!(exceeded.written, 1);
        assert_eq!(exceeded.needed, 2 * BLOCK);
        assert_eq!(exceeded.limit, SpaceLimit::Budget { budget: 3 * BLOCK });
        let message = err.to_string();
        assert!(
            message.starts_with(&format!(
                "{}: stopped after writing 1 bytes",
                file.display()
            )) && message.contains("byte budget of 12288 bytes"),
            "{message}"
        );
    }

    #[test]
    fn tree_usage_counts_as_extraction_does() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::create_dir_all(root.join("a/b")).expect("dirs");
        std::fs::write(root.join("a/empty"), b"").expect("file");
        std::fs::write(root.join("a/b/f"), vec![7u8; 5000]).expect("file");
        std::fs::hard_link(root.join("a/b/f"), root.join("a/g")).expect("link");
        std::os::unix::fs::symlink("b/f", root.join("a/s")).expect("symlink");
        // a, a/b; empty; f (two blocks); g and s one block each.
        assert_eq!(
            tree_usage(root).expect("usage"),
            2 * BLOCK + BLOCK + 2 * BLOCK + 2 * BLOCK
        );
    }

    #[test]
    fn a_reserve_larger_than_the_filesystem_refuses_the_first_write() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut guard = DiskGuard::new(dir.path(), None, FreeSpaceReserve::percent(100));
        let err = guard
            .admit(1, &dir.path().join("f"))
            .expect_err("nothing may be written");
        assert!(
            matches!(
                err.space_exceeded().map(|e| &e.limit),
                Some(SpaceLimit::Reserve {
                    reserve: FreeSpaceReserve { percent: 100, .. },
                    ..
                })
            ),
            "{err}"
        );
    }
}

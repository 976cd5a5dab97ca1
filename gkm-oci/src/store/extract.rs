//! The extraction policy and the hardened tar extractor.
//!
//! The extractor writes only regular files and directories (and, when the
//! policy allows them, links proven to stay inside the tree) below a staging
//! directory it owns. Anything else is a [`Rejection`] naming the entry and
//! the [`Rule`] it broke; the caller then removes the staging directory.

use std::collections::HashSet;
use std::fs::{self, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::image::labels::{KindLayout, MANIFEST_FILE};
use crate::image::layer::{DIR_MODE, EXEC_MODE, FILE_MODE};
use crate::store::disk::{DiskGuard, FreeSpaceReserve};
use crate::store::rejection::{Carried, Rejection, Rule};

/// Limits and choices for extracting a layer. [`Default`] is what gkm uses.
///
/// ```
/// use gkm_oci::ExtractPolicy;
/// let strict = ExtractPolicy { max_entries: 1_000, ..ExtractPolicy::default() };
/// assert!(!strict.allow_in_tree_links);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtractPolicy {
    /// Largest single file, in bytes (default 8 GiB).
    pub max_entry_size: u64,
    /// Largest sum of file sizes, in bytes (default 256 GiB).
    pub max_total_size: u64,
    /// Most entries of any kind (default 1,000,000).
    pub max_entries: u64,
    /// Largest ratio of uncompressed to compressed bytes (default 200)...
    pub max_compression_ratio: u64,
    /// ...checked once this many uncompressed bytes were read (default 16 MiB),
    /// so small layers of zeros pass.
    pub ratio_grace_bytes: u64,
    /// Longest path, in bytes (default 4096).
    pub max_path_len: usize,
    /// Longest path component, in bytes (default 255).
    pub max_name_len: usize,
    /// Allow hard links to files already extracted and relative symbolic
    /// links that stay in the tree (default false: links are rejected).
    pub allow_in_tree_links: bool,
    /// Reject setuid, setgid and sticky bits instead of dropping them
    /// (default false: they are dropped).
    pub reject_special_bits: bool,
    /// Largest GNU long-name or long-link entry or PAX extended header, in
    /// bytes (default 64 KiB): their data is read into memory whole.
    pub max_header_size: u64,
    /// Most bytes of paths remembered to detect duplicates and check links
    /// (default 32 MiB), so very many long paths cannot exhaust memory.
    pub max_path_bookkeeping: u64,
    /// Largest zstd window, as a power of two (default 25: 32 MiB); a frame
    /// asking for more is refused rather than allocated.
    pub max_zstd_window_log: u32,
    /// Most bytes the tree may take on disk, each file's data counted in
    /// whole 4 KiB blocks and each directory and link as one block (default
    /// `None`: no cap but the reserve). A node agent passes what is left of
    /// the node's and of the namespace's budgets, whichever is smaller.
    /// Unlike `max_total_size`, which bounds what an image may be, this
    /// bounds what the caller can give it: crossing it stops extraction
    /// with an [`std::io::ErrorKind::StorageFull`] error
    /// ([`crate::store::disk::SpaceExceeded`]), not a rejection.
    pub byte_budget: Option<u64>,
    /// Space that must stay free on the filesystem extracted into (default
    /// none: the caller knows whose filesystem it is; a node agent passes
    /// [`FreeSpaceReserve::KUBELET_EVICTION_PLUS_MARGIN`], 12%, the kubelet's
    /// default hard eviction threshold `nodefs.available<10%` plus a 2%
    /// margin, so an extraction stops before the kubelet starts evicting
    /// pods). Checked before extraction and
    /// again at least every 4 MiB written; reaching it stops extraction
    /// with an [`std::io::ErrorKind::StorageFull`] error.
    pub free_space_reserve: FreeSpaceReserve,
}

impl Default for ExtractPolicy {
    fn default() -> Self {
        ExtractPolicy {
            max_entry_size: 8 << 30,
            max_total_size: 256 << 30,
            max_entries: 1_000_000,
            max_compression_ratio: 200,
            ratio_grace_bytes: 16 << 20,
            max_path_len: 4096,
            max_name_len: 255,
            allow_in_tree_links: false,
            reject_special_bits: false,
            max_header_size: 64 << 10,
            max_path_bookkeeping: 32 << 20,
            max_zstd_window_log: 25,
            byte_budget: None,
            free_space_reserve: FreeSpaceReserve::NONE,
        }
    }
}

/// What part of the layer to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mapping {
    /// The whole layer, paths as they are (`io.triton.cache/…`,
    /// `io.triton.manifest/manifest.json`).
    Layer,
    /// Only the cache tree, with its `io.*.cache/` prefix stripped; the
    /// manifest directory is checked but not written.
    CacheOnly,
}

/// What an extraction wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ExtractStats {
    /// Entries read.
    pub entries: u64,
    /// Regular files written.
    pub files: u64,
    /// Bytes of file data written.
    pub bytes: u64,
    /// Bytes the tree was counted as taking against the byte budget: file
    /// data in whole 4 KiB blocks, one block per directory and link
    /// ([`crate::store::disk::tree_usage`] counts a tree on disk the same way).
    pub disk_bytes: u64,
}

/// Turn a read error into the error it carries, or a malformed-archive
/// rejection naming `entry`.
pub(crate) fn classify(e: io::Error, entry: &str) -> Error {
    if e.get_ref().is_some_and(|inner| inner.is::<Carried>()) {
        if let Some(inner) = e.into_inner()
            && let Ok(carried) = inner.downcast::<Carried>()
        {
            return match *carried {
                Carried::Rejected(r) => Error::Rejected(r),
                Carried::Source(s) => Error::Task(s),
            };
        }
        return Error::Task("unreadable error".into());
    }
    Error::Rejected(Rejection::new(entry, Rule::Malformed, e.to_string()))
}

/// Counts uncompressed bytes and enforces the compression ratio against the
/// compressed byte count another reader keeps.
pub(crate) struct RatioGuard<R> {
    pub(crate) inner: R,
    pub(crate) compressed: std::sync::Arc<std::sync::atomic::AtomicU64>,
    pub(crate) seen: u64,
    pub(crate) max_ratio: u64,
    pub(crate) grace: u64,
}

impl<R: Read> Read for RatioGuard<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.seen += n as u64;
        if self.seen > self.grace {
            let compressed = self
                .compressed
                .load(std::sync::atomic::Ordering::Relaxed)
                .max(1);
            if self.seen / compressed > self.max_ratio {
                return Err(io::Error::other(Carried::Rejected(Rejection::new(
                    "(layer)",
                    Rule::CompressionRatio,
                    format!(
                        "{} bytes from {compressed} compressed: more than {}x",
                        self.seen, self.max_ratio
                    ),
                ))));
            }
        }
        Ok(n)
    }
}

fn display_path(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).escape_debug().to_string()
}

/// Normalise an archive path into components, enforcing the path rules.
pub(crate) fn components<'a>(
    raw: &'a str,
    shown: &str,
    policy: &ExtractPolicy,
) -> Result<Vec<&'a str>, Rejection> {
    if raw.len() > policy.max_path_len {
        return Err(Rejection::new(
            shown,
            Rule::NameTooLong,
            format!("path is {} bytes, limit {}", raw.len(), policy.max_path_len),
        ));
    }
    if raw.starts_with('/') {
        return Err(Rejection::new(
            shown,
            Rule::AbsolutePath,
            "absolute paths are not allowed",
        ));
    }
    let mut out = Vec::new();
    for c in raw.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                return Err(Rejection::new(
                    shown,
                    Rule::ParentDir,
                    "paths may not contain \"..\"",
                ));
            }
            c if c.len() > policy.max_name_len => {
                return Err(Rejection::new(
                    shown,
                    Rule::NameTooLong,
                    format!(
                        "component is {} bytes, limit {}",
                        c.len(),
                        policy.max_name_len
                    ),
                ));
            }
            c if c.contains('\0') => {
                return Err(Rejection::new(shown, Rule::Malformed, "NUL byte in path"));
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

/// The top directories of every cache kind's layout, for the message of an
/// entry outside all of them: `io.triton.cache/, io.triton.manifest/, …`.
fn layout_dirs() -> String {
    gkm_core::image_layout::ALL
        .into_iter()
        .flat_map(|layout| [layout.cache_dir, layout.manifest_dir])
        .map(|dir| format!("{dir}/"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where an entry goes, after the layout mapping: `None` to check but skip.
fn map_entry(comps: &[&str], shown: &str, mapping: Mapping) -> Result<Option<String>, Rejection> {
    let Some(top) = comps.first() else {
        return Ok(None);
    };
    let Some(layout) = KindLayout::for_top_dir(top) else {
        return Err(Rejection::new(
            shown,
            Rule::OutsideLayout,
            format!("expected entries under {}", layout_dirs()),
        ));
    };
    let is_manifest = *top == layout.manifest_dir;
    if is_manifest && comps.len() > 1 && (comps.len() != 2 || comps[1] != MANIFEST_FILE) {
        return Err(Rejection::new(
            shown,
            Rule::OutsideLayout,
            format!("the manifest directory holds only {MANIFEST_FILE}"),
        ));
    }
    Ok(match mapping {
        Mapping::Layer => Some(comps.join("/")),
        Mapping::CacheOnly if is_manifest || comps.len() == 1 => None,
        Mapping::CacheOnly => Some(comps[1..].join("/")),
    })
}

struct State<'p> {
    policy: &'p ExtractPolicy,
    mapping: Mapping,
    seen: HashSet<String>,
    files: HashSet<String>,
    links: HashSet<String>,
    stats: ExtractStats,
    buf: Vec<u8>,
    /// The directory the previous file went into, known to exist.
    last_parent: Option<std::path::PathBuf>,
    /// Bytes of paths held in `seen`, `files` and `links`, with overhead.
    kept: u64,
    /// The byte budget and free-space reserve.
    disk: DiskGuard,
}

/// What remembering one path costs besides its bytes (set slot, allocation).
const PATH_OVERHEAD: u64 = 48;

impl State<'_> {
    /// Counts `rel` against the path bookkeeping budget.
    fn account(&mut self, rel: &str, shown: &str) -> Result<()> {
        self.kept += rel.len() as u64 + PATH_OVERHEAD;
        if self.kept > self.policy.max_path_bookkeeping {
            return Err(Error::Rejected(Rejection::new(
                shown,
                Rule::TooManyEntries,
                format!(
                    "the paths add up to more than {} bytes of bookkeeping",
                    self.policy.max_path_bookkeeping
                ),
            )));
        }
        Ok(())
    }

    fn through_link(&self, rel: &str) -> bool {
        !self.links.is_empty()
            && rel
                .match_indices('/')
                .any(|(i, _)| self.links.contains(&rel[..i]))
    }
}

/// Extract an uncompressed layer tar from `reader` into `dest`, an empty
/// directory the caller owns, under `policy`, within its byte budget and
/// free-space reserve on `dest`'s filesystem. On error `dest` may hold a
/// partial tree: the caller removes it.
pub fn extract_tar<R: Read>(
    reader: R,
    dest: &Path,
    mapping: Mapping,
    policy: &ExtractPolicy,
) -> Result<ExtractStats> {
    let guarded = crate::store::tar_guard::HeaderGuard::new(reader, policy.max_header_size);
    let mut archive = tar::Archive::new(guarded);
    let mut state = State {
        policy,
        mapping,
        seen: HashSet::new(),
        files: HashSet::new(),
        links: HashSet::new(),
        stats: ExtractStats::default(),
        buf: vec![0u8; 1 << 20],
        last_parent: None,
        kept: 0,
        disk: DiskGuard::new(dest, policy.byte_budget, policy.free_space_reserve),
    };
    let mut last = String::from("(start of archive)");
    let entries = archive.entries().map_err(|e| classify(e, &last))?;
    for entry in entries {
        let entry = entry.map_err(|e| classify(e, &format!("entry after {last}")))?;
        last = display_path(&entry.path_bytes());
        extract_entry(entry, dest, &mut state, &last)?;
    }
    // Read whatever follows the end-of-archive marker, so the whole stream
    // is hashed and counted.
    let mut rest = archive.into_inner();
    io::copy(&mut rest, &mut io::sink()).map_err(|e| classify(e, "(after end of archive)"))?;
    state.stats.disk_bytes = state.disk.counted();
    Ok(state.stats)
}

fn extract_entry<R: Read>(
    mut entry: tar::Entry<'_, R>,
    dest: &Path,
    st: &mut State<'_>,
    shown: &str,
) -> Result<()> {
    let policy = st.policy;
    st.stats.entries += 1;
    check_entry_count(st.stats.entries, policy, shown)?;
    let kind = entry.header().entry_type();
    if kind == tar::EntryType::XGlobalHeader {
        return Ok(());
    }
    check_pax(&mut entry, shown)?;
    check_kind(kind, policy, shown)?;
    let path_bytes = entry.path_bytes().into_owned();
    let Ok(raw) = std::str::from_utf8(&path_bytes) else {
        return reject(shown, Rule::NonUtf8Name, "path is not UTF-8");
    };
    let comps = components(raw, shown, policy)?;
    if comps.len() == 1 && kind != tar::EntryType::Directory {
        let rule = if kind.is_symlink() || kind.is_hard_link() {
            Rule::LinkEscape
        } else {
            Rule::OutsideLayout
        };
        return reject(
            shown,
            rule,
            "the cache and manifest directories must be real directories",
        );
    }
    let Some(rel) = map_entry(&comps, shown, st.mapping)? else {
        // Checked but not written: a layout directory or the manifest.
        check_entry_size(entry.size(), policy, shown)?;
        io::copy(&mut entry, &mut io::sink()).map_err(|e| classify(e, shown))?;
        return Ok(());
    };
    let mode = entry.header().mode().map_err(|e| classify(e, shown))?;
    if mode & 0o7000 != 0 && policy.reject_special_bits {
        return reject(
            shown,
            Rule::SpecialBits,
            format!("mode {mode:o} has setuid, setgid or sticky bits"),
        );
    }
    if st.through_link(&rel) {
        return reject(shown, Rule::ThroughLink, "an ancestor directory is a link");
    }
    st.account(&rel, shown)?;
    if !st.seen.insert(rel.clone()) {
        return reject(shown, Rule::Duplicate, "the archive holds this path twice");
    }
    let at = Placed {
        dest,
        target: dest.join(&rel),
        rel,
        shown,
    };
    match kind {
        tar::EntryType::Directory => write_dir(&at, &mut st.disk),
        tar::EntryType::Regular | tar::EntryType::Continuous => {
            write_file(&mut entry, at, mode, st)
        }
        tar::EntryType::Link => write_hard_link(&entry, at, st),
        tar::EntryType::Symlink => write_symlink(&entry, at, st),
        // Every other kind was refused by check_kind.
        _ => Ok(()),
    }
}

/// Refuses `shown`, which broke `rule`.
pub(crate) fn reject<T>(shown: &str, rule: Rule, detail: impl Into<String>) -> Result<T> {
    Err(Error::Rejected(Rejection::new(shown, rule, detail)))
}

/// Refuses the `count`th entry when the policy allows fewer.
pub(crate) fn check_entry_count(count: u64, policy: &ExtractPolicy, shown: &str) -> Result<()> {
    if count > policy.max_entries {
        return reject(
            shown,
            Rule::TooManyEntries,
            format!("more than {} entries", policy.max_entries),
        );
    }
    Ok(())
}

/// Refuses a file of `size` bytes that would take the files' sum, `so_far`
/// before it, over the policy's total.
pub(crate) fn check_total(
    so_far: u64,
    size: u64,
    policy: &ExtractPolicy,
    shown: &str,
) -> Result<()> {
    if so_far.saturating_add(size) > policy.max_total_size {
        return reject(
            shown,
            Rule::TotalTooLarge,
            format!("files add up to more than {} bytes", policy.max_total_size),
        );
    }
    Ok(())
}

/// Refuses every entry kind but directories and files (and links, when the
/// policy allows them).
pub(crate) fn check_kind(kind: tar::EntryType, policy: &ExtractPolicy, shown: &str) -> Result<()> {
    match kind {
        tar::EntryType::Directory | tar::EntryType::Regular | tar::EntryType::Continuous => Ok(()),
        tar::EntryType::Link | tar::EntryType::Symlink if policy.allow_in_tree_links => Ok(()),
        tar::EntryType::Link | tar::EntryType::Symlink => reject(
            shown,
            Rule::LinkNotAllowed,
            "links are not allowed by the extraction policy",
        ),
        tar::EntryType::GNUSparse => {
            reject(shown, Rule::Malformed, "sparse files are not supported")
        }
        other => reject(
            shown,
            Rule::SpecialFile,
            format!("{other:?} entries are not allowed: only files and directories"),
        ),
    }
}

/// Refuses an entry larger than the policy's single-entry limit.
pub(crate) fn check_entry_size(size: u64, policy: &ExtractPolicy, shown: &str) -> Result<()> {
    if size > policy.max_entry_size {
        return reject(
            shown,
            Rule::EntryTooLarge,
            format!("{size} bytes, limit {}", policy.max_entry_size),
        );
    }
    Ok(())
}

/// Where an admitted entry goes.
struct Placed<'a> {
    /// The extraction root.
    dest: &'a Path,
    /// `dest` joined with `rel`.
    target: PathBuf,
    /// The entry's path below `dest`.
    rel: String,
    /// The entry's path as errors show it.
    shown: &'a str,
}

impl Placed<'_> {
    /// An error writing the entry: a clash with an earlier entry is a
    /// [`Rule::Duplicate`] rejection, anything else an I/O error on it.
    fn io_err(&self, e: io::Error) -> Error {
        match e.kind() {
            io::ErrorKind::AlreadyExists
            | io::ErrorKind::NotADirectory
            | io::ErrorKind::IsADirectory => Error::Rejected(Rejection::new(
                self.shown,
                Rule::Duplicate,
                format!("clashes with an earlier entry: {e}"),
            )),
            _ => Error::io(&self.target, e),
        }
    }

    /// The directory the entry goes into.
    fn parent(&self) -> PathBuf {
        self.target
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| self.dest.to_path_buf())
    }
}

/// Creates a directory entry (and its missing ancestors); an existing real
/// directory is fine.
fn write_dir(at: &Placed<'_>, disk: &mut DiskGuard) -> Result<()> {
    if fs::symlink_metadata(&at.target).is_err() {
        disk.admit_dirs(1, &at.target)?;
    }
    let made = match make_dir(&at.target) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            make_dirs(at, &at.parent(), disk)?;
            make_dir(&at.target)
        }
        made => made,
    };
    match made {
        Ok(()) => Ok(()),
        Err(e)
            if e.kind() == io::ErrorKind::AlreadyExists
                && at.target.is_dir()
                && !at.target.is_symlink() =>
        {
            Ok(())
        }
        Err(e) => Err(at.io_err(e)),
    }
}

/// Writes a regular file's content, within the size limits, with the file
/// mode gkm uses (executable when any execute bit is set).
fn write_file<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    at: Placed<'_>,
    mode: u32,
    st: &mut State<'_>,
) -> Result<()> {
    let policy = st.policy;
    let shown = at.shown;
    let size = entry.size();
    check_entry_size(size, policy, shown)?;
    check_total(st.stats.bytes, size, policy, shown)?;
    let parent = at.parent();
    if st.last_parent.as_ref() != Some(&parent) {
        make_dirs(&at, &parent, &mut st.disk)?;
        st.last_parent = Some(parent);
    }
    st.disk.admit(size, &at.target)?;
    let file_mode = if mode & 0o111 != 0 {
        EXEC_MODE
    } else {
        FILE_MODE
    };
    let target = &at.target;
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(file_mode)
        .custom_flags(libc::O_NOFOLLOW)
        .open(target)
        .map_err(|e| at.io_err(e))?;
    // The mode given at creation is masked by the umask: set it.
    file.set_permissions(fs::Permissions::from_mode(file_mode))
        .map_err(|e| Error::io(target, e))?;
    let mut left = size;
    while left > 0 {
        let want = left.min(st.buf.len() as u64) as usize;
        let n = entry
            .read(&mut st.buf[..want])
            .map_err(|e| classify(e, shown))?;
        if n == 0 {
            return reject(
                shown,
                Rule::Malformed,
                format!("archive ends {left} bytes into a {size}-byte entry"),
            );
        }
        st.disk.write(n as u64, target)?;
        file.write_all(&st.buf[..n])
            .map_err(|e| Error::io(target, e))?;
        left -= n as u64;
    }
    // Only the layers of a kind whose tool compares mtimes carry them
    // (`Kind::keeps_mtimes`); the others' files say 0 and keep the time
    // they are written at.
    let mtime = entry.header().mtime().unwrap_or(0);
    if mtime > 0 {
        let Some(when) = std::time::UNIX_EPOCH.checked_add(std::time::Duration::from_secs(mtime))
        else {
            return reject(
                shown,
                Rule::Malformed,
                format!("a modification time of {mtime} s, beyond any date"),
            );
        };
        file.set_modified(when).map_err(|e| Error::io(target, e))?;
    }
    st.stats.bytes += size;
    st.stats.files += 1;
    if policy.allow_in_tree_links {
        // Only hard links look files up.
        st.account(&at.rel, shown)?;
        st.files.insert(at.rel);
    }
    Ok(())
}

/// A link entry's target, which must be UTF-8; makes the directory the link
/// goes into and counts the link's path.
fn link_target<R: Read>(
    entry: &tar::Entry<'_, R>,
    at: &Placed<'_>,
    st: &mut State<'_>,
) -> Result<String> {
    let link_bytes = entry
        .link_name_bytes()
        .map(|b| b.into_owned())
        .unwrap_or_default();
    let Ok(link) = String::from_utf8(link_bytes) else {
        return reject(at.shown, Rule::NonUtf8Name, "link target is not UTF-8");
    };
    make_dirs(at, &at.parent(), &mut st.disk)?;
    st.disk.admit(0, &at.target)?;
    st.account(&at.rel, at.shown)?;
    Ok(link)
}

/// Creates a hard link, only to a file this archive extracted earlier.
fn write_hard_link<R: Read>(
    entry: &tar::Entry<'_, R>,
    at: Placed<'_>,
    st: &mut State<'_>,
) -> Result<()> {
    let shown = at.shown;
    let link = link_target(entry, &at, st)?;
    let as_escape = |r: Rejection| Rejection {
        rule: Rule::LinkEscape,
        ..r
    };
    let comps = components(&link, shown, st.policy).map_err(as_escape)?;
    let mapped = map_entry(&comps, shown, st.mapping).map_err(as_escape)?;
    let Some(to) = mapped.filter(|m| st.files.contains(m)) else {
        return reject(
            shown,
            Rule::LinkEscape,
            format!("hard link to {link:?}, which is not a file extracted earlier"),
        );
    };
    fs::hard_link(at.dest.join(&to), &at.target).map_err(|e| at.io_err(e))?;
    st.files.insert(at.rel);
    Ok(())
}

/// Creates a symbolic link, only one that stays inside the tree.
fn write_symlink<R: Read>(
    entry: &tar::Entry<'_, R>,
    at: Placed<'_>,
    st: &mut State<'_>,
) -> Result<()> {
    let link = link_target(entry, &at, st)?;
    check_symlink(&link, &at.rel, st.mapping)
        .map_err(|d| Rejection::new(at.shown, Rule::LinkEscape, d))?;
    std::os::unix::fs::symlink(&link, &at.target).map_err(|e| at.io_err(e))?;
    st.links.insert(at.rel);
    Ok(())
}

/// Creates the directory `dir` with [`DIR_MODE`], whatever the umask.
fn make_dir(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new().mode(DIR_MODE).create(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(DIR_MODE))
}

/// Creates `dir` and its missing ancestors below the extraction root with
/// [`DIR_MODE`], for the entry `at`, counting each against `disk`.
fn make_dirs(at: &Placed<'_>, dir: &Path, disk: &mut DiskGuard) -> Result<()> {
    let mut missing = Vec::new();
    let mut up = dir;
    while up != at.dest && !up.is_dir() {
        missing.push(up);
        match up.parent() {
            Some(parent) => up = parent,
            None => break,
        }
    }
    disk.admit_dirs(missing.len() as u64, dir)?;
    for dir in missing.into_iter().rev() {
        match make_dir(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => {}
            Err(e) => return Err(at.io_err(e)),
        }
    }
    Ok(())
}

/// PAX records must parse, and a PAX size may not contradict a non-zero
/// header size: parsers that trust one or the other would see different
/// archives.
fn check_pax<R: Read>(entry: &mut tar::Entry<'_, R>, shown: &str) -> Result<()> {
    let header_size = entry.header().entry_size().unwrap_or(0);
    let Some(records) = entry.pax_extensions().map_err(|e| classify(e, shown))? else {
        return Ok(());
    };
    let malformed = |detail: String| {
        Err(Error::Rejected(Rejection::new(
            shown,
            Rule::Malformed,
            detail,
        )))
    };
    for record in records {
        let Ok(record) = record else {
            return malformed("unreadable PAX record".into());
        };
        if record.key() != Ok("size") {
            continue;
        }
        let value = record.value().unwrap_or("");
        let Ok(size) = value.parse::<u64>() else {
            return malformed(format!("PAX size {value:?} is not a number"));
        };
        if header_size != 0 && size != header_size {
            return malformed(format!(
                "PAX size {size} contradicts the header size {header_size}"
            ));
        }
    }
    Ok(())
}

/// A symbolic link is safe when its target is relative, its `..`
/// components all lead (so no `..` follows another link), and climbing
/// them from the link's directory stays inside the tree.
fn check_symlink(link: &str, rel: &str, mapping: Mapping) -> Result<(), String> {
    if link.is_empty() || link.starts_with('/') {
        return Err(format!(
            "symbolic link to {link:?}: targets must be relative"
        ));
    }
    let depth = rel.matches('/').count();
    // In the whole-layer mapping the first component is the io.* directory,
    // which the link may not leave.
    let floor = if mapping == Mapping::Layer { 1 } else { 0 };
    let mut ups = 0usize;
    let mut descended = false;
    for c in link.split('/') {
        match c {
            "" | "." => {}
            ".." if descended => {
                return Err(format!(
                    "symbolic link to {link:?}: \"..\" after a name is not allowed"
                ));
            }
            ".." => ups += 1,
            _ => descended = true,
        }
    }
    if ups > depth.saturating_sub(floor) {
        return Err(format!("symbolic link to {link:?} leaves the tree"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_outside_every_layout_is_refused_naming_every_kinds_directories() {
        let err = map_entry(&["etc", "passwd"], "etc/passwd", Mapping::Layer)
            .expect_err("outside every layout");
        let detail = err.to_string();
        for layout in gkm_core::image_layout::ALL {
            assert!(
                detail.contains(&format!("{}/", layout.cache_dir)),
                "{detail}"
            );
            assert!(
                detail.contains(&format!("{}/", layout.manifest_dir)),
                "{detail}"
            );
        }
        assert!(detail.contains("io.megacache.manifest/"), "{detail}");
    }
}

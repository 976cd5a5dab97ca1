//! Deterministic layer tars: the same cache tree gives the same bytes,
//! whatever its owners, permissions (beyond the exec bit) or the order its
//! files were created in, and whatever its mtimes but for the kinds whose
//! tool compares them (`Kind::keeps_mtimes`: ninja-built modules), whose
//! layers carry each file's mtime in whole seconds.

use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use gkm_core::cache::CacheManifest;

use crate::error::{Error, Result};
use crate::image::labels::{Compression, KindLayout};
use gkm_core::digest::{Digest, HashingWriter};

/// Mode of every directory and non-executable file in a layer.
pub const DIR_MODE: u32 = 0o755;
/// Mode of non-executable files.
pub const FILE_MODE: u32 = 0o644;
/// Mode of files with any execute bit set in the source tree.
pub const EXEC_MODE: u32 = 0o755;

/// What writing a layer produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerInfo {
    /// Digest of the compressed blob.
    pub digest: Digest,
    /// Digest of the uncompressed tar (the config's `diff_id`).
    pub diff_id: Digest,
    /// Size of the compressed blob.
    pub size: u64,
    /// Sum of the sizes of the cache's files.
    pub cache_size_bytes: u64,
    /// Compression used.
    pub compression: Compression,
}

/// One file or directory of the cache tree, relative to its root.
struct TreeEntry {
    rel: PathBuf,
    kind: TreeKind,
}

enum TreeKind {
    Dir,
    File { size: u64, exec: bool },
}

/// List a tree depth first, children sorted by name bytes. Refuses links,
/// special files and non-UTF-8 names, naming them.
fn list_tree(root: &Path) -> Result<Vec<TreeEntry>> {
    let mut out = Vec::new();
    walk(root, PathBuf::new(), &mut out)?;
    Ok(out)
}

fn walk(root: &Path, rel: PathBuf, out: &mut Vec<TreeEntry>) -> Result<()> {
    let dir = root.join(&rel);
    let mut children: Vec<_> = fs::read_dir(&dir)
        .map_err(|e| Error::io(&dir, e))?
        .map(|e| e.map(|e| e.file_name()).map_err(|e| Error::io(&dir, e)))
        .collect::<Result<_>>()?;
    children.sort();
    for name in children {
        let child_rel = rel.join(&name);
        let path = root.join(&child_rel);
        if name.to_str().is_none() {
            return Err(Error::Unpackable {
                path,
                reason: "file name is not UTF-8".into(),
            });
        }
        let meta = fs::symlink_metadata(&path).map_err(|e| Error::io(&path, e))?;
        let ft = meta.file_type();
        if ft.is_dir() {
            out.push(TreeEntry {
                rel: child_rel.clone(),
                kind: TreeKind::Dir,
            });
            walk(root, child_rel, out)?;
        } else if ft.is_file() {
            let exec = meta.permissions().mode() & 0o111 != 0;
            out.push(TreeEntry {
                rel: child_rel,
                kind: TreeKind::File {
                    size: meta.len(),
                    exec,
                },
            });
        } else {
            let what = if ft.is_symlink() {
                "a symbolic link"
            } else {
                "not a regular file or directory"
            };
            return Err(Error::Unpackable {
                path,
                reason: format!("{what}: cache images hold regular files and directories only"),
            });
        }
    }
    Ok(())
}

/// A reader that yields exactly `size` bytes of a file or fails, so a file
/// that changes while it is packaged cannot corrupt the tar.
struct Exact<R> {
    inner: io::Take<R>,
    path: PathBuf,
}

impl<R: Read> Read for Exact<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && !buf.is_empty() && self.inner.limit() > 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{} shrank while it was being packaged", self.path.display()),
            ));
        }
        Ok(n)
    }
}

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h
}

/// The layer directory the files of `cache_dir` go under: the kind's cache
/// directory (`io.triton.cache`) and, for a vLLM cache built from below its
/// root, where `cache_dir` sits below that root
/// (`io.vllm.cache/torch_compile_cache`), so the layer always holds a vLLM
/// cache root, as MCV's images do.
pub(crate) fn tree_root(cache_dir: &Path, manifest: &CacheManifest) -> Result<String> {
    let layout = KindLayout::of(manifest.kind());
    let offset = manifest.kind().offset_from_root(cache_dir)?;
    let offset = offset.unwrap_or_default();
    let offset = offset.to_str().ok_or_else(|| Error::Unpackable {
        path: cache_dir.to_path_buf(),
        reason: "file name is not UTF-8".into(),
    })?;
    Ok(if offset.is_empty() {
        layout.cache_dir.to_string()
    } else {
        format!("{}/{offset}", layout.cache_dir)
    })
}

/// `entries` without the files the kind of `manifest` calls scratch (its
/// [`Kind::scratch`](gkm_core::cache::kinds::Kind::scratch): lock files,
/// temporary files), which its tool makes again when it needs them. A lock
/// file delivered read-only would stop a non-root workload on its first
/// lock (opening it to write is refused), and a lock is no cache entry.
/// Directories are kept, empty or not, so the tree keeps its shape.
fn without_scratch_files(entries: Vec<TreeEntry>, manifest: &CacheManifest) -> Vec<TreeEntry> {
    let rules = manifest.kind().rules();
    entries
        .into_iter()
        .filter(|entry| {
            let is_file = matches!(entry.kind, TreeKind::File { .. });
            let rel = entry.rel.to_string_lossy();
            !(is_file && rules.scratch(&rel, false).is_some())
        })
        .collect()
}

/// Write the uncompressed layer tar of `cache_dir` and its manifest to `out`,
/// leaving out the kind's scratch files. Returns the sum of the cache's
/// file sizes.
pub fn write_tar<W: Write>(cache_dir: &Path, manifest: &CacheManifest, out: W) -> Result<(W, u64)> {
    let layout = KindLayout::of(manifest.kind());
    let entries = without_scratch_files(list_tree(cache_dir)?, manifest);
    let mut b = tar::Builder::new(out);
    b.mode(tar::HeaderMode::Deterministic);
    let root = tree_root(cache_dir, manifest)?;
    let mtimes = Mtimes::of(manifest.kind().rules().keeps_mtimes());
    let total = append_tree(&mut b, cache_dir, &root, entries, mtimes)?;
    append_dir(&mut b, layout.manifest_dir)?;
    let json = manifest.to_json();
    let manifest_path = layout.manifest_path();
    b.append_data(
        &mut header(tar::EntryType::Regular, FILE_MODE, json.len() as u64),
        &manifest_path,
        json.as_slice(),
    )
    .map_err(|e| Error::io(Path::new(&manifest_path), e))?;
    let out = b.into_inner().map_err(|e| Error::io(cache_dir, e))?;
    Ok((out, total))
}

/// What a layer tar holds.
#[derive(Clone, Copy)]
enum Content<'a> {
    /// A whole cache: its tree under the kind's cache directory, and its
    /// manifest.
    Cache(&'a CacheManifest),
    /// The files a delta adds, under the cache directory of `layout` (the
    /// base's kind), without a manifest (the base layer's stays the
    /// image's).
    Delta { layout: KindLayout },
}

/// Write the uncompressed tar of `content` from `dir`.
fn write_content<W: Write>(dir: &Path, content: Content<'_>, out: W) -> Result<(W, u64)> {
    match content {
        Content::Cache(manifest) => write_tar(dir, manifest, out),
        Content::Delta { layout } => write_delta_tar(dir, layout, out),
    }
}

/// Write the uncompressed delta layer tar of `delta_dir`, its files under
/// the cache directory of `layout` (`io.triton.cache`), with their mtimes
/// when its kind keeps them: the directories and files of the tree, no
/// manifest. Returns the sum of the files' sizes.
pub fn write_delta_tar<W: Write>(delta_dir: &Path, layout: KindLayout, out: W) -> Result<(W, u64)> {
    let entries = list_tree(delta_dir)?;
    let mut b = tar::Builder::new(out);
    b.mode(tar::HeaderMode::Deterministic);
    let mtimes = Mtimes::of(layout.kind.rules().keeps_mtimes());
    let total = append_tree(&mut b, delta_dir, layout.cache_dir, entries, mtimes)?;
    let out = b.into_inner().map_err(|e| Error::io(delta_dir, e))?;
    Ok((out, total))
}

/// What a layer's files say of their modification times.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mtimes {
    /// 0, whatever they are: the same tree gives the same bytes.
    Zero,
    /// Each file's own, in whole seconds, for a kind whose tool compares
    /// them ([`Kind::keeps_mtimes`](gkm_core::cache::kinds::Kind::keeps_mtimes)).
    Kept,
}

impl Mtimes {
    fn of(kept: bool) -> Mtimes {
        if kept { Mtimes::Kept } else { Mtimes::Zero }
    }
}

/// Appends the `root` directory and each of `entries` of `dir` below it.
fn append_tree<W: Write>(
    b: &mut tar::Builder<W>,
    dir: &Path,
    root: &str,
    entries: Vec<TreeEntry>,
    mtimes: Mtimes,
) -> Result<u64> {
    let mut parent = String::new();
    for component in root.split('/') {
        parent = if parent.is_empty() {
            component.to_string()
        } else {
            format!("{parent}/{component}")
        };
        append_dir(b, &parent)?;
    }
    let mut total = 0u64;
    for entry in entries {
        // Listing refused non-UTF-8 names, so this is lossless.
        let rel = entry.rel.to_string_lossy();
        let name = format!("{root}/{rel}");
        match entry.kind {
            TreeKind::Dir => append_dir(b, &name)?,
            TreeKind::File { size, exec } => {
                append_file(b, &dir.join(&entry.rel), &name, size, exec, mtimes)?;
                total += size;
            }
        }
    }
    Ok(total)
}

/// Appends the directory `name`.
fn append_dir<W: Write>(b: &mut tar::Builder<W>, name: &str) -> Result<()> {
    b.append_data(
        &mut header(tar::EntryType::Directory, DIR_MODE, 0),
        format!("{name}/"),
        io::empty(),
    )
    .map_err(|e| Error::io(Path::new(name), e))
}

/// Appends the file at `path` as `name`: exactly `size` bytes, not through
/// a link that replaced it since it was listed, with its mtime when
/// `mtimes` keeps them.
fn append_file<W: Write>(
    b: &mut tar::Builder<W>,
    path: &Path,
    name: &str,
    size: u64,
    exec: bool,
    mtimes: Mtimes,
) -> Result<()> {
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    let reader = Exact {
        inner: file.take(size),
        path: path.to_path_buf(),
    };
    let mode = if exec { EXEC_MODE } else { FILE_MODE };
    let mut h = header(tar::EntryType::Regular, mode, size);
    if mtimes == Mtimes::Kept {
        use std::os::unix::fs::MetadataExt;
        let mtime = reader
            .inner
            .get_ref()
            .metadata()
            .map_err(|e| Error::io(path, e))?
            .mtime();
        h.set_mtime(u64::try_from(mtime).unwrap_or(0));
    }
    b.append_data(&mut h, name, reader)
        .map_err(|e| Error::io(path, e))
}

/// Write the compressed layer of `cache_dir` to the file `blob`.
pub fn write_layer(
    cache_dir: &Path,
    manifest: &CacheManifest,
    compression: Compression,
    blob: &Path,
) -> Result<LayerInfo> {
    write_compressed(cache_dir, Content::Cache(manifest), compression, blob)
}

/// Write the compressed delta layer of `delta_dir` (its files under the
/// cache directory of `layout`, no manifest: [`write_delta_tar`]) to the
/// file `blob`.
pub fn write_delta_layer(
    delta_dir: &Path,
    layout: KindLayout,
    compression: Compression,
    blob: &Path,
) -> Result<LayerInfo> {
    write_compressed(delta_dir, Content::Delta { layout }, compression, blob)
}

fn write_compressed(
    dir: &Path,
    content: Content<'_>,
    compression: Compression,
    blob: &Path,
) -> Result<LayerInfo> {
    let file = File::create(blob).map_err(|e| Error::io(blob, e))?;
    let io_err = |e: io::Error| Error::io(blob, e);
    let compressed = HashingWriter::new(BufWriter::with_capacity(1 << 20, file));
    let (compressed, diff_id, cache_size_bytes) = match compression {
        Compression::Zstd => {
            let enc = zstd::Encoder::new(compressed, 3).map_err(io_err)?;
            let (plain, total) = write_content(dir, content, HashingWriter::new(enc))?;
            let (enc, diff_id, _) = plain.finish();
            (enc.finish().map_err(io_err)?, diff_id, total)
        }
        Compression::Gzip => {
            let enc = flate2::write::GzEncoder::new(compressed, flate2::Compression::default());
            let (plain, total) = write_content(dir, content, HashingWriter::new(enc))?;
            let (enc, diff_id, _) = plain.finish();
            (enc.finish().map_err(io_err)?, diff_id, total)
        }
        Compression::None => {
            let (plain, total) = write_content(dir, content, HashingWriter::new(compressed))?;
            let (inner, diff_id, _) = plain.finish();
            (inner, diff_id, total)
        }
    };
    let (buf, digest, size) = compressed.finish();
    let file = buf.into_inner().map_err(|e| io_err(e.into_error()))?;
    file.sync_all().map_err(io_err)?;
    Ok(LayerInfo {
        digest,
        diff_id,
        size,
        cache_size_bytes,
        compression,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gkm_core::cache::{CacheKind, Facts};

    #[test]
    fn a_layer_leaves_out_the_kinds_lock_files_but_keeps_their_directory() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let root = dir.path();
        fs::create_dir_all(root.join("locks")).expect("locks/");
        fs::write(root.join("locks/cabc.lock"), b"").expect("a lock");
        fs::create_dir_all(root.join("ab")).expect("a code dir");
        fs::write(root.join("ab/cabc.cpp"), b"int f();").expect("a source");
        let manifest = CacheManifest::of_kind(
            CacheKind::Inductor,
            Vec::<gkm_core::cache::CacheEntry>::new(),
            Facts::none(),
        );
        let (tar, total) = write_tar(root, &manifest, Vec::new()).expect("a tar");
        let mut archive = tar::Archive::new(tar.as_slice());
        let names: Vec<String> = archive
            .entries()
            .expect("entries")
            .map(|e| {
                e.expect("an entry")
                    .path()
                    .expect("a path")
                    .display()
                    .to_string()
            })
            .collect();
        let has = |suffix: &str| names.iter().any(|n| n.ends_with(suffix));
        assert!(has("/locks/") && has("/ab/cabc.cpp"), "{names:?}");
        assert!(!has(".lock"), "a lock file was packed: {names:?}");
        assert_eq!(total, 8, "the lock is not counted in the cache's size");
    }
}

//! Streaming a layer from its source to disk: read → hash → decompress (in
//! its own thread) → policy-checked extraction, with the digest verified
//! before anything is kept; and the layers of a multi-layer image (a delta
//! image: [`crate::capture::delta`]) applied in order into one tree, each later one
//! only adding files.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use futures::StreamExt;

use crate::error::{Error, Result};
use crate::image::labels::Compression;
use crate::image::manifest::Layer;
use crate::progress::{Progress, step};
use crate::registry::repo::{BlobHost, BlobSource, Repo};
use crate::store::extract::{
    ExtractPolicy, ExtractStats, Mapping, RatioGuard, classify, extract_tar,
};
use crate::store::rejection::{Carried, Rejection, Rule};
use gkm_core::digest::{Digest, Hasher};

const CHUNK: usize = 1 << 20;

/// Reads chunks a async task pumps from a registry stream.
struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<io::Result<Bytes>>,
    current: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(b)) => self.current = b,
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

/// Hashes and counts the compressed bytes, refusing more than the layer's
/// declared size (a source that never ends is cut off there).
struct Counting<R> {
    inner: R,
    hasher: Hasher,
    count: Arc<AtomicU64>,
    declared: u64,
    progress: Option<Progress>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        let total = self.count.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
        if total > self.declared {
            return Err(io::Error::other(Carried::Rejected(Rejection::new(
                "(layer)",
                Rule::Malformed,
                format!(
                    "the layer is longer than its declared {} bytes",
                    self.declared
                ),
            ))));
        }
        if let Some(p) = &self.progress {
            p.bytes(total);
        }
        Ok(n)
    }
}

/// Reads the chunks the decompression thread sends, and hands the spent
/// buffers back to it.
struct ChunkReader {
    rx: std::sync::mpsc::Receiver<io::Result<Vec<u8>>>,
    recycle: std::sync::mpsc::SyncSender<Vec<u8>>,
    current: Vec<u8>,
    pos: usize,
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.current.len() {
            match self.rx.recv() {
                Ok(Ok(chunk)) => {
                    let spent = std::mem::replace(&mut self.current, chunk);
                    if spent.capacity() >= CHUNK {
                        let _ = self.recycle.try_send(spent);
                    }
                    self.pos = 0;
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len() - self.pos);
        buf[..n].copy_from_slice(&self.current[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Decompress `raw` into chunks sent on `tx`, then read the rest of `raw`
/// so it is all hashed, even when the extractor stopped early (so that a
/// refusal of the layer can be told apart from bytes that are not the
/// layer). Returns the digest of the compressed bytes.
fn decompress<R: Read>(
    raw: Counting<R>,
    compression: Compression,
    max_window_log: u32,
    tx: std::sync::mpsc::SyncSender<io::Result<Vec<u8>>>,
    recycled: std::sync::mpsc::Receiver<Vec<u8>>,
) -> io::Result<Digest> {
    let pump = |r: &mut dyn Read| -> io::Result<bool> {
        loop {
            let mut chunk = recycled.try_recv().unwrap_or_default();
            chunk.resize(CHUNK, 0);
            let mut filled = 0;
            while filled < CHUNK {
                match r.read(&mut chunk[filled..]) {
                    Ok(0) => break,
                    Ok(n) => filled += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return Ok(false);
                    }
                }
            }
            if filled == 0 {
                return Ok(true);
            }
            chunk.truncate(filled);
            if tx.send(Ok(chunk)).is_err() {
                // The extractor stopped (a rejection): no need to go on.
                return Ok(false);
            }
        }
    };
    // The compressed bytes, once decompression ended.
    let mut raw = match compression {
        Compression::Zstd => {
            // A frame asking for a larger window is refused rather than
            // allocated.
            let mut d = zstd::Decoder::new(raw)?;
            d.window_log_max(max_window_log)?;
            pump(&mut d)?;
            d.finish().into_inner()
        }
        Compression::Gzip => {
            let mut d = flate2::read::MultiGzDecoder::new(raw);
            pump(&mut d)?;
            d.into_inner()
        }
        Compression::None => {
            let mut r = raw;
            pump(&mut r)?;
            r
        }
    };
    drop(tx);
    io::copy(&mut raw, &mut io::sink())?;
    Ok(raw.hasher.finish().0)
}

/// Extract the `layers` of `repo`, in order, into `dest` (an empty
/// directory the caller owns and removes on error) as one tree, verifying
/// each layer's digest ([`extract_layer`]).
///
/// The first layer is extracted into `dest`; each later one into a private
/// directory inside it, then moved into the tree entry by entry: a later
/// layer may only add files, so an entry that would overwrite a file (or
/// replace a directory) of an earlier layer, or a whiteout (`.wh.*`) that
/// would delete one, is refused naming it. The policy's limits (sum of
/// file sizes, entry count, byte budget) hold for the whole tree.
pub async fn extract_layers(
    repo: &Repo,
    layers: &[Layer],
    dest: &Path,
    mapping: Mapping,
    policy: &ExtractPolicy,
    progress: Option<Progress>,
) -> Result<ExtractStats> {
    let mut total = ExtractStats::default();
    for (index, layer) in layers.iter().enumerate() {
        if layers.len() > 1 {
            step(
                progress.as_ref(),
                &format!("layer {} of {}: {}", index + 1, layers.len(), layer.digest),
                None,
            );
        }
        if index == 0 {
            total = extract_layer(repo, layer, dest, mapping, policy, progress.clone()).await?;
            continue;
        }
        let apart = dest.join(crate::registry::layout::tmp_name(".gkm-layer-"));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&apart)
            .map_err(|e| Error::io(&apart, e))?;
        let left = what_is_left(policy, &total);
        let added = async {
            let stats =
                extract_layer(repo, layer, &apart, mapping, &left, progress.clone()).await?;
            let (from, into) = (apart.clone(), dest.to_path_buf());
            tokio::task::spawn_blocking(move || add_layer(&from, &into, Path::new(""))).await??;
            Ok::<_, Error>(stats)
        }
        .await;
        let _ = std::fs::remove_dir_all(&apart);
        let stats = added?;
        total.entries += stats.entries;
        total.files += stats.files;
        total.bytes += stats.bytes;
        total.disk_bytes += stats.disk_bytes;
    }
    Ok(total)
}

/// The policy for a later layer: the limits of the whole tree less what the
/// earlier layers took.
fn what_is_left(policy: &ExtractPolicy, so_far: &ExtractStats) -> ExtractPolicy {
    ExtractPolicy {
        max_total_size: policy.max_total_size.saturating_sub(so_far.bytes),
        max_entries: policy.max_entries.saturating_sub(so_far.entries),
        byte_budget: policy
            .byte_budget
            .map(|b| b.saturating_sub(so_far.disk_bytes)),
        ..policy.clone()
    }
}

/// Moves what a later layer extracted into `from` into the tree `into`,
/// below `rel`: new entries only. Blocking.
pub(crate) fn add_layer(from: &Path, into: &Path, rel: &Path) -> Result<()> {
    let dir = from.join(rel);
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .map_err(|e| Error::io(&dir, e))?
        .map(|e| e.map(|e| e.file_name()).map_err(|e| Error::io(&dir, e)))
        .collect::<Result<_>>()?;
    names.sort();
    for name in names {
        let rel = rel.join(&name);
        let shown = rel.to_string_lossy().into_owned();
        if name.to_string_lossy().starts_with(".wh.") {
            return Err(Error::Rejected(Rejection::new(
                &shown,
                Rule::DeletesEarlierLayer,
                "a whiteout: a later layer may only add files, not delete them",
            )));
        }
        let src = from.join(&rel);
        let dst = into.join(&rel);
        let is_dir = std::fs::symlink_metadata(&src)
            .map_err(|e| Error::io(&src, e))?
            .is_dir();
        match std::fs::symlink_metadata(&dst) {
            Ok(there) if is_dir && there.is_dir() => add_layer(from, into, &rel)?,
            Ok(there) => {
                let what = if there.is_dir() {
                    "a directory"
                } else {
                    "a file"
                };
                return Err(Error::Rejected(Rejection::new(
                    &shown,
                    Rule::OverwritesEarlierLayer,
                    format!(
                        "an earlier layer already has {what} here: a later layer may only add files"
                    ),
                )));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if is_dir {
                    std::fs::DirBuilder::new()
                        .mode(crate::image::layer::DIR_MODE)
                        .create(&dst)
                        .and_then(|()| {
                            std::fs::set_permissions(
                                &dst,
                                std::os::unix::fs::PermissionsExt::from_mode(
                                    crate::image::layer::DIR_MODE,
                                ),
                            )
                        })
                        .map_err(|e| Error::io(&dst, e))?;
                    add_layer(from, into, &rel)?;
                } else {
                    std::fs::rename(&src, &dst).map_err(|e| Error::io(&dst, e))?;
                }
            }
            Err(e) => return Err(Error::io(&dst, e)),
        }
    }
    Ok(())
}

/// Extract `layer` of `repo` into `dest` (an empty directory the caller
/// owns and removes on error), verifying the layer digest.
///
/// With registry mirrors ([`crate::registry::mirrors`]) the layer is read from the
/// first host that serves it; when the bytes a host served are not the
/// layer (they hash to another digest, or stop short), `dest` is emptied
/// and the next host is tried, the last one's failure being the result. A
/// refusal by the extraction policy of bytes that do hash to the layer's
/// digest is the image's own, and final.
pub async fn extract_layer(
    repo: &Repo,
    layer: &Layer,
    dest: &Path,
    mapping: Mapping,
    policy: &ExtractPolicy,
    progress: Option<Progress>,
) -> Result<ExtractStats> {
    let compression = layer.compression()?;
    let mut start = 0;
    loop {
        let (source, from) = repo.open_blob_from(&layer.digest, start).await?;
        let attempt = Attempt {
            compression,
            layer,
            from: &from,
            dest,
            mapping,
            policy,
        };
        match attempt.extract(source, progress.clone()).await {
            Err(e) if !from.last && served_other_bytes(&e) => {
                tracing::warn!(
                    host = %from.label, digest = %layer.digest, error = %e,
                    "refused the layer a registry host served; trying the next host"
                );
                let dir = dest.to_path_buf();
                tokio::task::spawn_blocking(move || empty_dir(&dir)).await??;
                start = from.index + 1;
            }
            result => return result,
        }
    }
}

/// Whether `e`, from extracting what a host served, says the host served
/// other bytes than the layer (or none), rather than that the layer itself
/// was refused or the destination failed.
fn served_other_bytes(e: &Error) -> bool {
    matches!(
        e,
        Error::DigestMismatch { .. }
            | Error::Task(_)
            | Error::Registry { .. }
            | Error::NotFound { .. }
    )
}

/// Removes everything in `dir`, keeping `dir`.
fn empty_dir(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let path = entry.map_err(|e| Error::io(dir, e))?.path();
        let removed = if path.is_dir() && !path.is_symlink() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed.map_err(|e| Error::io(&path, e))?;
    }
    Ok(())
}

/// One try at extracting a layer from one host.
struct Attempt<'a> {
    compression: Compression,
    layer: &'a Layer,
    from: &'a BlobHost,
    dest: &'a Path,
    mapping: Mapping,
    policy: &'a ExtractPolicy,
}

impl Attempt<'_> {
    async fn extract(
        &self,
        source: BlobSource,
        progress: Option<Progress>,
    ) -> Result<ExtractStats> {
        let what = match source {
            BlobSource::File(_) => "extracting the layer",
            BlobSource::Stream(_) => "fetching and extracting the layer",
        };
        step(progress.as_ref(), what, Some(self.layer.size));
        let mut abandoned = Abandoned::armed();
        let raw: Box<dyn Read + Send> = match source {
            BlobSource::File(path) => Box::new(File::open(&path).map_err(|e| Error::io(&path, e))?),
            BlobSource::Stream(stream) => {
                let (reader, pump) = channel_reader(stream, self.from.label.clone());
                abandoned.pump = Some(pump);
                Box::new(reader)
            }
        };
        let check = Check {
            expected: self.layer.digest.clone(),
            size: self.layer.size,
            from: self.from.label.clone(),
        };
        let compression = self.compression;
        let dest = self.dest.to_path_buf();
        let mapping = self.mapping;
        let policy = self.policy.clone();
        let given_up = abandoned.flag.clone();
        let extracted = tokio::task::spawn_blocking(move || {
            let extracted = run(raw, compression, &check, &dest, mapping, &policy, progress);
            // Written while the caller was giving up: nothing of it stays.
            if given_up.load(Ordering::SeqCst) {
                let _ = std::fs::remove_dir_all(&dest);
            }
            extracted
        })
        .await?;
        abandoned.armed = false;
        extracted
    }
}

/// Set when an extraction's caller gives up on it (drops its future, as a
/// deadline does): the pump stops, closing the connection, so the
/// extraction thread reads an end and stops, then empties the destination
/// it may have written to after the caller removed it.
struct Abandoned {
    armed: bool,
    flag: Arc<AtomicBool>,
    pump: Option<tokio::task::AbortHandle>,
}

impl Abandoned {
    fn armed() -> Abandoned {
        Abandoned {
            armed: true,
            flag: Arc::default(),
            pump: None,
        }
    }
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        if self.armed {
            self.flag.store(true, Ordering::SeqCst);
            if let Some(pump) = self.pump.take() {
                pump.abort();
            }
        }
    }
}

/// A blocking reader of `stream`, pumped by an async task (aborted with
/// the handle returned); a read error names `what`.
fn channel_reader(
    mut stream: futures::stream::BoxStream<'static, io::Result<Bytes>>,
    what: String,
) -> (ChannelReader, tokio::task::AbortHandle) {
    let (tx, rx) = tokio::sync::mpsc::channel(32);
    let pump = tokio::spawn(async move {
        // Network chunks are small; batch them so the extractor
        // wakes once per BATCH bytes, not once per packet.
        const BATCH: usize = 256 << 10;
        let mut batch = bytes::BytesMut::new();
        while let Some(item) = stream.next().await {
            match item {
                Ok(chunk) => {
                    batch.extend_from_slice(&chunk);
                    if batch.len() >= BATCH && tx.send(Ok(batch.split().freeze())).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let e = io::Error::other(Carried::Source(format!("reading {what}: {e}")));
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            }
        }
        if !batch.is_empty() {
            let _ = tx.send(Ok(batch.freeze())).await;
        }
    });
    let reader = ChannelReader {
        rx,
        current: Bytes::new(),
    };
    (reader, pump.abort_handle())
}

/// What the bytes read must be.
struct Check {
    /// The layer's digest.
    expected: Digest,
    /// Its declared size.
    size: u64,
    /// Where they come from, for errors.
    from: String,
}

impl Check {
    /// The error for bytes that are not the layer.
    fn mismatch(&self, actual: impl std::fmt::Display) -> Error {
        Error::DigestMismatch {
            what: format!("layer of {}", self.from),
            expected: self.expected.to_string(),
            actual: actual.to_string(),
        }
    }
}

fn run(
    raw: Box<dyn Read + Send>,
    compression: Compression,
    check: &Check,
    dest: &Path,
    mapping: Mapping,
    policy: &ExtractPolicy,
    progress: Option<Progress>,
) -> Result<ExtractStats> {
    let count = Arc::new(AtomicU64::new(0));
    let counting = Counting {
        inner: raw,
        hasher: Hasher::default(),
        count: count.clone(),
        declared: check.size,
        progress,
    };
    let window = policy.max_zstd_window_log;
    let (tx, rx) = std::sync::mpsc::sync_channel(8);
    let (recycle, recycled) = std::sync::mpsc::sync_channel(16);
    std::thread::scope(|s| {
        let decompressor = s.spawn(move || decompress(counting, compression, window, tx, recycled));
        let reader = RatioGuard {
            inner: ChunkReader {
                rx,
                recycle,
                current: Vec::new(),
                pos: 0,
            },
            compressed: count.clone(),
            seen: 0,
            max_ratio: policy.max_compression_ratio,
            grace: policy.ratio_grace_bytes,
        };
        let extracted = extract_tar(reader, dest, mapping, policy);
        let digest = decompressor
            .join()
            .map_err(|_| Error::Task("decompression thread panicked".into()))?;
        match (extracted, digest) {
            (Ok(stats), Ok(actual)) if actual == check.expected => Ok(stats),
            (Ok(_), Ok(actual)) => Err(check.mismatch(actual)),
            (Ok(_), Err(e)) => Err(classify(e, "(layer)")),
            // Refused, and the whole layer was hashed: a refusal of the
            // layer's own bytes is the image's, of other bytes the
            // source's.
            (Err(refused), Ok(actual)) if actual == check.expected => Err(refused),
            (Err(_), Ok(actual)) => Err(check.mismatch(actual)),
            // The rest could not be read: the source failed (the error
            // says how), or sent more bytes than the layer has.
            (Err(_), Err(e)) => Err(match classify(e, "(layer)") {
                Error::Rejected(more) => check.mismatch(format!("no digest: {}", more.detail)),
                failed => failed,
            }),
        }
    })
}

/// Flush everything written below `dir` to disk (one `syncfs`).
pub(crate) fn sync_filesystem(dir: &Path) -> Result<()> {
    use std::os::fd::AsRawFd;
    let f = File::open(dir).map_err(|e| Error::io(dir, e))?;
    // SAFETY: syncfs takes a valid open file descriptor, which `f` owns for
    // the duration of the call.
    let rc = unsafe { libc::syncfs(f.as_raw_fd()) };
    if rc != 0 {
        return Err(Error::io(dir, io::Error::last_os_error()));
    }
    Ok(())
}

/// fsync a directory so a rename in it is durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::io(dir, e))
}

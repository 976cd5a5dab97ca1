//! Streaming a layer from its source to disk: read → hash → decompress (in
//! its own thread) → policy-checked extraction, with the digest verified
//! before anything is kept.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use futures::StreamExt;

use crate::error::{Error, Result};
use crate::extract::{
    Carried, ExtractPolicy, ExtractStats, Mapping, RatioGuard, Rejection, Rule, classify,
    extract_tar,
};
use crate::image::Layer;
use crate::labels::Compression;
use crate::progress::{Progress, step};
use crate::repo::{BlobSource, Repo};
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
/// so it is all hashed. Returns the digest of the compressed bytes.
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
    let mut raw = match compression {
        Compression::Zstd => {
            // A frame asking for a larger window is refused rather than
            // allocated.
            let mut d = zstd::Decoder::new(raw)?;
            d.window_log_max(max_window_log)?;
            if !pump(&mut d)? {
                return Err(stopped());
            }
            d.finish().into_inner()
        }
        Compression::Gzip => {
            let mut d = flate2::read::MultiGzDecoder::new(raw);
            if !pump(&mut d)? {
                return Err(stopped());
            }
            d.into_inner()
        }
        Compression::None => {
            let mut r = raw;
            if !pump(&mut r)? {
                return Err(stopped());
            }
            r
        }
    };
    drop(tx);
    io::copy(&mut raw, &mut io::sink())?;
    Ok(raw.hasher.finish().0)
}

fn stopped() -> io::Error {
    io::Error::other("extraction stopped before the end of the layer")
}

/// Extract `layer` of `repo` into `dest` (an empty directory the caller
/// owns and removes on error), verifying the layer digest.
pub async fn extract_layer(
    repo: &Repo,
    layer: &Layer,
    dest: &Path,
    mapping: Mapping,
    policy: &ExtractPolicy,
    progress: Option<Progress>,
) -> Result<ExtractStats> {
    let compression = layer.compression()?;
    let source = repo.open_blob(&layer.digest).await?;
    let what = match source {
        BlobSource::File(_) => "extracting the layer",
        BlobSource::Stream(_) => "fetching and extracting the layer",
    };
    step(progress.as_ref(), what, Some(layer.size));
    let raw: Box<dyn Read + Send> = match source {
        BlobSource::File(path) => Box::new(File::open(&path).map_err(|e| Error::io(&path, e))?),
        BlobSource::Stream(mut stream) => {
            let (tx, rx) = tokio::sync::mpsc::channel(32);
            let what = repo.image().to_string();
            tokio::spawn(async move {
                // Network chunks are small; batch them so the extractor
                // wakes once per BATCH bytes, not once per packet.
                const BATCH: usize = 256 << 10;
                let mut batch = bytes::BytesMut::new();
                while let Some(item) = stream.next().await {
                    match item {
                        Ok(chunk) => {
                            batch.extend_from_slice(&chunk);
                            if batch.len() >= BATCH
                                && tx.send(Ok(batch.split().freeze())).await.is_err()
                            {
                                return;
                            }
                        }
                        Err(e) => {
                            let e =
                                io::Error::other(Carried::Source(format!("reading {what}: {e}")));
                            let _ = tx.send(Err(e)).await;
                            return;
                        }
                    }
                }
                if !batch.is_empty() {
                    let _ = tx.send(Ok(batch.freeze())).await;
                }
            });
            Box::new(ChannelReader {
                rx,
                current: Bytes::new(),
            })
        }
    };
    let expected = layer.digest.clone();
    let size = layer.size;
    let dest = dest.to_path_buf();
    let policy = policy.clone();
    tokio::task::spawn_blocking(move || {
        run(
            raw,
            compression,
            &expected,
            size,
            &dest,
            mapping,
            &policy,
            progress,
        )
    })
    .await?
}

#[allow(clippy::too_many_arguments)]
fn run(
    raw: Box<dyn Read + Send>,
    compression: Compression,
    expected: &Digest,
    size: u64,
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
        declared: size,
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
        let stats = extracted?;
        let actual = digest.map_err(|e| classify(e, "(layer)"))?;
        if &actual != expected {
            return Err(Error::DigestMismatch {
                what: "layer".into(),
                expected: expected.to_string(),
                actual: actual.to_string(),
            });
        }
        Ok(stats)
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

//! Reading PyTorch Mega-Cache blobs, what
//! `torch.compiler.save_cache_artifacts()` returns and
//! `load_cache_artifacts()` hot-loads, without unpickling anything.
//!
//! The container is `AppendingByteSerializer`'s
//! (`torch/utils/_appending_byte_serializer.py`, torch 2.11): a 4-byte
//! big-endian CRC-32 (zlib's) of everything after it, an 8-byte big-endian
//! encoding version (1), then one record per artefact type written by
//! `_serialize_single_cache` (`torch/compiler/_cache.py`): the type as a
//! string, an 8-byte count, and per artefact its key as a string and its
//! content as bytes (`CacheArtifact.serialize`). Bytes are an 8-byte
//! big-endian length then the bytes; a string is the bytes of its UTF-8
//! base64-encoded. The types in torch 2.11 are `inductor` (FX graph
//! entries), `aot_autograd`, `autotune`, `pgo` and `precompile`.
//!
//! Contents are pickles and are never unpickled: the Triton kernels an
//! `inductor` entry bundles are found by the kernel metadata JSON its
//! pickle embeds verbatim (see `blob`), filed under
//! `<blob file>:<type>/<key>`.

use std::path::Path;

use base64::Engine as _;

use super::Kind;
use crate::cache::files::{files, read_head, subdirs};
use crate::cache::{CacheError, CacheKind, CacheManifest, Facts, TorchFacts, TritonKernel, blob};
use crate::image_layout::KindLayout;

/// The Mega-Cache kind.
pub struct MegaCache;

impl CacheKind {
    /// PyTorch Mega-Cache blobs (`torch.compiler.save_cache_artifacts()`).
    #[allow(non_upper_case_globals)]
    pub const MegaCache: CacheKind = CacheKind(&MegaCache);
}

/// The PyTorch Mega-Cache image layout.
pub const LAYOUT: KindLayout = KindLayout {
    kind: CacheKind::MegaCache,
    cache_dir: "io.megacache.cache",
    manifest_dir: "io.megacache.manifest",
    label_prefix: "cache.megacache.image",
};

impl Kind for MegaCache {
    fn name(&self) -> &'static str {
        "megacache"
    }

    fn title(&self) -> &'static str {
        "a Mega-Cache"
    }

    fn layout(&self) -> KindLayout {
        LAYOUT
    }

    fn expected(&self) -> &'static str {
        EXPECTED
    }

    /// A directory holding files and no directory.
    fn recognise(&self, dir: &Path) -> Result<bool, CacheError> {
        Ok(!files(dir)?.is_empty() && subdirs(dir)?.is_empty())
    }

    /// A directory holding only Mega-Cache blobs.
    fn scan(&self, dir: &Path) -> Result<Option<CacheManifest>, CacheError> {
        Ok(scan_dir(dir)?.map(|(entries, torch)| {
            CacheManifest::of_kind(CacheKind::MegaCache, entries, Facts::of(torch))
        }))
    }

    /// One Mega-Cache blob.
    fn scan_file(&self, path: &Path) -> Option<Result<CacheManifest, CacheError>> {
        Some(scan_file(path).map(|(entries, torch)| {
            CacheManifest::of_kind(CacheKind::MegaCache, entries, Facts::of(torch))
        }))
    }

    crate::cache::torch_facts::torch_kind_rules!();
}

/// What a Mega-Cache cache is expected to be, for error messages.
pub(crate) const EXPECTED: &str = "a Mega-Cache blob (torch.compiler.save_cache_artifacts()) \
    or a directory holding only such blobs";

/// The container version torch 2.11 writes (`_ENCODING_VERSION`).
pub const ENCODING_VERSION: u64 = 1;

/// The checksum and the encoding version.
const HEADER_BYTES: usize = 12;

/// The largest blob read.
const MAX_BLOB_BYTES: u64 = 8 << 30;

/// One artefact of a blob: its type, key and content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artefact<'a> {
    /// PyTorch's artefact type (`inductor`, `aot_autograd`…).
    pub kind: String,
    /// Its cache key.
    pub key: String,
    /// Its content (a pickle, never unpickled).
    pub content: &'a [u8],
}

/// The artefacts of a Mega-Cache blob, in order. Refused, saying where,
/// when the checksum or version is wrong or a record runs past the end.
///
/// ```
/// use gkm_core::cache::megacache::artefacts;
/// let err = artefacts(b"not a mega-cache").unwrap_err();
/// assert!(err.contains("checksum"));
/// ```
pub fn artefacts(data: &[u8]) -> Result<Vec<Artefact<'_>>, String> {
    let Some((digest, body)) = data.split_first_chunk::<4>() else {
        return Err(format!("{} bytes: too short for a checksum", data.len()));
    };
    let expected = u32::from_be_bytes(*digest);
    let actual = crc32(body);
    if expected != actual {
        return Err(format!(
            "checksum {expected:08x} does not match its content ({actual:08x})"
        ));
    }
    let mut reader = Reader { data, at: 4 };
    let version = reader.u64("the encoding version")?;
    if version != ENCODING_VERSION {
        return Err(format!(
            "encoding version {version}; gkm reads version {ENCODING_VERSION}"
        ));
    }
    let mut out = Vec::new();
    while reader.at < data.len() {
        let kind = reader.string("an artefact type")?;
        let count = reader.u64("an artefact count")?;
        for _ in 0..count {
            let key = reader.string("an artefact key")?;
            let content = reader.bytes("an artefact's content")?;
            out.push(Artefact {
                kind: kind.clone(),
                key,
                content,
            });
        }
    }
    Ok(out)
}

/// The kernels and facts of one Mega-Cache blob file; refused naming the
/// file when it is not one. A file whose first bytes are not a checksum
/// and the encoding version is refused before it is read whole.
pub(crate) fn scan_file(path: &Path) -> Result<(Vec<TritonKernel>, TorchFacts), CacheError> {
    let head = read_head(path, HEADER_BYTES as u64)?;
    if head.len() < HEADER_BYTES || head[4..HEADER_BYTES] != ENCODING_VERSION.to_be_bytes() {
        return Err(not_mega(
            path,
            format!(
                "its first {HEADER_BYTES} bytes are not a checksum and encoding version {ENCODING_VERSION}"
            ),
        ));
    }
    let data = read(path)?;
    let artefacts = artefacts(&data).map_err(|reason| not_mega(path, reason))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut facts = TorchFacts::default();
    let mut entries = Vec::new();
    for artefact in &artefacts {
        facts.add(&artefact.kind, 1);
        let io = |source| CacheError::Io {
            path: path.to_path_buf(),
            source,
        };
        for mut entry in blob::kernels_in(artefact.content).map_err(io)? {
            entry.dummy_key = format!("{name}:{}/{}", artefact.kind, artefact.key);
            entries.push(entry);
        }
    }
    facts.add("triton", entries.len() as u64);
    Ok((entries, facts))
}

/// The kernels and facts of a directory of Mega-Cache blobs; `None` when
/// it holds subdirectories, no file, or no blob. A directory holding a
/// blob and a file that is not one is refused, naming the file.
pub(crate) fn scan_dir(dir: &Path) -> Result<Option<(Vec<TritonKernel>, TorchFacts)>, CacheError> {
    let names = files(dir)?;
    if names.is_empty() || !subdirs(dir)?.is_empty() {
        return Ok(None);
    }
    let mut scanned = Vec::new();
    let mut refused = None;
    for name in &names {
        match scan_file(&dir.join(name)) {
            Ok(found) => scanned.push(found),
            Err(e @ CacheError::Foreign { .. }) => {
                refused.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    if scanned.is_empty() {
        return Ok(None);
    }
    if let Some(e) = refused {
        return Err(e);
    }
    let mut facts = TorchFacts::default();
    let mut entries = Vec::new();
    for (found, part) in scanned {
        entries.extend(found);
        for (kind, n) in part.counts {
            facts.add(&kind, n);
        }
    }
    Ok(Some((entries, facts)))
}

fn read(path: &Path) -> Result<Vec<u8>, CacheError> {
    let io = |source| CacheError::Io {
        path: path.to_path_buf(),
        source,
    };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if len > MAX_BLOB_BYTES {
        return Err(not_mega(
            path,
            format!("{len} bytes, larger than the {MAX_BLOB_BYTES} gkm reads"),
        ));
    }
    std::fs::read(path).map_err(io)
}

fn not_mega(path: &Path, reason: String) -> CacheError {
    CacheError::Foreign {
        path: path.to_path_buf(),
        kind: MegaCache.title(),
        reason: format!("not a Mega-Cache blob: {reason}"),
    }
}

/// A cursor over a blob, every read bounds-checked.
struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], String> {
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| self.at.checked_add(n))
            .filter(|end| *end <= self.data.len())
            .ok_or_else(|| {
                format!(
                    "{what} at byte {} runs past the end ({} bytes)",
                    self.at,
                    self.data.len()
                )
            })?;
        let out = &self.data[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        let bytes = self.take(8, what)?;
        let mut buf = [0u8; 8];
        buf.copy_from_slice(bytes);
        Ok(u64::from_be_bytes(buf))
    }

    fn bytes(&mut self, what: &str) -> Result<&'a [u8], String> {
        let len = self.u64(what)?;
        self.take(len, what)
    }

    fn string(&mut self, what: &str) -> Result<String, String> {
        let at = self.at;
        let encoded = self.bytes(what)?;
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|e| format!("{what} at byte {at} is not base64: {e}"))?;
        String::from_utf8(decoded).map_err(|e| format!("{what} at byte {at} is not UTF-8: {e}"))
    }
}

/// zlib's CRC-32 (IEEE, reflected).
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for byte in data {
        crc ^= u32::from(*byte);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
}

/// One artefact type's record, for tests: the type and its (key,
/// content) pairs.
#[cfg(test)]
pub(crate) type Record<'a> = (&'a str, &'a [(&'a str, &'a [u8])]);

/// A blob as torch writes it, for tests: `records` are (type, [(key,
/// content)]).
#[cfg(test)]
pub(crate) fn encode(records: &[Record<'_>]) -> Vec<u8> {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let mut body = Vec::new();
    body.extend(ENCODING_VERSION.to_be_bytes());
    let bytes = |body: &mut Vec<u8>, b: &[u8]| {
        body.extend((b.len() as u64).to_be_bytes());
        body.extend(b);
    };
    for (kind, artefacts) in records {
        bytes(&mut body, b64(kind).as_bytes());
        body.extend((artefacts.len() as u64).to_be_bytes());
        for (key, content) in *artefacts {
            bytes(&mut body, b64(key).as_bytes());
            bytes(&mut body, content);
        }
    }
    let mut out = crc32(&body).to_be_bytes().to_vec();
    out.extend(body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_is_zlibs() {
        // zlib.crc32(b"123456789") == 0xCBF43926
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn a_blob_as_torch_writes_it_lists_its_artefacts() {
        let blob = encode(&[
            ("inductor", &[("fabc", b"\x80\x04pickle")]),
            ("aot_autograd", &[("aabc", b"x"), ("adef", b"y")]),
        ]);
        let found = artefacts(&blob).expect("reads");
        let kinds: Vec<&str> = found.iter().map(|a| a.kind.as_str()).collect();
        assert_eq!(kinds, ["inductor", "aot_autograd", "aot_autograd"]);
        assert_eq!(found[2].key, "adef");
        assert_eq!(found[0].content, b"\x80\x04pickle");
    }

    #[test]
    fn a_corrupt_or_truncated_blob_is_refused_saying_why() {
        let mut blob = encode(&[("inductor", &[("fabc", b"content")])]);
        let last = blob.len() - 1;
        blob[last] ^= 1;
        assert!(artefacts(&blob).unwrap_err().contains("checksum"));

        let mut body = ENCODING_VERSION.to_be_bytes().to_vec();
        body.extend(100u64.to_be_bytes());
        let mut truncated = crc32(&body).to_be_bytes().to_vec();
        truncated.extend(body);
        assert!(
            artefacts(&truncated)
                .unwrap_err()
                .contains("runs past the end")
        );

        let mut v2 = 2u64.to_be_bytes().to_vec();
        v2.splice(0..0, crc32(&2u64.to_be_bytes()).to_be_bytes());
        assert!(artefacts(&v2).unwrap_err().contains("encoding version 2"));
    }
}

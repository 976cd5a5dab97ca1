//! Content digests (`sha256:<hex>`) and hashing writers: the name of every
//! image, blob and node store entry.

use std::fmt;
use std::io::{self, Write};
use std::str::FromStr;

use sha2::{Digest as _, Sha256};

/// A validated `sha256:<64 lowercase hex>` content digest.
///
/// ```
/// use gkm_core::Digest;
/// let d: Digest = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855".parse().unwrap();
/// assert_eq!(d, Digest::of(b""));
/// assert!("sha256:abc".parse::<Digest>().is_err());
/// assert!("md5:d41d8cd98f00b204e9800998ecf8427e".parse::<Digest>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest::from_hasher(Sha256::new_with_prefix(bytes))
    }

    fn from_hasher(h: Sha256) -> Digest {
        Digest(format!("sha256:{}", hex::encode(h.finalize())))
    }

    /// The hex part, which names blobs and store directories.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }

    /// The full `sha256:<hex>` form.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Read a store directory or blob file name (the hex part) back.
    pub fn from_hex(hex: &str) -> Option<Digest> {
        format!("sha256:{hex}").parse().ok()
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A string that is not a `sha256:<64 lowercase hex>` digest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid digest {input:?}: {reason}")]
#[non_exhaustive]
pub struct InvalidDigest {
    /// What was given.
    pub input: String,
    /// What was wrong with it.
    pub reason: &'static str,
}

impl FromStr for Digest {
    type Err = InvalidDigest;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason: &'static str| InvalidDigest {
            input: s.to_string(),
            reason,
        };
        let hex = s
            .strip_prefix("sha256:")
            .ok_or_else(|| bad("expected a sha256:<hex> digest"))?;
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(bad("expected 64 lowercase hex digits after sha256:"));
        }
        Ok(Digest(s.to_string()))
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

/// A writer that hashes and counts what passes through it.
pub struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    count: u64,
}

impl<W: Write> HashingWriter<W> {
    /// Hashes and counts what is written on to `inner`.
    pub fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    /// The inner writer, the digest and the byte count.
    pub fn finish(self) -> (W, Digest, u64) {
        (self.inner, Digest::from_hasher(self.hasher), self.count)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A streaming hasher for blobs read in chunks.
#[derive(Default)]
pub struct Hasher {
    hasher: Sha256,
    count: u64,
}

impl Hasher {
    /// Adds the next chunk.
    pub fn update(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
        self.count += bytes.len() as u64;
    }

    /// The digest and byte count of everything added.
    pub fn finish(self) -> (Digest, u64) {
        (Digest::from_hasher(self.hasher), self.count)
    }
}

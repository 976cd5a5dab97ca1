//! A reader in front of the tar parser that bounds what a header may make it
//! allocate.
//!
//! The `tar` crate reads the data of GNU long-name and long-link entries and
//! of PAX extended headers whole into memory before the extractor sees the
//! entry they describe, so a layer of a few megabytes could make it allocate
//! gigabytes. [`HeaderGuard`] follows the archive's headers in the byte
//! stream the parser reads (the same sizes, PAX `size` overrides included)
//! and refuses such an entry larger than the policy's limit before the
//! parser reads a byte of it.

use std::io::{self, Read};

use crate::store::rejection::{Carried, Rejection, Rule};

const BLOCK: u64 = 512;

/// Follows tar headers in the stream it passes on; see the module docs.
pub(crate) struct HeaderGuard<R> {
    inner: R,
    limit: u64,
    /// Bytes of the current entry's data (with padding) still to pass.
    data_left: u64,
    /// The header block being read, and how much of it.
    header: [u8; BLOCK as usize],
    filled: usize,
    /// The data of the PAX header being read, and how much of it is left.
    pax: Option<(Vec<u8>, u64)>,
    /// PAX records that apply to the next entry that is not an extension.
    pending_pax: Option<Vec<u8>>,
    /// Bytes passed so far (for messages).
    offset: u64,
    /// The end of the archive, or a header the parser will refuse itself:
    /// nothing more to follow.
    done: bool,
}

impl<R: Read> HeaderGuard<R> {
    /// Guards `inner`, allowing extension headers of at most `limit` bytes.
    pub(crate) fn new(inner: R, limit: u64) -> HeaderGuard<R> {
        HeaderGuard {
            inner,
            limit,
            data_left: 0,
            header: [0; BLOCK as usize],
            filled: 0,
            pax: None,
            pending_pax: None,
            offset: 0,
            done: false,
        }
    }

    /// Passes `data` through the header state machine.
    fn follow(&mut self, mut data: &[u8]) -> Result<(), Rejection> {
        while !data.is_empty() && !self.done {
            if self.data_left > 0 {
                let take = (self.data_left.min(data.len() as u64)) as usize;
                if let Some((buf, left)) = &mut self.pax {
                    let keep = (*left).min(take as u64) as usize;
                    buf.extend_from_slice(&data[..keep]);
                    *left -= keep as u64;
                }
                self.data_left -= take as u64;
                self.offset += take as u64;
                data = &data[take..];
                if self.data_left == 0
                    && let Some((buf, _)) = self.pax.take()
                {
                    self.pending_pax = Some(buf);
                }
                continue;
            }
            let take = (BLOCK as usize - self.filled).min(data.len());
            self.header[self.filled..self.filled + take].copy_from_slice(&data[..take]);
            self.filled += take;
            self.offset += take as u64;
            data = &data[take..];
            if self.filled == BLOCK as usize {
                self.filled = 0;
                self.on_header()?;
            }
        }
        Ok(())
    }

    fn on_header(&mut self) -> Result<(), Rejection> {
        if self.header.iter().all(|b| *b == 0) {
            // The parser stops at the first zero block.
            self.done = true;
            return Ok(());
        }
        let header = tar::Header::from_byte_slice(&self.header);
        let kind = header.entry_type();
        let Ok(mut size) = header.entry_size() else {
            // The parser refuses the archive here.
            self.done = true;
            return Ok(());
        };
        let extension = kind.is_gnu_longname()
            || kind.is_gnu_longlink()
            || kind.is_pax_local_extensions()
            || kind.is_pax_global_extensions();
        if extension && size > self.limit {
            return Err(Rejection::new(
                &format!("(header at byte {})", self.offset - BLOCK),
                Rule::OversizedHeader,
                format!(
                    "a {:?} extension header of {size} bytes, limit {}",
                    kind, self.limit
                ),
            ));
        }
        if !extension && let Some(records) = self.pending_pax.take() {
            size = pax_size(&records).unwrap_or(size);
        }
        if kind.is_gnu_sparse() {
            // Sparse entries read extra header blocks; the extractor refuses
            // them as soon as it sees one.
            self.done = true;
            return Ok(());
        }
        let recognized = header.as_gnu().is_some() || header.as_ustar().is_some();
        if recognized && kind.is_pax_local_extensions() {
            self.pax = Some((Vec::with_capacity(size as usize), size));
        }
        match size.checked_add(BLOCK - 1) {
            Some(padded) => self.data_left = padded & !(BLOCK - 1),
            // The parser refuses the size itself.
            None => self.done = true,
        }
        if self.data_left == 0
            && let Some((buf, _)) = self.pax.take()
        {
            self.pending_pax = Some(buf);
        }
        Ok(())
    }
}

/// The `size` record of PAX data, read exactly as the `tar` crate reads it.
fn pax_size(records: &[u8]) -> Option<u64> {
    for record in tar::PaxExtensions::new(records) {
        let record = record.ok()?;
        if record.key() != Ok("size") {
            continue;
        }
        return record.value().ok()?.parse().ok();
    }
    None
}

impl<R: Read> Read for HeaderGuard<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.follow(&buf[..n])
            .map_err(|r| io::Error::other(Carried::Rejected(r)))?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(name: &str, kind: u8, size: u64) -> Vec<u8> {
        let mut h = tar::Header::new_gnu();
        h.set_path(name).expect("name");
        h.set_entry_type(tar::EntryType::new(kind));
        h.set_size(size);
        h.set_cksum();
        h.as_bytes().to_vec()
    }

    fn read_all(bytes: Vec<u8>, limit: u64) -> io::Result<usize> {
        let mut guard = HeaderGuard::new(bytes.as_slice(), limit);
        let mut sink = Vec::new();
        // Small reads, so headers straddle read boundaries.
        let mut buf = [0u8; 7];
        loop {
            let n = guard.read(&mut buf)?;
            if n == 0 {
                return Ok(sink.len());
            }
            sink.extend_from_slice(&buf[..n]);
        }
    }

    #[test]
    fn a_long_name_over_the_limit_is_refused_before_its_data() {
        let mut tar = header("x", b'L', 10 << 20);
        tar.extend(std::iter::repeat_n(b'a', 1024));
        let err = read_all(tar, 64 << 10).expect_err("refused");
        assert!(err.to_string().contains("oversized-header"), "{err}");
    }

    #[test]
    fn a_pax_size_is_followed_to_the_next_header() {
        // A PAX header saying the next file has 1024 bytes though its header
        // says 0; then a long name over the limit.
        let record = b"13 size=1024\n";
        let mut tar = header("pax", b'x', record.len() as u64);
        tar.extend_from_slice(record);
        tar.extend(std::iter::repeat_n(0u8, 512 - record.len()));
        tar.extend(header("io.triton.cache/f", b'0', 0));
        tar.extend(std::iter::repeat_n(b'z', 1024));
        tar.extend(header("y", b'K', 1 << 30));
        let err = read_all(tar, 64 << 10).expect_err("refused");
        assert!(err.to_string().contains("byte 2560"), "{err}");
    }

    #[test]
    fn ordinary_archives_pass_untouched() {
        let mut tar = header("io.triton.cache/a", b'0', 3);
        tar.extend_from_slice(b"abc");
        tar.extend(std::iter::repeat_n(0u8, 509));
        tar.extend(header("n", b'L', 100));
        tar.extend(std::iter::repeat_n(b'n', 512));
        tar.extend(std::iter::repeat_n(0u8, 1024));
        let len = tar.len();
        assert_eq!(read_all(tar, 64 << 10).expect("passes"), len);
    }
}

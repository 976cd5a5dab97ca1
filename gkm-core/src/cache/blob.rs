//! Finding Triton kernels inside vLLM's single-file artefacts.
//!
//! vLLM's `binary` layout (Inductor's standalone `CompiledArtifact` saved with
//! `format="binary"`) and its `aot_compile` layout (a `torch.compile` AOT
//! function saved as `model`) bundle the Triton kernels they need. Each
//! kernel's files — its `<kernel>.json` metadata among them — are stored as
//! raw byte strings in the serialised artefact, so the metadata JSON appears
//! verbatim. Triton writes it starting with `{"hash": `, which is what this
//! module looks for; each candidate is kept only if it reads as kernel
//! metadata with a target.

use std::io::{self, Read};

use super::TritonKernel;

/// What every Triton kernel metadata document starts with (Python's
/// `json.dumps` separators, and the compact form).
const STARTS: [&[u8]; 2] = [b"{\"hash\": \"", b"{\"hash\":\""];

/// Bytes read at a time.
const CHUNK: usize = 8 << 20;

/// The longest metadata document looked for; a candidate must fit in the
/// buffer before it is parsed, so this much is carried between chunks.
const MAX_METADATA: usize = 1 << 20;

/// The kernels whose metadata a blob embeds, in the order they appear,
/// without repeats.
pub(crate) fn kernels_in(mut reader: impl Read) -> io::Result<Vec<TritonKernel>> {
    let mut found: Vec<TritonKernel> = Vec::new();
    let mut buf: Vec<u8> = Vec::with_capacity(CHUNK + MAX_METADATA);
    loop {
        let eof = fill(&mut reader, &mut buf, CHUNK + MAX_METADATA)?;
        // Candidates starting before `limit` have MAX_METADATA bytes after
        // them in the buffer (or the rest of the blob).
        let limit = if eof {
            buf.len()
        } else {
            buf.len().saturating_sub(MAX_METADATA)
        };
        for entry in kernels_starting_before(&buf, limit) {
            if !found.contains(&entry) {
                found.push(entry);
            }
        }
        if eof {
            return Ok(found);
        }
        buf.drain(..limit);
    }
}

/// Read until `buf` holds `want` bytes or the reader ends; whether it ended.
fn fill(reader: &mut impl Read, buf: &mut Vec<u8>, want: usize) -> io::Result<bool> {
    while buf.len() < want {
        let start = buf.len();
        buf.resize(want, 0);
        match reader.read(&mut buf[start..]) {
            Ok(0) => {
                buf.truncate(start);
                return Ok(true);
            }
            Ok(n) => buf.truncate(start + n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => buf.truncate(start),
            Err(e) => {
                buf.truncate(start);
                return Err(e);
            }
        }
    }
    Ok(false)
}

/// Kernel metadata documents in `buf` that start before `limit`.
fn kernels_starting_before(buf: &[u8], limit: usize) -> Vec<TritonKernel> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < limit {
        let Some(offset) = buf[at..limit].iter().position(|b| *b == b'{') else {
            break;
        };
        let start = at + offset;
        at = start + 1;
        let rest = &buf[start..];
        if !STARTS.iter().any(|s| rest.starts_with(s)) {
            continue;
        }
        let window = &rest[..rest.len().min(MAX_METADATA)];
        let mut stream =
            serde_json::Deserializer::from_slice(window).into_iter::<serde_json::Value>();
        if let Some(Ok(serde_json::Value::Object(_))) = stream.next() {
            let end = stream.byte_offset();
            if let Ok(entry) = TritonKernel::from_kernel_json(&window[..end]) {
                out.push(entry);
                at = start + end;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(hash: &str, arch: &str) -> String {
        format!(
            r#"{{"hash": "{hash}", "target": {{"backend": "cuda", "arch": {arch}, "warp_size": 32}}, "num_warps": 4, "name": "k_{hash}"}}"#
        )
    }

    #[test]
    fn finds_metadata_between_binary_bytes() {
        let mut blob = vec![0x80, 0x04, 0x95, 0xff, b'{', b'{'];
        blob.extend_from_slice(metadata("aa", "80").as_bytes());
        blob.extend_from_slice(b"\x00\x01{\"hash\": \"not metadata\"}\xfe");
        blob.extend_from_slice(metadata("bb", "90").as_bytes());
        blob.extend_from_slice(metadata("aa", "80").as_bytes());
        blob.extend_from_slice(b"{\"hash\": \"truncated\", \"target\": {\"ba");
        let found = kernels_in(&blob[..]).unwrap();
        let hashes: Vec<_> = found.iter().map(|e| e.hash.as_str()).collect();
        assert_eq!(hashes, ["aa", "bb"]);
        assert_eq!(found[1].target().to_string(), "cuda/90/32");
    }

    #[test]
    fn finds_metadata_across_chunk_boundaries() {
        let doc = metadata("cc", "75");
        for pad in [CHUNK - 10, CHUNK + 1, CHUNK * 2 - doc.len() / 2] {
            let mut blob = vec![0u8; pad];
            blob.extend_from_slice(doc.as_bytes());
            blob.extend_from_slice(&[7u8; 100]);
            let found = kernels_in(&blob[..]).unwrap();
            assert_eq!(found.len(), 1, "padding {pad}");
            assert_eq!(found[0].hash, "cc");
        }
    }
}

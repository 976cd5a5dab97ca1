//! Accepting the kubelet plugin watcher's `:authority`.
//!
//! The kubelet's plugin watcher (which calls the registration socket in
//! `plugins_registry/`) dials the socket by its path without overriding the
//! HTTP/2 authority, so grpc-go sends the path itself (`/var/lib/kubelet/
//! plugins_registry/csi.gkm.io-reg.sock`) as `:authority`. That is not a valid
//! URI authority, and h2 (under tonic) answers every such request with
//! `PROTOCOL_ERROR`: the kubelet then logs `RegisterPlugin error -- failed to
//! get plugin info` and never uses the driver. The kubelet's CSI and
//! device-manager clients set `localhost` and are not affected.
//!
//! [`AuthorityFix`] sits between the socket and the HTTP/2 server. It reads
//! the client's frames, decodes every header block with its own HPACK
//! decoder (so the client's dynamic table is followed exactly), replaces an
//! `:authority` that is not a valid authority with `localhost`, and encodes
//! the block again with its own HPACK encoder, whose table the server's
//! decoder mirrors. Every other frame passes through unchanged, and so does
//! everything the server writes. A stream the adapter cannot follow (a bad
//! preface, an oversized frame) is passed through raw from then on, so the
//! server reports the error as it would have.
//!
//! Decoding is bounded: HPACK lets a few bytes name a 4 KiB entry of the
//! dynamic table again and again, so a small block can decode to gigabytes
//! (an "HPACK bomb"). A header block, its decoded header list (sized as
//! `SETTINGS_MAX_HEADER_LIST_SIZE` counts it: name, value and 32 bytes per
//! field) and its number of fields each have a limit ([`MAX_HEADER_LIST`],
//! [`MAX_HEADER_FIELDS`]); a block over one ends the connection with a
//! [`RewriteError::TooLarge`] naming the stream and the limit, before any
//! field beyond the limit is copied.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// The HTTP/2 client connection preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Frame header length.
const FRAME_HEADER: usize = 9;
/// The largest frame the server accepts (HTTP/2's default
/// `SETTINGS_MAX_FRAME_SIZE`, which tonic's server keeps).
const MAX_FRAME: usize = 16_384;
/// The largest header list followed, in `SETTINGS_MAX_HEADER_LIST_SIZE`
/// bytes (each field's name and value plus 32), and the largest encoded
/// header block (never larger than the list it decodes to): the limit of the
/// HTTP/2 server behind the adapter (hyper's default), so nothing it would
/// have served is refused. A larger block ends the connection.
pub const MAX_HEADER_LIST: usize = 16 * 1024;
/// The most fields one header block may hold (the kubelet sends about ten).
pub const MAX_HEADER_FIELDS: usize = 128;
/// What RFC 7541 adds to each field's name and value when sizing a list.
const FIELD_OVERHEAD: usize = 32;
/// HPACK's default dynamic table size, which the server's decoder uses.
const HPACK_TABLE: usize = 4_096;
/// What replaces an authority that is not one.
const LOCALHOST: &[u8] = b"localhost";

const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;

/// A server-side connection whose client header blocks have an invalid
/// `:authority` replaced by `localhost` (see the [module docs](self)).
pub struct AuthorityFix<S> {
    inner: S,
    rewriter: Rewriter,
    /// Rewritten bytes not handed to the reader yet.
    ready: Vec<u8>,
    ready_at: usize,
}

impl<S> AuthorityFix<S> {
    /// Wrap a freshly accepted connection.
    pub fn new(inner: S) -> AuthorityFix<S> {
        AuthorityFix {
            inner,
            rewriter: Rewriter::default(),
            ready: Vec::new(),
            ready_at: 0,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.ready_at < this.ready.len() {
                let pending = &this.ready[this.ready_at..];
                let n = pending.len().min(buf.remaining());
                buf.put_slice(&pending[..n]);
                this.ready_at += n;
                if this.ready_at == this.ready.len() {
                    this.ready.clear();
                    this.ready_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 8192];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) if read.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => {
                    this.rewriter
                        .feed(read.filled(), &mut this.ready)
                        .map_err(|e| {
                            tracing::warn!(error = %e, "ending a plugin-registration connection");
                            io::Error::new(io::ErrorKind::InvalidData, e)
                        })?;
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<S: Connected> Connected for AuthorityFix<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// Why a client's byte stream could not be rewritten.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RewriteError {
    /// A header block did not decode.
    #[error("HTTP/2 header block of stream {stream}: {detail}")]
    HeaderBlock {
        /// The stream it belongs to.
        stream: u32,
        /// What was wrong.
        detail: String,
    },
    /// A header block over a limit ([`MAX_HEADER_LIST`],
    /// [`MAX_HEADER_FIELDS`]): encoded or decoded, too large to follow.
    #[error("HTTP/2 header block of stream {stream}: {what} exceeds the limit of {limit}")]
    TooLarge {
        /// The stream it belongs to.
        stream: u32,
        /// What exceeded the limit.
        what: &'static str,
        /// The limit.
        limit: usize,
    },
}

#[derive(Default, PartialEq, Eq)]
enum Mode {
    /// Reading the connection preface; how much of it was seen.
    #[default]
    Preface,
    /// Reading frames.
    Frames,
    /// Passing everything through untouched.
    Raw,
}

/// The byte-level rewriter behind [`AuthorityFix`], usable on its own.
pub struct Rewriter {
    mode: Mode,
    pending: Vec<u8>,
    block: Option<Block>,
    decoder: Decoder<'static>,
    encoder: Encoder<'static>,
}

/// Decoded header fields, names and values.
type HeaderList = Vec<(Vec<u8>, Vec<u8>)>;

/// A header block being collected from HEADERS and CONTINUATION frames.
struct Block {
    stream: u32,
    end_stream: bool,
    fragment: Vec<u8>,
}

impl Default for Rewriter {
    fn default() -> Rewriter {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(HPACK_TABLE);
        Rewriter {
            mode: Mode::Preface,
            pending: Vec::new(),
            block: None,
            decoder,
            encoder: Encoder::new(),
        }
    }
}

impl Rewriter {
    /// Take `input` from the client and append what the server should read
    /// to `out`.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(), RewriteError> {
        if self.mode == Mode::Raw {
            out.extend_from_slice(input);
            return Ok(());
        }
        self.pending.extend_from_slice(input);
        if self.mode == Mode::Preface {
            let n = self.pending.len().min(PREFACE.len());
            if self.pending[..n] != PREFACE[..n] {
                return self.go_raw(out);
            }
            if n < PREFACE.len() {
                return Ok(());
            }
            out.extend_from_slice(PREFACE);
            self.pending.drain(..PREFACE.len());
            self.mode = Mode::Frames;
        }
        let mut at = 0;
        while self.pending.len() - at >= FRAME_HEADER {
            let header = &self.pending[at..at + FRAME_HEADER];
            let length =
                usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
            if length > MAX_FRAME {
                self.pending.drain(..at);
                return self.go_raw(out);
            }
            if self.pending.len() - at < FRAME_HEADER + length {
                break;
            }
            let (kind, flags) = (header[3], header[4]);
            let stream =
                u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
            let frame = at..at + FRAME_HEADER + length;
            let payload = &self.pending[at + FRAME_HEADER..frame.end];
            match kind {
                TYPE_HEADERS => {
                    let fragment = match headers_fragment(payload, flags) {
                        Some(fragment) => fragment.to_vec(),
                        // Malformed padding: let the server say so.
                        None => {
                            self.pending.drain(..at);
                            return self.go_raw(out);
                        }
                    };
                    self.block = Some(Block {
                        stream,
                        end_stream: flags & FLAG_END_STREAM != 0,
                        fragment,
                    });
                }
                TYPE_CONTINUATION if self.block.as_ref().is_some_and(|b| b.stream == stream) => {
                    if let Some(block) = self.block.as_mut() {
                        block.fragment.extend_from_slice(payload);
                    }
                }
                _ => {
                    out.extend_from_slice(&self.pending[frame.clone()]);
                    at = frame.end;
                    continue;
                }
            }
            at = frame.end;
            if self
                .block
                .as_ref()
                .is_some_and(|b| b.fragment.len() > MAX_HEADER_LIST)
            {
                return Err(RewriteError::TooLarge {
                    stream,
                    what: "the encoded block (bytes)",
                    limit: MAX_HEADER_LIST,
                });
            }
            if flags & FLAG_END_HEADERS != 0
                && let Some(block) = self.block.take()
            {
                self.rewrite(&block, out)?;
            }
        }
        self.pending.drain(..at);
        Ok(())
    }

    /// Passes what is pending and everything after it through untouched.
    fn go_raw(&mut self, out: &mut Vec<u8>) -> Result<(), RewriteError> {
        out.append(&mut self.pending);
        self.mode = Mode::Raw;
        Ok(())
    }

    /// Decode `block`, fix its authority, encode it again as one HEADERS
    /// frame and as many CONTINUATION frames as its size needs.
    fn rewrite(&mut self, block: &Block, out: &mut Vec<u8>) -> Result<(), RewriteError> {
        let mut fields = self.decode(block)?;
        for (name, value) in fields.iter_mut() {
            if name.as_slice() == b":authority"
                && http::uri::Authority::try_from(value.as_slice()).is_err()
            {
                tracing::debug!(stream = block.stream, authority = %String::from_utf8_lossy(value), "replacing an invalid :authority with localhost");
                *value = LOCALHOST.to_vec();
            }
        }
        let encoded = self
            .encoder
            .encode(fields.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        let mut chunks = encoded.chunks(MAX_FRAME).peekable();
        let mut first = true;
        // An empty block still needs its HEADERS frame.
        let empty: &[u8] = &[];
        let mut next = chunks.next().or(Some(empty));
        while let Some(chunk) = next {
            next = chunks.next();
            let mut flags = 0;
            if first && block.end_stream {
                flags |= FLAG_END_STREAM;
            }
            if next.is_none() {
                flags |= FLAG_END_HEADERS;
            }
            let kind = if first {
                TYPE_HEADERS
            } else {
                TYPE_CONTINUATION
            };
            write_frame(out, kind, flags, block.stream, chunk);
            first = false;
        }
        Ok(())
    }
}

impl Rewriter {
    /// Decode `block` within [`MAX_HEADER_LIST`] and [`MAX_HEADER_FIELDS`]:
    /// fields past a limit are not copied, and the block is refused.
    fn decode(&mut self, block: &Block) -> Result<HeaderList, RewriteError> {
        let mut fields = Vec::new();
        let mut list_size = 0usize;
        let mut count = 0usize;
        self.decoder
            .decode_with_cb(&block.fragment, |name, value| {
                count += 1;
                list_size = list_size.saturating_add(name.len() + value.len() + FIELD_OVERHEAD);
                if count <= MAX_HEADER_FIELDS && list_size <= MAX_HEADER_LIST {
                    fields.push((name.into_owned(), value.into_owned()));
                }
            })
            .map_err(|e| RewriteError::HeaderBlock {
                stream: block.stream,
                detail: format!("{e:?}"),
            })?;
        if count > MAX_HEADER_FIELDS {
            return Err(RewriteError::TooLarge {
                stream: block.stream,
                what: "the number of header fields",
                limit: MAX_HEADER_FIELDS,
            });
        }
        if list_size > MAX_HEADER_LIST {
            return Err(RewriteError::TooLarge {
                stream: block.stream,
                what: "the decoded header list (bytes)",
                limit: MAX_HEADER_LIST,
            });
        }
        Ok(fields)
    }
}

/// The header block fragment of a HEADERS frame's payload, without padding
/// and priority; `None` when the padding does not fit.
fn headers_fragment(payload: &[u8], flags: u8) -> Option<&[u8]> {
    let mut start = 0;
    let mut end = payload.len();
    if flags & FLAG_PADDED != 0 {
        let pad = usize::from(*payload.first()?);
        start += 1;
        end = end.checked_sub(pad)?;
    }
    if flags & FLAG_PRIORITY != 0 {
        start += 5;
    }
    payload.get(start..end)
}

fn write_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len();
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

#[cfg(test)]
mod tests {
    use super::*;

    type Fields = Vec<(Vec<u8>, Vec<u8>)>;

    fn request(authority: &str, path: &str) -> Fields {
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        .iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
    }

    fn encode(encoder: &mut Encoder<'_>, fields: &Fields) -> Vec<u8> {
        encoder.encode(fields.iter().map(|(n, v)| (n.as_slice(), v.as_slice())))
    }

    /// The frames of `bytes` as (type, flags, stream, payload).
    fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        let mut out = Vec::new();
        while bytes.len() >= FRAME_HEADER {
            let len =
                usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
            let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
            out.push((
                bytes[3],
                bytes[4],
                stream,
                bytes[FRAME_HEADER..FRAME_HEADER + len].to_vec(),
            ));
            bytes = &bytes[FRAME_HEADER + len..];
        }
        assert!(bytes.is_empty(), "trailing bytes");
        out
    }

    /// What the server's decoder reads from the rewritten frames.
    fn server_view(decoder: &mut Decoder<'_>, out: &[u8]) -> Vec<Fields> {
        let mut blocks = Vec::new();
        let mut block = Vec::new();
        for (kind, flags, _, payload) in frames(out) {
            if kind == TYPE_HEADERS || kind == TYPE_CONTINUATION {
                block.extend_from_slice(&payload);
                if flags & FLAG_END_HEADERS != 0 {
                    blocks.push(decoder.decode(&block).expect("server decodes"));
                    block.clear();
                }
            }
        }
        blocks
    }

    #[test]
    fn replaces_a_socket_path_authority_and_keeps_the_rest() {
        let socket = "/var/lib/kubelet/plugins_registry/csi.gkm.io-reg.sock";
        let mut client = Encoder::new();
        let mut input = PREFACE.to_vec();
        write_frame(&mut input, 0x4, 0, 0, &[]); // SETTINGS
        // Two requests on one connection: the second refers to the
        // client's dynamic table.
        let first = request(socket, "/pluginregistration.Registration/GetInfo");
        let second = request(
            socket,
            "/pluginregistration.Registration/NotifyRegistrationStatus",
        );
        write_frame(
            &mut input,
            TYPE_HEADERS,
            FLAG_END_HEADERS,
            1,
            &encode(&mut client, &first),
        );
        write_frame(&mut input, 0x0, FLAG_END_STREAM, 1, b"\0\0\0\0\0"); // DATA
        write_frame(
            &mut input,
            TYPE_HEADERS,
            FLAG_END_HEADERS,
            3,
            &encode(&mut client, &second),
        );

        // Fed one byte at a time, as a slow socket would deliver it.
        let mut rewriter = Rewriter::default();
        let mut out = Vec::new();
        for byte in &input {
            rewriter
                .feed(std::slice::from_ref(byte), &mut out)
                .expect("rewrites");
        }
        assert!(out.starts_with(PREFACE));
        let rest = &out[PREFACE.len()..];
        let kinds: Vec<(u8, u32)> = frames(rest).iter().map(|f| (f.0, f.2)).collect();
        assert_eq!(
            kinds,
            [(0x4, 0), (TYPE_HEADERS, 1), (0x0, 1), (TYPE_HEADERS, 3)]
        );

        let blocks = server_view(&mut Decoder::new(), rest);
        let expect = |fields: &Fields| -> Fields {
            fields
                .iter()
                .map(|(n, v)| {
                    let v = if n == b":authority" {
                        LOCALHOST.to_vec()
                    } else {
                        v.clone()
                    };
                    (n.clone(), v)
                })
                .collect()
        };
        assert_eq!(blocks, vec![expect(&first), expect(&second)]);
        for block in &blocks {
            for (name, value) in block {
                if name == b":authority" {
                    assert!(http::uri::Authority::try_from(value.as_slice()).is_ok());
                }
            }
        }
    }

    #[test]
    fn leaves_a_valid_authority_and_follows_padding_priority_and_continuation() {
        let mut client = Encoder::new();
        let fields = request("localhost", "/csi.v1.Node/NodeGetInfo");
        let block = encode(&mut client, &fields);
        let (a, b) = block.split_at(block.len() / 2);
        let mut payload = vec![3u8]; // pad length
        payload.extend_from_slice(&[0, 0, 0, 0, 16]); // priority
        payload.extend_from_slice(a);
        payload.extend_from_slice(&[0, 0, 0]);
        let mut input = PREFACE.to_vec();
        write_frame(
            &mut input,
            TYPE_HEADERS,
            FLAG_PADDED | FLAG_PRIORITY | FLAG_END_STREAM,
            5,
            &payload,
        );
        write_frame(&mut input, TYPE_CONTINUATION, FLAG_END_HEADERS, 5, b);

        let mut out = Vec::new();
        Rewriter::default()
            .feed(&input, &mut out)
            .expect("rewrites");
        let rest = &out[PREFACE.len()..];
        let f = frames(rest);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].1, FLAG_END_STREAM | FLAG_END_HEADERS);
        assert_eq!(server_view(&mut Decoder::new(), rest), vec![fields]);
    }

    #[test]
    fn a_stream_it_cannot_follow_passes_through_raw() {
        let mut out = Vec::new();
        let mut rewriter = Rewriter::default();
        rewriter
            .feed(b"GET / HTTP/1.1\r\n\r\n", &mut out)
            .expect("raw");
        assert_eq!(out, b"GET / HTTP/1.1\r\n\r\n");

        let mut oversized = PREFACE.to_vec();
        oversized.extend_from_slice(&[0x01, 0x00, 0x00, 0x0, 0, 0, 0, 0, 0]);
        let mut out = Vec::new();
        Rewriter::default().feed(&oversized, &mut out).expect("raw");
        assert_eq!(out, oversized);
    }

    /// One HEADERS frame on `stream` holding `block` whole.
    fn one_block(stream: u32, block: &[u8]) -> Vec<u8> {
        let mut input = PREFACE.to_vec();
        write_frame(&mut input, TYPE_HEADERS, FLAG_END_HEADERS, stream, block);
        input
    }

    #[test]
    fn a_block_decoding_past_the_limits_is_refused_naming_the_limit() {
        // One 4 KiB table entry named five times: a small block whose
        // header list is over MAX_HEADER_LIST.
        let mut client = Encoder::new();
        let big = vec![b'a'; 4000];
        let mut block = client.encode([(b"x-big".as_slice(), big.as_slice())]);
        block.extend(std::iter::repeat_n(0x80 | 62, 4));
        assert!(block.len() < MAX_HEADER_LIST);
        let err = Rewriter::default()
            .feed(&one_block(9, &block), &mut Vec::new())
            .expect_err("refused");
        assert!(
            matches!(
                err,
                RewriteError::TooLarge {
                    stream: 9,
                    limit: MAX_HEADER_LIST,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("decoded header list"), "{err}");

        // Many small fields: over MAX_HEADER_FIELDS.
        let fields: Fields = (0..=MAX_HEADER_FIELDS)
            .map(|i| (format!("x-{i}").into_bytes(), b"v".to_vec()))
            .collect();
        let block = encode(&mut Encoder::new(), &fields);
        let err = Rewriter::default()
            .feed(&one_block(11, &block), &mut Vec::new())
            .expect_err("refused");
        assert!(err.to_string().contains("number of header fields"), "{err}");
        assert!(err.to_string().contains("stream 11"), "{err}");

        // Just within the limits: rewritten.
        let fields: Fields = (0..MAX_HEADER_FIELDS)
            .map(|i| (format!("x-{i}").into_bytes(), b"v".to_vec()))
            .collect();
        let mut out = Vec::new();
        Rewriter::default()
            .feed(
                &one_block(13, &encode(&mut Encoder::new(), &fields)),
                &mut out,
            )
            .expect("within the limits");
        assert_eq!(
            server_view(&mut Decoder::new(), &out[PREFACE.len()..]),
            vec![fields]
        );
    }

    #[test]
    fn an_undecodable_block_is_an_error_naming_the_stream() {
        let mut input = PREFACE.to_vec();
        write_frame(
            &mut input,
            TYPE_HEADERS,
            FLAG_END_HEADERS,
            7,
            &[0xff, 0xff, 0xff, 0xff],
        );
        let err = Rewriter::default()
            .feed(&input, &mut Vec::new())
            .expect_err("refused");
        assert!(err.to_string().contains("stream 7"), "{err}");
    }
}

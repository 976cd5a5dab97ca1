//! The plugin-registration socket under an HPACK bomb: a header block of a
//! few hundred kilobytes that names one 4 KiB entry of the HPACK dynamic
//! table again and again, so that it decodes to hundreds of megabytes. The
//! socket lives in the kubelet's `plugins_registry`, where anything with
//! that host directory can reach it.
//!
//! The registration server must end such a connection without decoding the
//! block whole (this process's peak memory barely moves) and go on serving
//! the next client. This test binary holds this one test, so the peak
//! resident size it reads (`VmHWM`) is its own.

use std::time::Duration;

use gkm_k8s_kubelet::proto::registration::InfoRequest;
use gkm_k8s_kubelet::proto::registration::registration_client::RegistrationClient;
use gkm_k8s_kubelet::registration::{
    CSI_PLUGIN_TYPE, Plugin, RegistrationService, serve_registration,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const PLUGIN: Plugin = Plugin {
    kind: CSI_PLUGIN_TYPE,
    name: "bomb.gkm.io",
    versions: &["1.0.0"],
};
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const MAX_FRAME: usize = 16_384;
/// The value of the one table entry the bomb repeats: with its name and
/// 32 bytes of overhead it just fits HPACK's default 4 KiB table.
const ENTRY_VALUE: usize = 4_000;
/// How often the bomb names the entry: 60 000 one-byte references, so the
/// block is about 64 KiB and its header list about 240 MiB.
const REPEATS: usize = 60_000;
/// How much the peak resident size may grow while the bomb is handled.
const PEAK_GROWTH_LIMIT_KIB: u64 = 64 * 1024;

/// An HPACK integer with an `prefix`-bit prefix, its first byte or'ed with
/// `first`.
fn hpack_int(out: &mut Vec<u8>, first: u8, prefix: u32, mut value: usize) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// The bomb: a request's pseudo-headers, one literal field added to the
/// dynamic table (index 62), then `REPEATS` references to it.
fn bomb_block() -> Vec<u8> {
    let mut block = vec![
        0x83, // :method POST
        0x86, // :scheme http
        0x84, // :path /
    ];
    let name = b"x-bomb";
    block.push(0x40); // literal with incremental indexing, new name
    hpack_int(&mut block, 0, 7, name.len());
    block.extend_from_slice(name);
    hpack_int(&mut block, 0, 7, ENTRY_VALUE);
    block.extend(std::iter::repeat_n(b'a', ENTRY_VALUE));
    block.extend(std::iter::repeat_n(0x80 | 62, REPEATS));
    block
}

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len();
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// The connection's bytes: preface, empty SETTINGS, and the bomb on stream
/// 1 as a HEADERS frame and CONTINUATION frames.
fn bomb_connection() -> Vec<u8> {
    let block = bomb_block();
    let mut out = PREFACE.to_vec();
    frame(&mut out, 0x4, 0, 0, &[]);
    let chunks: Vec<&[u8]> = block.chunks(MAX_FRAME).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        let kind = if i == 0 { 0x1 } else { 0x9 };
        let mut flags = if i == 0 { 0x1 } else { 0 }; // END_STREAM
        if i + 1 == chunks.len() {
            flags |= 0x4; // END_HEADERS
        }
        frame(&mut out, kind, flags, 1, chunk);
    }
    out
}

/// This process's peak resident set size, KiB.
fn peak_rss_kib() -> anyhow::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no VmHWM in /proc/self/status"))
}

/// Everything the server writes until it closes the connection (or
/// `limit` passes), and whether it closed it.
async fn read_until_closed(conn: &mut UnixStream, limit: Duration) -> (Vec<u8>, bool) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, conn.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (got, true),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return (got, false),
        }
    }
}

/// HEADERS frames the server sent on `stream` (a response).
fn response_headers(mut bytes: &[u8], stream: u32) -> usize {
    let mut n = 0;
    while bytes.len() >= 9 {
        let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
        let on = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff;
        if bytes[3] == 0x1 && on == stream {
            n += 1;
        }
        bytes = bytes.get(9 + len..).unwrap_or_default();
    }
    n
}

#[tokio::test(flavor = "multi_thread")]
async fn the_registration_socket_refuses_an_hpack_bomb_and_keeps_serving() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join(PLUGIN.socket_name());
    let service = RegistrationService::new(PLUGIN, "/var/lib/kubelet/plugins/bomb/csi.sock".into());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn({
        let socket = socket.clone();
        async move {
            serve_registration(&socket, service, async {
                stopped.await.ok();
            })
            .await
        }
    });
    let began = tokio::time::Instant::now();
    while !socket.exists() {
        anyhow::ensure!(began.elapsed() < Duration::from_secs(10), "no socket");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let bytes = bomb_connection();
    let before = peak_rss_kib()?;
    let mut conn = UnixStream::connect(&socket).await?;
    // The server may close the connection before it read everything.
    let _ = conn.write_all(&bytes).await;
    let (answer, closed) = read_until_closed(&mut conn, Duration::from_secs(30)).await;
    let growth = peak_rss_kib()?.saturating_sub(before);
    eprintln!(
        "sent {} bytes; the server answered {} bytes, closed: {closed}; peak RSS grew {growth} KiB",
        bytes.len(),
        answer.len()
    );
    assert!(closed, "the server kept the bomb's connection open");
    assert_eq!(
        response_headers(&answer, 1),
        0,
        "the server answered the bomb's stream"
    );
    assert!(
        growth < PEAK_GROWTH_LIMIT_KIB,
        "peak resident size grew by {growth} KiB handling a {} byte header block",
        bytes.len()
    );

    // The next client (the kubelet's plugin watcher) is served as before.
    let channel = gkm_k8s_kubelet::socket::connect(&socket, Duration::from_secs(5)).await?;
    let info = RegistrationClient::new(channel)
        .get_info(InfoRequest {})
        .await?
        .into_inner();
    assert_eq!(info.name, PLUGIN.name);

    stop.send(()).ok();
    server.await??;
    Ok(())
}

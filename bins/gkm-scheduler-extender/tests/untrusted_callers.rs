//! What a caller that is not the scheduler can do to the extender, against
//! the real binary over a real apiserver: a body far larger than any
//! scheduler call is refused with 413 before it is read whole, calls that
//! send their bodies slowly hold no place the scheduler's calls need,
//! bodies being read hold a bounded number of bytes (past it a call is
//! answered 503 at once) and a body that never ends is cut off with 408.

mod support;

use std::time::{Duration, Instant};

use support::Cluster;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The most request body a scheduler call needs; the cap is near this.
const ONE_MIB: usize = 1 << 20;
/// The calls the extender answers at once, as it ships.
const IN_FLIGHT: usize = gkm_k8s_extender::MAX_IN_FLIGHT;

/// One HTTP/1.1 POST of `body` to `path`: the status line and the reply body.
async fn post(addr: &str, path: &str, body: &[u8]) -> anyhow::Result<(String, String)> {
    post_declaring(addr, path, body.len(), body).await
}

/// A POST whose head declares `length` bytes of body and which sends `body`
/// (perhaps fewer) before reading the reply.
async fn post_declaring(
    addr: &str,
    path: &str,
    length: usize,
    body: &[u8],
) -> anyhow::Result<(String, String)> {
    let mut stream = TcpStream::connect(addr).await?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {length}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply).await;
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let status = reply.lines().next().unwrap_or_default().to_owned();
    let body = reply
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// A chunked POST of `body`, sent in 64 KiB chunks until the server
/// answers, then the reply.
async fn post_chunked(addr: &str, path: &str, body: &[u8]) -> anyhow::Result<(String, String)> {
    let mut stream = TcpStream::connect(addr).await?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await?;
    let (mut read, mut write) = stream.into_split();
    let sender = async move {
        for chunk in body.chunks(64 << 10) {
            let framed = [format!("{:x}\r\n", chunk.len()).as_bytes(), chunk, b"\r\n"].concat();
            if write.write_all(&framed).await.is_err() {
                return;
            }
        }
        let _ = write.write_all(b"0\r\n\r\n").await;
    };
    let mut reply = Vec::new();
    let reader = read.read_to_end(&mut reply);
    let (_, read) = tokio::join!(sender, reader);
    read?;
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let status = reply.lines().next().unwrap_or_default().to_owned();
    let body = reply
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// A call that declares `length` bytes of body and sends only `sent`: the
/// extender reads it until the connection closes or its read times out.
async fn stalled_call(addr: &str, length: usize, sent: &[u8]) -> anyhow::Result<TcpStream> {
    let mut stream = TcpStream::connect(addr).await?;
    let head = format!(
        "POST /scheduler/bind HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {length}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(sent).await?;
    Ok(stream)
}

const BIND: &[u8] =
    br#"{"PodName":"nobody","PodNamespace":"default","PodUID":"0","Node":"nowhere"}"#;

#[tokio::test]
async fn a_bind_body_over_one_mebibyte_is_refused_with_413() -> anyhow::Result<()> {
    let mut cluster = Cluster::start().await?;
    cluster.start_extender().await?;
    let addr = cluster.extender_addr.clone();

    // A 2 MiB body, of which the first 64 KiB are sent: the extender
    // answers from the declared length, without waiting for the rest.
    let start = vec![b' '; 64 << 10];
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        post_declaring(&addr, "/scheduler/bind", 2 * ONE_MIB, &start),
    )
    .await;
    let Ok(reply) = reply else {
        panic!("the extender waited for a 2 MiB body\n{}", cluster.logs());
    };
    let (status, body) = reply?;
    assert!(
        status.starts_with("HTTP/1.1 413"),
        "a 2 MiB bind body: {status} {body}\n{}",
        cluster.logs()
    );
    assert!(
        body.contains("larger than") && body.contains("bytes"),
        "the refusal says what was too large: {body}"
    );

    // A body over the cap sent whole, without a declared length (chunked),
    // is refused too.
    let (status, body) = post_chunked(&addr, "/scheduler/bind", &vec![b' '; 2 * ONE_MIB]).await?;
    assert!(
        status.starts_with("HTTP/1.1 413"),
        "a 2 MiB chunked bind body: {status} {body}"
    );

    // A real-sized call is still answered (with the extender's own error:
    // no such pod).
    let (status, body) = post(&addr, "/scheduler/bind", BIND).await?;
    assert!(status.starts_with("HTTP/1.1 200"), "{status} {body}");
    Ok(())
}

#[tokio::test]
async fn slow_callers_cannot_starve_the_schedulers_calls() -> anyhow::Result<()> {
    let mut cluster = Cluster::start().await?;
    cluster.start_extender().await?;
    let addr = cluster.extender_addr.clone();

    // More calls than the extender answers at once, each stalled before
    // its body: they hold no place, and a whole call is still answered at
    // once.
    let mut stalled = Vec::new();
    for _ in 0..2 * IN_FLIGHT {
        stalled.push(stalled_call(&addr, 4096, b"").await?);
    }
    let began = Instant::now();
    let (status, body) =
        tokio::time::timeout(Duration::from_secs(5), post(&addr, "/scheduler/bind", BIND))
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "a bind waited behind {} stalled calls\n{}",
                    stalled.len(),
                    cluster.logs()
                )
            })??;
    assert!(
        status.starts_with("HTTP/1.1 200") && began.elapsed() < Duration::from_secs(2),
        "a bind behind stalled calls: {status} {body}"
    );

    // Bodies being read hold at most IN_FLIGHT bodies of the largest size:
    // once calls that sent all but one byte of theirs hold that (all but
    // IN_FLIGHT bytes, fewer than a bind's), one more body is shed at once
    // and told to retry.
    let mut full = Vec::new();
    for _ in 0..IN_FLIGHT {
        full.push(stalled_call(&addr, ONE_MIB, &vec![b' '; ONE_MIB - 1]).await?);
    }
    let (status, body) = gkm_testenv::settle(
        Duration::from_secs(5),
        || post(&addr, "/scheduler/bind", BIND),
        |(status, _)| status.starts_with("HTTP/1.1 503"),
    )
    .await?;
    assert!(
        status.starts_with("HTTP/1.1 503"),
        "a bind while {IN_FLIGHT} MiB of bodies are being read: {status} {body}\n{}",
        cluster.logs()
    );
    assert!(body.contains("retry"), "the refusal says to retry: {body}");

    // The bytes free as those calls end.
    drop(full);
    let (status, body) = gkm_testenv::settle(
        Duration::from_secs(10),
        || post(&addr, "/scheduler/bind", BIND),
        |(status, _)| status.starts_with("HTTP/1.1 200"),
    )
    .await?;
    anyhow::ensure!(
        status.starts_with("HTTP/1.1 200"),
        "still refused after the stalled calls closed: {status} {body}"
    );

    // A call that never finishes its body is cut off when its read times
    // out, and told why.
    let mut first = stalled.swap_remove(0);
    let mut reply = Vec::new();
    tokio::time::timeout(
        gkm_k8s_daemon::endpoints::BODY_READ_TIMEOUT + Duration::from_secs(5),
        first.read_to_end(&mut reply),
    )
    .await
    .map_err(|_| anyhow::anyhow!("a stalled call was never cut off"))??;
    let reply = String::from_utf8_lossy(&reply);
    assert!(
        reply.starts_with("HTTP/1.1 408") && reply.contains("longer than"),
        "a stalled call's reply: {reply}"
    );
    Ok(())
}

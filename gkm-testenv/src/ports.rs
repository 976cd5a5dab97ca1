//! Free loopback ports.

use std::net::TcpListener;

/// A TCP port on 127.0.0.1 that nothing listens on right now, and that no
/// other call in this process has handed out.
///
/// It is taken below the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`), where the outgoing connections of
/// the tests running beside it never land: a port the kernel handed out for
/// `bind(0)` could be taken by one of them before the component that is
/// given it listens.
pub fn free_port() -> std::io::Result<u16> {
    use std::collections::BTreeSet;
    use std::hash::{BuildHasher, Hasher};
    use std::sync::Mutex;
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    const LOWEST: u16 = 10000;
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    if ephemeral_low > LOWEST + 1000 {
        let span = u64::from(ephemeral_low - LOWEST);
        for _ in 0..200 {
            let random = std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish();
            let port = LOWEST + (random % span) as u16;
            if !handed_out.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
                handed_out.insert(port);
                return Ok(port);
            }
        }
    }
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    handed_out.insert(port);
    Ok(port)
}

/// `GET path` on 127.0.0.1:`port` over HTTP/1.1, as a probe or a scrape
/// makes it: the status and body, or `None` while nothing listens.
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let head = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await.ok()?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

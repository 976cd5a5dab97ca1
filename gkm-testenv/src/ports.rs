//! Free ports, handed out once per machine.

use std::net::TcpListener;
use std::path::Path;

/// Where the ports handed out on this machine are claimed, one file per
/// port holding the id of the process that claimed it: the test binaries
/// running side by side each pick ports, and a port one of them checked and
/// let go of must not be handed to another before the first one's
/// component listens on it.
const CLAIMS_DIR: &str = "/tmp/gkm-test-ports";

/// A TCP port that nothing listens on right now, on any address (the
/// operator and the agent of an installed chart listen on `0.0.0.0` of the
/// host network), and that no other call on this machine has handed out to
/// a process still running.
///
/// It is taken below the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`), where the outgoing connections of
/// the tests running beside it never land: a port the kernel handed out for
/// `bind(0)` could be taken by one of them before the component that is
/// given it listens.
pub fn free_port() -> std::io::Result<u16> {
    use std::hash::{BuildHasher, Hasher};

    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    const LOWEST: u16 = 10000;
    if ephemeral_low > LOWEST + 1000 {
        let claims = Path::new(CLAIMS_DIR);
        std::fs::create_dir_all(claims)?;
        let span = u64::from(ephemeral_low - LOWEST);
        for _ in 0..200 {
            let random = std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish();
            let port = LOWEST + (random % span) as u16;
            if TcpListener::bind(("0.0.0.0", port)).is_ok() && claim(claims, port)? {
                return Ok(port);
            }
        }
    }
    Ok(TcpListener::bind("0.0.0.0:0")?.local_addr()?.port())
}

/// Claims `port` for this process in `claims`: false when a process that
/// is still running claimed it first. A claim of a process that has ended
/// is taken over.
fn claim(claims: &Path, port: u16) -> std::io::Result<bool> {
    use std::io::Write as _;
    let file = claims.join(port.to_string());
    let mine = std::process::id();
    loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&file)
        {
            Ok(mut f) => {
                f.write_all(mine.to_string().as_bytes())?;
                return Ok(true);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let owner = std::fs::read_to_string(&file).unwrap_or_default();
                match owner.trim().parse::<u32>() {
                    Ok(pid) if pid == mine || Path::new(&format!("/proc/{pid}")).exists() => {
                        return Ok(false);
                    }
                    // Still being written by its claimant: leave it to it.
                    Err(_) if owner.is_empty() => return Ok(false),
                    // Its claimant has ended: take it over.
                    _ => {
                        let _ = std::fs::remove_file(&file);
                    }
                }
            }
            Err(e) => return Err(e),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_is_claimed_once_and_a_claim_of_an_ended_process_is_taken_over() {
        let claims = tempfile::tempdir().unwrap();
        assert!(claim(claims.path(), 20001).unwrap());
        assert!(!claim(claims.path(), 20001).unwrap(), "claimed twice");
        // pid 1 runs as long as the machine does.
        std::fs::write(claims.path().join("20002"), "1").unwrap();
        assert!(
            !claim(claims.path(), 20002).unwrap(),
            "a running claimant's port"
        );
        // No process has this id (above the kernel's pid_max).
        std::fs::write(claims.path().join("20003"), "4294967").unwrap();
        assert!(
            claim(claims.path(), 20003).unwrap(),
            "an ended claimant's port"
        );
        assert_eq!(
            std::fs::read_to_string(claims.path().join("20003")).unwrap(),
            std::process::id().to_string()
        );
    }

    #[test]
    fn ports_handed_out_are_distinct_and_free_on_every_address() {
        let ports: Vec<u16> = (0..20).map(|_| free_port().unwrap()).collect();
        let distinct: std::collections::BTreeSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        for port in ports {
            TcpListener::bind(("0.0.0.0", port)).unwrap();
        }
    }
}

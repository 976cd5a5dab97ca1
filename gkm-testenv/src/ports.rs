//! Free loopback ports.

use std::net::TcpListener;

/// A TCP port on 127.0.0.1 that nothing listens on right now.
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

//! gRPC over the unix sockets the kubelet and its plugins talk on: listening
//! on a socket ([`bind`]) and connecting to one ([`connect`]), as the
//! kubelet does to a plugin and a plugin does to the kubelet.

use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::{Channel, Endpoint, Uri};

/// A socket that could not be listened on or served.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct SocketError {
    /// The socket.
    pub path: PathBuf,
    /// What went wrong.
    pub source: io::Error,
}

impl SocketError {
    fn at(path: &Path) -> impl FnOnce(io::Error) -> SocketError + '_ {
        move |source| SocketError {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Listen on `socket`, creating its directory and removing a stale socket
/// file (but nothing that is not a socket).
pub fn bind(socket: &Path) -> Result<UnixListener, SocketError> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).map_err(SocketError::at(dir))?;
    }
    match std::fs::symlink_metadata(socket) {
        Ok(meta) if meta.file_type().is_socket() => {
            std::fs::remove_file(socket).map_err(SocketError::at(socket))?
        }
        Ok(_) => {
            return Err(SocketError::at(socket)(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "exists and is not a socket",
            )));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(SocketError::at(socket)(e)),
    }
    UnixListener::bind(socket).map_err(SocketError::at(socket))
}

/// What a gRPC server on `socket` ended with: the socket file is removed,
/// and a transport error becomes a [`SocketError`].
pub fn finish(
    socket: &Path,
    served: Result<(), tonic::transport::Error>,
) -> Result<(), SocketError> {
    let _ = std::fs::remove_file(socket);
    served.map_err(|e| SocketError::at(socket)(io::Error::other(e)))
}

/// A channel to the unix socket `socket`, retried until it answers or
/// `patience` runs out (a driver just started may not listen yet).
pub async fn connect(
    socket: &Path,
    patience: Duration,
) -> Result<Channel, tonic::transport::Error> {
    let deadline = Instant::now() + patience;
    loop {
        let path = socket.to_path_buf();
        let connected =
            Endpoint::from_static("http://[::1]:50051")
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?))
                    }
                }))
                .await;
        match connected {
            Ok(channel) => return Ok(channel),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

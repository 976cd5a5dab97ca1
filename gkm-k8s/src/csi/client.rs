//! The kubelet's side of the socket: a gRPC channel to a CSI driver (or
//! registration) unix socket, for tools and tests that talk to the driver.

use std::path::Path;
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

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

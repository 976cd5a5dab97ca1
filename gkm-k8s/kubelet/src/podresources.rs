//! The kubelet's pod-resources API (`List` over its unix socket, normally
//! [`DEFAULT_SOCKET`]): which containers hold which devices.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::proto::podresources as proto;
use crate::socket::connect;

/// The kubelet's pod-resources socket on a node.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// The kubelet's pod-resources API could not be asked.
#[derive(Debug, thiserror::Error)]
#[error("kubelet pod-resources API at {socket}: {message}")]
pub struct PodResourcesError {
    /// The kubelet's socket.
    pub socket: PathBuf,
    /// What went wrong.
    pub message: String,
}

/// Asks the kubelet at `socket` for every pod's resources.
pub async fn list(
    socket: &Path,
    timeout: Duration,
) -> Result<proto::ListPodResourcesResponse, PodResourcesError> {
    let failed = |message: String| PodResourcesError {
        socket: socket.to_path_buf(),
        message,
    };
    let channel = connect(socket, Duration::ZERO)
        .await
        .map_err(|e| failed(format!("cannot connect: {e}")))?;
    let mut client = proto::pod_resources_lister_client::PodResourcesListerClient::new(channel);
    let mut request = tonic::Request::new(proto::ListPodResourcesRequest {});
    request.set_timeout(timeout);
    let response = tokio::time::timeout(timeout, client.list(request))
        .await
        .map_err(|_| failed(format!("no answer within {timeout:?}")))?
        .map_err(|status| failed(status.message().to_string()))?;
    Ok(response.into_inner())
}

//! The apiserver client a gkm daemon or tool uses.

use std::path::{Path, PathBuf};

use crate::identity::{identify, program_name};

/// The apiserver client could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// No kubeconfig was given and none could be found.
    #[error("finding the cluster (KUBECONFIG, ~/.kube/config, in-cluster): {0}")]
    Infer(String),
    /// The kubeconfig given could not be read or used.
    #[error("--kubeconfig {path}: {message}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// The configuration found makes no client.
    #[error("making the apiserver client: {0}")]
    Client(String),
}

/// A client for the apiserver: from `kubeconfig` when given, else from
/// `$KUBECONFIG`, `~/.kube/config` or the in-cluster ServiceAccount. It
/// identifies itself as the program the process was started as
/// ([`program_name`]), so the apiserver records the writes that name no
/// field manager under that name.
pub async fn connect(kubeconfig: Option<&Path>) -> Result<kube::Client, ConnectError> {
    connect_as(kubeconfig, &program_name()).await
}

/// [`connect`], identifying the client as `program` ([`crate::identity`]).
pub async fn connect_as(
    kubeconfig: Option<&Path>,
    program: &str,
) -> Result<kube::Client, ConnectError> {
    let mut config = match kubeconfig {
        None => kube::Config::infer()
            .await
            .map_err(|e| ConnectError::Infer(e.to_string()))?,
        Some(path) => {
            let bad = |message: String| ConnectError::Kubeconfig {
                path: path.to_path_buf(),
                message,
            };
            let file = kube::config::Kubeconfig::read_from(path).map_err(|e| bad(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| bad(e.to_string()))?
        }
    };
    identify(&mut config, program);
    kube::Client::try_from(config).map_err(|e| ConnectError::Client(e.to_string()))
}

//! The kubelet's side of gkm's node plugins: the gRPC APIs the kubelet
//! speaks with a CSI driver, a device plugin and a plugin-registration
//! socket, and reads pod resources over, generated from their protos
//! ([`proto`]), and the unix socket plumbing around them.
//!
//! - [`socket`]: listening on a plugin socket and connecting to one.
//! - [`registration`]: registering a plugin through the kubelet's
//!   `plugins_registry`, with [`authority::AuthorityFix`] for the
//!   `:authority` the kubelet's plugin watcher sends.
//! - [`podresources`]: asking the kubelet which containers hold which
//!   devices.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use gkm_k8s_kubelet::podresources::{DEFAULT_SOCKET, list};
//! let pods = list(DEFAULT_SOCKET.as_ref(), Duration::from_secs(2)).await?;
//! for pod in pods.pod_resources {
//!     println!("{}/{}", pod.namespace, pod.name);
//! }
//! # Ok(()) }
//! ```

pub mod authority;
pub mod podresources;
pub mod registration;
pub mod socket;

/// The code generated from the kubelet's protos.
pub mod proto {
    /// CSI v1 messages and services (package `csi.v1`).
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod csi {
        tonic::include_proto!("csi.v1");
    }

    /// The kubelet's plugin-registration messages and service (package
    /// `pluginregistration`, its v1 API).
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod registration {
        tonic::include_proto!("pluginregistration");
    }

    /// The kubelet's device-plugin messages and services (package
    /// `v1beta1`).
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod deviceplugin {
        tonic::include_proto!("v1beta1");
    }

    /// The kubelet's pod-resources messages and service (package `v1`, its
    /// `podresources/v1` API).
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod podresources {
        tonic::include_proto!("v1");
    }
}

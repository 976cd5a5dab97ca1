//! The kubelet's plugin-registration handshake, as the kubelet performs it on
//! the socket gkm-csi serves in its `plugins_registry` directory.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod csi_support;

use gkm_k8s_csi::{PLUGIN, RegistrationService, serve_registration};
use gkm_k8s_kubelet::proto::registration::registration_client::RegistrationClient;
use gkm_k8s_kubelet::proto::registration::{InfoRequest, RegistrationStatus};
use tokio::sync::oneshot;

#[tokio::test(flavor = "multi_thread")]
async fn kubelet_learns_the_driver_and_reports_back() {
    let work = tempfile::tempdir().expect("tempdir");
    let registry = work.path().join("plugins_registry");
    let socket = registry.join(PLUGIN.socket_name());
    assert_eq!(
        socket.file_name().and_then(|n| n.to_str()),
        Some("csi.gkm.io-reg.sock")
    );
    let service = RegistrationService::new(
        PLUGIN,
        "/var/lib/kubelet/plugins/csi.gkm.io/csi.sock".into(),
    );
    let (stop, stopped) = oneshot::channel::<()>();
    let served = tokio::spawn({
        let (socket, service) = (socket.clone(), service.clone());
        async move {
            serve_registration(&socket, service, async {
                let _ = stopped.await;
            })
            .await
        }
    });

    let mut kubelet = RegistrationClient::new(csi_support::connect(&socket).await);
    let info = kubelet
        .get_info(InfoRequest {})
        .await
        .expect("GetInfo")
        .into_inner();
    assert_eq!(info.r#type, "CSIPlugin");
    assert_eq!(info.name, "csi.gkm.io");
    assert_eq!(
        info.endpoint,
        "/var/lib/kubelet/plugins/csi.gkm.io/csi.sock"
    );
    assert_eq!(info.supported_versions, vec!["1.0.0".to_string()]);

    assert!(!service.is_registered());
    let failed = RegistrationStatus {
        plugin_registered: false,
        error: "version mismatch".into(),
    };
    kubelet
        .notify_registration_status(failed)
        .await
        .expect("notify");
    assert!(!service.is_registered());
    let ok = RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    };
    kubelet
        .notify_registration_status(ok)
        .await
        .expect("notify");
    assert!(service.is_registered());

    let _ = stop.send(());
    served.await.expect("join").expect("served");
    assert!(!socket.exists(), "the socket is removed on shutdown");
}

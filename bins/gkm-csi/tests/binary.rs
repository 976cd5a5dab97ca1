//! The `gkm-csi` binary end to end: it serves CSI and the kubelet
//! registration on the sockets its flags name, answers for its node, refuses
//! an unknown cache with the reason, and on SIGTERM stops cleanly, removing
//! its sockets.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gkm_k8s_kubelet::proto::csi::identity_client::IdentityClient;
use gkm_k8s_kubelet::proto::csi::node_client::NodeClient;
use gkm_k8s_kubelet::proto::csi::volume_capability::{AccessType, MountVolume};
use gkm_k8s_kubelet::proto::csi::{
    GetPluginInfoRequest, NodeGetInfoRequest, NodePublishVolumeRequest, VolumeCapability,
};
use gkm_k8s_kubelet::proto::registration::InfoRequest;
use gkm_k8s_kubelet::proto::registration::registration_client::RegistrationClient;
use tonic::Code;
use tonic::transport::Channel;

/// Kills the driver if the test fails before stopping it.
struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn connect(socket: &Path) -> Channel {
    gkm_k8s_kubelet::socket::connect(socket, Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {}: {e:?}", socket.display()))
}

#[tokio::test(flavor = "multi_thread")]
async fn serves_registers_refuses_and_stops() {
    let work = tempfile::tempdir().expect("tempdir");
    let csi_socket = work.path().join("plugins/csi.gkm.io/csi.sock");
    let registry = work.path().join("plugins_registry");
    let child = Command::new(env!("CARGO_BIN_EXE_gkm-csi"))
        .arg(format!("--endpoint=unix://{}", csi_socket.display()))
        .arg("--node-name=node-7")
        .arg(format!("--store={}", work.path().join("store").display()))
        .arg("--kubelet-registration-path=/var/lib/kubelet/plugins/csi.gkm.io/csi.sock")
        .arg(format!("--plugin-registration-dir={}", registry.display()))
        .arg("--log-json")
        .stderr(Stdio::piped())
        .spawn()
        .expect("start gkm-csi");
    let mut driver = Driver(child);

    let channel = connect(&csi_socket).await;
    let info = IdentityClient::new(channel.clone())
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .expect("GetPluginInfo")
        .into_inner();
    assert_eq!(info.name, "csi.gkm.io");
    let mut node = NodeClient::new(channel);
    let info = node
        .node_get_info(NodeGetInfoRequest {})
        .await
        .expect("NodeGetInfo")
        .into_inner();
    assert_eq!(info.node_id, "node-7");

    // No agent has recorded anything: the cache is unknown on this node.
    let req = NodePublishVolumeRequest {
        volume_id: "csi-1".into(),
        target_path: work.path().join("target").display().to_string(),
        volume_capability: Some(VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume::default())),
            access_mode: None,
        }),
        volume_context: [
            ("csi.storage.k8s.io/ephemeral", "true"),
            ("csi.storage.k8s.io/pod.namespace", "ml"),
            ("csi.storage.k8s.io/pod.name", "infer-0"),
            ("csi.gkm.io/GKMCache", "vector-add"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        ..Default::default()
    };
    let status = node.node_publish_volume(req).await.expect_err("refused");
    assert_eq!(status.code(), Code::NotFound);
    assert!(
        status
            .message()
            .starts_with("GKMCache ml/vector-add is not known on node node-7"),
        "{}",
        status.message()
    );

    let reg_socket = registry.join("csi.gkm.io-reg.sock");
    let info = RegistrationClient::new(connect(&reg_socket).await)
        .get_info(InfoRequest {})
        .await
        .expect("GetInfo")
        .into_inner();
    assert_eq!(
        info.endpoint,
        "/var/lib/kubelet/plugins/csi.gkm.io/csi.sock"
    );

    // SIGTERM: a clean exit, sockets removed.
    let pid = libc::pid_t::try_from(driver.0.id()).expect("pid");
    // SAFETY: sending a signal to the child this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = gkm_testenv::eventually(
        "gkm-csi stopping on SIGTERM",
        Duration::from_secs(5),
        || {
            let status = driver.0.try_wait();
            async move { Ok(status?) }
        },
    )
    .await
    .expect("gkm-csi stopped within 5 s of SIGTERM");
    let mut log = String::new();
    if let Some(mut stderr) = driver.0.stderr.take() {
        use std::io::Read;
        let _ = stderr.read_to_string(&mut log);
    }
    assert!(status.success(), "{status}\n{log}");
    assert!(
        !csi_socket.exists() && !reg_socket.exists(),
        "sockets removed"
    );
    // JSON logs: every line is an object, and the refusal is among them.
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["fields"]["message"] == "publish refused"),
        "{log}"
    );
}

//! csi-sanity (kubernetes-csi/csi-test, pinned in hack/tools/csi-test) runs
//! its Identity and Node suites against the driver.
//!
//! gkm-csi has no controller service (inline ephemeral volumes need none),
//! so csi-sanity skips the specs that need one, except "should remove target
//! path", which asks `CreateVolume` for a volume to publish. For an inline
//! volume the kubelet is what names the volume and builds its context from
//! the pod spec; this test plays that part on a second socket
//! (`--csi.controllerendpoint`, Node suite only): `CreateVolume` answers with
//! the volume context the kubelet would send for a pod whose inline volume
//! carries csi-sanity's `--csi.testvolumeparameters` as its volume
//! attributes. The cache those attributes name is extracted from a fixture
//! into the store, and the delivery index marks it deliverable, as the agent
//! would. The Identity suite asks every endpoint it is given for the
//! driver's identity, so it runs on its own against the driver's socket.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod csi_support;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use csi_support::{extract_fixture, gkmcache, start_driver};
use gkm_k8s_csi::{CTX_EPHEMERAL, CTX_POD_NAME, CTX_POD_NAMESPACE, CTX_POD_UID};
use gkm_k8s_kubelet::proto::csi::controller_server::{Controller, ControllerServer};
use gkm_k8s_kubelet::proto::csi::{
    CreateVolumeRequest, CreateVolumeResponse, DeleteVolumeRequest, DeleteVolumeResponse, Volume,
};
use gkm_k8s_node::delivery::{Delivery, DeliveryIndex};
use gkm_testenv::{Component, find_binary};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// The kubelet's side of an inline volume, reached through CreateVolume.
struct InlineVolumes;

#[tonic::async_trait]
impl Controller for InlineVolumes {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let req = request.into_inner();
        let mut context: HashMap<String, String> = req.parameters.clone();
        let pod = format!(
            "pod-{}",
            &gkm_oci::Digest::of(req.name.as_bytes()).hex()[..10]
        );
        context.insert(CTX_EPHEMERAL.into(), "true".into());
        context.insert(CTX_POD_NAMESPACE.into(), "sanity".into());
        context.insert(CTX_POD_NAME.into(), pod.clone());
        context.insert(CTX_POD_UID.into(), format!("uid-{pod}"));
        Ok(Response::new(CreateVolumeResponse {
            volume: Some(Volume {
                volume_id: format!("csi-{}", gkm_oci::Digest::of(req.name.as_bytes()).hex()),
                volume_context: context,
                ..Default::default()
            }),
        }))
    }

    async fn delete_volume(
        &self,
        _request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        Ok(Response::new(DeleteVolumeResponse {}))
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn csi_sanity_identity_and_node_suites_pass() {
    let sanity = find_binary(Component::CsiSanity).unwrap_or_else(|e| panic!("{e:#}"));
    let work = tempfile::tempdir().expect("tempdir");
    let store = work.path().join("store");

    // The cache the test volume names, delivered as the agent would.
    let digest = extract_fixture(work.path(), &store, "triton-vector-add-cuda-sm75").await;
    DeliveryIndex::new(&store)
        .publish(
            &gkmcache("sanity", "vector-add"),
            &Delivery::deliverable(digest),
        )
        .expect("index");
    let params = work.path().join("volume-attributes.yaml");
    std::fs::write(
        &params,
        "csi.gkm.io/GKMCache: vector-add\ncsi.gkm.io/namespace: sanity\n",
    )
    .expect("params");

    let driver = start_driver(&work.path().join("csi.sock"), "sanity-node", &store).await;
    let kubelet_socket = work.path().join("kubelet.sock");
    let listener = UnixListener::bind(&kubelet_socket).expect("bind");
    let kubelet = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ControllerServer::new(InlineVolumes))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    csi_support::connect(&driver.socket).await;

    let endpoint = |p: &Path| format!("unix://{}", p.display());
    let common = vec![
        format!("--csi.endpoint={}", endpoint(&driver.socket)),
        format!("--csi.mountdir={}", work.path().join("mnt").display()),
        format!("--csi.stagingdir={}", work.path().join("staging").display()),
        format!("--csi.testvolumeparameters={}", params.display()),
    ];

    // The Identity suite asks every endpoint it is given for the driver's
    // identity, so it runs against the driver's socket alone.
    let mut identity = common.clone();
    identity.push("--ginkgo.focus=Identity Service".into());
    let (passed, log) = run_sanity(&sanity, &identity).await;
    assert!(passed >= 3, "{log}");

    let mut node = common;
    node.push(format!(
        "--csi.controllerendpoint={}",
        endpoint(&kubelet_socket)
    ));
    node.push("--ginkgo.focus=Node Service".into());
    let (passed, log) = run_sanity(&sanity, &node).await;
    kubelet.abort();
    // NodeGetCapabilities, NodeGetInfo, NodePublishVolume (3), NodeUnpublishVolume (3).
    assert!(passed >= 8, "{log}");
    assert!(
        log.contains("should remove target path"),
        "the publish/unpublish spec ran:\n{log}"
    );
}

/// Run csi-sanity with `args`; the number of specs passed, and its output.
/// Fails the test if csi-sanity fails or any spec does.
async fn run_sanity(sanity: &Path, args: &[String]) -> (u32, String) {
    let run = tokio::process::Command::new(sanity)
        .args(args)
        .arg("--ginkgo.no-color")
        .arg("--ginkgo.v")
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("csi-sanity finished within 5 minutes")
        .expect("run csi-sanity");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "csi-sanity {args:?} failed:\n{log}"
    );

    // "SUCCESS! -- P Passed | 0 Failed | 0 Pending | S Skipped"
    let summary = log
        .lines()
        .find(|l| l.contains("Passed |"))
        .unwrap_or_else(|| panic!("no summary:\n{log}"));
    let count = |label: &str| -> u32 {
        summary
            .split('|')
            .find(|part| part.contains(label))
            .and_then(|part| part.split_whitespace().rev().nth(1))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {label} count in {summary:?}"))
    };
    assert_eq!(count("Failed"), 0, "{log}");
    println!(
        "csi-sanity {}: {summary}",
        args.last().map(String::as_str).unwrap_or_default()
    );
    (count("Passed"), log)
}

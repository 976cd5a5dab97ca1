//! A real node runs a pod in a real container, serves its log through the
//! apiserver, survives a kubelet restart, and leaves nothing behind.

use std::time::Duration;

use gkm_testenv::{
    BUSYBOX_IMAGE, ControlPlane, ControlPlaneOptions, RealNode, RealNodeOptions, mounts_under,
    pod_log, wait_for_pod,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_runs_in_a_real_container_and_nothing_is_left() -> anyhow::Result<()> {
    let plane = ControlPlane::start_with(ControlPlaneOptions {
        controller_manager: true,
        ..ControlPlaneOptions::default()
    })
    .await?;
    let mut node = RealNode::start(
        &plane,
        RealNodeOptions {
            name: "real-0".into(),
            ..RealNodeOptions::default()
        },
    )
    .await?;
    eprintln!("real node Ready in {:.1?}", node.started_in());
    let dir = node.paths().dir.clone();
    plane.ensure_namespace("real").await?;
    let client = plane.client().await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "real");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "hello", "namespace": "real"},
        "spec": {
            "nodeName": "real-0",
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "hello", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "echo hello from $(cat /proc/1/comm) in $(hostname); exec sleep 100000"],
            }],
        }
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let running = |p: &Pod| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    let hello = wait_for_pod(&pods, "hello", TIMEOUT, running).await?;
    let ip = hello
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_default();
    let ip: std::net::Ipv4Addr = ip.parse()?;
    assert!(
        ip.octets()[0] == 10 && (64..128).contains(&ip.octets()[1]),
        "the pod has an address from the node's CNI range: {ip}"
    );
    let mut log = String::new();
    for _ in 0..40 {
        log = pod_log(&pods, "hello", "hello").await?;
        if !log.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(
        log.trim(),
        "hello from sh in hello",
        "the container's own output, through the apiserver"
    );

    // exec through the apiserver, the kubelet and containerd's stream server.
    let kubectl = gkm_testenv::find_binary(gkm_testenv::Component::Kubectl)?;
    let exec = std::process::Command::new(kubectl)
        .arg(format!("--kubeconfig={}", plane.kubeconfig().display()))
        .args(["-n", "real", "exec", "hello", "--", "cat", "/proc/1/comm"])
        .output()?;
    assert_eq!(
        String::from_utf8_lossy(&exec.stdout).trim(),
        "sleep",
        "kubectl exec: {}",
        String::from_utf8_lossy(&exec.stderr)
    );

    // An image of a dynamically linked program, with its shared libraries.
    let ls = gkm_testenv::TestImage::new(&["gkm.test/ls:1"])
        .with_binary("bin/ls", std::path::Path::new("/bin/ls"))?
        .with_entrypoint(&["/bin/ls", "/bin"]);
    node.import_image(&ls)?;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "ls", "namespace": "real"},
        "spec": {
            "nodeName": "real-0",
            "automountServiceAccountToken": false,
            "restartPolicy": "Never",
            "containers": [{"name": "ls", "image": "gkm.test/ls:1", "imagePullPolicy": "Never"}],
        }
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let succeeded =
        |p: &Pod| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded");
    wait_for_pod(&pods, "ls", TIMEOUT, succeeded).await?;
    assert_eq!(
        pod_log(&pods, "ls", "ls").await?.trim(),
        "ls",
        "the program ran with its libraries"
    );
    pods.delete("ls", &DeleteParams::default().grace_period(0))
        .await?;

    node.restart_kubelet().await?;
    assert!(
        running(&pods.get("hello").await?),
        "the pod runs on across a kubelet restart"
    );

    pods.delete("hello", &DeleteParams::default().grace_period(0))
        .await?;
    gkm_testenv::eventually("the pod deleted", TIMEOUT, || async {
        Ok(pods.get_opt("hello").await?.is_none().then_some(()))
    })
    .await?;
    drop(node);
    assert!(
        mounts_under(&dir).is_empty(),
        "no mount left: {:?}",
        mounts_under(&dir)
    );
    assert!(!dir.exists(), "the node's directory is gone");
    let shims = std::process::Command::new("pgrep")
        .args(["-f", &dir.display().to_string()])
        .output()?;
    assert!(
        shims.stdout.is_empty(),
        "no process of the node is left: {}",
        String::from_utf8_lossy(&shims.stdout)
    );
    Ok(())
}

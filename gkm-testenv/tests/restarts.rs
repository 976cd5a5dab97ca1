//! Crashes of the control plane: kube-apiserver and etcd killed with
//! SIGKILL come back on the same port and data, and what was written before
//! the crash is still there.

use std::time::Duration;

use gkm_testenv::{ControlPlane, ControlPlaneRestarts};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;

async fn namespace_exists(plane: &ControlPlane, name: &str) -> anyhow::Result<bool> {
    let namespaces: Api<Namespace> = Api::all(plane.client().await?);
    Ok(namespaces.get_opt(name).await?.is_some())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_apiserver_and_etcd_come_back_after_sigkill_with_their_data() -> anyhow::Result<()> {
    let plane = ControlPlane::start().await?;
    let mut restarts = ControlPlaneRestarts::new(&plane)?;
    plane.ensure_namespace("before-crashes").await?;
    let (apiserver, etcd) = restarts.pids();

    restarts.restart_apiserver(&plane).await?;
    assert_ne!(restarts.pids().0, apiserver, "a new apiserver runs");
    assert!(namespace_exists(&plane, "before-crashes").await?);

    restarts.restart_etcd(&plane).await?;
    assert_ne!(restarts.pids().1, etcd, "a new etcd runs");
    // Still serving a while after the restart, not only at once.
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert!(namespace_exists(&plane, "before-crashes").await?);
    plane.ensure_namespace("after-crashes").await?;

    // A second crash of each restarts the replacements.
    restarts.restart_etcd(&plane).await?;
    restarts.restart_apiserver(&plane).await?;
    assert!(namespace_exists(&plane, "after-crashes").await?);
    Ok(())
}

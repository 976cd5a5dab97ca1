//! The components start for real, answer, and leave nothing behind.

use std::path::Path;

use gkm_testenv::{Component, ControlPlane, Registry, find_binary_in};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};

/// Whether `pid` is a live process (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

#[test]
fn registry_serves_the_distribution_api_and_stops_on_drop() -> anyhow::Result<()> {
    let registry = Registry::start()?;
    let pid = registry.pid();
    let root = registry.root().to_path_buf();
    assert!(alive(pid));
    let catalog = http_get(registry.addr(), "/v2/_catalog")?;
    assert!(
        catalog.starts_with("HTTP/1.0 200") || catalog.starts_with("HTTP/1.1 200"),
        "{catalog}"
    );
    assert!(catalog.contains("\"repositories\""), "{catalog}");
    drop(registry);
    assert!(!alive(pid), "registry {pid} outlived its handle");
    assert!(
        !root.exists(),
        "registry dir {} left behind",
        root.display()
    );
    Ok(())
}

#[tokio::test]
async fn control_plane_authorizes_with_rbac_and_stops_on_drop() -> anyhow::Result<()> {
    let plane = ControlPlane::start().await?;
    let pids = plane.pids();
    let dir = plane.dir().to_path_buf();

    let admin = plane.client().await?;
    let namespaces = Api::<Namespace>::all(admin)
        .list(&ListParams::default())
        .await?;
    assert!(
        namespaces
            .items
            .iter()
            .any(|ns| ns.metadata.name.as_deref() == Some("default"))
    );

    // RBAC is on: a user with no bindings is authenticated but forbidden.
    let nobody = plane.client_for("nobody", &[]).await?;
    match Api::<Namespace>::all(nobody)
        .list(&ListParams::default())
        .await
    {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403, "{status:?}");
            assert!(
                status.message.contains("User \"nobody\""),
                "{}",
                status.message
            );
        }
        other => panic!("expected 403 Forbidden for an unbound user, got {other:?}"),
    }

    drop(plane);
    for pid in pids {
        assert!(!alive(pid), "process {pid} outlived the control plane");
    }
    assert!(
        !dir.exists(),
        "control plane dir {} left behind",
        dir.display()
    );
    Ok(())
}

#[test]
fn a_missing_component_names_the_command_that_installs_it() -> anyhow::Result<()> {
    let empty = gkm_testenv::temp_dir()?;
    let err = find_binary_in(Component::Kwok, &[empty.path().to_path_buf()]).unwrap_err();
    let message = err.to_string();
    assert!(message.contains("kwok is not installed"), "{message}");
    assert!(message.contains("hack/ci/components.sh kwok"), "{message}");
    let err = find_binary_in(
        Component::KubeApiserver,
        &[Path::new("/nonexistent").into()],
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("hack/ci/components.sh kubernetes"),
        "{err}"
    );
    Ok(())
}

fn http_get(addr: &str, path: &str) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr)?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response)
}

#[tokio::test]
async fn kwok_nodes_become_ready_and_run_pods() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Pod;
    use std::collections::BTreeMap;

    let options = gkm_testenv::ControlPlaneOptions {
        controller_manager: true,
        ..Default::default()
    };
    let plane = ControlPlane::start_with(options).await?;
    let mut kwok = gkm_testenv::Kwok::start(&plane)?;
    let client = plane.client().await?;
    let labels = BTreeMap::from([("gkm.io/test".to_string(), "yes".to_string())]);
    let capacity = BTreeMap::from([("nvidia.com/gpu".to_string(), "2".to_string())]);
    let node = kwok
        .create_node(&client, "kwok-gpu-1", &labels, &capacity)
        .await?;
    let allocatable = node.status.and_then(|s| s.allocatable).unwrap_or_default();
    assert_eq!(
        allocatable.get("nvidia.com/gpu").map(|q| q.0.as_str()),
        Some("2")
    );

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    // The controller manager creates the namespace's default ServiceAccount.
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(client, "default");
    gkm_testenv::eventually(
        "the default ServiceAccount (made by kube-controller-manager)",
        std::time::Duration::from_secs(30),
        || async { Ok(accounts.get_opt("default").await?.map(|_| ())) },
    )
    .await?;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "on-kwok"},
        "spec": {"nodeName": "kwok-gpu-1", "containers": [{"name": "c", "image": "busybox"}]},
    }))?;
    pods.create(&Default::default(), &pod).await?;
    gkm_testenv::wait_for_pod(&pods, "on-kwok", std::time::Duration::from_secs(30), |p| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    })
    .await?;
    Ok(())
}

//! The generated CRDs: pinned by a snapshot, and `deploy/crds/` kept current.

use std::path::PathBuf;

fn deploy_dir() -> PathBuf {
    gkm_testenv::repo_root().join("deploy/crds")
}

#[test]
fn crd_yaml_snapshot() {
    let yaml = gkm_k8s_api::crd::crds_yaml().expect("CRDs serialise");
    insta::assert_snapshot!("crds", yaml);
}

/// `deploy/crds/<plural>.gkm.io.yaml` must equal what the code generates.
/// Regenerate with `GKM_UPDATE_DEPLOY=1 cargo test -p gkm-k8s-api --test crd_files`.
#[test]
fn deploy_crds_are_current() {
    let update = std::env::var_os("GKM_UPDATE_DEPLOY").is_some();
    let mut stale = Vec::new();
    for crd in gkm_k8s_api::crd::crds() {
        let name = crd.metadata.name.clone().expect("CRD has a name");
        let path = deploy_dir().join(format!("{name}.yaml"));
        let want = serde_yaml::to_string(&crd).expect("CRD serialises");
        if update {
            std::fs::create_dir_all(deploy_dir()).expect("create deploy/crds");
            std::fs::write(&path, &want).expect("write CRD file");
        } else if std::fs::read_to_string(&path).ok().as_deref() != Some(want.as_str()) {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "stale CRD files: {stale:?}; regenerate with `GKM_UPDATE_DEPLOY=1 cargo test -p gkm-k8s-api --test crd_files`"
    );
}

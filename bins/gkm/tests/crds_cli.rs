//! `gkm crds` prints exactly the CRDs shipped in `deploy/crds/`.

use std::path::Path;
use std::process::Command;

#[test]
fn gkm_crds_prints_the_shipped_crds() {
    let out = Command::new(env!("CARGO_BIN_EXE_gkm"))
        .arg("crds")
        .output()
        .expect("run gkm crds");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8(out.stdout).expect("UTF-8");
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds");
    let mut names = Vec::new();
    for doc in printed.split("---\n").filter(|d| !d.trim().is_empty()) {
        let crd: serde_yaml::Value = serde_yaml::from_str(doc).expect("each document is YAML");
        assert_eq!(crd["kind"], "CustomResourceDefinition");
        let name = crd["metadata"]["name"].as_str().expect("named").to_string();
        let shipped = std::fs::read_to_string(deploy.join(format!("{name}.yaml")))
            .expect("shipped in deploy/crds");
        assert_eq!(doc, shipped, "{name} differs from deploy/crds");
        names.push(name);
    }
    names.sort();
    assert_eq!(
        names,
        [
            "clustergkmcachenodes.gkm.io",
            "clustergkmcaches.gkm.io",
            "gkmcachenodes.gkm.io",
            "gkmcaches.gkm.io",
            "gkmgpuquotas.gkm.io"
        ]
    );
}

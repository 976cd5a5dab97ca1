//! `gkm crds` prints exactly the CRDs shipped in `deploy/crds/`, as YAML
//! or, with `--json`, as one JSON array.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

/// Runs `gkm ARGS`, which must succeed; its standard output.
fn gkm(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gkm"))
        .args(args)
        .output()
        .expect("run gkm crds");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

#[test]
fn gkm_crds_prints_the_shipped_crds() {
    let printed = gkm(&["crds"]);
    let deploy = gkm_testenv::repo_root().join("deploy/crds");
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
        shipped_names(),
        "every shipped CRD, and nothing else"
    );
}

/// The names of the CRDs in deploy/crds, sorted.
fn shipped_names() -> Vec<String> {
    let deploy = gkm_testenv::repo_root().join("deploy/crds");
    let mut names: Vec<String> = std::fs::read_dir(deploy)
        .expect("deploy/crds")
        .map(|entry| {
            entry
                .expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter_map(|file| file.strip_suffix(".yaml").map(str::to_string))
        .collect();
    names.sort();
    names
}

#[test]
fn gkm_crds_json_is_the_same_crds() {
    let json: Vec<serde_json::Value> =
        serde_json::from_str(&gkm(&["crds", "--json"])).expect("one JSON array");
    let yaml: Vec<serde_json::Value> = gkm(&["crds"])
        .split("---\n")
        .filter(|d| !d.trim().is_empty())
        .map(|d| serde_yaml::from_str(d).expect("YAML"))
        .collect();
    assert_eq!(json.len(), shipped_names().len());
    assert_eq!(json, yaml);
}

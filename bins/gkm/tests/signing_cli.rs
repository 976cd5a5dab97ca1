//! `gkm sign` and `gkm verify` as a user runs them, against a real registry
//! and the real cosign: what gkm signs cosign accepts, a stranger's key is
//! refused with exit code 4, and `--json` says what was proven.

use gkm_testenv::{Component, Registry};

mod support;

use support::{gkm_in as gkm, key_pair, text};

fn fixture() -> String {
    gkm_testenv::fixture_cache("triton-vector-add-cuda-sm75")
        .display()
        .to_string()
}

#[test]
fn signed_by_gkm_verified_by_gkm_and_cosign_refused_for_a_stranger() {
    let registry = Registry::shared().unwrap_or_else(|e| panic!("{e:#}"));
    let work = tempfile::tempdir().expect("tempdir");
    let dir = work.path();
    let image = format!("{}/cli/signed:v1", registry.addr());
    let built = gkm(&["build", &fixture(), "-t", &image, "--insecure"], dir);
    assert!(built.status.success(), "gkm build: {}", text(&built));
    let digest = String::from_utf8_lossy(&built.stdout).trim().to_string();

    let ours = key_pair(&dir.join("ours"));
    let stranger = key_pair(&dir.join("stranger"));
    let key = ours.join("cosign.key").display().to_string();
    let public = ours.join("cosign.pub").display().to_string();

    // The legacy (v2) signature first: cosign v2 accepts it.
    let signed = gkm(
        &[
            "sign",
            &image,
            "--key",
            &key,
            "--format",
            "v2",
            "--insecure",
        ],
        dir,
    );
    assert!(
        signed.status.success(),
        "gkm sign --format v2: {}",
        text(&signed)
    );
    let pinned = format!("{}/cli/signed@{digest}", registry.addr());
    let out = support::cosign_verify(Component::CosignV2, &public, &pinned, dir);
    assert!(
        out.status.success(),
        "cosign verify of gkm's signature: {}",
        text(&out)
    );

    // Then a sigstore bundle (the default); gkm verifies the image.
    let signed = gkm(
        &["sign", &image, "--key", &key, "--insecure", "--json"],
        dir,
    );
    assert!(signed.status.success(), "gkm sign: {}", text(&signed));
    insta::assert_snapshot!(
        "json-sign",
        support::json_snapshot(
            &String::from_utf8_lossy(&signed.stdout),
            dir,
            registry.addr()
        )
    );
    let verified = gkm(
        &["verify", &image, "--key", &public, "--insecure", "--json"],
        dir,
    );
    assert_eq!(verified.status.code(), Some(0), "{}", text(&verified));
    insta::assert_snapshot!(
        "json-verify",
        support::json_snapshot(
            &String::from_utf8_lossy(&verified.stdout),
            dir,
            registry.addr()
        )
    );
    let doc: serde_json::Value =
        serde_json::from_slice(&verified.stdout).expect("--json prints JSON");
    assert_eq!(doc["verified"], true);
    assert_eq!(doc["result"]["digest"], digest.as_str(), "{doc}");

    // A key that did not sign: refused, exit code 4, saying why.
    let wrong = stranger.join("cosign.pub").display().to_string();
    let refused = gkm(&["verify", &image, "--key", &wrong, "--insecure"], dir);
    assert_eq!(refused.status.code(), Some(4), "{}", text(&refused));
    assert!(text(&refused).contains("rejected"), "{}", text(&refused));

    // An image nobody signed: refused too.
    let unsigned = format!("{}/cli/unsigned:v1", registry.addr());
    let built = gkm(
        &[
            "build",
            &fixture(),
            "-t",
            &unsigned,
            "--insecure",
            "--compression",
            "gzip",
        ],
        dir,
    );
    assert!(built.status.success(), "gkm build: {}", text(&built));
    let refused = gkm(
        &[
            "verify",
            &unsigned,
            "--key",
            &public,
            "--insecure",
            "--json",
        ],
        dir,
    );
    assert_eq!(refused.status.code(), Some(4), "{}", text(&refused));
    let doc: serde_json::Value =
        serde_json::from_slice(&refused.stdout).expect("--json prints JSON");
    assert_eq!(doc["verified"], false);
    assert!(
        doc["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{doc}"
    );
}

//! Helpers the CLI tests share: redacting what varies between runs.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gkm_testenv::{Component, find_binary};

/// The password of the cosign keys the signing tests make.
pub const PASSWORD: &str = "gkm-cli-test";

/// Runs `program` in `dir` as a user with cosign keys would: `COSIGN_PASSWORD`
/// set, `HOME` and `DOCKER_CONFIG` inside `dir` (no credentials of the
/// machine running the tests).
pub fn run(program: &Path, args: &[&str], dir: &Path) -> Output {
    Command::new(program)
        .args(args)
        .current_dir(dir)
        .env("COSIGN_PASSWORD", PASSWORD)
        .env("COSIGN_YES", "true")
        .env("HOME", dir)
        .env("DOCKER_CONFIG", dir.join("docker"))
        .output()
        .expect("run")
}

/// Runs the `gkm` under test with [`run`].
pub fn gkm_in(args: &[&str], dir: &Path) -> Output {
    run(Path::new(env!("CARGO_BIN_EXE_gkm")), args, dir)
}

/// [`gkm_in`], failing unless it succeeds; its output ([`text`]).
pub fn gkm_ok(args: &[&str], dir: &Path) -> String {
    let out = gkm_in(args, dir);
    assert!(out.status.success(), "gkm {args:?} failed:\n{}", text(&out));
    text(&out)
}

/// `gkm check IMAGE --gpus` against one GPU of each profile of `fit`,
/// which it fits (exit 0), and of `unfit`, which it does not (exit 3), as a
/// user checks a cache before delivering it.
// Not every test binary checks fit.
#[allow(dead_code)]
pub fn check_fits(image: &str, dir: &Path, fit: &[&str], unfit: &[&str]) {
    for (profiles, code) in [(fit, 0), (unfit, 3)] {
        for profile in profiles {
            let gpus = one_gpu(dir, profile);
            let out = gkm_in(&["check", image, "--gpus", &gpus], dir);
            eprintln!("gkm check ({profile}):\n{}", text(&out));
            assert_eq!(out.status.code(), Some(code), "{profile}: {}", text(&out));
        }
    }
}

/// A simulated inventory of one `profile` GPU in `dir`, for `--gpus`.
pub fn one_gpu(dir: &Path, profile: &str) -> String {
    let path = dir.join(format!("gpus-{profile}.yaml"));
    std::fs::write(&path, format!("gpus:\n  - profile: {profile}\n")).unwrap();
    path.display().to_string()
}

/// Standard output then standard error, for messages.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `dir`, holding a cosign key pair (`cosign.key`, `cosign.pub`, password
/// [`PASSWORD`]) made by the real cosign, unless it already does.
pub fn key_pair(dir: &Path) -> PathBuf {
    if dir.join("cosign.key").exists() {
        return dir.to_path_buf();
    }
    std::fs::create_dir_all(dir).expect("key dir");
    let cosign = find_binary(Component::CosignV2).unwrap_or_else(|e| panic!("{e:#}"));
    let out = run(&cosign, &["generate-key-pair"], dir);
    assert!(
        out.status.success(),
        "cosign generate-key-pair: {}",
        text(&out)
    );
    dir.to_path_buf()
}

/// Replace the hex of `sha256:<hex>` digests and `sha256/<hex>` store paths
/// with `<digest>`, and `dir` with `[TMP]`.
pub fn redact(text: &str, dir: &Path) -> String {
    let text = text.replace(&dir.display().to_string(), "[TMP]");
    let mut out = String::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("sha256") {
        let prefix = 6 + rest[i + 6..].starts_with([':', '/']) as usize;
        out.push_str(&rest[..i + prefix]);
        let hex: String = rest[i + prefix..]
            .chars()
            .take_while(char::is_ascii_hexdigit)
            .collect();
        out.push_str(if hex.len() == 64 { "<digest>" } else { &hex });
        rest = &rest[i + prefix + hex.len()..];
    }
    out.push_str(rest);
    out
}

/// `stdout` must be exactly one JSON document (nothing before or after it);
/// returns it pretty-printed with digests, `dir` and the registry address
/// `registry` redacted, for a snapshot.
pub fn json_snapshot(stdout: &str, dir: &Path, registry: &str) -> String {
    let doc: serde_json::Value = serde_json::from_str(stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}):\n{stdout}"));
    let text = serde_json::to_string_pretty(&doc).expect("print JSON");
    redact(&text, dir).replace(registry, "[REGISTRY]")
}

/// Runs the real cosign (`component`: v2 or v3) to verify `image` (pinned
/// to a digest) in a plain-HTTP registry with the public key `public`.
pub fn cosign_verify(component: Component, public: &str, image: &str, dir: &Path) -> Output {
    let cosign = find_binary(component).unwrap_or_else(|e| panic!("{e:#}"));
    run(
        &cosign,
        &[
            "verify",
            "--key",
            public,
            "--insecure-ignore-tlog=true",
            "--allow-insecure-registry",
            "--allow-http-registry",
            image,
        ],
        dir,
    )
}

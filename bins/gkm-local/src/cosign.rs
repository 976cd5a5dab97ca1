//! Signing images with the real cosign (v3, and v2 for its legacy `.sig`
//! signatures; built by `hack/ci/components.sh cosign`).

use std::path::{Path, PathBuf};
use std::process::Command;

use gkm_testenv::{Component, find_binary};

/// The password of the keys generated here (they are throwaway keys).
pub const PASSWORD: &str = "gkm-local";

/// A cosign key pair on disk.
#[derive(Debug, Clone)]
pub struct CosignKey {
    /// `cosign.key`, encrypted with the local password.
    pub private_key: PathBuf,
    /// The public key, PEM.
    pub public_pem: String,
}

fn cosign(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    cosign_of(Component::CosignV3, dir, args)
}

fn cosign_of(version: Component, dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(find_binary(version)?)
        .args(args)
        .current_dir(dir)
        .env("COSIGN_PASSWORD", PASSWORD)
        .env("COSIGN_YES", "true")
        .env("HOME", dir)
        .env("TUF_ROOT", dir.join("tuf"))
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if !output.status.success() {
        anyhow::bail!("cosign {args:?} failed: {text}");
    }
    Ok(text)
}

/// `cosign generate-key-pair` in `dir` (created if needed).
pub fn generate_key_pair(dir: &Path) -> anyhow::Result<CosignKey> {
    std::fs::create_dir_all(dir)?;
    cosign(dir, &["generate-key-pair"])?;
    Ok(CosignKey {
        private_key: dir.join("cosign.key"),
        public_pem: std::fs::read_to_string(dir.join("cosign.pub"))?,
    })
}

/// `cosign sign` of `image` (a digest reference) with `key`: a sigstore
/// bundle attached as an OCI referrer, offline (no transparency log), to a
/// plain-HTTP registry.
pub fn sign(key: &CosignKey, image: &str) -> anyhow::Result<()> {
    sign_with(
        Component::CosignV3,
        key,
        image,
        &["--use-signing-config=false"],
    )
}

/// `cosign sign` of `image` (a digest reference) with `key` by cosign v2:
/// a simple-signing payload at the `sha256-<hex>.sig` tag, offline, to a
/// plain-HTTP registry.
pub fn sign_v2(key: &CosignKey, image: &str) -> anyhow::Result<()> {
    sign_with(Component::CosignV2, key, image, &[])
}

fn sign_with(
    version: Component,
    key: &CosignKey,
    image: &str,
    extra: &[&str],
) -> anyhow::Result<()> {
    let dir = key.private_key.parent().unwrap_or(Path::new("."));
    let key_path = key.private_key.display().to_string();
    let mut args = vec!["sign", "--key", &key_path];
    args.extend_from_slice(extra);
    args.extend([
        "--tlog-upload=false",
        "--allow-http-registry",
        "--allow-insecure-registry",
        image,
    ]);
    // One signature pushed at a time by this process: the test registry
    // (distribution, filesystem storage) has refused a signature manifest
    // ("multiple errors") while another cosign uploaded the same blobs into
    // the same repository. Signing is a test-ground step, not gkm's.
    let _one_at_a_time = SIGNING.lock().unwrap_or_else(|e| e.into_inner());
    cosign_of(version, dir, &args)?;
    Ok(())
}

/// Held while a `cosign sign` runs ([`sign_with`]).
static SIGNING: std::sync::Mutex<()> = std::sync::Mutex::new(());

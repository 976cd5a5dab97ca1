//! Signatures made by the real cosign (v2 and v3) and by gkm, verified by
//! gkm and by cosign, on images in a local Distribution registry; keyless
//! signatures from a local certificate authority; and every refusal with its
//! reason.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use gkm_core::policy::{
    Format, Identity, KeyAlgorithm, Mode, Policy, PublicKey, Rejection, SignedBy, Signer,
    SubjectMatch, TrustedRoot, Verified,
};
use gkm_oci::repo::RawManifest;
use gkm_oci::sign::{SignFormat, SigningKey, sign};
use gkm_oci::verify::{SignatureHints, VerifyError, verify, verify_with_hints};
use gkm_oci::{BuildOptions, Digest, ImageRef, RegistryOptions, Repo, build};
use gkm_testenv::{Component, fixture_cache};

const PASSWORD: &str = "correct horse";

fn options() -> RegistryOptions {
    RegistryOptions {
        insecure: true,
        ..Default::default()
    }
}

fn registry() -> &'static gkm_testenv::Registry {
    gkm_testenv::Registry::shared()
        .expect("start docker-registry (apt-get install -y docker-registry)")
}

/// Build fixture `fixture` into `repo:v1` of the shared registry.
async fn push_image(repo: &str, fixture: &str) -> (ImageRef, Digest) {
    push_image_to(registry(), repo, fixture).await
}

const CUDA: &str = "triton-vector-add-cuda-sm75";
const ROCM: &str = "triton-vector-add-rocm-gfx90a";

fn cosign_binary(version: Component) -> PathBuf {
    gkm_testenv::find_binary(version).unwrap_or_else(|e| panic!("{e:#}"))
}

/// Run cosign in `dir`; returns (success, stdout + stderr).
fn cosign(version: Component, dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(cosign_binary(version))
        .args(args)
        .current_dir(dir)
        .env("COSIGN_PASSWORD", PASSWORD)
        .env("COSIGN_YES", "true")
        .env("HOME", dir)
        .env("TUF_ROOT", dir.join("tuf"))
        .output()
        .expect("run cosign");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn cosign_ok(version: Component, dir: &Path, args: &[&str]) -> String {
    let (ok, text) = cosign(version, dir, args);
    assert!(ok, "cosign {args:?} failed:\n{text}");
    text
}

/// A key pair from `cosign generate-key-pair`: (cosign.key path, public key).
fn cosign_keys(dir: &Path, name: &str) -> (PathBuf, PublicKey) {
    let sub = dir.join(name);
    std::fs::create_dir_all(&sub).expect("mkdir");
    cosign_ok(Component::CosignV2, &sub, &["generate-key-pair"]);
    let public =
        PublicKey::from_pem(&std::fs::read_to_string(sub.join("cosign.pub")).expect("cosign.pub"))
            .expect("cosign's public key");
    (sub.join("cosign.key"), public)
}

fn pinned(image: &ImageRef, digest: &Digest) -> String {
    image.with_digest(digest).to_string()
}

/// The registry flags each cosign needs for the plain-HTTP test registry.
const OFFLINE_SIGN: &[&str] = &[
    "--tlog-upload=false",
    "--allow-http-registry",
    "--allow-insecure-registry",
];
const OFFLINE_VERIFY: &[&str] = &[
    "--insecure-ignore-tlog=true",
    "--allow-http-registry",
    "--allow-insecure-registry",
];

fn args<'a>(head: &[&'a str], tail: &[&'a str]) -> Vec<&'a str> {
    head.iter().chain(tail).copied().collect()
}

/// An empty `trusted_root.json` (no authorities, no logs): what cosign needs
/// to read bundles offline when only keys are trusted.
fn empty_trusted_root(dir: &Path) -> PathBuf {
    let path = dir.join("empty_trusted_root.json");
    std::fs::write(
        &path,
        r#"{"mediaType":"application/vnd.dev.sigstore.trustedroot+json;version=0.1"}"#,
    )
    .expect("write trusted root");
    path
}

async fn verify_keys(
    image: &ImageRef,
    digest: &Digest,
    keys: &[&PublicKey],
) -> Result<Verified, VerifyError> {
    let policy = Policy::keys(keys.iter().map(|k| (*k).clone()).collect()).expect("policy");
    verify(image, &options(), digest, &policy).await
}

fn rejection(result: Result<Verified, VerifyError>) -> Rejection {
    match result {
        Err(VerifyError::Rejected(r)) => r,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn signed_by_key(key: &PublicKey) -> SignedBy {
    SignedBy::Key {
        fingerprint: key.fingerprint(),
        algorithm: key.algorithm(),
    }
}

fn load_key(path: &Path) -> SigningKey {
    SigningKey::from_pem(
        &std::fs::read_to_string(path).expect("key"),
        PASSWORD.as_bytes(),
    )
    .expect("cosign key")
}

#[tokio::test(flavor = "multi_thread")]
async fn cosign_v2_signatures_verify_with_gkm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (key, public) = cosign_keys(dir.path(), "signer");
    let (image, digest) = push_image("cosign-v2", CUDA).await;
    let key = key.to_string_lossy().into_owned();
    cosign_ok(
        Component::CosignV2,
        dir.path(),
        &args(
            &["sign", "--key", &key],
            &args(OFFLINE_SIGN, &[&pinned(&image, &digest)]),
        ),
    );

    let verified = verify_keys(&image, &digest, &[&public])
        .await
        .expect("cosign v2 signature verifies");
    assert_eq!(
        verified,
        Verified {
            format: Format::CosignV2,
            signed_by: signed_by_key(&public),
            digest: digest.to_string(),
            tlog: false
        }
    );
    assert_eq!(public.algorithm(), KeyAlgorithm::EcdsaP256);
}

#[tokio::test(flavor = "multi_thread")]
async fn cosign_v3_bundles_verify_with_gkm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (key, public) = cosign_keys(dir.path(), "signer");
    let (image, digest) = push_image("cosign-v3", CUDA).await;
    let key = key.to_string_lossy().into_owned();
    cosign_ok(
        Component::CosignV3,
        dir.path(),
        &args(
            &["sign", "--key", &key, "--use-signing-config=false"],
            &args(OFFLINE_SIGN, &[&pinned(&image, &digest)]),
        ),
    );
    // cosign v3 wrote a bundle referrer and no v2 signature tag.
    let v2 = gkm_oci::verify::location::fetch_tag(
        &image,
        &options(),
        &gkm_oci::verify::signature_tag(&digest),
    )
    .await
    .expect("read the signature tag");
    assert!(v2.is_none(), "cosign v3 also wrote a v2 signature");
    let verified = verify_keys(&image, &digest, &[&public])
        .await
        .expect("cosign v3 bundle verifies");
    assert_eq!(verified.format, Format::SigstoreBundle);
    assert_eq!(verified.signed_by, signed_by_key(&public));
    assert_eq!(verified.digest, digest.to_string());
}

#[tokio::test(flavor = "multi_thread")]
async fn gkm_v2_signatures_verify_with_cosign() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (key_path, public) = cosign_keys(dir.path(), "signer");
    let (image, digest) = push_image("gkm-v2", CUDA).await;
    let signed = sign(
        &image,
        &options(),
        &digest,
        &load_key(&key_path),
        SignFormat::CosignV2,
    )
    .await
    .expect("sign");
    assert!(
        signed
            .location
            .ends_with(&format!(":sha256-{}.sig", digest.hex())),
        "{}",
        signed.location
    );

    let pubkey = dir
        .path()
        .join("signer/cosign.pub")
        .to_string_lossy()
        .into_owned();
    let target = pinned(&image, &digest);
    let out = cosign_ok(
        Component::CosignV2,
        dir.path(),
        &args(
            &["verify", "--key", &pubkey],
            &args(OFFLINE_VERIFY, &[&target]),
        ),
    );
    assert!(
        out.contains(&format!("\"docker-manifest-digest\":\"{digest}\"")),
        "{out}"
    );
    let out = cosign_ok(
        Component::CosignV3,
        dir.path(),
        &args(
            &["verify", "--key", &pubkey, "--new-bundle-format=false"],
            &args(OFFLINE_VERIFY, &[&target]),
        ),
    );
    assert!(out.contains("cosign container image signature"), "{out}");

    let verified = verify_keys(&image, &digest, &[&public])
        .await
        .expect("gkm verifies its own");
    assert_eq!(verified.format, Format::CosignV2);
}

#[tokio::test(flavor = "multi_thread")]
async fn gkm_bundles_verify_with_cosign() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (key_path, public) = cosign_keys(dir.path(), "signer");
    let (image, digest) = push_image("gkm-bundle", CUDA).await;
    sign(
        &image,
        &options(),
        &digest,
        &load_key(&key_path),
        SignFormat::Bundle,
    )
    .await
    .expect("sign");

    let pubkey = dir
        .path()
        .join("signer/cosign.pub")
        .to_string_lossy()
        .into_owned();
    let root = empty_trusted_root(dir.path())
        .to_string_lossy()
        .into_owned();
    let target = pinned(&image, &digest);
    let out = cosign_ok(
        Component::CosignV3,
        dir.path(),
        &args(
            &["verify", "--key", &pubkey, "--trusted-root", &root],
            &args(OFFLINE_VERIFY, &[&target]),
        ),
    );
    assert!(
        out.contains(&format!("\"docker-manifest-digest\":\"{digest}\"")),
        "{out}"
    );
    cosign_ok(
        Component::CosignV2,
        dir.path(),
        &args(
            &[
                "verify",
                "--key",
                &pubkey,
                "--new-bundle-format",
                "--trusted-root",
                &root,
            ],
            &args(OFFLINE_VERIFY, &[&target]),
        ),
    );
    // Without the bundle, cosign v3 finds nothing to verify with the v2 scheme.
    let (ok, _) = cosign(
        Component::CosignV3,
        dir.path(),
        &args(
            &["verify", "--key", &pubkey, "--new-bundle-format=false"],
            &args(OFFLINE_VERIFY, &[&target]),
        ),
    );
    assert!(
        !ok,
        "gkm wrote only a bundle, yet cosign found a v2 signature"
    );

    let verified = verify_keys(&image, &digest, &[&public])
        .await
        .expect("gkm verifies its own");
    assert_eq!(verified.format, Format::SigstoreBundle);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unsigned_image_is_refused() {
    let (_, public) = generated_key();
    let (image, digest) = push_image("unsigned", CUDA).await;
    assert_eq!(
        rejection(verify_keys(&image, &digest, &[&public]).await),
        Rejection::NoSignature
    );
}

fn generated_key() -> (SigningKey, PublicKey) {
    let (key, _) = SigningKey::generate_p256().expect("key");
    let public = key.public_key().clone();
    (key, public)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_signature_by_another_key_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (key_path, _) = cosign_keys(dir.path(), "signer");
    let (_, other) = generated_key();
    let (image, digest) = push_image("wrong-key", CUDA).await;
    let key = key_path.to_string_lossy().into_owned();
    cosign_ok(
        Component::CosignV2,
        dir.path(),
        &args(
            &["sign", "--key", &key],
            &args(OFFLINE_SIGN, &[&pinned(&image, &digest)]),
        ),
    );
    cosign_ok(
        Component::CosignV3,
        dir.path(),
        &args(
            &["sign", "--key", &key, "--use-signing-config=false"],
            &args(OFFLINE_SIGN, &[&pinned(&image, &digest)]),
        ),
    );
    let refused = rejection(verify_keys(&image, &digest, &[&other]).await);
    assert_eq!(
        refused,
        Rejection::NoneAccepted(vec![
            Rejection::WrongKey {
                format: Format::CosignV2
            },
            Rejection::WrongKey {
                format: Format::SigstoreBundle
            },
        ]),
        "{refused}"
    );
}

/// Copy the manifest at `from_tag` to `to_tag` (blobs are shared in the repository).
async fn copy_tag(image: &ImageRef, from_tag: &str, to_tag: &str) {
    let from = gkm_oci::verify::location::tagged(image, from_tag);
    let to = gkm_oci::verify::location::tagged(image, to_tag);
    let manifest = Repo::open(&from, &options())
        .expect("repo")
        .fetch_manifest()
        .await
        .expect("fetch");
    Repo::create(&to, &options())
        .expect("repo")
        .put_manifest(&manifest)
        .await
        .expect("put");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_right_key_over_another_digest_is_refused() {
    let (key, public) = generated_key();
    let (signed_image, signed_digest) = push_image("other-digest", CUDA).await;
    let (_, other_digest) = push_image("other-digest", ROCM).await;
    assert_ne!(signed_digest, other_digest);
    for format in [SignFormat::CosignV2, SignFormat::Bundle] {
        sign(&signed_image, &options(), &signed_digest, &key, format)
            .await
            .expect("sign");
    }
    // Someone replays the signatures of the CUDA image onto the ROCm image.
    copy_tag(
        &signed_image,
        &gkm_oci::verify::signature_tag(&signed_digest),
        &gkm_oci::verify::signature_tag(&other_digest),
    )
    .await;
    copy_tag(
        &signed_image,
        &gkm_oci::verify::referrers_tag(&signed_digest),
        &gkm_oci::verify::referrers_tag(&other_digest),
    )
    .await;
    let refused = rejection(verify_keys(&signed_image, &other_digest, &[&public]).await);
    let mismatch = |format| Rejection::DigestMismatch {
        format,
        expected: other_digest.to_string(),
        signed: signed_digest.to_string(),
    };
    assert_eq!(
        refused,
        Rejection::NoneAccepted(vec![
            mismatch(Format::CosignV2),
            mismatch(Format::SigstoreBundle)
        ])
    );
    assert!(
        refused.to_string().contains("payload digest mismatch"),
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tag_moved_to_an_unsigned_image_is_refused() {
    let (key, public) = generated_key();
    let (image, first) = push_image("moved-tag", CUDA).await;
    sign(&image, &options(), &first, &key, SignFormat::Bundle)
        .await
        .expect("sign");
    assert!(verify_keys(&image, &first, &[&public]).await.is_ok());
    // The tag now points at another, unsigned image.
    let (_, moved) = push_image("moved-tag", ROCM).await;
    let resolved = Repo::open(&image, &options())
        .expect("repo")
        .fetch_manifest()
        .await
        .expect("resolve")
        .digest;
    assert_eq!(resolved, moved);
    assert_eq!(
        rejection(verify_keys(&image, &resolved, &[&public]).await),
        Rejection::NoSignature
    );
}

/// Replace the bundle of `digest`'s only referrer with `edit(bundle)`,
/// writing the new bundle, referrer manifest and tag-schema index.
async fn edit_bundle(image: &ImageRef, digest: &Digest, edit: impl FnOnce(&mut serde_json::Value)) {
    let repo = Repo::create(image, &options()).expect("repo");
    let index_tag = gkm_oci::verify::referrers_tag(digest);
    let at = gkm_oci::verify::location::tagged(image, &index_tag);
    let index = Repo::open(&at, &options())
        .expect("repo")
        .fetch_manifest()
        .await
        .expect("index");
    let mut index: serde_json::Value = serde_json::from_slice(&index.bytes).expect("index json");
    let referrer: Digest = index["manifests"][0]["digest"]
        .as_str()
        .expect("digest")
        .parse()
        .expect("digest");
    let manifest = repo
        .fetch_manifest_digest(&referrer)
        .await
        .expect("referrer");
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&manifest.bytes).expect("manifest json");
    let layer: Digest = manifest["layers"][0]["digest"]
        .as_str()
        .expect("layer")
        .parse()
        .expect("digest");
    let mut bundle: serde_json::Value =
        serde_json::from_slice(&repo.fetch_small_blob(&layer).await.expect("bundle"))
            .expect("bundle json");
    edit(&mut bundle);
    let bytes = serde_json::to_vec(&bundle).expect("json");
    let new_layer = Digest::of(&bytes);
    let chunk: std::io::Result<bytes::Bytes> = Ok(bytes::Bytes::from(bytes.clone()));
    repo.put_blob(
        &new_layer,
        bytes.len() as u64,
        gkm_oci::repo::BlobSource::Stream(Box::pin(futures::stream::once(async move { chunk }))),
    )
    .await
    .expect("put bundle");
    manifest["layers"][0]["digest"] = new_layer.to_string().into();
    manifest["layers"][0]["size"] = bytes.len().into();
    let manifest_bytes = serde_json::to_vec(&manifest).expect("json");
    let manifest_digest = Digest::of(&manifest_bytes);
    Repo::create(&image.with_digest(&manifest_digest), &options())
        .expect("repo")
        .put_manifest(&RawManifest {
            digest: manifest_digest.clone(),
            media_type: "application/vnd.oci.image.manifest.v1+json".into(),
            bytes: manifest_bytes.clone(),
        })
        .await
        .expect("put manifest");
    index["manifests"][0]["digest"] = manifest_digest.to_string().into();
    index["manifests"][0]["size"] = manifest_bytes.len().into();
    let index_bytes = serde_json::to_vec(&index).expect("json");
    Repo::create(&at, &options())
        .expect("repo")
        .put_manifest(&RawManifest {
            digest: Digest::of(&index_bytes),
            media_type: "application/vnd.oci.image.index.v1+json".into(),
            bytes: index_bytes,
        })
        .await
        .expect("put index");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tampered_bundle_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (key_path, public) = cosign_keys(dir.path(), "signer");
    let (image, digest) = push_image("tampered", CUDA).await;
    let key = key_path.to_string_lossy().into_owned();
    cosign_ok(
        Component::CosignV3,
        dir.path(),
        &args(
            &["sign", "--key", &key, "--use-signing-config=false"],
            &args(OFFLINE_SIGN, &[&pinned(&image, &digest)]),
        ),
    );
    // Rewrite the statement's predicate; the signature stays.
    edit_bundle(&image, &digest, |bundle| {
        let payload = bundle["dsseEnvelope"]["payload"].as_str().expect("payload");
        let mut statement: serde_json::Value =
            serde_json::from_slice(&BASE64.decode(payload).expect("base64")).expect("statement");
        statement["predicate"] = serde_json::json!({"note": "altered"});
        bundle["dsseEnvelope"]["payload"] = BASE64
            .encode(serde_json::to_vec(&statement).expect("json"))
            .into();
    })
    .await;
    let refused = rejection(verify_keys(&image, &digest, &[&public]).await);
    assert!(
        matches!(
            &refused,
            Rejection::Tampered {
                format: Format::SigstoreBundle,
                ..
            }
        ),
        "{refused}"
    );
    assert!(
        refused.to_string().starts_with("tampered sigstore bundle"),
        "{refused}"
    );

    // A bundle that is no longer a bundle.
    edit_bundle(&image, &digest, |bundle| {
        *bundle = serde_json::json!({"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json"});
    })
    .await;
    let refused = rejection(verify_keys(&image, &digest, &[&public]).await);
    assert!(
        matches!(
            &refused,
            Rejection::Malformed {
                format: Format::SigstoreBundle,
                ..
            }
        ),
        "{refused}"
    );
    assert!(
        refused.to_string().contains("is not a sigstore bundle"),
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_truncated_signature_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (key_path, public) = cosign_keys(dir.path(), "signer");
    let (image, digest) = push_image("truncated", CUDA).await;
    let key = key_path.to_string_lossy().into_owned();
    cosign_ok(
        Component::CosignV2,
        dir.path(),
        &args(
            &["sign", "--key", &key],
            &args(OFFLINE_SIGN, &[&pinned(&image, &digest)]),
        ),
    );
    let tag = gkm_oci::verify::signature_tag(&digest);
    let at = gkm_oci::verify::location::tagged(&image, &tag);
    let raw = Repo::open(&at, &options())
        .expect("repo")
        .fetch_manifest()
        .await
        .expect("sig manifest");
    let mut manifest: serde_json::Value = serde_json::from_slice(&raw.bytes).expect("json");
    let annotation =
        &mut manifest["layers"][0]["annotations"][gkm_oci::verify::SIGNATURE_ANNOTATION];
    let sig = BASE64
        .decode(annotation.as_str().expect("signature"))
        .expect("base64");
    *annotation = BASE64.encode(&sig[..sig.len() - 9]).into();
    let bytes = serde_json::to_vec(&manifest).expect("json");
    Repo::create(&at, &options())
        .expect("repo")
        .put_manifest(&RawManifest {
            digest: Digest::of(&bytes),
            media_type: raw.media_type,
            bytes,
        })
        .await
        .expect("put");
    let refused = rejection(verify_keys(&image, &digest, &[&public]).await);
    assert!(
        matches!(
            &refused,
            Rejection::Malformed {
                format: Format::CosignV2,
                ..
            }
        ),
        "{refused}"
    );
    assert!(refused.to_string().contains("truncated"), "{refused}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_registry_answering_garbage_is_an_error_not_a_verdict() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut buf = [0u8; 4096];
            let _ = socket.read(&mut buf).await;
            let _ = socket
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n\x00\x01garbage!!")
                .await;
        }
    });
    let image: ImageRef = format!("{addr}/signatures/garbage:v1")
        .parse()
        .expect("ref");
    let digest = Digest::of(b"an image that is not there");
    let (_, public) = generated_key();
    match verify_keys(&image, &digest, &[&public]).await {
        Err(VerifyError::Image(e)) => {
            let text = e.to_string();
            assert!(text.contains(&addr.to_string()), "{text}");
            assert!(
                matches!(
                    e,
                    gkm_oci::Error::Registry { .. } | gkm_oci::Error::Format { .. }
                ),
                "{e:?}"
            );
        }
        other => panic!("expected a registry error, got {other:?}"),
    }
}

/// A local certificate authority issuing Fulcio-style signing certificates.
struct Fulcio {
    params: rcgen::CertificateParams,
    key: rcgen::KeyPair,
    cert_der: Vec<u8>,
}

const ISSUER: &str = "https://token.actions.example.com";
const SUBJECT: &str = "https://github.com/acme/caches/.github/workflows/build.yml@refs/heads/main";

fn der_utf8(s: &str) -> Vec<u8> {
    let mut out = vec![12u8, s.len() as u8];
    out.extend_from_slice(s.as_bytes());
    out
}

impl Fulcio {
    fn new(name: &str) -> Fulcio {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2100, 1, 1);
        let cert_der = params.self_signed(&key).expect("self-sign").der().to_vec();
        Fulcio {
            params,
            key,
            cert_der,
        }
    }

    /// A leaf for `subject` (a URI SAN) naming `issuer` in the v2 extension
    /// (or only the legacy one), valid in `years`; (cert PEM, key PKCS#8 PEM).
    fn leaf(
        &self,
        issuer: &str,
        subject: &str,
        legacy_only: bool,
        years: (i32, i32),
    ) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = self.leaf_with(issuer, subject, legacy_only, years, &key, None);
        (cert.pem(), key.serialize_pem())
    }

    /// The leaf of [`Fulcio::leaf`] for `key`, with `extra` as its last
    /// extension; the same `TBSCertificate` for the same arguments.
    fn leaf_with(
        &self,
        issuer: &str,
        subject: &str,
        legacy_only: bool,
        years: (i32, i32),
        key: &rcgen::KeyPair,
        extra: Option<rcgen::CustomExtension>,
    ) -> rcgen::Certificate {
        use rcgen::{
            CertificateParams, CustomExtension, ExtendedKeyUsagePurpose, Issuer, KeyUsagePurpose,
            SanType, SerialNumber,
        };
        let mut params = CertificateParams::default();
        params.serial_number = Some(SerialNumber::from(vec![0x14, 0x14]));
        params.subject_alt_names = vec![SanType::URI(subject.try_into().expect("uri"))];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::CodeSigning];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.not_before = rcgen::date_time_ymd(years.0, 1, 1);
        params.not_after = rcgen::date_time_ymd(years.1, 1, 1);
        params
            .custom_extensions
            .push(CustomExtension::from_oid_content(
                &[1, 3, 6, 1, 4, 1, 57264, 1, 1],
                issuer.as_bytes().to_vec(),
            ));
        if !legacy_only {
            params
                .custom_extensions
                .push(CustomExtension::from_oid_content(
                    &[1, 3, 6, 1, 4, 1, 57264, 1, 8],
                    der_utf8(issuer),
                ));
        }
        params.custom_extensions.extend(extra);
        let ca = Issuer::from_params(&self.params, &self.key);
        params.signed_by(key, &ca).expect("sign leaf")
    }

    fn trusted_root(&self) -> String {
        serde_json::json!({
            "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
            "certificateAuthorities": [{
                "subject": {"organization": "gkm tests", "commonName": "local fulcio"},
                "uri": "https://fulcio.local",
                "certChain": {"certificates": [{"rawBytes": BASE64.encode(&self.cert_der)}]},
                "validFor": {"start": "2020-01-01T00:00:00Z"}
            }]
        })
        .to_string()
    }

    fn ca_pem(&self) -> String {
        gkm_core::policy::to_pem("CERTIFICATE", &self.cert_der)
    }
}

fn keyless_policy(root: &str, issuer: &str, subject: SubjectMatch) -> Policy {
    let identity = Identity::new(issuer, subject).expect("identity");
    let root = TrustedRoot::from_json(root.as_bytes()).expect("trusted root");
    Policy::new(
        Mode::Enforce,
        vec![Signer::Keyless(identity)],
        Some(root),
        false,
    )
    .expect("policy")
    .allowing_unlogged_keyless()
}

/// Sign `digest` with cosign (`version`), the leaf's key and the leaf
/// certificate (no Fulcio, no Rekor): cosign v2 writes the certificate into
/// the `.sig` layer annotations, cosign v3 into the bundle.
fn cosign_sign_with_certificate(
    version: Component,
    dir: &Path,
    fulcio: &Fulcio,
    leaf: &(String, String),
    image: &ImageRef,
    digest: &Digest,
) {
    std::fs::write(dir.join("leaf.pem"), &leaf.0).expect("write");
    std::fs::write(dir.join("leaf-key.pem"), &leaf.1).expect("write");
    std::fs::write(dir.join("ca.pem"), fulcio.ca_pem()).expect("write");
    let _ = std::fs::remove_file(dir.join("import.key"));
    let _ = std::fs::remove_file(dir.join("import.pub"));
    cosign_ok(
        version,
        dir,
        &[
            "import-key-pair",
            "--key",
            "leaf-key.pem",
            "--output-key-prefix",
            "import",
        ],
    );
    let mut sign = vec![
        "sign",
        "--key",
        "import.key",
        "--certificate",
        "leaf.pem",
        "--certificate-chain",
        "ca.pem",
    ];
    if version == Component::CosignV3 {
        sign.push("--use-signing-config=false");
    }
    cosign_ok(
        version,
        dir,
        &args(&sign, &args(OFFLINE_SIGN, &[&pinned(image, digest)])),
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn keyless_certificates_from_a_local_ca_prove_issuer_and_subject() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fulcio = Fulcio::new("local fulcio");
    let root = fulcio.trusted_root();
    let leaf = fulcio.leaf(ISSUER, SUBJECT, false, (2020, 2100));
    let (image, digest) = push_image("keyless", CUDA).await;
    cosign_sign_with_certificate(
        Component::CosignV2,
        dir.path(),
        &fulcio,
        &leaf,
        &image,
        &digest,
    );
    let check = |policy: Policy| {
        let image = image.clone();
        let digest = digest.clone();
        async move { verify(&image, &options(), &digest, &policy).await }
    };

    let exact = check(keyless_policy(
        &root,
        ISSUER,
        SubjectMatch::Exact(SUBJECT.into()),
    ))
    .await
    .expect("exact identity");
    assert_eq!(
        exact,
        Verified {
            format: Format::CosignV2,
            signed_by: SignedBy::Keyless {
                issuer: ISSUER.into(),
                subject: SUBJECT.into()
            },
            digest: digest.to_string(),
            tlog: false,
        }
    );
    let pattern =
        SubjectMatch::regexp(r"https://github\.com/acme/.*@refs/heads/main").expect("pattern");
    assert!(check(keyless_policy(&root, ISSUER, pattern)).await.is_ok());

    let wrong_subject = SubjectMatch::Exact(
        "https://github.com/evil/caches/.github/workflows/build.yml@refs/heads/main".into(),
    );
    let refused = rejection(check(keyless_policy(&root, ISSUER, wrong_subject)).await);
    assert_eq!(
        refused,
        Rejection::IdentityMismatch {
            expected: "https://github.com/evil/caches/.github/workflows/build.yml@refs/heads/main"
                .into(),
            found: SUBJECT.into()
        }
    );
    let not_anchored = SubjectMatch::regexp(r"https://github\.com/acme/caches").expect("pattern");
    assert!(matches!(
        rejection(check(keyless_policy(&root, ISSUER, not_anchored)).await),
        Rejection::IdentityMismatch { .. }
    ));

    let refused = rejection(
        check(keyless_policy(
            &root,
            "https://accounts.example.org",
            SubjectMatch::Exact(SUBJECT.into()),
        ))
        .await,
    );
    assert_eq!(
        refused,
        Rejection::IssuerMismatch {
            expected: "\"https://accounts.example.org\"".into(),
            found: ISSUER.into()
        }
    );

    let stranger = Fulcio::new("local fulcio");
    let refused = rejection(
        check(keyless_policy(
            &stranger.trusted_root(),
            ISSUER,
            SubjectMatch::Exact(SUBJECT.into()),
        ))
        .await,
    );
    assert!(
        matches!(&refused, Rejection::UntrustedChain(_)),
        "{refused}"
    );

    // No transparency log vouches for the signature: refused unless the
    // policy says otherwise in so many words (`keyless_policy` does).
    let identity = Identity::new(ISSUER, SubjectMatch::Exact(SUBJECT.into())).expect("identity");
    let strict = Policy::new(
        Mode::Enforce,
        vec![Signer::Keyless(identity)],
        Some(TrustedRoot::from_json(root.as_bytes()).expect("root")),
        false,
    )
    .expect("policy");
    assert!(strict.keyless_needs_tlog());
    assert_eq!(rejection(check(strict).await), Rejection::TlogMissing);

    // cosign agrees, offline, with the same trusted root.
    let root_path = dir.path().join("trusted_root.json");
    std::fs::write(&root_path, &root).expect("write");
    let root_path = root_path.to_string_lossy().into_owned();
    let out = cosign_ok(
        Component::CosignV2,
        dir.path(),
        &args(
            &[
                "verify",
                "--certificate-identity",
                SUBJECT,
                "--certificate-oidc-issuer",
                ISSUER,
                "--trusted-root",
                &root_path,
                "--insecure-ignore-sct",
            ],
            &args(OFFLINE_VERIFY, &[&pinned(&image, &digest)]),
        ),
    );
    assert!(out.contains(&digest.to_string()), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn keyless_certificates_with_only_the_legacy_issuer_extension_are_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fulcio = Fulcio::new("legacy fulcio");
    let leaf = fulcio.leaf(ISSUER, SUBJECT, true, (2020, 2100));
    let (image, digest) = push_image("keyless-legacy", ROCM).await;
    cosign_sign_with_certificate(
        Component::CosignV2,
        dir.path(),
        &fulcio,
        &leaf,
        &image,
        &digest,
    );
    let policy = keyless_policy(
        &fulcio.trusted_root(),
        ISSUER,
        SubjectMatch::Exact(SUBJECT.into()),
    );
    let verified = verify(&image, &options(), &digest, &policy)
        .await
        .expect("legacy extension");
    assert_eq!(
        verified.signed_by,
        SignedBy::Keyless {
            issuer: ISSUER.into(),
            subject: SUBJECT.into()
        }
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_expired_certificate_without_a_timestamp_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fulcio = Fulcio::new("expired fulcio");
    let leaf = fulcio.leaf(ISSUER, SUBJECT, false, (2021, 2022));
    let (image, digest) = push_image("keyless-expired", CUDA).await;
    cosign_sign_with_certificate(
        Component::CosignV2,
        dir.path(),
        &fulcio,
        &leaf,
        &image,
        &digest,
    );
    let policy = keyless_policy(
        &fulcio.trusted_root(),
        ISSUER,
        SubjectMatch::Exact(SUBJECT.into()),
    );
    let refused = rejection(verify(&image, &options(), &digest, &policy).await);
    assert!(
        matches!(&refused, Rejection::CertificateExpired(_)),
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn cosign_v3_keyless_bundles_prove_issuer_and_subject() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fulcio = Fulcio::new("bundle fulcio");
    let root = fulcio.trusted_root();
    let leaf = fulcio.leaf(ISSUER, SUBJECT, false, (2020, 2100));
    let (image, digest) = push_image("keyless-bundle", CUDA).await;
    cosign_sign_with_certificate(
        Component::CosignV3,
        dir.path(),
        &fulcio,
        &leaf,
        &image,
        &digest,
    );

    let pattern = SubjectMatch::regexp(r"https://github\.com/acme/.*").expect("pattern");
    let verified = verify(
        &image,
        &options(),
        &digest,
        &keyless_policy(&root, ISSUER, pattern),
    )
    .await
    .expect("verifies");
    assert_eq!(verified.format, Format::SigstoreBundle);
    assert_eq!(
        verified.signed_by,
        SignedBy::Keyless {
            issuer: ISSUER.into(),
            subject: SUBJECT.into()
        }
    );

    let refused = rejection(
        verify(
            &image,
            &options(),
            &digest,
            &keyless_policy(&root, ISSUER, SubjectMatch::Exact("ci@example.com".into())),
        )
        .await,
    );
    assert!(
        matches!(&refused, Rejection::IdentityMismatch { found, .. } if found == SUBJECT),
        "{refused}"
    );
    let stranger = Fulcio::new("bundle fulcio");
    let refused = rejection(
        verify(
            &image,
            &options(),
            &digest,
            &keyless_policy(
                &stranger.trusted_root(),
                ISSUER,
                SubjectMatch::Exact(SUBJECT.into()),
            ),
        )
        .await,
    );
    assert!(
        matches!(&refused, Rejection::UntrustedChain(_)),
        "{refused}"
    );
}

/// A local transparency log key and the `tlogs` entry naming it.
fn rekor_log(key: &SigningKey) -> serde_json::Value {
    use sha2::Digest as _;
    let spki = key.public_key().der();
    serde_json::json!({
        "baseUrl": "https://rekor.local",
        "hashAlgorithm": "SHA2_256",
        "publicKey": {
            "rawBytes": BASE64.encode(spki),
            "keyDetails": "PKIX_ECDSA_P256_SHA_256",
            "validFor": {"start": "2020-01-01T00:00:00Z"}
        },
        "logId": {"keyId": BASE64.encode(sha2::Sha256::digest(spki))}
    })
}

/// Add to the first layer of `digest`'s `.sig` manifest a Rekor entry for
/// its signature, integrated at `integrated_time` and signed by `log`.
async fn add_rekor_entry(
    image: &ImageRef,
    digest: &Digest,
    log: &SigningKey,
    integrated_time: i64,
) {
    use sha2::Digest as _;
    let at = gkm_oci::verify::location::tagged(image, &gkm_oci::verify::signature_tag(digest));
    let raw = Repo::open(&at, &options())
        .expect("repo")
        .fetch_manifest()
        .await
        .expect("sig manifest");
    let mut manifest: serde_json::Value = serde_json::from_slice(&raw.bytes).expect("json");
    let layer = &mut manifest["layers"][0];
    let signature = layer["annotations"][gkm_oci::verify::SIGNATURE_ANNOTATION]
        .as_str()
        .expect("sig")
        .to_string();
    let body = serde_json::json!({
        "apiVersion": "0.0.1",
        "kind": "hashedrekord",
        "spec": {
            "data": {"hash": {"algorithm": "sha256", "value": layer["digest"].as_str().expect("digest").trim_start_matches("sha256:")}},
            "signature": {"content": signature}
        }
    });
    let log_id = hex::encode(sha2::Sha256::digest(log.public_key().der()));
    let payload = serde_json::json!({
        "body": BASE64.encode(serde_json::to_vec(&body).expect("json")),
        "integratedTime": integrated_time,
        "logID": log_id,
        "logIndex": 7,
    });
    // The log signs the canonical JSON: keys sorted, no spaces.
    let set = log
        .sign(&serde_json::to_vec(&payload).expect("json"))
        .expect("sign");
    let bundle =
        serde_json::json!({"SignedEntryTimestamp": BASE64.encode(set), "Payload": payload});
    layer["annotations"][gkm_oci::verify::REKOR_BUNDLE_ANNOTATION] = bundle.to_string().into();
    let bytes = serde_json::to_vec(&manifest).expect("json");
    Repo::create(&at, &options())
        .expect("repo")
        .put_manifest(&RawManifest {
            digest: Digest::of(&bytes),
            media_type: raw.media_type,
            bytes,
        })
        .await
        .expect("put");
}

fn with_tlogs(root: &str, logs: Vec<serde_json::Value>) -> String {
    let mut root: serde_json::Value = serde_json::from_str(root).expect("json");
    root["tlogs"] = logs.into();
    root.to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_required_transparency_log_entry_must_be_signed_by_a_trusted_log() {
    let (key, public) = generated_key();
    let (rekor, _) = SigningKey::generate_p256().expect("log key");
    let (impostor, _) = SigningKey::generate_p256().expect("log key");
    let (image, digest) = push_image("tlog", ROCM).await;
    sign(&image, &options(), &digest, &key, SignFormat::CosignV2)
        .await
        .expect("sign");
    let root = with_tlogs(
        r#"{"mediaType":"application/vnd.dev.sigstore.trustedroot+json;version=0.1"}"#,
        vec![rekor_log(&rekor)],
    );
    let root = TrustedRoot::from_json(root.as_bytes()).expect("root");
    let policy = Policy::new(
        Mode::Enforce,
        vec![Signer::Key(public.clone())],
        Some(root),
        true,
    )
    .expect("policy");

    let refused = rejection(verify(&image, &options(), &digest, &policy).await);
    assert_eq!(refused, Rejection::TlogMissing);

    add_rekor_entry(&image, &digest, &impostor, 1_700_000_000).await;
    assert_eq!(
        rejection(verify(&image, &options(), &digest, &policy).await),
        Rejection::TlogMissing
    );

    add_rekor_entry(&image, &digest, &rekor, 1_700_000_000).await;
    let verified = verify(&image, &options(), &digest, &policy)
        .await
        .expect("logged signature");
    assert!(verified.tlog);
    assert_eq!(verified.signed_by, signed_by_key(&public));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_expired_certificate_with_a_logged_timestamp_inside_its_validity_verifies() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fulcio = Fulcio::new("timestamped fulcio");
    let leaf = fulcio.leaf(ISSUER, SUBJECT, false, (2021, 2022));
    let (image, digest) = push_image("keyless-logged", ROCM).await;
    cosign_sign_with_certificate(
        Component::CosignV2,
        dir.path(),
        &fulcio,
        &leaf,
        &image,
        &digest,
    );
    let (rekor, _) = SigningKey::generate_p256().expect("log key");
    let root = with_tlogs(&fulcio.trusted_root(), vec![rekor_log(&rekor)]);
    let policy = keyless_policy(&root, ISSUER, SubjectMatch::Exact(SUBJECT.into()));
    assert!(matches!(
        rejection(verify(&image, &options(), &digest, &policy).await),
        Rejection::CertificateExpired(_)
    ));
    // Logged on 2021-06-01, while the certificate was valid.
    add_rekor_entry(&image, &digest, &rekor, 1_622_505_600).await;
    let verified = verify(&image, &options(), &digest, &policy)
        .await
        .expect("timestamped signature");
    assert!(verified.tlog);
    assert_eq!(
        verified.signed_by,
        SignedBy::Keyless {
            issuer: ISSUER.into(),
            subject: SUBJECT.into()
        }
    );
}

/// A PKCS#8 private key and its PEM public key, for `alg`.
fn rcgen_key(alg: &'static rcgen::SignatureAlgorithm) -> (String, String) {
    let key = rcgen::KeyPair::generate_for(alg).expect("generate key");
    (key.serialize_pem(), key.public_key_pem())
}

#[tokio::test(flavor = "multi_thread")]
async fn every_key_algorithm_signs_and_verifies_with_gkm_and_cosign() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (image, digest) = push_image("algorithms", ROCM).await;
    let root = empty_trusted_root(dir.path())
        .to_string_lossy()
        .into_owned();
    let target = pinned(&image, &digest);
    let cases = [
        (&rcgen::PKCS_ECDSA_P256_SHA256, KeyAlgorithm::EcdsaP256),
        (&rcgen::PKCS_ECDSA_P384_SHA384, KeyAlgorithm::EcdsaP384),
        (&rcgen::PKCS_ED25519, KeyAlgorithm::Ed25519),
        (&rcgen::PKCS_RSA_SHA256, KeyAlgorithm::Rsa),
    ];
    for (alg, expected) in cases {
        let (private_pem, public_pem) = rcgen_key(alg);
        let key = SigningKey::from_pem(&private_pem, b"").expect("PKCS#8 key");
        let public = PublicKey::from_pem(&public_pem).expect("public key");
        assert_eq!(public.algorithm(), expected);
        assert_eq!(key.public_key(), &public);
        for format in [SignFormat::CosignV2, SignFormat::Bundle] {
            sign(&image, &options(), &digest, &key, format)
                .await
                .expect("sign");
        }
        let pub_path = dir.path().join(format!("{expected:?}.pub"));
        std::fs::write(&pub_path, &public_pem).expect("write");
        let pub_path = pub_path.to_string_lossy().into_owned();
        // cosign checks both formats with this key (it hashes for ECDSA
        // with SHA-256 unless told otherwise; gkm signs P-384 with SHA-384).
        let mut verify_args = vec!["verify", "--key", pub_path.as_str()];
        if expected == KeyAlgorithm::EcdsaP384 {
            verify_args.extend(["--signature-digest-algorithm", "sha384"]);
        }
        cosign_ok(
            Component::CosignV3,
            dir.path(),
            &args(
                &args(&verify_args, &["--trusted-root", &root]),
                &args(OFFLINE_VERIFY, &[&target]),
            ),
        );
        cosign_ok(
            Component::CosignV3,
            dir.path(),
            &args(
                &args(&verify_args, &["--new-bundle-format=false"]),
                &args(OFFLINE_VERIFY, &[&target]),
            ),
        );
        let verified = verify_keys(&image, &digest, &[&public])
            .await
            .expect("verifies");
        assert_eq!(verified.signed_by, signed_by_key(&public));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn images_in_an_oci_layout_are_signed_and_verified_in_both_formats() {
    let dir = tempfile::tempdir().expect("tempdir");
    let image: ImageRef = format!("oci:{}/layout:v1", dir.path().display())
        .parse()
        .expect("ref");
    let built = build(
        &fixture_cache(CUDA),
        &image,
        &BuildOptions::default(),
        &options(),
    )
    .await
    .expect("build into a layout");
    let (key, public) = generated_key();
    let (_, stranger) = generated_key();
    assert_eq!(
        rejection(verify_keys(&image, &built.digest, &[&public]).await),
        Rejection::NoSignature
    );
    for (format, expected) in [
        (SignFormat::CosignV2, Format::CosignV2),
        (SignFormat::Bundle, Format::SigstoreBundle),
    ] {
        sign(&image, &options(), &built.digest, &key, format)
            .await
            .expect("sign");
        let verified = verify_keys(&image, &built.digest, &[&public])
            .await
            .expect("verifies");
        assert_eq!(verified.signed_by, signed_by_key(&public));
        assert_eq!(
            verified.format,
            Format::CosignV2,
            "the v2 signature is checked first"
        );
        let refused = rejection(verify_keys(&image, &built.digest, &[&stranger]).await);
        assert!(
            refused
                .reasons()
                .contains(&&Rejection::WrongKey { format: expected }),
            "{refused}"
        );
    }
}

/// A bundle whose in-toto statement is an attestation (here a provenance)
/// signed by the accepted key says something about the image, but is not a
/// signature of it: refused, naming the predicate type.
#[tokio::test(flavor = "multi_thread")]
async fn an_attestation_by_the_accepted_key_is_not_a_signature() {
    let (key, public) = generated_key();
    let (image, digest) = push_image("attestation", CUDA).await;
    sign(&image, &options(), &digest, &key, SignFormat::Bundle)
        .await
        .expect("sign");
    assert!(verify_keys(&image, &digest, &[&public]).await.is_ok());
    // The same key signs a provenance statement about the same digest.
    edit_bundle(&image, &digest, |bundle| {
        let envelope = &mut bundle["dsseEnvelope"];
        let payload = envelope["payload"].as_str().expect("payload");
        let mut statement: serde_json::Value =
            serde_json::from_slice(&BASE64.decode(payload).expect("base64")).expect("statement");
        statement["predicateType"] = "https://slsa.dev/provenance/v1".into();
        let payload = serde_json::to_vec(&statement).expect("json");
        let payload_type = envelope["payloadType"].as_str().expect("type").to_string();
        let signature = key
            .sign(&gkm_oci::verify::pae(&payload_type, &payload))
            .expect("sign");
        envelope["payload"] = BASE64.encode(&payload).into();
        envelope["signatures"][0]["sig"] = BASE64.encode(signature).into();
    })
    .await;
    let refused = rejection(verify_keys(&image, &digest, &[&public]).await);
    let message = refused.to_string();
    assert!(
        message.contains("\"https://slsa.dev/provenance/v1\"")
            && message.contains("not a signature"),
        "{message}"
    );
}

/// A CT log of the trusted root: (its entry in `ctlogs`, its signing key).
fn ct_log() -> (serde_json::Value, SigningKey) {
    use sha2::Digest as _;
    let (key, public) = generated_key();
    let entry = serde_json::json!({
        "baseUrl": "https://ct.local",
        "hashAlgorithm": "SHA2_256",
        "publicKey": {
            "rawBytes": BASE64.encode(public.der()),
            "keyDetails": "PKIX_ECDSA_P256_SHA_256",
            "validFor": {"start": "2020-01-01T00:00:00Z"}
        },
        "logId": {"keyId": BASE64.encode(sha2::Sha256::digest(public.der()))}
    });
    (entry, key)
}

/// The SCT extension a CT log signing with `log` gives the precertificate
/// `tbs` issued by the CA whose public key is `issuer_spki` (RFC 6962 §3.2).
fn sct_extension(log: &SigningKey, tbs: &[u8], issuer_spki: &[u8]) -> rcgen::CustomExtension {
    use sha2::Digest as _;
    let timestamp: u64 = 1_700_000_000_000;
    let mut signed = vec![0u8, 0];
    signed.extend_from_slice(&timestamp.to_be_bytes());
    signed.extend_from_slice(&[0, 1]);
    signed.extend_from_slice(&sha2::Sha256::digest(issuer_spki));
    signed.extend_from_slice(&(tbs.len() as u32).to_be_bytes()[1..]);
    signed.extend_from_slice(tbs);
    signed.extend_from_slice(&[0, 0]);
    let signature = log.sign(&signed).expect("sign");
    let mut sct = vec![0u8];
    sct.extend_from_slice(&sha2::Sha256::digest(log.public_key().der()));
    sct.extend_from_slice(&timestamp.to_be_bytes());
    sct.extend_from_slice(&[0, 0, 4, 3]);
    sct.extend_from_slice(&(signature.len() as u16).to_be_bytes());
    sct.extend_from_slice(&signature);
    let mut list = ((sct.len() + 2) as u16).to_be_bytes().to_vec();
    list.extend_from_slice(&(sct.len() as u16).to_be_bytes());
    list.extend_from_slice(&sct);
    let mut value = vec![0x04, 0x82];
    value.extend_from_slice(&(list.len() as u16).to_be_bytes());
    value.extend_from_slice(&list);
    rcgen::CustomExtension::from_oid_content(&[1, 3, 6, 1, 4, 1, 11129, 2, 4, 2], value)
}

/// When the trusted root names a CT log, a keyless certificate counts only
/// with an SCT that log signed over its precertificate.
#[tokio::test(flavor = "multi_thread")]
async fn keyless_certificates_need_an_sct_when_the_root_names_ct_logs() {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let dir = tempfile::tempdir().expect("tempdir");
    let fulcio = Fulcio::new("ct fulcio");
    let (log_entry, log) = ct_log();
    let (_, stranger) = ct_log();
    let mut root: serde_json::Value =
        serde_json::from_str(&fulcio.trusted_root()).expect("root json");
    root["ctlogs"] = serde_json::json!([log_entry]);
    let root = root.to_string();
    let policy = || keyless_policy(&root, ISSUER, SubjectMatch::Exact(SUBJECT.into()));
    let (_, ca) = X509Certificate::from_der(&fulcio.cert_der).expect("ca");
    let issuer_spki = ca.public_key().raw.to_vec();

    let key = rcgen::KeyPair::generate().expect("key");
    let precert = fulcio.leaf_with(ISSUER, SUBJECT, false, (2020, 2100), &key, None);
    let (_, parsed) = X509Certificate::from_der(precert.der()).expect("precert");
    let tbs = parsed.tbs_certificate.as_ref().to_vec();
    let mut other_tbs = tbs.clone();
    let last = other_tbs.len() - 1;
    other_tbs[last] ^= 1;
    let cases = [
        (
            "sct-by-the-log",
            Some(sct_extension(&log, &tbs, &issuer_spki)),
        ),
        ("sct-none", None),
        (
            "sct-by-another-log",
            Some(sct_extension(&stranger, &tbs, &issuer_spki)),
        ),
        (
            "sct-over-another-certificate",
            Some(sct_extension(&log, &other_tbs, &issuer_spki)),
        ),
    ];
    let mut outcomes = Vec::new();
    for (name, extension) in cases {
        let cert = fulcio.leaf_with(ISSUER, SUBJECT, false, (2020, 2100), &key, extension);
        let (image, digest) = push_image(name, CUDA).await;
        let leaf = (cert.pem(), key.serialize_pem());
        cosign_sign_with_certificate(
            Component::CosignV2,
            dir.path(),
            &fulcio,
            &leaf,
            &image,
            &digest,
        );
        outcomes.push(verify(&image, &options(), &digest, &policy()).await);
    }
    let mut outcomes = outcomes.into_iter();
    let proven = outcomes
        .next()
        .expect("outcome")
        .expect("an SCT of the log verifies");
    assert_eq!(
        proven.signed_by,
        SignedBy::Keyless {
            issuer: ISSUER.into(),
            subject: SUBJECT.into()
        }
    );
    let none = rejection(outcomes.next().expect("outcome")).to_string();
    assert!(
        none.contains("carries no signed certificate timestamp"),
        "{none}"
    );
    let other = rejection(outcomes.next().expect("outcome")).to_string();
    assert!(other.contains("unknown log"), "{other}");
    let forged = rejection(outcomes.next().expect("outcome")).to_string();
    assert!(forged.contains("signature does not verify"), "{forged}");
}

#[tokio::test(flavor = "multi_thread")]
async fn signatures_are_found_without_a_ping_and_a_proven_one_ends_the_search() {
    // A registry of its own, logging each request.
    let registry = &gkm_testenv::Registry::start_logging_requests().expect("start docker-registry");
    let (key, public) = generated_key();
    let policy = Policy::keys(vec![public]).expect("policy");

    // cosign v2: its tag and its payload, nothing else (the bundles are not
    // looked for once a signature proved the policy).
    let (image, digest) = push_image_to(registry, "counted", CUDA).await;
    sign(&image, &options(), &digest, &key, SignFormat::CosignV2)
        .await
        .expect("sign");
    let before = registry.requests().expect("requests").len();
    verify(&image, &options(), &digest, &policy)
        .await
        .expect("verified");
    let requests = registry.requests().expect("requests").split_off(before);
    assert_eq!(requests.len(), 2, "{requests:?}");
    let tag = format!("sha256-{}.sig", digest.hex());
    assert_eq!(
        requests[0],
        format!("GET /v2/signatures/counted/manifests/{tag}")
    );
    assert!(
        requests[1].starts_with("GET /v2/signatures/counted/blobs/sha256:"),
        "{requests:?}"
    );

    // A bundle, on a registry without the referrers API: looked for at the
    // cosign v2 tag, then at the tag-schema index (where such a registry
    // keeps referrers: the referrers API is not asked), then read; never a
    // `/v2/` ping.
    let bundled = signed_image(registry, "bundled", &key, SignFormat::Bundle).await;
    let requests = counted_verification(registry, &bundled, &policy, None).await;
    let [sig, index, manifest, blob] = &requests[..] else {
        panic!("{requests:?}");
    };
    assert!(sig.ends_with(".sig"), "{requests:?}");
    assert!(
        index.contains(&format!("/manifests/sha256-{}", bundled.1.hex())),
        "{requests:?}"
    );
    assert!(manifest.contains("/manifests/sha256:") && blob.contains("/blobs/sha256:"));

    // With hints shared between verifications, as the operator keeps
    // them: once a bundle proved a policy on this registry, the next image
    // is not looked for at the v2 tag; its bundle costs the index, its
    // manifest and the bundle itself.
    let hints = SignatureHints::default();
    counted_verification(registry, &bundled, &policy, Some(&hints)).await;
    let next = signed_image(registry, "bundled-next", &key, SignFormat::Bundle).await;
    let requests = counted_verification(registry, &next, &policy, Some(&hints)).await;
    assert_eq!(requests.len(), 3, "{requests:?}");
    assert!(
        !requests.iter().any(|r| r.ends_with(".sig")),
        "{requests:?}"
    );
    // An image signed by cosign v2 there is still found (after the
    // referrers, which hold nothing), and then the v2 tag is looked up
    // first again: its tag and its payload.
    let legacy = signed_image(registry, "legacy", &key, SignFormat::CosignV2).await;
    let requests = counted_verification(registry, &legacy, &policy, Some(&hints)).await;
    assert!(requests.len() > 2, "{requests:?}");
    let legacy_next = signed_image(registry, "legacy-next", &key, SignFormat::CosignV2).await;
    let requests = counted_verification(registry, &legacy_next, &policy, Some(&hints)).await;
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert!(requests[0].ends_with(".sig"), "{requests:?}");
}

/// The image `repo` of `registry`, signed with `key` in `format`.
async fn signed_image(
    registry: &gkm_testenv::Registry,
    repo: &str,
    key: &SigningKey,
    format: SignFormat,
) -> (ImageRef, Digest) {
    let (image, digest) = push_image_to(registry, repo, ROCM).await;
    sign(&image, &options(), &digest, key, format)
        .await
        .expect("sign");
    (image, digest)
}

/// The registry requests of verifying `image` (which must verify), with
/// `hints` or without.
async fn counted_verification(
    registry: &gkm_testenv::Registry,
    (image, digest): &(ImageRef, Digest),
    policy: &Policy,
    hints: Option<&SignatureHints>,
) -> Vec<String> {
    let before = registry.requests().expect("requests").len();
    match hints {
        Some(hints) => verify_with_hints(image, &options(), digest, policy, hints).await,
        None => verify(image, &options(), digest, policy).await,
    }
    .expect("verified");
    let requests = registry.requests().expect("requests").split_off(before);
    assert!(!requests.iter().any(|r| r == "GET /v2/"), "{requests:?}");
    requests
}

/// Build fixture `fixture` into `repo:v1` of `registry`.
async fn push_image_to(
    registry: &gkm_testenv::Registry,
    repo: &str,
    fixture: &str,
) -> (ImageRef, Digest) {
    let image: ImageRef = format!("{}/signatures/{repo}:v1", registry.addr())
        .parse()
        .expect("ref");
    let built = build(
        &fixture_cache(fixture),
        &image,
        &BuildOptions::default(),
        &options(),
    )
    .await
    .expect("build and push the image");
    (image, built.digest)
}

//! The bodies of gkm's fuzz targets (`fuzz/`), also run on stable as
//! property tests and, through [`replay`], over the fuzzers' corpus and
//! regression inputs. Each must return without panicking whatever the input.
//!
//! [`TARGETS`] maps every target of this crate to its body over raw bytes,
//! exactly what libFuzzer hands the target; bodies needing structure decode
//! it with [`arbitrary::Unstructured`], so a corpus file replays the same
//! input on stable as under the fuzzer.

use std::path::{Path, PathBuf};

use arbitrary::Unstructured;
use gkm_core::policy::{
    Authority, Identity, LogKey, Mode, Policy, PublicKey, Signer, SubjectMatch, TrustedRoot,
};

use crate::store::extract::{ExtractPolicy, Mapping, extract_tar};
use gkm_core::digest::Digest;

/// Extract arbitrary bytes as a layer tar into a fresh directory below
/// `scratch` under a small policy, then check nothing escaped: the only
/// thing in `scratch` afterwards is that directory, and it holds no links
/// (links are rejected by default). Returns whether the archive was accepted.
pub fn tar_extraction(data: &[u8], scratch: &Path) -> bool {
    let policy = ExtractPolicy {
        max_entry_size: 1 << 20,
        max_total_size: 4 << 20,
        max_entries: 1_000,
        ratio_grace_bytes: 1 << 20,
        // The verdict may not depend on how full the machine's disk is.
        free_space_reserve: crate::store::disk::FreeSpaceReserve::NONE,
        ..ExtractPolicy::default()
    };
    let dest = scratch.join("dest");
    if std::fs::create_dir(&dest).is_err() {
        return false;
    }
    let accepted = extract_tar(data, &dest, Mapping::Layer, &policy).is_ok();
    assert_only_dest(scratch, &dest);
    let _ = std::fs::remove_dir_all(&dest);
    accepted
}

fn assert_only_dest(scratch: &Path, dest: &Path) {
    let names: Vec<_> = std::fs::read_dir(scratch)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert_eq!(
        names,
        vec![dest.to_path_buf()],
        "extraction wrote outside its directory"
    );
    let mut stack = vec![dest.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let ft = entry
                .file_type()
                .map(|t| (t.is_dir(), t.is_file()))
                .unwrap_or((false, false));
            match ft {
                (true, _) => stack.push(entry.path()),
                (_, true) => {}
                _ => panic!(
                    "extraction created {:?}, which is neither file nor directory",
                    entry.path()
                ),
            }
        }
    }
}

/// Parse arbitrary bytes as `manifest.json`; what parses must round-trip.
pub fn manifest_json(data: &[u8]) {
    if let Ok(m) = gkm_core::cache::CacheManifest::from_json(data) {
        let again = gkm_core::cache::CacheManifest::from_json(&m.to_json());
        assert!(again.is_ok(), "a manifest gkm wrote does not read back");
    }
}

/// Parse an arbitrary string as a summary label; what parses must
/// round-trip.
pub fn summary_label(data: &str) {
    if let Ok(s) = gkm_core::cache::Summary::from_label(data) {
        assert_eq!(
            gkm_core::cache::Summary::from_label(&s.to_label()).ok(),
            Some(s)
        );
    }
}

/// Parse an arbitrary string as an image reference; what parses must
/// print to something that parses to the same reference.
pub fn image_reference(data: &str) {
    if let Ok(r) = data.parse::<crate::ImageRef>() {
        let printed = r.to_string();
        let again = printed.parse::<crate::ImageRef>();
        assert!(again.is_ok(), "{printed:?} (from {data:?}) does not parse");
        if let Ok(again) = again {
            assert_eq!(again.to_string(), printed);
        }
    }
}

/// A fuzz target's body over the raw bytes libFuzzer hands it.
pub type Body = fn(&[u8]);

/// The fuzz targets whose bodies live in this crate, by target name (the
/// binary's name in `fuzz/Cargo.toml`).
pub const TARGETS: &[(&str, Body)] = &[
    ("tar_extract", tar_extract_bytes),
    ("manifest_json", manifest_json),
    ("summary_label", |d| with_str(d, summary_label)),
    ("image_reference", |d| with_str(d, image_reference)),
    ("oci_json", oci_json),
    ("sigstore_bundle", sigstore_bundle),
    ("keys_certificates", keys_certificates),
    ("trusted_root", trusted_root),
    ("cache_scan", cache_scan),
    ("duration", |d| with_str(d, duration)),
    ("erofs_superblock", erofs_superblock),
];

/// Run `body` on `data` when it is UTF-8, as libFuzzer's `&str` targets do.
pub fn with_str(data: &[u8], body: fn(&str)) {
    if let Ok(s) = std::str::from_utf8(data) {
        body(s);
    }
}

/// Run `body` over every file of `<fuzz_dir>/corpus/<target>/` and
/// `<fuzz_dir>/regressions/<target>/` (either may be missing). Returns the
/// files replayed; a file that cannot be read is an error naming it.
pub fn replay(fuzz_dir: &Path, target: &str, body: Body) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for kind in ["corpus", "regressions"] {
        let dir = fuzz_dir.join(kind).join(target);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry?.path();
            if path.is_file() {
                files.push(path);
            }
        }
    }
    files.sort();
    for path in &files {
        let data = std::fs::read(path)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        body(&data);
    }
    Ok(files)
}

/// [`tar_extraction`] in a fresh temporary directory.
pub fn tar_extract_bytes(data: &[u8]) {
    if let Ok(scratch) = tempfile::tempdir() {
        tar_extraction(data, scratch.path());
    }
}

/// Parse arbitrary bytes as an image manifest, an image index (a platform
/// index and a multi-target image's) and an image config, as a registry or
/// layout hands them over, and read the cache labels from the config labels,
/// the manifest annotations and the index descriptors' annotations.
pub fn oci_json(data: &[u8]) {
    if let Ok(m) = crate::image::manifest::Manifest::parse(data) {
        for layer in &m.layers {
            let _ = layer.compression();
        }
        let _ = crate::image::labels::CacheLabels::read(&m.annotations);
        let raw = crate::registry::repo::RawManifest {
            digest: gkm_core::digest::Digest::of(data),
            media_type: crate::image::labels::OCI_MANIFEST.to_string(),
            bytes: data.to_vec(),
        };
        let _ = crate::image::erofs::referrer(&raw, &m.layers);
    }
    let _ = crate::image::manifest::select_from_index(data);
    // The same bytes as a multi-target image's index.
    let raw = crate::registry::repo::RawManifest {
        digest: gkm_core::digest::Digest::of(data),
        media_type: crate::image::labels::OCI_INDEX.to_string(),
        bytes: data.to_vec(),
    };
    if let Ok(Some(multi)) = crate::image::multi::MultiTarget::parse(&raw) {
        let _ = multi.choose(&[], &Default::default());
    }
    if let Ok(labels) = crate::image::manifest::config_labels(data) {
        let _ = crate::image::labels::CacheLabels::read(&labels);
    }
}

/// A fixed ECDSA P-256 public key the signature bodies verify against.
const FUZZ_KEY: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAELBFYwi6T+1cDH5O9PS6VKohzObjI
vGLth2V4ShrYsGm7jIMw78ZaJoWtlUHcUK9OdzoCKH8sm9jqITf2gGBKIQ==
-----END PUBLIC KEY-----
";

/// The image digest the signature bodies check against.
const FUZZ_DIGEST: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

/// A trusted root whose certificate authority is `ca` (DER) and whose
/// transparency and CT logs use `log_key` (DER).
fn fuzz_root(ca: Vec<u8>, log_key: Vec<u8>) -> TrustedRoot {
    let log = LogKey {
        base_url: "https://log.invalid".into(),
        log_id: String::new(),
        key: log_key,
        valid_for: Default::default(),
    };
    TrustedRoot {
        certificate_authorities: vec![Authority {
            uri: "https://ca.invalid".into(),
            chain: vec![ca],
            valid_for: Default::default(),
        }],
        tlogs: vec![log.clone()],
        ctlogs: vec![log],
        timestamp_authorities: Vec::new(),
    }
}

/// Parse arbitrary bytes as a sigstore bundle (DSSE envelope or message
/// signature, certificate chain, tlog entries) and check the signature it
/// carries against a key policy and a keyless policy whose trusted root
/// trusts the bundle's own certificate, so the certificate, SCT and
/// transparency-log checks all run on the input.
pub fn sigstore_bundle(data: &[u8]) {
    let Ok(bundle) = serde_json::from_slice::<crate::verify::bundle::Bundle>(data) else {
        return;
    };
    let Ok(digest) = FUZZ_DIGEST.parse::<Digest>() else {
        return;
    };
    let Ok(candidate) = crate::verify::bundle::candidate(&bundle, &digest, data.to_vec()) else {
        return;
    };
    let Ok(key) = PublicKey::from_pem(FUZZ_KEY) else {
        return;
    };
    let now = 1_700_000_000;
    let root = fuzz_root(
        candidate.certificate.clone().unwrap_or_default(),
        key.der().to_vec(),
    );
    let keyless = SubjectMatch::regexp(".*")
        .and_then(|s| Identity::new("https://issuer.invalid", s))
        .map(Signer::Keyless);
    let policies = [
        Policy::keys(vec![key.clone()]),
        keyless
            .and_then(|k| Policy::new(Mode::Enforce, vec![k, Signer::Key(key)], Some(root), true)),
    ];
    for policy in policies.iter().flatten() {
        let _ = crate::verify::check(&candidate, &digest, policy, now);
    }
}

/// Read arbitrary input as the keys and certificates gkm accepts: PEM and
/// DER public keys, PKCS#8 and cosign-encrypted private keys, and a signing
/// certificate checked against a trusted root whose CA, SCT list and log key
/// also come from the input.
pub fn keys_certificates(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let (Ok(ca), Ok(log_key), Ok(sct)) = (
        u.arbitrary::<Vec<u8>>(),
        u.arbitrary::<Vec<u8>>(),
        u.arbitrary::<Vec<u8>>(),
    ) else {
        return;
    };
    let leaf = u.take_rest();
    let text = String::from_utf8_lossy(leaf);
    if let Ok(key) = PublicKey::from_pem(&text) {
        let again = PublicKey::from_pem(&key.to_pem());
        assert_eq!(
            again.ok().as_ref(),
            Some(&key),
            "a key gkm wrote does not read back"
        );
    }
    let _ = PublicKey::from_der(leaf.to_vec());
    let _ = crate::sign::SigningKey::from_pem(&text, b"");
    let _ = crate::sign::SigningKey::from_pkcs8(leaf);
    let root = fuzz_root(ca, log_key);
    let _ = crate::verify::certificate::check_leaf(leaf, &root, 1_700_000_000);
    let _ = crate::verify::sct::check(
        Some(&sct),
        leaf,
        &root.certificate_authorities[0].chain[0],
        &root,
    );
}

/// Parse arbitrary bytes as a sigstore `trusted_root.json`.
pub fn trusted_root(data: &[u8]) {
    let _ = TrustedRoot::from_json(data);
}

/// Names a cache tree is made of: the directories and files the Triton and
/// vLLM scanners look for, so structured input reaches them.
const CACHE_NAMES: &[&str] = &[
    "torch_compile_cache",
    "torch_aot_compile",
    "aot_compile",
    "rank_0_0",
    "rank_0",
    "rank_1_0_0",
    "backbone",
    "inductor_cache",
    "triton_cache",
    "triton",
    "io.triton.cache",
    "io.vllm.cache",
    "5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ",
    "d4ec7c2a7d",
    "model",
    "add_kernel.json",
    "__grp__add_kernel.json",
    "add_kernel.ptx",
    "add_kernel.cubin",
    "add_kernel.hsaco",
    "add_kernel.amdgcn",
    "add_kernel.spv",
    "cache_key_factors.json",
    "vllm_compile_cache.py",
    "computation_graph.py",
    "artifact_0",
    "manifest.json",
    "__triton_launcher.so",
];

/// Build a small directory tree from structured input (paths made of the
/// names the scanners look for, or arbitrary ones, with arbitrary contents)
/// and scan it as a kernel cache. What scans must round-trip through
/// `manifest.json` and its summary through the image label.
pub fn cache_scan(data: &[u8]) {
    let Ok(scratch) = tempfile::tempdir() else {
        return;
    };
    let mut u = Unstructured::new(data);
    let files = u.int_in_range(0..=12u8).unwrap_or(0);
    for _ in 0..files {
        let depth = u.int_in_range(1..=5u8).unwrap_or(1);
        let mut path = scratch.path().to_path_buf();
        for _ in 0..depth {
            let name = if u.ratio(1, 8).unwrap_or(false) {
                u.arbitrary::<String>()
                    .unwrap_or_default()
                    .replace(['/', '\0'], "_")
            } else {
                u.choose(CACHE_NAMES)
                    .map(|s| s.to_string())
                    .unwrap_or_default()
            };
            if name.is_empty() || name == "." || name == ".." {
                continue;
            }
            path.push(name);
        }
        let contents = u.arbitrary::<Vec<u8>>().unwrap_or_default();
        if let Some(parent) = path.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        let _ = std::fs::write(&path, contents);
    }
    if let Ok(manifest) = gkm_core::cache::scan(scratch.path()) {
        let again = gkm_core::cache::CacheManifest::from_json(&manifest.to_json());
        assert!(again.is_ok(), "a scanned manifest does not read back");
        summary_label(&manifest.summary().to_label());
    }
}

/// Parse a string as a duration (`gkm_bin_support::duration`,
/// `spec.resolveInterval`); what parses prints, as seconds and
/// milliseconds, to the same duration.
pub fn duration(text: &str) {
    if let Some(d) = gkm_core::duration::parse_duration(text) {
        let printed = format!("{}s{}ms", d.as_secs(), d.subsec_millis());
        assert_eq!(
            gkm_core::duration::parse_duration(&printed),
            Some(d),
            "{text:?} parsed to {d:?}, which prints as {printed:?}"
        );
    }
}

/// Check arbitrary bytes as the first block of an EROFS blob (an 8-byte
/// blob size, then the block, zero-padded to its 4096 bytes), as given and
/// again with its superblock checksum made right, so every later check is
/// reached too. Never panics; what is accepted is what the checks promise:
/// the magic, 4096-byte blocks filling the blob, only accepted features.
pub fn erofs_superblock(data: &[u8]) {
    use crate::image::erofs::superblock::{
        ACCEPTED_INCOMPAT, HEAD_LEN, MAGIC, SUPERBLOCK_OFFSET, check, checksum,
    };
    let mut u = Unstructured::new(data);
    let size = u.arbitrary::<u64>().unwrap_or_default();
    let rest = u.take_rest();
    let _ = check(rest, size);
    let mut head = rest.to_vec();
    head.resize(HEAD_LEN.max(head.len()), 0);
    let mut resealed = head.clone();
    if let Some(sum) = checksum(&resealed) {
        resealed[SUPERBLOCK_OFFSET + 4..SUPERBLOCK_OFFSET + 8].copy_from_slice(&sum.to_le_bytes());
    }
    for head in [&head, &resealed] {
        if let Ok(sb) = check(head, size) {
            let magic = &head[SUPERBLOCK_OFFSET..SUPERBLOCK_OFFSET + 4];
            assert_eq!(magic, MAGIC.to_le_bytes(), "accepted without the magic");
            assert_eq!(
                u64::from(sb.blocks) << 12,
                size,
                "blocks do not fill the blob"
            );
            assert_eq!(sb.feature_incompat & !ACCEPTED_INCOMPAT, 0);
        }
    }
}

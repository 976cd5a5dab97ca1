//! Disk limits: a layer that decompresses to far more than its size label
//! says is stopped at the caller's byte budget, and a filesystem running out
//! of space mid-extraction is stopped at the free-space reserve, before
//! ENOSPC. Either way nothing is kept: no staging, no destination, no store
//! entry.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

use gkm_oci::labels::{OCI_CONFIG, OCI_MANIFEST};
use gkm_oci::{
    Compression, Error, ExtractPolicy, FreeSpaceReserve, Image, ImageRef, Layout, RegistryOptions,
    Repo, SpaceLimit, Store, UnpackOptions, extract_to_dir,
};

const MIB: u64 = 1 << 20;

/// The layer's `io.triton.manifest/manifest.json`.
const MANIFEST: &[u8] = br#"{"kind":"triton","entries":[]}"#;

/// A zstd layer of `files` files of `file_size` zero bytes each under
/// `io.triton.cache/`, plus a manifest: a few kilobytes compressed.
fn zeros_layer(files: u64, file_size: u64) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut dir = tar::Header::new_gnu();
    dir.set_entry_type(tar::EntryType::Directory);
    dir.set_mode(0o755);
    dir.set_size(0);
    for name in [
        "io.triton.cache/",
        "io.triton.cache/k/",
        "io.triton.manifest/",
    ] {
        tar.append_data(&mut dir.clone(), name, std::io::empty())
            .expect("dir");
    }
    for i in 0..files {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(file_size);
        tar.append_data(
            &mut h,
            format!("io.triton.cache/k/zeros-{i}.bin"),
            std::io::repeat(0).take(file_size),
        )
        .expect("file");
    }
    let mut h = tar::Header::new_gnu();
    h.set_mode(0o644);
    h.set_size(MANIFEST.len() as u64);
    tar.append_data(&mut h, "io.triton.manifest/manifest.json", MANIFEST)
        .expect("manifest");
    let tar = tar.into_inner().expect("tar");
    let mut enc = zstd::Encoder::new(Vec::new(), 19).expect("zstd");
    enc.write_all(&tar).expect("zstd");
    enc.finish().expect("zstd")
}

/// Write `blob` as the one zstd layer of an image in a layout under `dir`,
/// its config claiming `label_size` bytes of cache; returns its reference.
fn image_of(dir: &Path, blob: &[u8], label_size: u64) -> ImageRef {
    let layout = Layout::create(dir).expect("layout");
    let layer = layout.write_blob(blob).expect("blob");
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Labels": {
            "cache.triton.image/summary": "{\"targets\":[]}",
            "cache.triton.image/cache-size-bytes": label_size.to_string(),
        }},
        "rootfs": {"type": "layers", "diff_ids": []},
    });
    let config = serde_json::to_vec(&config).expect("json");
    let config_digest = layout.write_blob(&config).expect("config");
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": config_digest.to_string(), "size": config.len()},
        "layers": [{"mediaType": Compression::Zstd.media_type(), "digest": layer.to_string(), "size": blob.len()}],
    });
    let bytes = serde_json::to_vec(&manifest).expect("json");
    let digest = layout.write_blob(&bytes).expect("manifest");
    let desc = oci_spec::image::Descriptor::new(
        oci_spec::image::MediaType::ImageManifest,
        bytes.len() as u64,
        digest
            .as_str()
            .parse::<oci_spec::image::Digest>()
            .expect("digest"),
    );
    layout.tag("zeros", &desc).expect("tag");
    format!("oci:{}:zeros", dir.display()).parse().expect("ref")
}

fn left_in(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// Asserts `err` stopped at the default reserve mid-extraction, with the
/// reserve still free then.
fn assert_stopped_at_the_reserve(err: &Error) {
    assert_storage_full(err, "free-space reserve");
    let exceeded = err.space_exceeded().expect("a disk limit");
    let SpaceLimit::Reserve {
        reserve,
        reserve_bytes,
        free,
    } = exceeded.limit
    else {
        panic!("not the reserve: {exceeded:?}");
    };
    assert_eq!(
        reserve,
        FreeSpaceReserve::KUBELET_EVICTION_PLUS_MARGIN,
        "the default reserve"
    );
    assert!(
        !exceeded.estimated && exceeded.written > 0,
        "refused before writing: {err}"
    );
    assert!(
        free >= reserve_bytes,
        "less than the reserve was left: {err}"
    );
}

/// Asserts `err` is a storage-full I/O error whose message says `want`, and
/// not the kernel's own ENOSPC.
fn assert_storage_full(err: &Error, want: &str) {
    let message = err.to_string();
    match err {
        Error::Io { source, .. } => assert_eq!(
            source.kind(),
            std::io::ErrorKind::StorageFull,
            "not a storage-full error: {message}"
        ),
        other => panic!("not an I/O error: {other}"),
    }
    assert!(
        !message.contains("No space left on device"),
        "the filesystem filled up before extraction stopped: {message}"
    );
    assert!(message.contains(want), "{message:?} does not say {want:?}");
}

/// `policy` without its compression-ratio limit. The default 200x lets a
/// 1 GiB layer become 200 GiB, so the disk limits must hold whatever the
/// ratio; the small layers here stand in for such a layer.
fn lifted_ratio(policy: ExtractPolicy) -> ExtractPolicy {
    ExtractPolicy {
        max_compression_ratio: u64::MAX,
        ..policy
    }
}

/// A tmpfs mounted for the duration of a test, unmounted on drop (also when
/// the test fails).
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (as `mount -o size=` reads it) at `at`;
    /// `None` when this process may not mount.
    fn mount(at: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(at).expect("mount point");
        let data = std::ffi::CString::new(format!("size={size},mode=0755")).expect("options");
        match rustix::mount::mount(
            "tmpfs",
            at,
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            data.as_c_str(),
        ) {
            Ok(()) => Some(Tmpfs(at.to_path_buf())),
            Err(rustix::io::Errno::PERM) => None,
            Err(e) => panic!("mounting a tmpfs at {}: {e}", at.display()),
        }
    }

    fn free(&self) -> u64 {
        let st = rustix::fs::statvfs(&self.0).expect("statvfs");
        st.f_bavail * st.f_frsize
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        if let Err(e) = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH) {
            eprintln!("unmounting {}: {e}", self.0.display());
        }
    }
}

/// A 32 MiB tmpfs, a 48 MiB tree whose label claims 4 KiB: a node's
/// reserve (12% of the filesystem, what the agent keeps free) stops the extraction while the tmpfs
/// still has room, and leaves it empty; so does a reserve in bytes.
#[tokio::test(flavor = "multi_thread")]
async fn running_out_of_space_mid_extraction_stops_at_the_reserve() {
    let work = tempfile::tempdir().expect("tempdir");
    let Some(tmpfs) = Tmpfs::mount(&work.path().join("fs"), "32m") else {
        eprintln!(
            "SKIPPED running_out_of_space_mid_extraction_stops_at_the_reserve: \
             mounting a tmpfs needs root (CAP_SYS_ADMIN)"
        );
        return;
    };
    let empty = tmpfs.free();
    let image = image_of(&work.path().join("layout"), &zeros_layer(12, 4 * MIB), 4096);
    let repo = Repo::open(&image, &RegistryOptions::default()).expect("repo");
    let img = Image::fetch(&repo).await.expect("fetch");
    let policy = ExtractPolicy {
        free_space_reserve: FreeSpaceReserve::KUBELET_EVICTION_PLUS_MARGIN,
        ..lifted_ratio(ExtractPolicy::default())
    };

    // Into a directory on the tmpfs.
    let out = tmpfs.0.join("cache");
    let options = UnpackOptions {
        policy: policy.clone(),
        no_sync: true,
        progress: None,
    };
    let err = extract_to_dir(&repo, &img, &out, &options)
        .await
        .expect_err("a 48 MiB tree cannot fit a 32 MiB filesystem");
    assert_stopped_at_the_reserve(&err);
    assert!(!out.exists(), "{} exists", out.display());
    assert_eq!(
        left_in(&tmpfs.0),
        Vec::<PathBuf>::new(),
        "left on the tmpfs"
    );
    assert_eq!(tmpfs.free(), empty, "space not given back");

    // Into the tmpfs itself, an empty mount point (as a fill job does).
    let err = extract_to_dir(&repo, &img, &tmpfs.0, &options)
        .await
        .expect_err("a 48 MiB tree cannot fit a 32 MiB filesystem");
    assert_stopped_at_the_reserve(&err);
    assert_eq!(
        left_in(&tmpfs.0),
        Vec::<PathBuf>::new(),
        "left on the tmpfs"
    );
    assert_eq!(tmpfs.free(), empty, "space not given back");

    // Into a node store on the tmpfs.
    let store = Store::open(tmpfs.0.join("store")).expect("store");
    let err = store
        .ensure_image(&repo, &img, &policy, None)
        .await
        .expect_err("a 48 MiB tree cannot fit a 32 MiB filesystem");
    assert_stopped_at_the_reserve(&err);
    for dir in ["staging", "sha256"] {
        let left = left_in(&tmpfs.0.join("store").join(dir));
        assert!(left.is_empty(), "store/{dir} holds {left:?}");
    }
    assert!(
        store.get(&img.digest).is_none(),
        "the store holds the image"
    );

    // A reserve in bytes: 8 MiB.
    let eight = ExtractPolicy {
        free_space_reserve: FreeSpaceReserve::bytes(8 * MIB),
        ..policy
    };
    let err = store
        .ensure_image(&repo, &img, &eight, None)
        .await
        .expect_err("a 48 MiB tree cannot fit a 32 MiB filesystem");
    assert_storage_full(&err, "reserve of 8388608 bytes (8MiB of the filesystem)");
    let exceeded = err.space_exceeded().expect("a disk limit");
    assert!(
        matches!(exceeded.limit, SpaceLimit::Reserve { free, .. } if free >= 8 * MIB),
        "{exceeded:?}"
    );
    let left = left_in(&tmpfs.0.join("store/staging"));
    assert!(left.is_empty(), "store/staging holds {left:?}");
    assert_eq!(tmpfs.free(), empty, "space not given back");
}

/// 64 MiB of zeros in a few kilobytes of zstd, labelled 4 KiB, with a
/// 16 MiB budget: the label passes the check before extraction, the count
/// while writing stops it at the budget, and nothing is kept.
#[tokio::test(flavor = "multi_thread")]
async fn a_high_ratio_layer_with_a_lying_label_stops_at_the_byte_budget() {
    let work = tempfile::tempdir().expect("tempdir");
    let blob = zeros_layer(8, 8 * MIB);
    assert!(blob.len() < 64 << 10, "the layer is {} bytes", blob.len());
    let image = image_of(&work.path().join("layout"), &blob, 4096);
    let repo = Repo::open(&image, &RegistryOptions::default()).expect("repo");
    let img = Image::fetch(&repo).await.expect("fetch");
    let budget = 16 * MIB;
    let policy = ExtractPolicy {
        byte_budget: Some(budget),
        ..lifted_ratio(ExtractPolicy::default())
    };

    // Into a directory.
    let out = work.path().join("out/cache");
    let options = UnpackOptions {
        policy: policy.clone(),
        no_sync: true,
        progress: None,
    };
    let err = extract_to_dir(&repo, &img, &out, &options)
        .await
        .expect_err("a 64 MiB tree is over a 16 MiB budget");
    assert_storage_full(&err, &format!("byte budget of {budget} bytes"));
    let exceeded = err.space_exceeded().expect("a disk limit");
    assert!(
        matches!(exceeded.limit, SpaceLimit::Budget { budget: b } if b == budget),
        "{exceeded:?}"
    );
    assert!(
        !exceeded.estimated && exceeded.written > 0 && exceeded.written <= budget,
        "stopped after {} bytes",
        exceeded.written
    );
    assert!(!out.exists(), "{} exists", out.display());
    let left = left_in(&work.path().join("out"));
    assert!(left.is_empty(), "the output's parent holds {left:?}");

    // Into a node store.
    let store = Store::open(work.path().join("store")).expect("store");
    let err = store
        .ensure_image(&repo, &img, &policy, None)
        .await
        .expect_err("a 64 MiB tree is over a 16 MiB budget");
    assert_storage_full(&err, &format!("byte budget of {budget} bytes"));
    for dir in ["staging", "sha256"] {
        let left = left_in(&work.path().join("store").join(dir));
        assert!(left.is_empty(), "store/{dir} holds {left:?}");
    }
    assert!(
        store.get(&img.digest).is_none(),
        "the store holds the image"
    );

    // The same image within a budget it fits is extracted whole.
    let roomy = ExtractPolicy {
        byte_budget: Some(65 * MIB),
        ..policy
    };
    let stored = store
        .ensure_image(&repo, &img, &roomy, None)
        .await
        .expect("64 MiB fits 65 MiB");
    let stats = stored.extracted.expect("extracted");
    assert_eq!(stats.bytes, 64 * MIB + MANIFEST.len() as u64);
    // What the agent sums for its budgets counts the stored tree as the
    // extraction counted it: 3 directories, 8 files, the manifest, and the
    // store's seal.
    assert_eq!(stats.disk_bytes, 64 * MIB + 5 * 4096);
    assert_eq!(
        store.usage(&img.digest).expect("usage"),
        Some(stats.disk_bytes)
    );
}

/// A size label larger than the budget is believed: refused before a byte
/// is written. (A label can only raise the estimate, never lower it.)
#[tokio::test(flavor = "multi_thread")]
async fn a_size_label_over_the_budget_is_refused_before_writing() {
    let work = tempfile::tempdir().expect("tempdir");
    let image = image_of(&work.path().join("layout"), &zeros_layer(1, 4096), 1 << 30);
    let repo = Repo::open(&image, &RegistryOptions::default()).expect("repo");
    let img = Image::fetch(&repo).await.expect("fetch");
    let policy = ExtractPolicy {
        byte_budget: Some(16 * MIB),
        ..ExtractPolicy::default()
    };
    let store = Store::open(work.path().join("store")).expect("store");
    let err = store
        .ensure_image(&repo, &img, &policy, None)
        .await
        .expect_err("the label says 1 GiB");
    assert_storage_full(&err, "byte budget of 16777216 bytes");
    let exceeded = err.space_exceeded().expect("a disk limit");
    assert!(exceeded.estimated && exceeded.written == 0, "{exceeded:?}");
    assert!(
        err.to_string().contains("refused before extracting"),
        "{err}"
    );
    let left = left_in(&work.path().join("store/staging"));
    assert!(left.is_empty(), "store/staging holds {left:?}");
}

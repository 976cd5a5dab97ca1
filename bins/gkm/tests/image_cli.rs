//! `gkm build`, `push`, `pull`, `inspect`, `check` and `extract` as a user
//! runs them: on OCI layouts, on a real registry, and on images laid out as
//! GKM/MCV builds them.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

mod support;
use gkm_testenv::fixture_cache;
use support::{json_snapshot, redact};

const FIXTURES: [&str; 3] = [
    "triton-vector-add-cuda-sm75",
    "triton-vector-add-rocm-gfx90a",
    "vllm-torch-compile-inductor",
];

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn gkm(args: &[&str], env: &[(&str, &Path)], stdin: Option<&str>) -> Out {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gkm"));
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // No credentials from the machine running the tests.
    cmd.env("DOCKER_CONFIG", "/nonexistent-gkm-test-docker-config");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("run gkm");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("write stdin");
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("wait for gkm");
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn ok(args: &[&str]) -> String {
    let out = gkm(args, &[], None);
    assert_eq!(out.code, 0, "gkm {args:?} failed:\n{}", out.stderr);
    out.stdout
}

/// Every path below `root` with its bytes (None for directories) and exec bit.
fn tree(root: &Path) -> BTreeMap<String, (Option<Vec<u8>>, bool)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir") {
            let path = entry.expect("entry").path();
            let rel = path
                .strip_prefix(root)
                .expect("below root")
                .to_string_lossy()
                .into_owned();
            let meta = std::fs::symlink_metadata(&path).expect("metadata");
            assert!(
                meta.is_dir() || meta.is_file(),
                "{} is neither file nor directory",
                path.display()
            );
            if meta.is_dir() {
                out.insert(rel, (None, false));
                stack.push(path);
            } else {
                let exec = meta.permissions().mode() & 0o111 != 0;
                out.insert(rel, (Some(std::fs::read(&path).expect("read")), exec));
            }
        }
    }
    out
}

fn assert_same_tree(expected: &Path, actual: &Path) {
    let (a, b) = (tree(expected), tree(actual));
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "paths differ"
    );
    assert!(
        a == b,
        "{} and {} differ in content",
        expected.display(),
        actual.display()
    );
}

/// A simulated inventory of one `profile` GPU under `dir`, in a directory of
/// a fixed name: simulated UUIDs derive from the file's directory and name,
/// so they read the same in every run.
fn write_gpus(dir: &Path, profile: &str) -> PathBuf {
    let dir = dir.join("inventories");
    std::fs::create_dir_all(&dir).expect("inventory directory");
    let path = dir.join(format!("gpus-{profile}.yaml"));
    std::fs::write(&path, format!("gpus:\n  - profile: {profile}\n")).expect("write inventory");
    path
}

#[test]
fn layout_round_trip_and_inspect() {
    let work = tempfile::tempdir().expect("tempdir");
    let w = work.path();
    for name in FIXTURES {
        let src = fixture_cache(name);
        let built = format!("oci:{}/built:{name}", w.display());
        let digest = ok(&["build", &src.display().to_string(), "-t", &built]);
        let digest = digest.trim();
        assert!(
            digest.starts_with("sha256:") && digest.len() == 71,
            "{digest}"
        );

        let text = ok(&["inspect", &built]);
        insta::assert_snapshot!(format!("inspect-{name}"), redact(&text, w));
        let json: serde_json::Value =
            serde_json::from_str(&ok(&["inspect", &built, "--json"])).expect("json");
        assert_eq!(json["digest"], digest);

        let pulled = format!("oci:{}/pulled:{name}", w.display());
        assert_eq!(ok(&["pull", &built, &pulled]).trim(), digest);
        let out = w.join(format!("out-{name}"));
        assert_eq!(
            ok(&["extract", &pulled, "-o", &out.display().to_string()]).trim(),
            digest
        );
        assert_same_tree(&src, &out);
    }
}

#[test]
fn registry_round_trip() {
    let registry = gkm_testenv::Registry::shared()
        .expect("start docker-registry (apt-get install -y docker-registry)");
    let work = tempfile::tempdir().expect("tempdir");
    let w = work.path();
    for name in FIXTURES {
        let src = fixture_cache(name);
        let layout = format!("oci:{}/built:{name}", w.display());
        let digest = ok(&[
            "build",
            &src.display().to_string(),
            "-t",
            &layout,
            "--compression",
            "gzip",
        ]);
        let remote = format!("{}/cli/{name}:v1", registry.addr());
        assert_eq!(ok(&["push", &layout, &remote, "--insecure"]), digest);
        let json: serde_json::Value =
            serde_json::from_str(&ok(&["inspect", &remote, "--json", "--insecure"])).expect("json");
        assert_eq!(json["digest"], digest.trim());
        let targets: Vec<&str> = json["targets"]
            .as_array()
            .expect("targets")
            .iter()
            .filter_map(|t| t.as_str())
            .collect();
        match name {
            "triton-vector-add-cuda-sm75" => {
                assert!(targets.contains(&"cuda/75/32"), "{targets:?}")
            }
            "triton-vector-add-rocm-gfx90a" => {
                assert!(targets.contains(&"hip/gfx90a/64"), "{targets:?}")
            }
            _ => assert!(!targets.is_empty()),
        }
        let pulled = format!("oci:{}/pulled:{name}", w.display());
        assert_eq!(ok(&["pull", &remote, &pulled, "--insecure"]), digest);
        let out = w.join(format!("out-{name}"));
        assert_eq!(
            ok(&[
                "extract",
                &remote,
                "-o",
                &out.display().to_string(),
                "--insecure"
            ]),
            digest
        );
        assert_same_tree(&src, &out);

        // Into the node store; a second pull of the same digest does no work.
        let store = w.join("store").display().to_string();
        let pull_into_store = || -> serde_json::Value {
            let args = ["pull", &remote, "--store", &store, "--insecure", "--json"];
            serde_json::from_str(&ok(&args)).expect("json")
        };
        let stored = pull_into_store();
        assert_eq!(stored["digest"], digest.trim());
        let path = PathBuf::from(stored["path"].as_str().expect("path"));
        let cache_dir = if name.starts_with("vllm") {
            "io.vllm.cache"
        } else {
            "io.triton.cache"
        };
        assert_same_tree(&src, &path.join(cache_dir));
        let again = pull_into_store();
        assert_eq!(again["path"], stored["path"]);
        assert_eq!(again["extracted"], false, "stored already: {again}");
    }
    // A build straight to the registry gives the same digest as through a layout.
    let name = FIXTURES[0];
    let remote = format!("{}/cli/direct:v1", registry.addr());
    let direct = ok(&[
        "build",
        &fixture_cache(name).display().to_string(),
        "-t",
        &remote,
        "--insecure",
    ]);
    let layout = format!("oci:{}/again:{name}", w.display());
    assert_eq!(
        direct,
        ok(&[
            "build",
            &fixture_cache(name).display().to_string(),
            "-t",
            &layout,
            "--title",
            "direct"
        ])
    );
}

/// Writes, from a fixture, an image exactly as MCV lays it out: Docker
/// schema2 manifest and config, one gzip layer with `io.triton.cache/` and
/// `io.triton.manifest/manifest.json` written with real mtimes, owners and
/// `./` prefixes, and `cache.triton.image/*` labels.
fn write_mcv_image(fixture: &Path, layout_dir: &Path) -> String {
    let mut tar = tar::Builder::new(Vec::new());
    let header = |kind: tar::EntryType, mode: u32, size: u64| {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(size);
        h.set_mtime(1_748_444_895);
        h.set_uid(1000);
        h.set_gid(1000);
        h.set_username("builder").expect("uname");
        h.set_groupname("builder").expect("gname");
        h
    };
    tar.append_data(
        &mut header(tar::EntryType::Directory, 0o775, 0),
        "./io.triton.cache/",
        std::io::empty(),
    )
    .expect("dir");
    let mut hash = String::new();
    let mut dummy_key = String::new();
    let mut size = 0u64;
    for (rel, (bytes, exec)) in tree(fixture) {
        let name = format!("./io.triton.cache/{rel}");
        match bytes {
            None => tar.append_data(
                &mut header(tar::EntryType::Directory, 0o775, 0),
                format!("{name}/"),
                std::io::empty(),
            ),
            Some(b) => {
                if rel.ends_with("/add_kernel.json") {
                    let meta: serde_json::Value = serde_json::from_slice(&b).expect("kernel json");
                    hash = meta["hash"].as_str().expect("hash").to_string();
                    dummy_key = rel.split('/').next().expect("key").to_string();
                }
                size += b.len() as u64;
                let mode = if exec { 0o775 } else { 0o664 };
                tar.append_data(
                    &mut header(tar::EntryType::Regular, mode, b.len() as u64),
                    &name,
                    b.as_slice(),
                )
            }
        }
        .expect("append");
    }
    let manifest = serde_json::json!({"triton": [{
        "hash": hash, "dummy_key": dummy_key, "ptx_version": null, "num_stages": 3, "num_warps": 4,
        "debug": false, "backend": "cuda", "arch": 75, "warp_size": 32,
    }]});
    let manifest = serde_json::to_vec(&manifest).expect("manifest json");
    tar.append_data(
        &mut header(tar::EntryType::Directory, 0o775, 0),
        "./io.triton.manifest/",
        std::io::empty(),
    )
    .expect("dir");
    tar.append_data(
        &mut header(tar::EntryType::Regular, 0o664, manifest.len() as u64),
        "./io.triton.manifest/manifest.json",
        manifest.as_slice(),
    )
    .expect("manifest");
    let plain = tar.into_inner().expect("tar");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&plain).expect("gzip");
    let layer = gz.finish().expect("gzip");

    let layout = gkm_oci::Layout::create(layout_dir).expect("layout");
    let layer_digest = layout.write_blob(&layer).expect("layer");
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "created": "2025-05-28T15:08:15.773233031Z",
        "config": {"Labels": {
            "cache.triton.image/cache-size-bytes": size.to_string(),
            "cache.triton.image/entry-count": "1",
            "cache.triton.image/summary": r#"{"variant":"multi","entry_count":1,"targets":[{"backend":"cuda","arch":"75","warp_size":32}]}"#,
            "cache.triton.image/variant": "multi",
        }},
        "rootfs": {"type": "layers", "diff_ids": [gkm_oci::Digest::of(&plain).to_string()]},
    });
    let config = serde_json::to_vec(&config).expect("config");
    let config_digest = layout.write_blob(&config).expect("config blob");
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": config.len(), "digest": config_digest.to_string()},
        "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": layer.len(), "digest": layer_digest.to_string()}],
    });
    let bytes = serde_json::to_vec_pretty(&manifest).expect("manifest");
    let digest = layout.write_blob(&bytes).expect("manifest blob");
    let desc = oci_spec::image::Descriptor::new(
        oci_spec::image::MediaType::Other(
            "application/vnd.docker.distribution.manifest.v2+json".into(),
        ),
        bytes.len() as u64,
        digest
            .as_str()
            .parse::<oci_spec::image::Digest>()
            .expect("digest"),
    );
    layout.tag("mcv", &desc).expect("tag");
    digest.to_string()
}

/// `gkm build --erofs`: the image carries each layer's EROFS twin, which
/// `gkm inspect` lists and `build --json` prints; `gkm extract` still gives
/// the files; without a mkfs.erofs the build fails naming how to install it.
#[test]
fn an_erofs_twin_is_built_listed_and_the_files_still_extract() {
    let mkfs = gkm_testenv::find_binary(gkm_testenv::Component::MkfsErofs)
        .unwrap_or_else(|e| panic!("{e:#}"));
    let work = tempfile::tempdir().expect("tempdir");
    let w = work.path();
    let name = FIXTURES[0];
    let src = fixture_cache(name).display().to_string();
    let built = format!("oci:{}/built:{name}", w.display());
    let run = gkm(
        &["build", &src, "-t", &built, "--erofs", "--json"],
        &[("GKM_MKFS_EROFS", mkfs.as_path())],
        None,
    );
    assert_eq!(run.code, 0, "gkm build --erofs:\n{}", run.stderr);
    let json: serde_json::Value = serde_json::from_str(&run.stdout).expect("json");
    let twin = json["erofs"]["digest"]
        .as_str()
        .expect("an erofs digest")
        .to_string();
    assert_eq!(json["erofs"]["mediaType"], "application/vnd.erofs");
    assert_eq!(json["erofs"]["compression"], "lz4hc");

    let text = ok(&["inspect", &built]);
    let row = text
        .lines()
        .find(|l| l.starts_with(&twin))
        .unwrap_or_else(|| panic!("no row for {twin}:\n{text}"));
    assert!(text.contains("EROFS LAYER"), "{text}");
    assert!(row.contains("lz4hc"), "{row}");
    let inspected: serde_json::Value =
        serde_json::from_str(&ok(&["inspect", &built, "--json"])).expect("json");
    assert_eq!(inspected["layers"][0]["erofs"]["digest"], twin);
    assert_eq!(
        inspected["layers"][0]["erofs"]["size"],
        json["erofs"]["size"]
    );

    let out = w.join("out");
    ok(&["extract", &built, "-o", &out.display().to_string()]);
    assert_same_tree(&fixture_cache(name), &out);

    let missing = w.join("no-mkfs.erofs");
    let run = gkm(
        &[
            "build",
            &src,
            "-t",
            &format!("oci:{}/none:v1", w.display()),
            "--erofs",
        ],
        &[("GKM_MKFS_EROFS", missing.as_path())],
        None,
    );
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("no-mkfs.erofs") && run.stderr.contains("apt-get install erofs-utils"),
        "{}",
        run.stderr
    );
}

#[test]
fn reads_images_built_by_mcv() {
    let registry = gkm_testenv::Registry::shared()
        .expect("start docker-registry (apt-get install -y docker-registry)");
    let work = tempfile::tempdir().expect("tempdir");
    let w = work.path();
    let fixture = fixture_cache("triton-vector-add-cuda-sm75");
    let digest = write_mcv_image(&fixture, &w.join("mcv"));
    let layout = format!("oci:{}/mcv:mcv", w.display());
    let remote = format!("{}/mcv/vector-add-cache:cuda", registry.addr());
    assert_eq!(ok(&["push", &layout, &remote, "--insecure"]).trim(), digest);

    for image in [layout.as_str(), remote.as_str()] {
        let insecure = ["--insecure"];
        let flags: &[&str] = if image == remote { &insecure } else { &[] };
        let run = |args: &[&str]| gkm(&[args, flags].concat(), &[], None);

        let out = run(&["inspect", image]);
        assert_eq!(out.code, 0, "{}", out.stderr);
        insta::assert_snapshot!(
            "inspect-mcv",
            redact(&out.stdout, w).replace(&remote, "[REMOTE]").replace(
                &layout.replace(&w.display().to_string(), "[TMP]"),
                "[REMOTE]"
            )
        );

        let t4 = write_gpus(w, "T4");
        let out = run(&["check", image, "--gpus", &t4.display().to_string()]);
        assert_eq!(
            out.code, 0,
            "a T4 (sm_75) runs a cuda/75/32 cache:\n{}{}",
            out.stdout, out.stderr
        );
        assert!(out.stdout.ends_with("compatible\n"), "{}", out.stdout);
        let mi300 = write_gpus(w, "MI300X");
        let out = run(&["check", image, "--gpus", &mi300.display().to_string()]);
        assert_eq!(
            out.code, 3,
            "an MI300X does not run CUDA kernels:\n{}{}",
            out.stdout, out.stderr
        );
        assert!(out.stdout.contains("incompatible"), "{}", out.stdout);

        let dest = w.join(format!(
            "out-{}",
            if image == remote { "remote" } else { "layout" }
        ));
        let out = run(&["extract", image, "-o", &dest.display().to_string()]);
        assert_eq!(out.code, 0, "{}", out.stderr);
        assert_eq!(out.stdout.trim(), digest);
        assert_same_tree(&fixture, &dest);
    }
}

#[test]
fn check_a_directory() {
    let work = tempfile::tempdir().expect("tempdir");
    let rocm = fixture_cache("triton-vector-add-rocm-gfx90a")
        .display()
        .to_string();
    let mi210 = write_gpus(work.path(), "MI210");
    let out = gkm(
        &["check", &rocm, "--gpus", &mi210.display().to_string()],
        &[],
        None,
    );
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    insta::assert_snapshot!("check-rocm-on-mi210", out.stdout);
    let t4 = write_gpus(work.path(), "T4");
    let out = gkm(
        &["check", &rocm, "--gpus", &t4.display().to_string()],
        &[],
        None,
    );
    assert_eq!(out.code, 3, "{}{}", out.stdout, out.stderr);
    insta::assert_snapshot!("check-rocm-on-t4", out.stdout);
}

#[test]
fn a_torn_triton_group_is_refused_by_build_naming_the_entry() {
    let work = tempfile::tempdir().expect("tempdir");
    let w = work.path();
    let src = w.join("cache");
    gkm_testenv::copy_tree(&fixture_cache(FIXTURES[0]), &src).expect("copy");
    let (group, _) = gkm_testenv::tree_files(&src)
        .expect("the cache")
        .into_iter()
        .find(|(p, _)| p.to_string_lossy().contains("__grp__"))
        .expect("a group file");
    let key = src.join(group.parent().expect("a key directory"));
    let layout_dir = w.join("layout");
    let build = |what: &str| {
        let out = gkm(
            &[
                "build",
                &src.display().to_string(),
                "-t",
                &format!("oci:{}:torn", layout_dir.display()),
            ],
            &[],
            None,
        );
        assert_eq!(out.code, 1, "{what}: {}", out.stderr);
        assert!(!layout_dir.exists(), "{what}: nothing is written");
        out.stderr
    };

    let ptx = key.join("add_kernel.ptx");
    let kept = std::fs::read(&ptx).expect("ptx");
    std::fs::remove_file(&ptx).expect("remove");
    let err = build("a missing child");
    assert!(
        err.contains("__grp__add_kernel.json")
            && err.contains("entry add_kernel.ptx: missing from the tree"),
        "{err}"
    );

    std::fs::write(&ptx, b"").expect("truncate");
    let err = build("an empty child");
    assert!(err.contains("entry add_kernel.ptx: empty"), "{err}");

    std::fs::write(&ptx, kept).expect("restore");
    let grp = key.join("__grp__add_kernel.json");
    let doc = std::fs::read_to_string(&grp).expect("group");
    std::fs::write(
        &grp,
        doc.replace("/add_kernel.ptx\"", "/../../etc/add_kernel.ptx\""),
    )
    .expect("write");
    let err = build("a child recorded outside its directory");
    assert!(
        err.contains("entry add_kernel.ptx: recorded at") && err.contains("outside"),
        "{err}"
    );
}

#[test]
fn exit_codes_and_messages() {
    let work = tempfile::tempdir().expect("tempdir");
    let w = work.path();
    // Usage.
    assert_eq!(
        gkm(&["extract", "oci:/x"], &[], None).code,
        2,
        "missing -o is a usage error"
    );
    assert_eq!(
        gkm(&["build", "/tmp"], &[], None).code,
        2,
        "missing -t is a usage error"
    );
    // Not found.
    let out = gkm(
        &["inspect", &format!("oci:{}/missing", w.display())],
        &[],
        None,
    );
    assert_eq!(out.code, 1);
    assert!(out.stderr.starts_with("gkm: error: "), "{}", out.stderr);
    assert!(out.stderr.contains("oci-layout"), "{}", out.stderr);
    // Not a cache.
    let out = gkm(
        &[
            "build",
            &w.display().to_string(),
            "-t",
            &format!("oci:{}/x", w.display()),
        ],
        &[],
        None,
    );
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("is not a kernel cache"),
        "{}",
        out.stderr
    );
    // A non-empty output directory is refused, and left alone.
    let layout = format!("oci:{}/l:v1", w.display());
    ok(&[
        "build",
        &fixture_cache(FIXTURES[0]).display().to_string(),
        "-t",
        &layout,
    ]);
    let busy = w.join("busy");
    std::fs::create_dir(&busy).expect("mkdir");
    std::fs::write(busy.join("keep"), b"mine").expect("write");
    let out = gkm(
        &["extract", &layout, "-o", &busy.display().to_string()],
        &[],
        None,
    );
    assert_eq!(out.code, 1);
    assert!(out.stderr.contains("not empty"), "{}", out.stderr);
    assert_eq!(std::fs::read_dir(&busy).expect("read").count(), 1);
    // A policy refusal: exit 4 naming the entry and the rule.
    let out = gkm(
        &[
            "extract",
            &layout,
            "-o",
            &w.join("small").display().to_string(),
            "--max-entries",
            "3",
        ],
        &[],
        None,
    );
    assert_eq!(out.code, 4, "{}", out.stderr);
    assert!(
        out.stderr
            .starts_with("gkm: rejected: layer rejected: entry "),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("too-many-entries"), "{}", out.stderr);
    assert!(!w.join("small").exists());
    // An empty existing directory (a mount point) is filled in place.
    let empty = w.join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    ok(&["extract", &layout, "-o", &empty.display().to_string()]);
    assert_same_tree(&fixture_cache(FIXTURES[0]), &empty);
}

/// `--byte-budget` and `--keep-free` stop an extraction that would take
/// too much of the disk (exit 1, naming the limit) and leave nothing.
#[test]
fn extract_within_a_byte_budget_and_a_free_space_reserve() {
    let work = tempfile::tempdir().expect("tempdir");
    let w = work.path();
    let layout = format!("oci:{}/l:v1", w.display());
    ok(&[
        "build",
        &fixture_cache(FIXTURES[0]).display().to_string(),
        "-t",
        &layout,
    ]);
    let out_dir = w.join("out/cache");
    let out_arg = out_dir.display().to_string();
    let out = gkm(
        &["extract", &layout, "-o", &out_arg, "--byte-budget", "4096"],
        &[],
        None,
    );
    fails_saying(&out, "byte budget of 4096 bytes");
    assert!(!out_dir.exists(), "{} exists", out_dir.display());
    let left: Vec<_> = std::fs::read_dir(w.join("out"))
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left next to the output: {left:?}");
    // All of the filesystem kept free: nothing can be written.
    let out = gkm(
        &["extract", &layout, "-o", &out_arg, "--keep-free", "100%"],
        &[],
        None,
    );
    fails_saying(&out, "free-space reserve");
    assert!(!out_dir.exists(), "{} exists", out_dir.display());
    // Not a percentage: a usage error.
    let out = gkm(
        &["extract", &layout, "-o", &out_arg, "--keep-free", "150%"],
        &[],
        None,
    );
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("0% to 100%"), "{}", out.stderr);
    // No reserve and room in the budget: extracted.
    ok(&[
        "extract",
        &layout,
        "-o",
        &out_arg,
        "--keep-free",
        "0",
        "--byte-budget",
        "1073741824",
    ]);
    assert_same_tree(&fixture_cache(FIXTURES[0]), &out_dir);
}

#[test]
fn credentials_from_docker_config_and_stdin() {
    let work = tempfile::tempdir().expect("tempdir");
    let cfg = work.path().join("docker");
    std::fs::create_dir(&cfg).expect("mkdir");
    std::fs::write(
        cfg.join("config.json"),
        br#"{"auths":{"registry.invalid":{"auth":"not base64!"}}}"#,
    )
    .expect("write config");
    // DOCKER_CONFIG is honoured: its broken entry for this registry is reported.
    let out = gkm(
        &["inspect", "registry.invalid/x:y"],
        &[("DOCKER_CONFIG", &cfg)],
        None,
    );
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("config.json") && out.stderr.contains("auths.registry.invalid"),
        "{}",
        out.stderr
    );
    // --username needs --password-stdin.
    assert_eq!(
        gkm(
            &["inspect", "registry.invalid/x:y", "--username", "u"],
            &[],
            None
        )
        .code,
        2
    );
    // With explicit credentials the config file is not read.
    let out = gkm(
        &[
            "inspect",
            "127.0.0.1:9/x:y",
            "--insecure",
            "--username",
            "u",
            "--password-stdin",
        ],
        &[("DOCKER_CONFIG", &cfg)],
        Some("secret\n"),
    );
    assert_eq!(out.code, 1);
    assert!(!out.stderr.contains("config.json"), "{}", out.stderr);
    assert!(
        !out.stderr.contains("secret"),
        "the password leaked: {}",
        out.stderr
    );
}

#[test]
fn killed_extraction_leaves_no_partial_tree() {
    let work = tempfile::tempdir().expect("tempdir");
    let w = work.path();
    // A fixture plus a 96 MiB file, so extraction takes long enough to be
    // caught half-way.
    let cache = w.join("cache");
    let fixture = fixture_cache(FIXTURES[0]);
    for (rel, (bytes, _)) in tree(&fixture) {
        match bytes {
            None => std::fs::create_dir_all(cache.join(&rel)).expect("mkdir"),
            Some(b) => {
                std::fs::create_dir_all(cache.join(&rel).parent().expect("parent")).expect("mkdir");
                std::fs::write(cache.join(&rel), b).expect("write");
            }
        }
    }
    let kernel_dir = std::fs::read_dir(&cache)
        .expect("read")
        .next()
        .expect("a dir")
        .expect("entry")
        .path();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let big: Vec<u8> = (0..96 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 56) as u8
        })
        .collect();
    std::fs::write(kernel_dir.join("big.bin"), &big).expect("write big file");
    let layout = format!("oci:{}/layout:big", w.display());
    ok(&["build", &cache.display().to_string(), "-t", &layout]);

    let store = w.join("store");
    let mut child = Command::new(env!("CARGO_BIN_EXE_gkm"))
        .args(["pull", &layout, "--store", &store.display().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run gkm");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let caught = loop {
        let partial = std::fs::read_dir(store.join("staging"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().is_dir())
            .any(|e| {
                let p = e
                    .path()
                    .join("io.triton.cache")
                    .join(kernel_dir.file_name().expect("name"))
                    .join("big.bin");
                std::fs::metadata(p).is_ok_and(|m| m.len() > 0)
            });
        if partial {
            child.kill().expect("kill gkm");
            break true;
        }
        if child.try_wait().expect("wait").is_some() || std::time::Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    };
    let _ = child.wait();
    assert!(
        caught,
        "extraction finished before it could be killed half-way"
    );
    let visible: Vec<_> = std::fs::read_dir(store.join("sha256"))
        .expect("read")
        .collect();
    assert!(
        visible.is_empty(),
        "a killed extraction left a visible tree: {visible:?}"
    );
    assert!(
        std::fs::read_dir(store.join("staging"))
            .expect("read")
            .next()
            .is_some(),
        "nothing was left to clean"
    );

    // The next run cleans the leftovers and extracts in full.
    let line = ok(&["pull", &layout, "--store", &store.display().to_string()]);
    let path = PathBuf::from(line.split_whitespace().nth(1).expect("path"));
    assert_same_tree(&cache, &path.join("io.triton.cache"));
    let left: Vec<_> = std::fs::read_dir(store.join("staging"))
        .expect("read")
        .collect();
    assert!(left.is_empty(), "leftovers survived: {left:?}");
}

/// Every image command's `--json`: one JSON document on stdout, nothing on
/// stderr, in the documented shape.
#[test]
fn json_output_of_the_image_commands() {
    let registry = gkm_testenv::Registry::shared()
        .expect("start docker-registry (apt-get install -y docker-registry)");
    let work = tempfile::tempdir().expect("tempdir");
    let w = work.path();
    let src = fixture_cache(FIXTURES[0]).display().to_string();
    let layout = format!("oci:{}/built:v1", w.display());
    let remote = format!("{}/cli/json:v1", registry.addr());
    let store = w.join("store").display().to_string();
    let out = w.join("out").display().to_string();
    let gpus = write_gpus(w, "T4").display().to_string();
    let commands: [(&str, Vec<&str>); 7] = [
        ("build", vec!["build", &src, "-t", &layout, "--json"]),
        (
            "push",
            vec!["push", &layout, &remote, "--insecure", "--json"],
        ),
        (
            "pull-store",
            vec!["pull", &remote, "--store", &store, "--insecure", "--json"],
        ),
        (
            "extract",
            vec!["extract", &remote, "-o", &out, "--insecure", "--json"],
        ),
        ("inspect", vec!["inspect", &remote, "--insecure", "--json"]),
        (
            "check",
            vec!["check", &remote, "--gpus", &gpus, "--insecure", "--json"],
        ),
        (
            "pull",
            vec!["pull", &remote, &layout, "--insecure", "--json"],
        ),
    ];
    for (name, args) in commands {
        let run = gkm(&args, &[], None);
        assert_eq!(run.code, 0, "gkm {args:?}:\n{}", run.stderr);
        assert_eq!(run.stderr, "", "gkm {args:?} wrote to stderr");
        insta::assert_snapshot!(
            format!("json-{name}"),
            json_snapshot(&run.stdout, w, registry.addr())
        );
    }
}

/// A plain-HTTP registry spoken to over HTTPS: the error says to add
/// `--insecure`.
#[test]
fn a_plain_http_registry_suggests_insecure() {
    let registry = gkm_testenv::Registry::shared()
        .expect("start docker-registry (apt-get install -y docker-registry)");
    let remote = format!("{}/cli/never-pushed:v1", registry.addr());
    let out = gkm(&["inspect", &remote], &[], None);
    fails_saying(
        &out,
        "does not speak HTTPS; if it is a plain-HTTP registry, add --insecure",
    );
}

/// A registry that wants credentials gkm does not have: the error says
/// which config file gkm read, what it lacked, and how to log in.
#[test]
fn a_registry_wanting_credentials_says_where_gkm_looked() {
    let registry = gkm_testenv::Registry::start_with_basic_auth("gkm", "secret")
        .expect("start docker-registry with htpasswd");
    let work = tempfile::tempdir().expect("tempdir");
    let cfg = work.path().join("docker");
    let remote = format!("{}/cli/private:v1", registry.addr());
    let host = registry.addr();
    let inspect = |env: &[(&str, &Path)], stdin: Option<&str>, extra: &[&str]| {
        let mut args = vec!["inspect", remote.as_str(), "--insecure"];
        args.extend_from_slice(extra);
        gkm(&args, env, stdin)
    };
    // No config file.
    let out = inspect(&[("DOCKER_CONFIG", &cfg)], None, &[]);
    fails_saying(
        &out,
        &format!(
            "{host} wants credentials; gkm looked for them in {}/config.json, which does not exist; run `docker login {host}`",
            cfg.display()
        ),
    );
    // A config file without this registry.
    std::fs::create_dir(&cfg).expect("mkdir");
    std::fs::write(
        cfg.join("config.json"),
        r#"{"auths":{"other.example":{"auth":"dTpw"}}}"#,
    )
    .expect("write config");
    let out = inspect(&[("DOCKER_CONFIG", &cfg)], None, &[]);
    fails_saying(&out, &format!("which has no entry for {host}"));
    // A wrong password given on the command line.
    let out = inspect(
        &[("DOCKER_CONFIG", &cfg)],
        Some("wrong\n"),
        &["--username", "gkm", "--password-stdin"],
    );
    fails_saying(
        &out,
        &format!("{host} refused the user name and password given with --username"),
    );
    // The right one gets through to the (missing) image.
    let out = inspect(
        &[("DOCKER_CONFIG", &cfg)],
        Some("secret\n"),
        &["--username", "gkm", "--password-stdin"],
    );
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(!out.stderr.contains("hint"), "{}", out.stderr);
}

/// `out` is an error (exit code 1) whose message contains `text`.
fn fails_saying(out: &Out, text: &str) {
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(out.stderr.contains(text), "no {text:?} in:\n{}", out.stderr);
}

/// On a terminal `gkm extract` shows its step, bytes, rate and time left on
/// stderr; with `--json` the terminal gets the JSON document only.
#[test]
fn progress_on_a_terminal_only() {
    let work = tempfile::tempdir().expect("tempdir");
    let w = work.path();
    let layout = format!("oci:{}/l:v1", w.display());
    ok(&[
        "build",
        &fixture_cache(FIXTURES[2]).display().to_string(),
        "-t",
        &layout,
    ]);
    let under_tty = |args: &str| {
        let cmd = format!("GKM_LOG=debug {} {args}", env!("CARGO_BIN_EXE_gkm"));
        let out = Command::new("script")
            .args(["-q", "-e", "-c", &cmd, "/dev/null"])
            .env("COLUMNS", "120")
            .output()
            .expect("run script (util-linux)");
        assert!(out.status.success(), "{cmd}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let shown = under_tty(&format!("extract {layout} -o {}/a", w.display()));
    assert!(shown.contains("extract: "), "no progress line:\n{shown}");
    assert!(shown.contains("extracting the layer"), "no step:\n{shown}");
    assert!(shown.contains("left"), "no time left:\n{shown}");
    assert!(shown.contains("extracted oci:"), "no summary:\n{shown}");

    // From a registry, with debug logs: each log line is written on a line
    // of its own, never after a bar.
    let registry = gkm_testenv::Registry::shared()
        .expect("start docker-registry (apt-get install -y docker-registry)");
    let remote = format!("{}/cli/progress:v1", registry.addr());
    ok(&["push", &layout, &remote, "--insecure"]);
    let shown = under_tty(&format!("extract {remote} -o {}/c --insecure", w.display()));
    assert!(
        shown.contains("fetching and extracting"),
        "no step:\n{shown}"
    );
    let logs: Vec<&str> = shown
        .split(['\r', '\n'])
        .filter(|line| line.contains("DEBUG"))
        .collect();
    assert!(!logs.is_empty(), "no debug log lines:\n{shown}");
    for line in logs {
        let line = line.trim_start_matches("\x1b[2K");
        assert!(
            line.starts_with(|c: char| c.is_ascii_digit() || c == '\x1b')
                && !line.contains("extract:"),
            "a log line shares its line with the bar: {line:?}"
        );
    }

    let json = under_tty(&format!("extract {layout} -o {}/b --json", w.display()));
    let doc: serde_json::Value = serde_json::from_str(&json.replace("\r\n", "\n"))
        .unwrap_or_else(|e| panic!("--json on a terminal printed more than JSON ({e}):\n{json}"));
    assert_eq!(doc["files"].as_u64().map(|n| n > 0), Some(true), "{doc}");
}

//! Multi-target images as a user makes and reads them, on a real registry:
//! `gkm build` of several real Triton caches (one per GPU target) into one
//! index, `gkm inspect` listing the variants, `gkm check` saying which
//! variant each GPU gets and why, `gkm extract` taking the variant of the
//! GPUs, `gkm pull --store` storing it, `gkm pull` copying the whole index,
//! `gkm index` assembling existing images, and `gkm sign`/`verify` covering
//! the index, so that moving one variant under the same tag is refused.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use gkm_testenv::Registry;

mod support;

use support::{gkm_in as gkm, key_pair, text};

/// The real Triton caches of `fixtures/triton`, one per target.
fn triton(target: &str) -> String {
    gkm_testenv::repo_root()
        .join("fixtures/triton")
        .join(target)
        .display()
        .to_string()
}

/// A simulated inventory file of one GPU of `profile`.
fn gpus(dir: &Path, profile: &str) -> PathBuf {
    let path = dir.join(format!("{profile}.yaml"));
    std::fs::write(&path, format!("gpus:\n- profile: {profile}\n")).expect("write inventory");
    path
}

/// `gkm pull IMAGE --store STORE --insecure`, with `extra` flags.
fn pull_store(image: &str, store: &str, extra: &[&str], dir: &Path) -> std::process::Output {
    let mut args = vec!["pull", image, "--store", store, "--insecure"];
    args.extend_from_slice(extra);
    gkm(&args, dir)
}

fn json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not one JSON document ({e}): {}", text(out)))
}

/// Every file below `root`, relative, with its bytes.
fn files(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    gkm_testenv::tree_files(root).unwrap_or_else(|e| panic!("{}: {e}", root.display()))
}

#[test]
fn one_image_for_a_mixed_fleet_each_gpu_gets_its_variant() {
    let registry = Registry::shared().unwrap_or_else(|e| panic!("{e:#}"));
    let work = tempfile::tempdir().expect("tempdir");
    let dir = work.path();
    let image = format!("{}/cli/fleet:v1", registry.addr());
    let targets = ["cuda-75-32", "cuda-80-32", "cuda-90-32", "hip-gfx942-64"];
    let mut args = vec!["build".to_string()];
    args.extend(targets.iter().map(|t| triton(t)));
    args.extend(["-t", &image, "--insecure", "--json"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let built = gkm(&args, dir);
    assert!(built.status.success(), "gkm build: {}", text(&built));
    let built = json(&built);
    let index = built["digest"].as_str().expect("index digest").to_string();
    let variants: Vec<String> = built["variants"]
        .as_array()
        .expect("variants")
        .iter()
        .map(|v| v["digest"].as_str().expect("variant digest").to_string())
        .collect();
    assert_eq!(variants.len(), 4, "{built}");
    assert_eq!(
        built["variants"][3]["targets"][0], "hip/gfx942/64",
        "{built}"
    );

    // inspect lists the variants and their targets from the index.
    let inspected = gkm(&["inspect", &image, "--insecure", "--json"], dir);
    assert!(inspected.status.success(), "{}", text(&inspected));
    let doc = json(&inspected);
    assert_eq!(doc["digest"], index.as_str());
    assert_eq!(doc["mediaType"], "application/vnd.oci.image.index.v1+json");
    let listed: Vec<&str> = doc["variants"]
        .as_array()
        .expect("variants")
        .iter()
        .map(|v| v["targets"][0].as_str().expect("target"))
        .collect();
    assert_eq!(
        listed,
        ["cuda/75/32", "cuda/80/32", "cuda/90/32", "hip/gfx942/64"]
    );
    let table = gkm(&["inspect", &image, "--insecure"], dir);
    assert!(
        text(&table).contains("VARIANT") && text(&table).contains(&variants[2]),
        "{}",
        text(&table)
    );
    // Each variant is a single-target image read as before.
    let repository = image.trim_end_matches(":v1");
    let one = gkm(
        &[
            "inspect",
            &format!("{repository}@{}", variants[1]),
            "--insecure",
            "--json",
        ],
        dir,
    );
    assert!(one.status.success(), "{}", text(&one));
    assert_eq!(json(&one)["targets"][0], "cuda/80/32");

    // check: which variant each GPU gets, and why.
    let h100 = gpus(dir, "H100");
    let checked = gkm(
        &[
            "check",
            &image,
            "--gpus",
            h100.to_str().unwrap(),
            "--insecure",
        ],
        dir,
    );
    assert_eq!(checked.status.code(), Some(0), "{}", text(&checked));
    let said = text(&checked);
    assert!(
        said.contains(&format!("variant 2 {}", variants[2]))
            && said.contains("matches cuda/90/32")
            && said.contains("node gets variant 2"),
        "{said}"
    );
    let mi210 = gpus(dir, "MI210");
    let refused = gkm(
        &[
            "check",
            &image,
            "--gpus",
            mi210.to_str().unwrap(),
            "--insecure",
            "--json",
        ],
        dir,
    );
    assert_eq!(refused.status.code(), Some(3), "{}", text(&refused));
    let doc = json(&refused);
    assert_eq!(doc["chosen"], serde_json::Value::Null);
    assert!(
        doc["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("no variant fits any GPU") && r.contains("variant 3")),
        "{doc}"
    );

    // extract takes the variant of the GPUs: a T4 gets the sm75 tree.
    let t4 = gpus(dir, "T4");
    let out = dir.join("sm75");
    let extracted = gkm(
        &[
            "extract",
            &image,
            "--gpus",
            t4.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--insecure",
        ],
        dir,
    );
    assert!(extracted.status.success(), "{}", text(&extracted));
    assert_eq!(
        String::from_utf8_lossy(&extracted.stdout).trim(),
        variants[0]
    );
    assert_eq!(files(&out), files(Path::new(&triton("cuda-75-32"))));

    // pull --store stores the variant of the GPUs, saying which.
    let store = dir.join("store").display().to_string();
    let stored = pull_store(
        &image,
        &store,
        &["--gpus", t4.to_str().unwrap(), "--json"],
        dir,
    );
    assert!(stored.status.success(), "{}", text(&stored));
    let doc = json(&stored);
    assert_eq!(doc["digest"], variants[0].as_str(), "{doc}");
    assert_eq!(doc["indexDigest"], index.as_str(), "{doc}");
    assert_eq!(doc["variant"], 0, "{doc}");
    assert_eq!(doc["extracted"], true, "{doc}");
    let path = PathBuf::from(doc["path"].as_str().expect("path"));
    assert_eq!(
        files(&path.join("io.triton.cache")),
        files(Path::new(&triton("cuda-75-32")))
    );
    let named = pull_store(&image, &store, &["--variant", &variants[2]], dir);
    assert!(named.status.success(), "{}", text(&named));
    let line = String::from_utf8_lossy(&named.stdout);
    assert!(line.starts_with(&format!("{} ", variants[2])), "{line}");
    assert!(
        String::from_utf8_lossy(&named.stderr)
            .contains(&format!("stored variant 2 {}", variants[2])),
        "{}",
        text(&named)
    );
    let path = PathBuf::from(line.split_whitespace().nth(1).expect("path"));
    assert_eq!(
        files(&path.join("io.triton.cache")),
        files(Path::new(&triton("cuda-90-32")))
    );
    // None fits an MI210: exit 3, naming each variant and why, nothing stored.
    let refused = pull_store(&image, &store, &["--gpus", mi210.to_str().unwrap()], dir);
    assert_eq!(refused.status.code(), Some(3), "{}", text(&refused));
    let said = text(&refused);
    assert!(
        said.contains("no variant fits any GPU")
            && said.contains(&format!("variant 3 {} (hip/gfx942/64)", variants[3])),
        "{said}"
    );
    let entries = std::fs::read_dir(Path::new(&store).join("sha256"))
        .expect("store entries")
        .count();
    assert_eq!(entries, 2, "only the two variants pulled are stored");
    let unknown = pull_store(&image, &store, &["--variant", &index], dir);
    assert_eq!(unknown.status.code(), Some(1), "{}", text(&unknown));
    assert!(
        text(&unknown).contains("not a variant of index") && text(&unknown).contains(&variants[1]),
        "{}",
        text(&unknown)
    );

    // pull copies the whole index; the copy lists the same variants.
    let layout = format!("oci:{}:v1", dir.join("layout").display());
    let pulled = gkm(&["pull", &image, &layout, "--insecure"], dir);
    assert!(pulled.status.success(), "{}", text(&pulled));
    assert_eq!(String::from_utf8_lossy(&pulled.stdout).trim(), index);
    let local = json(&gkm(&["inspect", &layout, "--json"], dir));
    assert_eq!(local["variants"].as_array().map(Vec::len), Some(4));
    // A copy takes every variant: naming one is refused as a usage error.
    let one = gkm(
        &[
            "pull",
            &image,
            &layout,
            "--variant",
            &variants[0],
            "--insecure",
        ],
        dir,
    );
    assert_eq!(one.status.code(), Some(2), "{}", text(&one));

    // The signature covers the index, and through it every variant digest.
    let keys = key_pair(&dir.join("keys"));
    let key = keys.join("cosign.key").display().to_string();
    let public = keys.join("cosign.pub").display().to_string();
    let signed = gkm(&["sign", &image, "--key", &key, "--insecure"], dir);
    assert!(signed.status.success(), "{}", text(&signed));
    assert!(text(&signed).contains(&index), "{}", text(&signed));
    let verified = gkm(&["verify", &image, "--key", &public, "--insecure"], dir);
    assert_eq!(verified.status.code(), Some(0), "{}", text(&verified));

    // Moving one variant: another sm75 cache assembled with the other three
    // under the same tag is a new index nobody signed.
    let other = format!("{}/cli/sm75-other:v1", registry.addr());
    let built = gkm(
        &[
            "build",
            &gkm_testenv::fixture_cache("triton-vector-add-cuda-sm75")
                .display()
                .to_string(),
            "-t",
            &other,
            "--insecure",
        ],
        dir,
    );
    assert!(built.status.success(), "{}", text(&built));
    let pinned: Vec<String> = variants[1..]
        .iter()
        .map(|d| format!("{repository}@{d}"))
        .collect();
    let mut args = vec!["index", &other];
    args.extend(pinned.iter().map(String::as_str));
    args.extend(["-t", &image, "--insecure", "--json"]);
    let moved = gkm(&args, dir);
    assert!(moved.status.success(), "gkm index: {}", text(&moved));
    let moved = json(&moved);
    assert_ne!(moved["digest"], index.as_str());
    assert_eq!(moved["variants"][1]["digest"], variants[1].as_str());
    let refused = gkm(&["verify", &image, "--key", &public, "--insecure"], dir);
    assert_eq!(refused.status.code(), Some(4), "{}", text(&refused));

    // Variants that cannot make one image are refused, naming why.
    let clash = gkm(
        &[
            "index",
            &other,
            &format!("{repository}@{}", variants[0]),
            "-t",
            &format!("{}/cli/clash:v1", registry.addr()),
            "--insecure",
        ],
        dir,
    );
    assert_eq!(clash.status.code(), Some(1), "{}", text(&clash));
    assert!(
        text(&clash).contains("target cuda/75/32 is in both"),
        "{}",
        text(&clash)
    );
    let nested = gkm(
        &[
            "index",
            &image,
            "-t",
            &format!("{}/cli/nested:v1", registry.addr()),
            "--insecure",
        ],
        dir,
    );
    assert_eq!(nested.status.code(), Some(1), "{}", text(&nested));
    assert!(
        text(&nested).contains("multi-target image"),
        "{}",
        text(&nested)
    );
}

//! `gkm build`, `inspect` and `check` on a FlashInfer cache as a user runs
//! them: a `~/.cache/flashinfer` laid out as `flashinfer-python` 0.7.4
//! writes it (`gkm_testenv::flashinfer`; FlashInfer compiles only with a
//! GPU), one JIT module built for `sm_90a` and one autotune store entry.

// A test panics with what went wrong.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use gkm_testenv::flashinfer::{MODULE, flashinfer_tree, module_dir};

mod support;

use support::{check_fits, gkm_in, gkm_ok, text};

#[test]
fn a_flashinfer_cache_builds_inspects_and_fits_the_gpus_of_its_architecture() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("flashinfer");
    flashinfer_tree(&root, &root);
    let image = format!("oci:{}:fi", dir.path().join("layout").display());

    let built = gkm_ok(&["build", root.to_str().unwrap(), "-t", &image], dir.path());
    eprintln!("gkm build:\n{built}");
    assert!(
        built.contains("(flashinfer cache): 2 kernels, ") && built.contains("targets: cuda/90a/32"),
        "{built}"
    );

    let inspected = gkm_ok(&["inspect", &image], dir.path());
    eprintln!("gkm inspect:\n{inspected}");
    assert!(inspected.contains("Kind:        flashinfer"), "{inspected}");
    assert!(
        inspected.contains(&format!("Built at:    {}", root.display())),
        "{inspected}"
    );
    assert!(
        inspected.contains("Targets:     cuda/90a/32"),
        "{inspected}"
    );
    assert!(
        inspected.contains("cache.flashinfer.image/flashinfer-version  0.7.4"),
        "{inspected}"
    );

    check_fits(&image, dir.path(), &["H100"], &["A100"]);

    // A file FlashInfer does not write refuses the build, naming it.
    let notes = module_dir(&root).join("notes.txt");
    std::fs::write(&notes, b"mine").unwrap();
    let out = gkm_in(&["build", root.to_str().unwrap(), "-t", &image], dir.path());
    eprintln!("gkm build (foreign file):\n{}", text(&out));
    assert!(
        text(&out).contains(&format!(
            "{} is not part of a FlashInfer cache",
            notes.display()
        )),
        "{}",
        text(&out)
    );
    std::fs::remove_file(&notes).unwrap();
    let so = module_dir(&root).join(format!("{MODULE}.so"));
    std::fs::write(&so, b"").unwrap();
    let out = gkm_in(&["build", root.to_str().unwrap(), "-t", &image], dir.path());
    eprintln!("gkm build (torn module):\n{}", text(&out));
    assert!(
        text(&out).contains(&format!("{} is a torn entry", so.display())),
        "{}",
        text(&out)
    );
}

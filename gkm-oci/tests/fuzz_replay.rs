//! Replays every fuzz target's corpus (`fuzz/corpus/<target>/`) and crash
//! regressions (`fuzz/regressions/<target>/`) through the same bodies the
//! fuzz targets run, so the fuzzers' findings stay fixed without nightly or
//! libFuzzer. `hack/hostile/fuzz.sh` grows both directories.

use std::path::PathBuf;

use gkm_oci::fuzzing::{TARGETS, replay};

fn fuzz_dir() -> PathBuf {
    gkm_testenv::repo_root().join("fuzz")
}

#[test]
fn every_target_of_the_fuzz_crate_replays_here_or_in_gkm_k8s_csi() {
    let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).expect("fuzz/Cargo.toml");
    let declared: Vec<&str> = manifest
        .lines()
        .filter_map(|l| l.strip_prefix("name = \""))
        .filter_map(|l| l.strip_suffix('"'))
        .filter(|n| *n != "gkm-fuzz")
        .collect();
    // gkm-k8s-csi replays these (gkm-k8s/csi/tests/fuzz_replay.rs).
    let in_k8s = ["csi_publish"];
    for name in &declared {
        assert!(
            TARGETS.iter().any(|(t, _)| t == name) || in_k8s.contains(name),
            "fuzz target {name} has no body to replay"
        );
    }
    assert_eq!(declared.len(), TARGETS.len() + in_k8s.len());
}

#[test]
fn corpus_and_regressions_replay_without_panics() {
    let mut replayed = 0;
    for (target, body) in TARGETS {
        let files = replay(&fuzz_dir(), target, *body).expect("reading the corpus");
        println!("{target}: {} inputs", files.len());
        replayed += files.len();
    }
    assert!(
        replayed > 0,
        "no corpus found under {}",
        fuzz_dir().display()
    );
}

/// A regression the fuzzer's key target guards: an encrypted key asking for
/// scrypt parameters that would need 128 TiB is refused, naming them,
/// instead of aborting on the allocation.
#[test]
fn an_encrypted_key_with_an_absurd_scrypt_cost_is_refused() {
    let input = std::fs::read(fuzz_dir().join("regressions/keys_certificates/scrypt-huge-n"))
        .expect("regression input");
    let pem = String::from_utf8_lossy(&input);
    let Err(err) = gkm_oci::sign::SigningKey::from_pem(&pem, b"") else {
        panic!("an absurd scrypt cost is accepted");
    };
    assert!(
        err.to_string()
            .contains("scrypt parameters N=1099511627776 r=8 p=1"),
        "{err}"
    );
}

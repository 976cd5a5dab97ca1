//! Replays the corpus and crash regressions of the fuzz targets whose bodies
//! live in gkm-k8s-csi (`fuzz/corpus/<target>/`, `fuzz/regressions/<target>/`).

use std::path::Path;

use gkm_k8s_csi::fuzzing::TARGETS;
use gkm_oci::fuzzing::replay;

#[test]
fn corpus_and_regressions_replay_without_panics() {
    let fuzz_dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz"));
    for (target, body) in TARGETS {
        let files = replay(fuzz_dir, target, *body).expect("reading the corpus");
        println!("{target}: {} inputs", files.len());
        assert!(!files.is_empty(), "no corpus for {target}");
    }
}

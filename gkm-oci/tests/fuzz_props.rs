//! The fuzz targets' bodies (`fuzz/`), run on stable as property tests.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use gkm_oci::fuzzing;
use proptest::prelude::*;

/// A small valid layer tar to mutate.
fn valid_tar() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |name: &str, data: &[u8], kind: tar::EntryType| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, name, data).expect("append");
    };
    add("io.triton.cache/", b"", tar::EntryType::Directory);
    add(
        "io.triton.cache/K/add_kernel.json",
        br#"{"hash":"ab"}"#,
        tar::EntryType::Regular,
    );
    add(
        "io.triton.cache/K/add_kernel.cubin",
        &[7u8; 700],
        tar::EntryType::Regular,
    );
    add(
        "io.triton.manifest/manifest.json",
        br#"{"triton":[]}"#,
        tar::EntryType::Regular,
    );
    b.into_inner().expect("finish")
}

fn mutated_tar() -> impl Strategy<Value = Vec<u8>> {
    let base = valid_tar();
    let len = base.len();
    (
        proptest::collection::vec((0..len, any::<u8>()), 0..16),
        0..=len,
    )
        .prop_map(move |(edits, cut)| {
            let mut t = base.clone();
            for (i, b) in edits {
                t[i] = b;
            }
            t.truncate(cut.max(1));
            t
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn tar_extraction_of_random_bytes(data in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let scratch = tempfile::tempdir().expect("tempdir");
        fuzzing::tar_extraction(&data, scratch.path());
    }

    #[test]
    fn tar_extraction_of_mutated_layers(data in mutated_tar()) {
        let scratch = tempfile::tempdir().expect("tempdir");
        fuzzing::tar_extraction(&data, scratch.path());
    }

    #[test]
    fn manifest_json_never_panics(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        fuzzing::manifest_json(&data);
    }

    #[test]
    fn manifest_json_mutations(
        backend in "(cuda|hip|rocm|xpu|[a-z]{0,5})",
        arch in "(75|sm_80|gfx90a|[0-9a-z_.]{0,6})",
        warp in any::<i64>(),
        ptx in proptest::option::of(any::<i64>()),
    ) {
        let ptx = ptx.map(|p| p.to_string()).unwrap_or_else(|| "null".into());
        let json = format!(r#"{{"triton":[{{"hash":"h","dummy_key":"k","ptx_version":{ptx},"num_stages":3,"num_warps":4,"debug":false,"backend":"{backend}","arch":"{arch}","warp_size":{warp}}}]}}"#);
        fuzzing::manifest_json(json.as_bytes());
    }

    #[test]
    fn summary_label_never_panics(data in ".{0,200}") {
        fuzzing::summary_label(&data);
    }

    #[test]
    fn summary_label_shapes(backend in "[a-z]{0,6}", arch in "[0-9a-z_]{0,8}", warp in any::<i64>()) {
        fuzzing::summary_label(&format!(r#"{{"targets":[{{"backend":"{backend}","arch":"{arch}","warp_size":{warp}}}]}}"#));
    }

    #[test]
    fn image_reference_never_panics(data in "(oci:)?[a-zA-Z0-9./:@_-]{0,60}") {
        fuzzing::image_reference(&data);
    }

    #[test]
    fn image_reference_any_string(data in ".{0,80}") {
        fuzzing::image_reference(&data);
    }
}

#[test]
fn valid_tar_is_accepted() {
    // The mutation base must itself extract, or the mutations test nothing.
    let scratch = tempfile::tempdir().expect("tempdir");
    assert!(fuzzing::tar_extraction(&valid_tar(), scratch.path()));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn parsers_of_signatures_images_and_caches_never_panic(
        data in proptest::collection::vec(any::<u8>(), 0..2048),
    ) {
        for (_, body) in fuzzing::TARGETS {
            body(&data);
        }
    }
}

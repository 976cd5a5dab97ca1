//! A FlashInfer cache (`FLASHINFER_CACHE_DIR`) laid out as
//! `flashinfer-python` 0.7.4 writes it (`flashinfer/jit/env.py`,
//! `jit/core.py`, `jit/cpp_ext.py`, `autotune_cache.py`; the lines are cited
//! in `gkm_core::cache::kinds::flashinfer`): one JIT module of a workspace
//! `0.7.4/90a/`, its lock, log and generated sources, and one autotune
//! store entry. FlashInfer builds modules only with a GPU; the tree is
//! written from its layout rules.

use std::fs;
use std::path::{Path, PathBuf};

fn write(path: &Path, bytes: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, bytes).unwrap();
}

/// A module name as `gen_batch_decode_module` spells it.
pub const MODULE: &str = "batch_decode_with_kv_cache_dtype_q_f16_dtype_kv_f16_dtype_o_f16_dtype_idx_i32_head_dim_qk_128_head_dim_vo_128_posenc_0_use_swa_False_use_logits_cap_False";
/// An environment hash (`sha256(canonical manifest)[:16]`),
/// `autotune_cache.py` lines 364-369.
pub const ENV: &str = "3f9a1c0d2b4e6f70";
/// An operation hash (`sha256(key)[:24]`), `autotune_cache.py` lines
/// 377-379.
pub const OP: &str = "a1b2c3d4e5f60718293a4b5c";

/// A real shared library (one Inductor built, `fixtures/torch`) standing
/// for the module's `.so`, with the CUDA runtime it links named in it as
/// in a dynamic string table.
fn library() -> Vec<u8> {
    let path = crate::fixtures::repo_root().join(
        "fixtures/torch/inductor/ht/chtw5l77yxhgzkni3bo4jtkxyxriuzy6rjaji72aehdvpmcb6iex.main.so",
    );
    let mut bytes = fs::read(path).unwrap();
    bytes.extend(b"\0libcudart.so.12\0");
    bytes
}

/// The module directory of the FlashInfer cache rooted at `root`.
pub fn module_dir(root: &Path) -> PathBuf {
    root.join("0.7.4/90a/cached_ops").join(MODULE)
}

/// A FlashInfer cache at `root`, its modules built with the cache at
/// `built` (`FLASHINFER_CACHE_DIR`, `env.py` line 68).
pub fn flashinfer_tree(root: &Path, built: &Path) {
    let module = module_dir(root);
    let out = built.join("0.7.4/90a/cached_ops").join(MODULE);
    let generated = built.join("0.7.4/90a/generated").join(MODULE);
    let objects = [
        format!("{MODULE}_batch_decode.cuda.o"),
        format!("{MODULE}_batch_decode_jit_binding.cuda.o"),
    ];
    // `generate_ninja_build_for_op`, cpp_ext.py lines 294-401.
    let mut ninja = format!(
        "ninja_required_version = 1.3\nname = {MODULE}\ncuda_home = /usr/local/cuda\ncxx = c++\n\
         nvcc = $cuda_home/bin/nvcc\n\nrule cuda_compile\n  command = $nvcc_launcher $nvcc \
         --generate-dependencies-with-compile -MF $out.d $cuda_cflags -c $in -o $out\n  \
         depfile = $out.d\n  deps = gcc\n\nrule link\n  command = $cxx $in $ldflags -o $out\n\n"
    );
    for (object, source) in objects
        .iter()
        .zip(["batch_decode", "batch_decode_jit_binding"])
    {
        ninja.push_str(&format!(
            "build {}: cuda_compile {}\n",
            out.join(object).display(),
            generated.join(format!("{source}.cu")).display()
        ));
        write(&module.join(object), b"\x7fELF object");
        write(&module.join(format!("{object}.d")), b"deps\n");
        write(
            &root
                .join("0.7.4/90a/generated")
                .join(MODULE)
                .join(format!("{source}.cu")),
            b"// generated\n",
        );
    }
    let so = out.join(format!("{MODULE}.so"));
    let linked: Vec<String> = objects
        .iter()
        .map(|o| out.join(o).display().to_string())
        .collect();
    ninja.push_str(&format!(
        "\nbuild {}: link {}\ndefault {}\n",
        so.display(),
        linked.join(" "),
        so.display()
    ));
    write(&module.join("build.ninja"), ninja.as_bytes());
    write(&module.join(format!("{MODULE}.so")), &library());
    write(&module.join(".ninja_log"), b"# ninja log v6\n");
    write(&module.join(".ninja_deps"), b"# ninjadeps\n");
    write(
        &root
            .join("0.7.4/90a/cached_ops/tmp")
            .join(format!("{MODULE}.lock")),
        b"",
    );
    write(&root.join("0.7.4/90a/flashinfer_jit.log"), b"");
    let store = root.join("autotune/v2").join(ENV);
    write(
        &store.join("manifest.json"),
        br#"{"cache_schema": "v2", "cublas_version": "12.8.4", "cuda_version": "12.8",
            "cudnn_version": "91000", "flashinfer_version": "0.7.4", "gpu": "NVIDIA H100 80GB HBM3"}"#,
    );
    write(
        &store.join("entries").join(format!("{OP}.json")),
        br#"{"key": "('trtllm::fp4_gemm', 'CutlassFp4GemmRunner', (8192, 4096), ())",
            "runner": "CutlassFp4GemmRunner", "tactic": [3, 1]}"#,
    );
}

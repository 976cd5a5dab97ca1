//! A DeepGEMM cache (`DG_JIT_CACHE_DIR`) laid out as DeepGEMM 2.6 writes it
//! (`csrc/jit/compiler.hpp`; the lines are cited in
//! `gkm_core::cache::kinds::deepgemm`): kernels of `sm90_fp8_gemm_1d2d`
//! at two shapes, each a `kernel.cu` as DeepGEMM generates it and a real
//! cubin (one real Triton compiled for the architecture, `fixtures/triton`),
//! filed under the digest DeepGEMM 2.6.1's own `get_hex_digest` printed for
//! its key (compiled with g++ from `csrc/utils/hash.hpp` and run on the
//! key's bytes), and a compile directory left in `tmp/`. DeepGEMM compiles
//! only with a GPU and NVCC; the tree is written from its layout rules.

use std::fs;
use std::path::{Path, PathBuf};

/// The `deep_gemm` package directory the kernels were compiled with: where
/// the `vllm/vllm-openai` image installs it.
pub const ROOT: &str = "/usr/local/lib/python3.12/dist-packages/deep_gemm";
/// The kernels' name.
pub const NAME: &str = "sm90_fp8_gemm_1d2d";
/// The `N` of each kernel's shape, and the digest of its key by NVCC 12.9
/// for sm_90a, C++20, no `DG_JIT_*` debug setting: `get_hex_digest` of
/// `"{NAME}$$NVCC12.9$${flags}$${kernel_source(n)}"`, the flags
/// `Compiler`'s and `NVCCCompiler`'s (compiler.hpp lines 50-52 and
/// 204-208) with `-I{ROOT}/include`.
pub const KERNELS: [(u32, &str); 2] = [
    (4096, "fe6a9b5cdb99e7ae9f279e4b9bdf5f59"),
    (2048, "18d4f83534554b0dd8bb1b0298445d54"),
];
/// The digest of the `N = 4096` kernel's key by NVRTC 13.0 for sm_100f
/// (a B200 or B300), with CUDA at `/usr/local/cuda` (compiler.hpp lines
/// 262-282: `-I{ROOT}/include -I/usr/local/cuda/include … --pch`).
pub const NVRTC_SM100F: &str = "0299e9a771df4c8cba19d79d5f1aaec0";

/// The source DeepGEMM generates for `sm90_fp8_gemm_1d2d` with `N = n`
/// (`SM90FP8Gemm1D2DRuntime::generate_impl`,
/// `csrc/jit_kernels/impls/sm90_fp8_gemm_1d2d.hpp` lines 34-68).
pub fn kernel_source(n: u32) -> String {
    format!(
        "\n#include <deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh>\n\nusing namespace deep_gemm;\n\n\
         static void __instantiate_kernel() {{\n    auto ptr = reinterpret_cast<void*>(&sm90_fp8_gemm_1d2d_impl<\n\
         \x20       cute::UMMA::Major::K,\n        0, {n}, 7168,\n        1,\n        64, 128, 128,\n\
         \x20       128, 128, 128,\n        5,\n        128, 256,\n        1, false,\n        132, GemmType::Normal,\n\
         \x20       cutlass::bfloat16_t,\n        EpilogueIdentity\n    >);\n}};\n"
    )
}

/// A real cubin compiled for `target` (`cuda-90-32`): the first Triton
/// kernel of that fleet fixture.
pub fn real_cubin(target: &str) -> Vec<u8> {
    let fixture = crate::fixtures::repo_root()
        .join("fixtures/triton")
        .join(target);
    let mut dirs: Vec<PathBuf> = fs::read_dir(&fixture)
        .unwrap_or_else(|e| panic!("{}: {e}", fixture.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs.iter()
        .flat_map(|d| fs::read_dir(d).into_iter().flatten().flatten())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "cubin"))
        .map(|p| fs::read(p).unwrap())
        .unwrap_or_else(|| panic!("no cubin in {}", fixture.display()))
}

/// The directory of kernel `digest` in the cache rooted at `root`.
pub fn kernel_dir(root: &Path, digest: &str) -> PathBuf {
    root.join("cache").join(format!("kernel.{NAME}.{digest}"))
}

/// Writes kernel `digest` (source `kernel_source(n)`, cubin of fixture
/// `target`) into the cache at `root`.
pub fn write_kernel(root: &Path, n: u32, digest: &str, target: &str) {
    let dir = kernel_dir(root, digest);
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("kernel.cu"), kernel_source(n)).unwrap();
    fs::write(dir.join("kernel.cubin"), real_cubin(target)).unwrap();
}

/// A DeepGEMM cache at `root`: the [`KERNELS`] for sm_90a, and a compile
/// directory in `tmp/` (`tmp/<uuid>/kernel.cu`, a kernel being compiled).
pub fn deepgemm_tree(root: &Path) {
    for (n, digest) in KERNELS {
        write_kernel(root, n, digest, "cuda-90-32");
    }
    let compiling = root.join("tmp/5d0c8a1e-2f4b-4c6d-9e7a-1b3c5d7f9a2b");
    fs::create_dir_all(&compiling).unwrap();
    fs::write(compiling.join("kernel.cu"), kernel_source(1024)).unwrap();
}

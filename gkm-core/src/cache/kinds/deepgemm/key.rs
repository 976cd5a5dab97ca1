//! DeepGEMM's key of a kernel, recomputed: what binds a DeepGEMM cache to
//! the install that compiled it.
//!
//! DeepGEMM 2.6 files a kernel at `cache/kernel.<name>.<digest>`, the
//! digest `get_hex_digest("<name>$$<signature>$$<flags>$$<code>")`
//! (`Compiler::build`, `csrc/jit/compiler.hpp` lines 105-107): `code` is
//! the kernel's `kernel.cu`; `signature` the compiler, `NVCC<major>.<minor>`
//! or `NVRTC<major>.<minor>` (lines 197-200 and 262-264); `flags` its
//! command line (lines 50-57, 204-208 and 266-282), which names
//! `-I<deep_gemm>/include` (the installed package's directory,
//! `deep_gemm/__init__.py` lines 123-126), for NVRTC also
//! `-I<CUDA_HOME>/include`, and `--gpu-architecture=sm_<arch>` (`90a`;
//! `100f` or `100a` on the 10.x family, `device_runtime.hpp` lines 88-97).
//! None of them is in the tree: with `deep_gemm` installed anywhere else
//! (another venv, another Python) every lookup misses and DeepGEMM
//! compiles again. So a builder declares the package's directory and gkm
//! checks each key against it ([`binding`]), trying the compilers, C++
//! standards and `DG_JIT_*` debug settings DeepGEMM 2.6 can have used.

use std::fmt::Write as _;

/// The digest DeepGEMM files a kernel under: two FNV-1a hashes of `data`
/// (64-bit, seeds `0xc6a4a7935bd1e995` and `0x9e3779b97f4a7c15`), each
/// finished by SplitMix64, as 32 hex digits (`get_hex_digest`,
/// `csrc/utils/hash.hpp`).
pub(crate) fn hex_digest(data: &[u8]) -> String {
    fn fnv1a(data: &[u8], seed: u64) -> u64 {
        data.iter().fold(seed, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    }
    fn split_mix(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    let mut out = String::with_capacity(32);
    for seed in [0xc6a4_a793_5bd1_e995, 0x9e37_79b9_7f4a_7c15] {
        let _ = write!(out, "{:016x}", split_mix(fnv1a(data, seed)));
    }
    out
}

/// Which compiler DeepGEMM ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Compiler {
    Nvcc,
    Nvrtc,
}

/// What a kernel's key was found to name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Binding {
    /// The compiler signature: `NVCC12.9`, `NVRTC13.0`.
    pub(crate) compiler: String,
    /// The architecture it was compiled for: `90a`, `100f`.
    pub(crate) arch: String,
}

/// The compiler versions DeepGEMM 2.6 accepts (12.3 and later) that are
/// tried.
fn versions() -> impl Iterator<Item = (u32, u32)> {
    (3..=9).map(|m| (12, m)).chain((0..=9).map(|m| (13, m)))
}

/// The flags DeepGEMM 2.6 passes with `DG_JIT_CPP_STANDARD=std`, the
/// debug settings `verbose` (`DG_JIT_DEBUG`, `DG_JIT_PTXAS_VERBOSE` or
/// `DG_JIT_PTXAS_CHECK`), `lineinfo` (`DG_JIT_WITH_LINEINFO`) and `debug`
/// (`DG_JIT_DEBUG`, NVRTC's `--pch-verbose`).
struct Settings {
    std: u32,
    verbose: bool,
    lineinfo: bool,
    debug: bool,
}

fn flags(
    compiler: Compiler,
    (major, minor): (u32, u32),
    settings: &Settings,
    include: &str,
    cuda_home: &str,
    arch: &str,
) -> String {
    let mut flags = format!(
        "-std=c++{} --diag-suppress=39,161,174,177,186,940 \
         --ptxas-options=--register-usage-level=10",
        settings.std
    );
    if settings.verbose {
        flags.push_str(" --ptxas-options=--verbose,--warn-on-local-memory-usage");
    }
    if settings.lineinfo {
        flags.push_str(" -Xcompiler -rdynamic -lineinfo");
    }
    match compiler {
        Compiler::Nvcc => format!(
            "{flags} -I{include} --gpu-architecture=sm_{arch} \
             --compiler-options=-fPIC,-O3,-fconcepts,-Wno-deprecated-declarations,-Wno-abi \
             -O3 --expt-relaxed-constexpr --expt-extended-lambda"
        ),
        Compiler::Nvrtc => {
            // As DeepGEMM tests it: `major > 12 or minor >= 8`.
            let pch = match (major > 12 || minor >= 8, settings.debug) {
                (true, true) => "--pch --pch-verbose=true ",
                (true, false) => "--pch ",
                (false, _) => "",
            };
            format!(
                "{flags} -I{include} -I{cuda_home}/include --gpu-architecture=sm_{arch} \
                 -default-device {pch}--device-int128"
            )
        }
    }
}

/// What the key of kernel `name` (its `kernel.cu` being `code`, its cubin
/// compiled for SM `sm`) was computed from, when `digest` is DeepGEMM
/// 2.6's key of it with the `deep_gemm` package at `root` (and, for NVRTC,
/// CUDA at `cuda_home`); `None` when no compiler, standard or debug setting
/// DeepGEMM 2.6 can have used gives `digest`.
pub(crate) fn binding(
    name: &str,
    code: &[u8],
    digest: &str,
    sm: u32,
    root: &str,
    cuda_home: &str,
) -> Option<Binding> {
    let include = format!("{}/include", root.trim_end_matches('/'));
    let archs = [format!("{sm}a"), format!("{sm}f")];
    let mut data = Vec::with_capacity(code.len() + 1024);
    for compiler in [Compiler::Nvcc, Compiler::Nvrtc] {
        let all = all_settings(compiler);
        for version in versions() {
            let signature = match compiler {
                Compiler::Nvcc => format!("NVCC{}.{}", version.0, version.1),
                Compiler::Nvrtc => format!("NVRTC{}.{}", version.0, version.1),
            };
            for arch in &archs {
                for settings in &all {
                    let flags = flags(compiler, version, settings, &include, cuda_home, arch);
                    data.clear();
                    data.extend_from_slice(format!("{name}$${signature}$${flags}$$").as_bytes());
                    data.extend_from_slice(code);
                    if hex_digest(&data) == digest {
                        return Some(Binding {
                            compiler: signature,
                            arch: arch.clone(),
                        });
                    }
                }
            }
        }
    }
    None
}

/// Every setting tried: C++20 (the default), 17 and 23, each with the
/// debug settings DeepGEMM can set in each combination (`debug` sets
/// `verbose` too, and matters to NVRTC only).
fn all_settings(compiler: Compiler) -> Vec<Settings> {
    let debugs: &[bool] = match compiler {
        Compiler::Nvcc => &[false],
        Compiler::Nvrtc => &[false, true],
    };
    let mut all = Vec::new();
    for std in [20, 17, 23] {
        for &debug in debugs {
            for lineinfo in [false, true] {
                for verbose in [false, true] {
                    if debug && !verbose {
                        continue;
                    }
                    all.push(Settings {
                        std,
                        verbose,
                        lineinfo,
                        debug,
                    });
                }
            }
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Digests printed by DeepGEMM 2.6.1's own `get_hex_digest`
    /// (`csrc/utils/hash.hpp`, compiled with g++ and run on these inputs).
    #[test]
    fn the_digest_is_deepgemms() {
        assert_eq!(hex_digest(b"abc"), "6cb682c2bda63e59351d88a9dce78d10");
        assert_eq!(hex_digest(b""), "ddd805b8cbc69b1ee220a8397b1dcdaf");
    }
}

//! Inductor's C++ kernels for the CPU: the shared libraries it builds into
//! its cache's two-character directories (`<h[1:3]>/c<hash>.main.so` from
//! `.main.cpp`, `CppCodeCache.load_async`, `torch/_inductor/codecache.py`;
//! `c<hash>.so` from `.cpp` for the small programs `VecISA.check_build`
//! compiles to probe the CPU, `torch/_inductor/cpu_vec_isa.py`), read
//! without loading them.
//!
//! **The CPU ISA they need is read from the library.** Inductor compiles
//! with `-march=native` and the flags of the vector ISA it picked
//! (`VecISA._arch_flags`: `-mavx2 -mfma -mf16c` for `avx2`,
//! `-mavx512f -mavx512dq -mavx512vl -mavx512bw -mfma` for `avx512`, plus
//! `-mavx512vnni` for `avx512_vnni`, plus `-mamx-tile -mamx-bf16 -mamx-int8`
//! for `amx_tile`), and those flags are part of each kernel's key (the
//! command line is hashed into it, `load_async`'s `main_cmd_line`). torch
//! 2.13 also compiles with `-g1` (`aot_inductor.enable_line_tables`,
//! `AOT_INDUCTOR_ENABLE_LINE_TABLES`, on by default), and GCC then records
//! its switches in the library's DWARF producer string
//! (`-grecord-gcc-switches`, GCC's default): `-march=native` expanded into
//! the CPU's own flags ending in `-mtune=<cpu>`, then the switches Inductor
//! added. The ISA a kernel needs is the one whose flags follow that
//! `-mtune=`. A library without such a string (built by clang, or by a torch
//! without `-g1`) states no ISA.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::cache::elf;
use crate::cache::files::read_head;
use crate::cache::{CacheError, EntryFacts, Target};

/// One C++ library Inductor built: a kernel, or one of its ISA probes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CppKernel {
    /// The library's path below the tree it is filed in, `/`-separated
    /// (`inductor_cache/xz/cxz….main.so`).
    pub key: String,
    /// The vector ISA it was compiled for, Inductor's name (`amx_tile`,
    /// `avx512_vnni`, `avx512`, `avx2`); `None` when it records its
    /// compiler switches and they name none, or it records none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isa: Option<String>,
    /// Whether the library records the switches it was compiled with
    /// (GCC's DWARF producer string).
    #[serde(default)]
    pub switches: bool,
    /// Whether it is one of the programs Inductor builds to probe the CPU
    /// (`__avx_chk_kernel`, `__amx_chk_kernel`…), not a kernel.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub isa_check: bool,
}

impl EntryFacts for CppKernel {
    fn key(&self) -> &str {
        &self.key
    }

    /// None: a C++ kernel runs on the CPU.
    fn target(&self) -> Option<Target> {
        None
    }
}

/// The largest library read; a larger one is refused, naming it.
const MAX_LIBRARY_BYTES: u64 = 256 << 20;

/// What the symbol of each of Inductor's ISA probes ends in
/// (`cpu_vec_isa.py`: `__avx_chk_kernel`, `__avx512_bf16_chk_kernel`,
/// `__avx512_vnni_chk_kernel_1`, `__amx_chk_kernel`).
const ISA_CHECK_SYMBOL: &[u8] = b"_chk_kernel";

/// The start of GCC's DWARF producer string (`GNU C17 12.2.0 …`,
/// `GNU C++20 12.2.0 …`).
const GCC_PRODUCER: &[u8] = b"GNU C";

/// The ISAs by the flag that marks each in Inductor's switches, the
/// widest first (`VecAMX`, `VecAVX512VNNI`, `VecAVX512`, `VecAVX2`).
const ISA_FLAGS: [(&str, &str); 4] = [
    ("-mamx-tile", "amx_tile"),
    ("-mavx512vnni", "avx512_vnni"),
    ("-mavx512f", "avx512"),
    ("-mavx2", "avx2"),
];

/// Reads the library at `path`, filed as `key`. A library that is not a
/// whole ELF file (empty, truncated: Inductor would load it and fail, not
/// build it again) is a torn entry, refused naming it.
pub(crate) fn read(path: &Path, key: String) -> Result<CppKernel, CacheError> {
    let bytes = read_head(path, MAX_LIBRARY_BYTES + 1)?;
    if bytes.len() as u64 > MAX_LIBRARY_BYTES {
        return Err(CacheError::Invalid {
            what: "C++ kernel library",
            reason: format!("{}: larger than {MAX_LIBRARY_BYTES} bytes", path.display()),
        });
    }
    if let Some(why) = elf::not_whole(&bytes, bytes.len() as u64) {
        return Err(torn(path, why));
    }
    let switches = producer_switches(&bytes);
    Ok(CppKernel {
        key,
        isa: switches.as_deref().and_then(isa_of_switches),
        switches: switches.is_some(),
        isa_check: contains(&bytes, ISA_CHECK_SYMBOL),
    })
}

/// The ISA the kernels (not the ISA probes) of `kernels` were compiled for:
/// `None` when none states one. Kernels built for two ISAs are refused,
/// naming one of each: no CPU has Inductor pick both, so a node would
/// reuse only some of them.
pub(crate) fn kernels_isa<'a>(
    kernels: impl IntoIterator<Item = &'a CppKernel>,
    what: &str,
) -> Result<Option<String>, CacheError> {
    let mut found: Option<&CppKernel> = None;
    for kernel in kernels.into_iter().filter(|k| !k.isa_check) {
        let Some(isa) = &kernel.isa else { continue };
        match found {
            Some(first) if first.isa.as_ref() != Some(isa) => {
                return Err(CacheError::Invalid {
                    what: "C++ kernels",
                    reason: format!(
                        "{what} holds kernels built for two CPU ISAs ({} for {}, {} for {isa}): \
                         Inductor picks one ISA on a CPU, so no node reuses them all; build it \
                         from a cache compiled on one kind of CPU",
                        first.key,
                        first.isa.as_deref().unwrap_or_default(),
                        kernel.key
                    ),
                });
            }
            Some(_) => {}
            None => found = Some(kernel),
        }
    }
    Ok(found.and_then(|k| k.isa.clone()))
}

/// The switches of the first GCC producer string in `bytes` that records
/// `-march=`: the NUL-terminated string, split on whitespace.
fn producer_switches(bytes: &[u8]) -> Option<Vec<String>> {
    let mut at = 0;
    while let Some(found) = find(&bytes[at..], GCC_PRODUCER) {
        let start = at + found;
        let end = bytes[start..]
            .iter()
            .position(|b| *b == 0)
            .map_or(bytes.len(), |n| start + n);
        let text = String::from_utf8_lossy(&bytes[start..end]);
        if text.contains(" -march=") {
            return Some(text.split_whitespace().map(str::to_string).collect());
        }
        at = end.max(start + 1);
    }
    None
}

/// The ISA Inductor's switches name: those after the last `-mtune=`,
/// where `-march=native`'s expansion ends.
fn isa_of_switches(switches: &[String]) -> Option<String> {
    let after = switches.iter().rposition(|s| s.starts_with("-mtune="))? + 1;
    let added = &switches[after..];
    ISA_FLAGS
        .iter()
        .find(|(flag, _)| added.iter().any(|s| s == flag))
        .map(|(_, isa)| (*isa).to_string())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    find(haystack, needle).is_some()
}

fn torn(path: &Path, reason: String) -> CacheError {
    CacheError::TornEntry {
        path: path.to_path_buf(),
        reason: format!("a C++ kernel library {reason}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn switches(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn the_isa_is_what_follows_the_native_expansion() {
        // The CPU's own flags name AMX; the kernel was built for AVX2.
        let avx2 = "GNU C++20 12.2.0 -march=rocketlake -mavx512f -mamx-tile --param=l1-cache-size=48 \
                    -mtune=rocketlake -mavx2 -mfma -mf16c -g1 -O3";
        assert_eq!(isa_of_switches(&switches(avx2)).as_deref(), Some("avx2"));
        let amx = "GNU C++20 -march=rocketlake -mtune=rocketlake -mavx512f -mavx512dq -mavx512bw \
                   -mfma -mavx512vnni -mavx512vl -mamx-tile -mamx-bf16 -mamx-int8 -g1";
        assert_eq!(isa_of_switches(&switches(amx)).as_deref(), Some("amx_tile"));
        assert_eq!(isa_of_switches(&switches("GNU C++20 -march=x -g1")), None);
        assert_eq!(
            isa_of_switches(&switches("GNU C++20 -march=x -mtune=x -O3")),
            None
        );
    }

    #[test]
    fn kernels_of_two_isas_are_refused_naming_both() {
        let kernel = |key: &str, isa: &str, isa_check: bool| CppKernel {
            key: key.into(),
            isa: Some(isa.into()),
            switches: true,
            isa_check,
        };
        let probes_differ = [kernel("a", "avx2", true), kernel("b", "amx_tile", false)];
        assert_eq!(
            kernels_isa(&probes_differ, "t").unwrap().as_deref(),
            Some("amx_tile")
        );
        let err = kernels_isa(
            &[kernel("a", "avx2", false), kernel("b", "avx512", false)],
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("a for avx2") && err.contains("b for avx512"),
            "{err}"
        );
    }
}

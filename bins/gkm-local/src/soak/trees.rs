//! The small cache trees the soak delivers, one variant per change, and
//! the fingerprint a pod prints of what it reads: the `sha256sum` lines of
//! every verified path, hashed. A pod that reads a partial tree (a missing
//! file) or a mixed one (files of two variants) prints a fingerprint that is
//! no verified variant's.

use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

/// The file each variant adds to its fixture, holding the variant's name
/// (in the fixture's directory of helpers, which holds no kernel).
pub const VARIANT_FILE: &str = "NNIRBEH2OVXHBOQBWMZABZQUTHRBNTKPWP7Q45RX7SE5JGCMEUPA/soak-variant";

/// Where reader pods mount their cache.
pub const MOUNT_PATH: &str = "/cache";

/// Writes variant `name` of `fixture` into `dest`: the fixture's files,
/// plus [`VARIANT_FILE`] holding `name`.
pub fn write_variant(fixture: &Path, dest: &Path, name: &str) -> anyhow::Result<()> {
    gkm_testenv::copy_tree(fixture, dest)?;
    let marker = dest.join(VARIANT_FILE);
    if let Some(dir) = marker.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&marker, format!("{name}\n"))?;
    Ok(())
}

/// The relative paths of the regular files under `tree`, sorted.
pub fn verified_paths(tree: &Path) -> anyhow::Result<Vec<String>> {
    let mut paths: Vec<String> = gkm_testenv::tree_files(tree)?
        .into_iter()
        .map(|(path, _)| path.to_string_lossy().into_owned())
        .collect();
    paths.sort();
    Ok(paths)
}

/// The fingerprint of `tree` as a pod reading `paths` under
/// [`MOUNT_PATH`] computes it ([`read_script`]).
pub fn fingerprint(tree: &Path, paths: &[String]) -> anyhow::Result<String> {
    let mut listing = String::new();
    for path in paths {
        let bytes = std::fs::read(tree.join(path))?;
        listing.push_str(&format!(
            "{}  {}\n",
            hex::encode(Sha256::digest(&bytes)),
            mounted(path).display()
        ));
    }
    Ok(hex::encode(Sha256::digest(listing.as_bytes())))
}

fn mounted(path: &str) -> PathBuf {
    Path::new(MOUNT_PATH).join(path)
}

/// The shell loop of a reader pod: every `every_s` seconds it hashes each
/// of `paths` under [`MOUNT_PATH`] (errors included, so a missing file
/// changes the result) and appends `<unix time> READ <fingerprint>` to
/// `/out/reads.log`; a writer also writes a file of its own into its view
/// and reads it back.
pub fn read_script(paths: &[String], writes: bool, every_s: u64) -> String {
    let files: Vec<String> = paths
        .iter()
        .map(|p| format!("'{}'", mounted(p).display()))
        .collect();
    let write = if writes {
        format!(
            "echo \"$n\" > {0}/soak-scratch && [ \"$(cat {0}/soak-scratch)\" = \"$n\" ] \
             || echo \"$(date +%s) WRITE-FAILED\" >> /out/reads.log; ",
            MOUNT_PATH
        )
    } else {
        String::new()
    };
    format!(
        "n=0; while true; do n=$((n+1)); \
         h=$(for f in {files}; do sha256sum \"$f\" 2>&1; done | sha256sum | cut -d' ' -f1); \
         echo \"$(date +%s) READ $h\" >> /out/reads.log; {write}sleep {every_s}; done",
        files = files.join(" ")
    )
}

/// One line of a reader's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadLine {
    /// A read, at unix time `at`, with its fingerprint.
    Read {
        /// Unix seconds.
        at: u64,
        /// The fingerprint.
        fingerprint: String,
    },
    /// A write into a writable view that did not read back.
    WriteFailed {
        /// Unix seconds.
        at: u64,
    },
}

/// The lines of a reader's log it understands (a line cut short by a read
/// while the pod writes is skipped).
pub fn parse_reads(log: &str) -> Vec<ReadLine> {
    log.lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            let at = parts.next()?.parse().ok()?;
            match (parts.next()?, parts.next()) {
                ("READ", Some(h)) if h.len() == 64 => Some(ReadLine::Read {
                    at,
                    fingerprint: h.to_string(),
                }),
                ("WRITE-FAILED", None) => Some(ReadLine::WriteFailed { at }),
                _ => None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_fingerprint_matches_what_sha256sum_prints_in_a_pod() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("d")).unwrap();
        std::fs::write(dir.path().join("d/k.bin"), b"kernel").unwrap();
        std::fs::write(dir.path().join("z"), b"").unwrap();
        let paths = verified_paths(dir.path()).unwrap();
        assert_eq!(paths, ["d/k.bin", "z"]);
        // sha256sum's own lines for these two files under /cache, hashed.
        let listing = format!(
            "{}  /cache/d/k.bin\n{}  /cache/z\n",
            hex::encode(Sha256::digest(b"kernel")),
            hex::encode(Sha256::digest(b""))
        );
        assert_eq!(
            fingerprint(dir.path(), &paths).unwrap(),
            hex::encode(Sha256::digest(listing.as_bytes()))
        );
    }

    #[test]
    fn two_variants_have_two_fingerprints() {
        let fixture = tempfile::tempdir().unwrap();
        std::fs::write(fixture.path().join("a"), b"a").unwrap();
        let out = tempfile::tempdir().unwrap();
        write_variant(fixture.path(), &out.path().join("v1"), "v1").unwrap();
        write_variant(fixture.path(), &out.path().join("v2"), "v2").unwrap();
        let paths = verified_paths(&out.path().join("v1")).unwrap();
        assert_eq!(paths, verified_paths(&out.path().join("v2")).unwrap());
        assert_ne!(
            fingerprint(&out.path().join("v1"), &paths).unwrap(),
            fingerprint(&out.path().join("v2"), &paths).unwrap()
        );
    }

    #[test]
    fn reads_and_failed_writes_are_parsed_and_torn_lines_skipped() {
        let h = "a".repeat(64);
        let log = format!("10 READ {h}\n11 WRITE-FAILED\n12 READ abc\n13 RE");
        assert_eq!(
            parse_reads(&log),
            [
                ReadLine::Read {
                    at: 10,
                    fingerprint: h
                },
                ReadLine::WriteFailed { at: 11 }
            ]
        );
    }
}

//! A store entry's seal: a fingerprint of its tree taken when it was
//! extracted, so that a tree changed since (by anything that could write
//! into it) is noticed and extracted again rather than delivered.
//!
//! The fingerprint hashes, for every file and directory below the entry's
//! root in name order, its path, type, mode, owner, size, inode, link count
//! and its modification and change times. Writing, creating, deleting,
//! renaming or re-linking anything changes the change time (`ctime`) of the
//! file or of its directory, and no process can set a change time back
//! (only the system clock can), so a tree whose seal still matches is the
//! tree that was extracted, without reading its contents: checking a
//! 20,000-file tree costs 20,000 `lstat`s. Copying the store elsewhere
//! breaks every seal, which only costs a fresh extraction. (Times are read
//! to the nanosecond, as ext4, xfs, btrfs and tmpfs keep them; on a
//! filesystem keeping whole seconds, a rewrite of a file with the same
//! length in the very second it was sealed would go unnoticed.)
//!
//! The seal lives in the entry, beside the cache tree and the manifest
//! ([`SEAL_FILE`]), where no delivered volume reaches: the driver mounts
//! only the cache tree.

use std::fs;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use gkm_core::digest::{Digest, HashingWriter};
pub use gkm_core::store_layout::SEAL_FILE;

/// The fingerprint of an entry's tree.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Seal {
    /// The seal's format.
    pub version: u32,
    /// Files and directories below the entry's root.
    pub entries: u64,
    /// The hash of their metadata, in name order (`sha256:<hex>`).
    pub fingerprint: String,
}

/// The format [`seal`] writes.
const VERSION: u32 = 1;

/// What [`check`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SealCheck {
    /// The tree is as it was extracted.
    Intact,
    /// The entry has no seal: it was stored by a version of gkm that wrote
    /// none, when any pod given the tree could write into it.
    Missing,
    /// The tree changed since it was sealed, or the seal is unreadable.
    Broken {
        /// What differs.
        reason: String,
    },
}

/// Takes the fingerprint of the tree below `entry` (the seal file itself
/// left out).
pub fn fingerprint(entry: &Path) -> io::Result<Seal> {
    let mut hasher = HashingWriter::new(io::sink());
    let mut entries = 0;
    walk(entry, entry, &mut hasher, &mut entries)?;
    let (_, fingerprint, _): (_, Digest, _) = hasher.finish();
    Ok(Seal {
        version: VERSION,
        entries,
        fingerprint: fingerprint.to_string(),
    })
}

fn walk(
    root: &Path,
    dir: &Path,
    hasher: &mut HashingWriter<io::Sink>,
    entries: &mut u64,
) -> io::Result<()> {
    let mut children: Vec<PathBuf> = fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<io::Result<_>>()?;
    children.sort_by(|a, b| a.as_os_str().as_bytes().cmp(b.as_os_str().as_bytes()));
    for path in children {
        let rel = path.strip_prefix(root).unwrap_or(&path);
        if rel == Path::new(SEAL_FILE) {
            continue;
        }
        let meta = fs::symlink_metadata(&path)?;
        hasher.write_all(rel.as_os_str().as_bytes())?;
        writeln!(
            hasher,
            "\0{} {} {} {} {} {} {}.{} {}.{}",
            meta.mode(),
            meta.uid(),
            meta.gid(),
            meta.size(),
            meta.ino(),
            meta.nlink(),
            meta.mtime(),
            meta.mtime_nsec(),
            meta.ctime(),
            meta.ctime_nsec(),
        )?;
        *entries += 1;
        if meta.is_dir() {
            walk(root, &path, hasher, entries)?;
        }
    }
    Ok(())
}

/// Seals the tree below `entry`: writes its fingerprint to
/// `entry/`[`SEAL_FILE`]. Nothing may change the tree afterwards.
pub fn seal(entry: &Path) -> io::Result<Seal> {
    let seal = fingerprint(entry)?;
    let json = serde_json::to_vec(&seal).map_err(io::Error::other)?;
    let path = entry.join(SEAL_FILE);
    let mut file = fs::File::create(&path)?;
    file.write_all(&json)?;
    // Readable by the driver in its own container, whatever the umask.
    file.set_permissions(fs::Permissions::from_mode(0o644))?;
    file.sync_all()?;
    Ok(seal)
}

/// Whether the tree below `entry` is still the one its seal describes.
pub fn check(entry: &Path) -> SealCheck {
    let bytes = match fs::read(entry.join(SEAL_FILE)) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return SealCheck::Missing,
        Err(e) => {
            return SealCheck::Broken {
                reason: format!("reading its seal: {e}"),
            };
        }
    };
    let sealed: Seal = match serde_json::from_slice(&bytes) {
        Ok(seal) => seal,
        Err(e) => {
            return SealCheck::Broken {
                reason: format!("its seal is not one gkm wrote: {e}"),
            };
        }
    };
    if sealed.version != VERSION {
        return SealCheck::Broken {
            reason: format!("its seal has format {}, not {VERSION}", sealed.version),
        };
    }
    match fingerprint(entry) {
        Ok(now) if now == sealed => SealCheck::Intact,
        Ok(now) => SealCheck::Broken {
            reason: format!(
                "the tree changed since it was extracted ({} entries then, {} now)",
                sealed.entries, now.entries
            ),
        },
        Err(e) => SealCheck::Broken {
            reason: format!("reading the tree: {e}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::create_dir_all(dir.path().join("io.triton.cache/KEY")).expect("tree");
        fs::write(dir.path().join("io.triton.cache/KEY/k.cubin"), b"kernel").expect("file");
        fs::create_dir_all(dir.path().join("io.triton.manifest")).expect("manifest dir");
        fs::write(dir.path().join("io.triton.manifest/manifest.json"), b"{}").expect("manifest");
        dir
    }

    /// Lets the clock move on, so a change's ctime differs from the seal's
    /// even on a filesystem with coarse timestamps.
    fn tick() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    #[test]
    fn a_sealed_tree_is_intact_until_anything_in_it_changes() {
        let dir = entry();
        let root = dir.path();
        assert_eq!(check(root), SealCheck::Missing);
        let sealed = seal(root).expect("seal");
        assert_eq!(sealed.entries, 5);
        assert_eq!(check(root), SealCheck::Intact);
        // Reading changes nothing; sealing again gives the same seal.
        fs::read(root.join("io.triton.cache/KEY/k.cubin")).expect("read");
        assert_eq!(seal(root).expect("seal again"), sealed);

        type Change = fn(&Path);
        let changes: [(&str, Change); 6] = [
            ("a new key directory", |r| {
                fs::create_dir(r.join("io.triton.cache/NEWKEYAAAA")).expect("mkdir")
            }),
            ("a file rewritten with the same length", |r| {
                fs::write(r.join("io.triton.cache/KEY/k.cubin"), b"planted").expect("write")
            }),
            ("a file deleted", |r| {
                fs::remove_file(r.join("io.triton.cache/KEY/k.cubin")).expect("rm")
            }),
            ("a mode changed", |r| {
                use std::os::unix::fs::PermissionsExt;
                fs::set_permissions(
                    r.join("io.triton.cache/KEY"),
                    fs::Permissions::from_mode(0o777),
                )
                .expect("chmod")
            }),
            ("a file renamed", |r| {
                fs::rename(
                    r.join("io.triton.cache/KEY/k.cubin"),
                    r.join("io.triton.cache/KEY/j.cubin"),
                )
                .expect("mv")
            }),
            ("a file whose times were set back", |r| {
                let file = r.join("io.triton.cache/KEY/k.cubin");
                let before = fs::metadata(&file)
                    .expect("stat")
                    .modified()
                    .expect("mtime");
                fs::write(&file, b"kernel").expect("write");
                fs::File::options()
                    .write(true)
                    .open(&file)
                    .expect("open")
                    .set_modified(before)
                    .expect("touch -d");
            }),
        ];
        for (what, change) in changes {
            let dir = entry();
            seal(dir.path()).expect("seal");
            tick();
            change(dir.path());
            assert!(
                matches!(check(dir.path()), SealCheck::Broken { .. }),
                "{what} went unnoticed"
            );
        }
    }

    #[test]
    fn a_seal_that_is_not_gkms_is_broken() {
        let dir = entry();
        fs::write(dir.path().join(SEAL_FILE), b"not json").expect("write");
        let SealCheck::Broken { reason } = check(dir.path()) else {
            panic!("accepted");
        };
        assert!(reason.contains("not one gkm wrote"), "{reason}");
    }
}

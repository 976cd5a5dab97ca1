//! How a claim holds its cache so that a refill switches trees in one step
//! under running readers.
//!
//! Workloads mount the claim's root and read the tree there, as GKM lays it
//! out, so the root itself cannot be swapped. Instead:
//!
//! ```text
//! <root>/
//!   .gkm/
//!     sha256-<hex>/             a complete tree per digest, renamed into
//!                               place only once fully extracted
//!     current -> sha256-<hex>   the digest served, switched by rename(2)
//!   <entry> -> .gkm/current/<entry>   one per top-level entry of the tree
//! ```
//!
//! Every path a reader opens resolves through `.gkm/current`, so the
//! switch is the one atomic rename of that link: a path that both digests
//! hold reads wholly from the old tree or wholly from the new one, never
//! from a tree half removed or half moved in. The previous tree stays on
//! disk until the next refill, so a reader that opened it keeps a complete
//! tree; older trees are removed. The links are relative, so the tree reads
//! the same wherever the claim is mounted.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use gkm_oci::Digest;

use crate::error::{Error, Result};

/// The hidden directory holding the trees, reserved at the claim's root.
pub const STORE: &str = ".gkm";
/// The link in [`STORE`] naming the tree served.
pub const CURRENT: &str = "current";
/// Where entries found at the root that are not links into the store (a
/// claim filled before this layout) are moved, kept for one refill.
const LEGACY: &str = "legacy";
/// The prefix of a tree being extracted.
const PARTIAL: &str = "partial-";
/// The directory the previous layout built its next tree in.
const OLD_NEXT: &str = ".gkm-next";

/// A claim's root and the layout in it.
#[derive(Debug, Clone)]
pub struct Layout {
    root: PathBuf,
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The name of `digest`'s tree in the store: `sha256-<hex>`.
pub fn tree_name(digest: &Digest) -> String {
    digest.to_string().replace(':', "-")
}

impl Layout {
    /// The layout of the claim mounted at `root`.
    pub fn new(root: &Path) -> Layout {
        Layout {
            root: root.to_path_buf(),
        }
    }

    fn store(&self) -> PathBuf {
        self.root.join(STORE)
    }

    /// The directory `digest`'s complete tree is kept in.
    pub fn tree(&self, digest: &Digest) -> PathBuf {
        self.store().join(tree_name(digest))
    }

    /// Makes the store and removes what an interrupted fill left: partial
    /// trees and the previous layout's build directory. Returns a fresh
    /// directory path (not yet existing) to extract `digest` into.
    pub fn prepare(&self, digest: &Digest) -> Result<PathBuf> {
        let store = self.store();
        fs::create_dir_all(&store).map_err(io_error(&store))?;
        let old_next = self.root.join(OLD_NEXT);
        if old_next.exists() {
            fs::remove_dir_all(&old_next).map_err(io_error(&old_next))?;
        }
        for entry in fs::read_dir(&store).map_err(io_error(&store))? {
            let entry = entry.map_err(io_error(&store))?;
            if entry.file_name().to_string_lossy().starts_with(PARTIAL) {
                let path = entry.path();
                fs::remove_dir_all(&path).map_err(io_error(&path))?;
            }
        }
        Ok(store.join(format!("{PARTIAL}{}", tree_name(digest))))
    }

    /// Moves the extracted tree at `partial` into place as `digest`'s tree
    /// (a tree already there, complete, is kept and `partial` removed).
    pub fn complete(&self, digest: &Digest, partial: &Path) -> Result<PathBuf> {
        let tree = self.tree(digest);
        if tree.is_dir() {
            fs::remove_dir_all(partial).map_err(io_error(partial))?;
        } else {
            fs::rename(partial, &tree).map_err(io_error(&tree))?;
        }
        Ok(tree)
    }

    /// The digest tree `current` names now, if any.
    fn current_tree(&self) -> Option<String> {
        let link = fs::read_link(self.store().join(CURRENT)).ok()?;
        Some(link.to_string_lossy().into_owned())
    }

    /// Serves `digest`'s tree (which must be complete): switches `current`
    /// to it in one rename, links its top-level entries at the root, removes
    /// the links of entries it lacks, and removes every tree but it and the
    /// one served before.
    pub fn switch(&self, digest: &Digest) -> Result<()> {
        let store = self.store();
        let tree = self.tree(digest);
        let mut names = BTreeSet::new();
        for entry in fs::read_dir(&tree).map_err(io_error(&tree))? {
            let name = entry.map_err(io_error(&tree))?.file_name();
            if name == STORE {
                return Err(Error::InvalidSpec(format!(
                    "the image's tree has a top-level {STORE:?}, which the claim reserves for its own use"
                )));
            }
            names.insert(name);
        }
        let previous = self.current_tree();

        // The switch.
        let next = store.join(format!("{CURRENT}.next"));
        let _ = fs::remove_file(&next);
        symlink(tree_name(digest), &next).map_err(io_error(&next))?;
        let current = store.join(CURRENT);
        fs::rename(&next, &current).map_err(io_error(&current))?;

        // Links for the new tree's entries; entries of another layout move
        // into the store first.
        for name in &names {
            let at = self.root.join(name);
            let target = Path::new(STORE).join(CURRENT).join(name);
            match fs::symlink_metadata(&at) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    if fs::read_link(&at).ok().as_deref() == Some(target.as_path()) {
                        continue;
                    }
                }
                Ok(_) => {
                    let legacy = store.join(LEGACY);
                    fs::create_dir_all(&legacy).map_err(io_error(&legacy))?;
                    let aside = legacy.join(name);
                    fs::rename(&at, &aside).map_err(io_error(&aside))?;
                }
                Err(_) => {}
            }
            let tmp = store.join("link.next");
            let _ = fs::remove_file(&tmp);
            symlink(&target, &tmp).map_err(io_error(&tmp))?;
            fs::rename(&tmp, &at).map_err(io_error(&at))?;
        }

        // Links of entries the new tree lacks, and entries of another
        // layout it does not replace.
        for entry in fs::read_dir(&self.root).map_err(io_error(&self.root))? {
            let entry = entry.map_err(io_error(&self.root))?;
            let name = entry.file_name();
            if name == STORE || names.contains(&name) {
                continue;
            }
            let path = entry.path();
            let is_link = fs::symlink_metadata(&path)
                .map_err(io_error(&path))?
                .file_type()
                .is_symlink();
            if is_link {
                fs::remove_file(&path).map_err(io_error(&path))?;
            } else {
                let legacy = store.join(LEGACY);
                fs::create_dir_all(&legacy).map_err(io_error(&legacy))?;
                let aside = legacy.join(&name);
                fs::rename(&path, &aside).map_err(io_error(&aside))?;
            }
        }

        // Keep the tree served and the one served before; a claim of the
        // previous layout keeps its entries (in legacy) for one refill too.
        let keep: BTreeSet<String> = [Some(tree_name(digest)), previous.clone()]
            .into_iter()
            .flatten()
            .chain([CURRENT.to_string()])
            .chain(previous.is_none().then(|| LEGACY.to_string()))
            .collect();
        for entry in fs::read_dir(&store).map_err(io_error(&store))? {
            let entry = entry.map_err(io_error(&store))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if keep.contains(&name) || name.starts_with(PARTIAL) {
                continue;
            }
            let path = entry.path();
            let removed = if entry.file_type().map_err(io_error(&path))?.is_dir() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            removed.map_err(io_error(&path))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(byte: char) -> Digest {
        format!("sha256:{}", byte.to_string().repeat(64))
            .parse()
            .expect("a digest")
    }

    fn tree(layout: &Layout, d: &Digest, files: &[(&str, &str)]) {
        let partial = layout.prepare(d).expect("prepare");
        for (path, content) in files {
            let path = partial.join(path);
            fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            fs::write(path, content).expect("write");
        }
        layout.complete(d, &partial).expect("complete");
    }

    /// A fresh directory for one test, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let dir =
                std::env::temp_dir().join(format!("gkm-layout-{}-{name}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).expect("scratch dir");
            Scratch(dir)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn listing(root: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(root)
            .expect("read")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n != STORE)
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_refill_serves_the_new_tree_keeps_the_previous_and_drops_older() {
        let dir = Scratch::new("refill");
        let layout = Layout::new(dir.path());
        // A claim filled by the previous layout: entries at the root.
        fs::create_dir_all(dir.path().join("k/")).expect("mkdir");
        fs::write(dir.path().join("k/a"), "legacy").expect("write");

        let (one, two, three) = (digest('1'), digest('2'), digest('3'));
        tree(&layout, &one, &[("k/a", "one"), ("u/x", "one")]);
        layout.switch(&one).expect("switch");
        assert_eq!(listing(dir.path()), ["k", "u"]);
        assert_eq!(fs::read_to_string(dir.path().join("k/a")).unwrap(), "one");
        assert!(
            dir.path().join(".gkm/legacy/k/a").is_file(),
            "kept one refill"
        );

        tree(&layout, &two, &[("k/a", "two")]);
        layout.switch(&two).expect("switch");
        assert_eq!(
            listing(dir.path()),
            ["k"],
            "u went with the tree that had it"
        );
        assert_eq!(fs::read_to_string(dir.path().join("k/a")).unwrap(), "two");
        assert!(layout.tree(&one).is_dir(), "the previous tree is kept");
        assert!(!dir.path().join(".gkm/legacy").exists());

        tree(&layout, &three, &[("k/a", "three")]);
        layout.switch(&three).expect("switch");
        assert!(!layout.tree(&one).exists(), "older trees are removed");
        assert!(layout.tree(&two).is_dir());
        assert_eq!(fs::read_to_string(dir.path().join("k/a")).unwrap(), "three");
    }

    #[test]
    fn a_tree_claiming_the_reserved_name_is_refused() {
        let dir = Scratch::new("reserved");
        let layout = Layout::new(dir.path());
        let d = digest('4');
        tree(&layout, &d, &[(".gkm/x", "x")]);
        let err = layout.switch(&d).expect_err("refused").to_string();
        assert!(err.contains(".gkm"), "{err}");
    }
}

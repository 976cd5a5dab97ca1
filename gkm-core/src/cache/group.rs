//! Triton's group files, `__grp__<kernel>.json`:
//! `{"child_paths": {"<file>": "<absolute path>", …}}`, one entry for each
//! artefact of a kernel, named by the absolute path it had when it was
//! compiled. Triton takes a kernel from its cache only when the group file
//! is there and every child path exists, so the group ties a tree to the
//! directory it was built in (its build path, Triton's `TRITON_CACHE_DIR`).
//!
//! Three things are decided here, each in one place:
//! - whether a group is whole ([`check_group`]): every child is a file of
//!   the group's own directory, present and not empty, and its path ends in
//!   that directory's place in the tree; otherwise the tree is torn and is
//!   refused, naming the entry;
//! - the build path of a tree ([`build_path`]): what every group's children
//!   share above the tree, the same for all of them;
//! - a group moved to another path ([`relocate_group`]): the same children
//!   under the new path, nothing else changed.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::CacheError;
use super::files::{files, read_head, subdirs};

/// Prefix of Triton's group files.
pub(crate) const GROUP_PREFIX: &str = "__grp__";

/// The largest group file read (Triton's are well under a KiB).
const MAX_GROUP_BYTES: u64 = 1 << 20;

/// How deep below a tree's root group files are looked for (a vLLM tree
/// keeps its Triton caches a few levels down).
const MAX_DEPTH: usize = 12;

/// A group file as Triton writes it; anything else it holds is kept as is.
#[derive(Debug, Deserialize, Serialize)]
struct GroupFile {
    child_paths: BTreeMap<String, String>,
    #[serde(flatten)]
    rest: serde_json::Map<String, serde_json::Value>,
}

fn torn(group: &Path, entry: &str, reason: impl Into<String>) -> CacheError {
    CacheError::TornGroup {
        group: group.to_path_buf(),
        entry: entry.to_string(),
        reason: reason.into(),
    }
}

fn parse(group: &Path) -> Result<GroupFile, CacheError> {
    let bytes = read_head(group, MAX_GROUP_BYTES + 1)?;
    if bytes.len() as u64 > MAX_GROUP_BYTES {
        return Err(CacheError::BadMetadata {
            path: group.to_path_buf(),
            reason: format!("group file larger than {MAX_GROUP_BYTES} bytes"),
        });
    }
    serde_json::from_slice(&bytes).map_err(|e| CacheError::BadMetadata {
        path: group.to_path_buf(),
        reason: format!("not a whole group file ({{\"child_paths\": {{…}}}}): {e}"),
    })
}

/// Checks the group file `group` in the key directory `dir`, whose regular
/// files are `files`: each child must be a plain file name of `dir`,
/// present and not empty, and its recorded path must end in
/// `<key>/<file>`. Returns the absolute directory the group's kernel was
/// compiled in (the recorded paths' parent), `None` for a group with no
/// children.
pub(crate) fn check_group(
    dir: &Path,
    group: &Path,
    files: &[String],
) -> Result<Option<PathBuf>, CacheError> {
    let parsed = parse(group)?;
    let key = dir.file_name().unwrap_or_default();
    let mut built_in: Option<PathBuf> = None;
    for (name, recorded) in &parsed.child_paths {
        let plain = Path::new(name).components().count() == 1
            && matches!(
                Path::new(name).components().next(),
                Some(Component::Normal(_))
            );
        if !plain {
            return Err(torn(
                group,
                name,
                "not a file name of the group's directory",
            ));
        }
        if !files.iter().any(|f| f == name) {
            return Err(torn(group, name, "missing from the tree"));
        }
        let len = std::fs::metadata(dir.join(name))
            .map_err(|source| CacheError::Io {
                path: dir.join(name),
                source,
            })?
            .len();
        if len == 0 {
            return Err(torn(group, name, "empty"));
        }
        let recorded = Path::new(recorded);
        let parent = recorded.parent().unwrap_or(Path::new(""));
        let in_place = recorded.is_absolute()
            && recorded.file_name() == Some(std::ffi::OsStr::new(name))
            && parent.file_name() == Some(key)
            && !recorded.components().any(|c| c == Component::ParentDir);
        if !in_place {
            return Err(torn(
                group,
                name,
                format!(
                    "recorded at {}, outside the group's directory",
                    recorded.display()
                ),
            ));
        }
        match &built_in {
            Some(dir) if dir != parent => {
                return Err(torn(
                    group,
                    name,
                    format!(
                        "recorded in {}, not in {} with the other children",
                        parent.display(),
                        dir.display()
                    ),
                ));
            }
            _ => built_in = Some(parent.to_path_buf()),
        }
    }
    Ok(built_in)
}

/// The group files in the key directory `dir` whose regular files are
/// `files`.
pub(crate) fn groups_in(dir: &Path, files: &[String]) -> Vec<PathBuf> {
    files
        .iter()
        .filter(|f| f.starts_with(GROUP_PREFIX) && f.ends_with(".json"))
        .map(|f| dir.join(f))
        .collect()
}

/// The path a cache tree rooted at `root` was built at: the directory that,
/// with each group's place below `root` appended, gives the directory its
/// children were recorded in. `None` when the tree holds no group file (a
/// tree with nothing Triton loads through a group is at home anywhere).
///
/// Refused, naming the group: a torn group (see the [module](self)), a
/// group whose recorded directory does not end in its place below `root`,
/// and two groups built at different paths.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let key = dir.path().join("KEY");
/// std::fs::create_dir(&key)?;
/// std::fs::write(key.join("k.json"), b"{}")?;
/// std::fs::write(
///     key.join("__grp__k.json"),
///     br#"{"child_paths": {"k.json": "/home/ci/.triton/cache/KEY/k.json"}}"#,
/// )?;
/// let built = gkm_core::cache::build_path(dir.path())?;
/// assert_eq!(built.as_deref(), Some(std::path::Path::new("/home/ci/.triton/cache")));
/// # Ok(()) }
/// ```
pub fn build_path(root: &Path) -> Result<Option<PathBuf>, CacheError> {
    Ok(placed_groups(root)?.into_iter().next().map(|g| g.base))
}

/// A group file of a tree, where its tree was built.
struct PlacedGroup {
    /// The group file.
    group: PathBuf,
    /// The tree's build path, by this group.
    base: PathBuf,
}

/// Every group file below `root` (within [`MAX_DEPTH`]) with children,
/// each checked ([`check_group`]) and placed: all must agree on the tree's
/// build path, or the second that does not is refused.
fn placed_groups(root: &Path) -> Result<Vec<PlacedGroup>, CacheError> {
    let mut placed: Vec<PlacedGroup> = Vec::new();
    let mut pending = vec![(root.to_path_buf(), 0usize)];
    while let Some((dir, depth)) = pending.pop() {
        let names = files(&dir)?;
        for group in groups_in(&dir, &names) {
            let Some(built_in) = check_group(&dir, &group, &names)? else {
                continue;
            };
            let place = dir.strip_prefix(root).unwrap_or(&dir);
            let base = strip_suffix(&built_in, place).ok_or_else(|| {
                torn(
                    &group,
                    "child_paths",
                    format!(
                        "recorded in {}, which does not end in the group's place {} in the tree",
                        built_in.display(),
                        place.display()
                    ),
                )
            })?;
            if let Some(first) = placed.first().filter(|first| first.base != base) {
                return Err(torn(
                    &group,
                    "child_paths",
                    format!(
                        "built at {} but {} was built at {}",
                        base.display(),
                        first.group.display(),
                        first.base.display()
                    ),
                ));
            }
            placed.push(PlacedGroup { group, base });
        }
        if depth < MAX_DEPTH {
            pending.extend(subdirs(&dir)?.into_iter().map(|d| (d, depth + 1)));
        }
    }
    Ok(placed)
}

/// The group files of the tree at `root` as they read with the tree moved
/// to `to`: each group's path relative to `root` and its relocated bytes
/// ([`relocate_group`]). Empty when the tree holds no group with children,
/// or was built at `to`. Refused as [`build_path`] refuses.
pub fn relocated_groups(root: &Path, to: &Path) -> Result<Vec<(PathBuf, Vec<u8>)>, CacheError> {
    let mut out = Vec::new();
    for placed in placed_groups(root)? {
        if placed.base == to {
            return Ok(Vec::new());
        }
        let bytes = read_head(&placed.group, MAX_GROUP_BYTES)?;
        let relative = placed
            .group
            .strip_prefix(root)
            .unwrap_or(&placed.group)
            .to_path_buf();
        out.push((relative, relocate_group(&bytes, &placed.base, to)?));
    }
    Ok(out)
}

/// `path` without `suffix` at its end, component by component.
fn strip_suffix(path: &Path, suffix: &Path) -> Option<PathBuf> {
    let path: Vec<Component> = path.components().collect();
    let suffix: Vec<Component> = suffix.components().collect();
    let keep = path.len().checked_sub(suffix.len())?;
    (path[keep..] == suffix[..]).then(|| path[..keep].iter().collect())
}

/// The group file `bytes`, its children recorded under `to` instead of
/// `from` (the build path a tree moves from and the path it is mounted
/// at); everything else in the file is kept. Refused when a child is not
/// recorded under `from`.
///
/// ```
/// use std::path::Path;
/// let group = br#"{"child_paths": {"k.json": "/home/ci/.triton/cache/KEY/k.json"}}"#;
/// let moved = gkm_core::cache::relocate_group(
///     group,
///     Path::new("/home/ci/.triton/cache"),
///     Path::new("/root/.triton/cache"),
/// )
/// .unwrap();
/// let moved: serde_json::Value = serde_json::from_slice(&moved).unwrap();
/// assert_eq!(moved["child_paths"]["k.json"], "/root/.triton/cache/KEY/k.json");
/// ```
pub fn relocate_group(bytes: &[u8], from: &Path, to: &Path) -> Result<Vec<u8>, CacheError> {
    let invalid = |reason: String| CacheError::Invalid {
        what: "Triton group file",
        reason,
    };
    let mut group: GroupFile = serde_json::from_slice(bytes).map_err(|e| invalid(e.to_string()))?;
    for (name, recorded) in group.child_paths.iter_mut() {
        let below = Path::new(recorded.as_str())
            .strip_prefix(from)
            .map_err(|_| {
                invalid(format!(
                    "child {name} is recorded at {recorded}, not under {}",
                    from.display()
                ))
            })?;
        let moved = to.join(below);
        *recorded = moved
            .to_str()
            .ok_or_else(|| invalid(format!("{} is not UTF-8", moved.display())))?
            .to_string();
    }
    serde_json::to_vec(&group).map_err(|e| invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    const BUILT: &str = "/home/ci/.triton/cache";

    fn key_dir(root: &Path, key: &str, children: &[(&str, &str)]) -> PathBuf {
        let dir = root.join(key);
        fs::create_dir_all(&dir).unwrap();
        let mut paths = serde_json::Map::new();
        for (name, content) in children {
            fs::write(dir.join(name), content).unwrap();
            paths.insert((*name).into(), format!("{BUILT}/{key}/{name}").into());
        }
        let group = serde_json::json!({ "child_paths": paths });
        fs::write(dir.join("__grp__k.json"), group.to_string()).unwrap();
        dir
    }

    fn checked(dir: &Path) -> Result<Option<PathBuf>, CacheError> {
        let names = files(dir).unwrap();
        check_group(dir, &dir.join("__grp__k.json"), &names)
    }

    #[test]
    fn a_whole_group_gives_the_directory_it_was_built_in() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = key_dir(tmp.path(), "KEY", &[("k.json", "{}"), ("k.cubin", "x")]);
        assert_eq!(
            checked(&dir).unwrap(),
            Some(PathBuf::from(format!("{BUILT}/KEY")))
        );
        assert_eq!(build_path(tmp.path()).unwrap(), Some(PathBuf::from(BUILT)));
    }

    #[test]
    fn a_torn_group_is_refused_naming_the_entry() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = key_dir(tmp.path(), "KEY", &[("k.json", "{}"), ("k.cubin", "x")]);
        fs::remove_file(dir.join("k.cubin")).unwrap();
        let err = checked(&dir).unwrap_err().to_string();
        assert!(err.contains("k.cubin") && err.contains("missing"), "{err}");

        fs::write(dir.join("k.cubin"), "").unwrap();
        let err = checked(&dir).unwrap_err().to_string();
        assert!(err.contains("k.cubin") && err.contains("empty"), "{err}");

        for (name, recorded) in [
            ("k.cubin", "/elsewhere/OTHER/k.cubin".to_string()),
            ("k.cubin", format!("{BUILT}/KEY/../OTHER/KEY/k.cubin")),
            ("k.cubin", "KEY/k.cubin".to_string()),
            ("../k.cubin", format!("{BUILT}/KEY/../k.cubin")),
        ] {
            fs::write(dir.join("k.cubin"), "x").unwrap();
            let group = serde_json::json!({ "child_paths": { name: recorded } });
            fs::write(dir.join("__grp__k.json"), group.to_string()).unwrap();
            let err = checked(&dir).unwrap_err().to_string();
            assert!(err.contains(name), "{name} {recorded}: {err}");
        }

        fs::write(dir.join("__grp__k.json"), br#"{"child_paths": {"k.js"#).unwrap();
        let err = checked(&dir).unwrap_err().to_string();
        assert!(
            err.contains("__grp__k.json") && err.contains("not a whole group"),
            "{err}"
        );
    }

    #[test]
    fn groups_built_at_two_paths_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        key_dir(tmp.path(), "A", &[("k.json", "{}")]);
        let b = key_dir(tmp.path(), "B", &[("k.json", "{}")]);
        fs::write(
            b.join("__grp__k.json"),
            br#"{"child_paths": {"k.json": "/other/B/k.json"}}"#,
        )
        .unwrap();
        let err = build_path(tmp.path()).unwrap_err().to_string();
        assert!(err.contains("/other") && err.contains(BUILT), "{err}");
    }

    #[test]
    fn a_trees_groups_relocate_to_a_new_path_and_not_to_their_own() {
        let tmp = tempfile::tempdir().unwrap();
        key_dir(tmp.path(), "A", &[("k.json", "{}")]);
        key_dir(tmp.path(), "B", &[("k.json", "{}"), ("k.ptx", "x")]);
        let moved = relocated_groups(tmp.path(), Path::new("/mnt/cache")).unwrap();
        let names: Vec<_> = moved.iter().map(|(p, _)| p.clone()).collect();
        assert_eq!(names.len(), 2);
        assert!(
            names.contains(&PathBuf::from("A/__grp__k.json")),
            "{names:?}"
        );
        for (path, bytes) in &moved {
            let doc: serde_json::Value = serde_json::from_slice(bytes).unwrap();
            let key = path.parent().unwrap().display().to_string();
            assert_eq!(
                doc["child_paths"]["k.json"],
                format!("/mnt/cache/{key}/k.json")
            );
        }
        assert!(
            relocated_groups(tmp.path(), Path::new(BUILT))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn relocating_a_group_moves_every_child_and_keeps_the_rest() {
        let group = format!(
            r#"{{"child_paths": {{"k.json": "{BUILT}/KEY/k.json", "k.ptx": "{BUILT}/KEY/k.ptx"}}, "extra": 1}}"#
        );
        let moved =
            relocate_group(group.as_bytes(), Path::new(BUILT), Path::new("/root/cache")).unwrap();
        let moved: serde_json::Value = serde_json::from_slice(&moved).unwrap();
        assert_eq!(moved["child_paths"]["k.json"], "/root/cache/KEY/k.json");
        assert_eq!(moved["child_paths"]["k.ptx"], "/root/cache/KEY/k.ptx");
        assert_eq!(moved["extra"], 1);
        let err = relocate_group(group.as_bytes(), Path::new("/nope"), Path::new("/x"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("k.json") && err.contains("/nope"), "{err}");
    }
}

//! The documentation holds together: every relative link in `README.md` and
//! `docs/*.md` reaches a file, and every `#anchor` a heading of its page
//! (GitHub's slugs); the layout tables of `docs/architecture.md` name
//! exactly what `ls` shows in the directories they describe; and `README.md`
//! stays a front page (short, `helm install` near the top, "Run it" and
//! "Test it" first).
//!
//! A layout table follows a marker line `<!-- layout: DIR -->` (`.` for the
//! repository's root; `<!-- layout: DIR dirs -->` compares directories only),
//! and the first cell of each row names an entry: `name/` for a directory,
//! `name` for a file. What `ls` shows is what git tracks or would track (not
//! ignored), that exists, with no leading dot.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

/// The most lines the front page may have.
const README_MAX_LINES: usize = 300;
/// `helm install` must appear within this many lines of the front page.
const HELM_INSTALL_WITHIN: usize = 100;
/// The front page's first sections, in order.
const README_FIRST_SECTIONS: [&str; 2] = ["Run it", "Test it"];
/// The page whose layout tables are checked against the tree.
const LAYOUT_PAGE: &str = "docs/architecture.md";

fn root() -> PathBuf {
    gkm_testenv::repo_root()
}

/// `README.md` and every `docs/*.md`, relative to the root.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![PathBuf::from("README.md")];
    let mut docs: Vec<PathBuf> = fs::read_dir(root().join("docs"))
        .expect("reading docs/")
        .map(|entry| entry.expect("reading docs/").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .map(|path| {
            path.strip_prefix(root())
                .expect("docs/ is under the root")
                .to_path_buf()
        })
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

fn read(page: &Path) -> String {
    fs::read_to_string(root().join(page))
        .unwrap_or_else(|e| panic!("reading {}: {e}", page.display()))
}

/// The lines of a page outside fenced code blocks, with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<char> = None;
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ['`', '~']
            .into_iter()
            .find(|&c| trimmed.chars().take(3).filter(|&x| x == c).count() == 3);
        match (fence, marker) {
            (None, Some(c)) => fence = Some(c),
            (Some(open), Some(c)) if open == c && trimmed.trim_end().chars().all(|x| x == c) => {
                fence = None
            }
            (None, None) => lines.push((index + 1, line)),
            _ => {}
        }
    }
    lines
}

/// A heading's level and text, if the line is an ATX heading.
fn heading(line: &str) -> Option<(usize, &str)> {
    let level = line.chars().take_while(|&c| c == '#').count();
    if !(1..=6).contains(&level) {
        return None;
    }
    let rest = &line[level..];
    if !rest.starts_with(' ') {
        return None;
    }
    Some((level, rest.trim().trim_end_matches('#').trim_end()))
}

/// The text a heading renders: code spans and emphasis lose their marks,
/// links keep their text.
fn rendered(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if c == '['
            && let Some(close) = rest.find("](")
            && let Some(end) = rest[close..].find(')')
        {
            out.push_str(&rest[1..close]);
            rest = &rest[close + end + 1..];
            continue;
        }
        if c != '`' && c != '*' {
            out.push(c);
        }
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// GitHub's anchor of a heading: lowercase, punctuation but `-` and `_`
/// dropped, spaces to `-`.
fn slug(text: &str) -> String {
    rendered(text)
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor of a page, duplicates numbered `-1`, `-2`… as GitHub does.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let Some((_, title)) = heading(line) else {
            continue;
        };
        let base = slug(title);
        let count = seen.entry(base.clone()).or_insert(0);
        let anchor = if *count == 0 {
            base.clone()
        } else {
            format!("{base}-{count}")
        };
        *count += 1;
        anchors.insert(anchor);
    }
    anchors
}

/// The line with its code spans blanked, so links shown as code are not read.
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(' ');
        } else if in_code {
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    out
}

/// The targets of a line's inline links and images, and of a reference
/// definition (`[name]: target`).
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut targets = Vec::new();
    let trimmed = line.trim_start();
    if trimmed.starts_with('[')
        && let Some(close) = trimmed.find("]:")
        && let Some(target) = trimmed[close + 2..].split_whitespace().next()
    {
        targets.push(target.trim_matches(['<', '>']).to_string());
    }
    let mut rest = line.as_str();
    while let Some(open) = rest.find("](") {
        let after = &rest[open + 2..];
        let mut depth = 0usize;
        let end = after
            .char_indices()
            .find(|&(_, c)| match c {
                '(' => {
                    depth += 1;
                    false
                }
                ')' if depth == 0 => true,
                ')' => {
                    depth -= 1;
                    false
                }
                _ => false,
            })
            .map_or(after.len(), |(i, _)| i);
        let target = after[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.trim_matches(['<', '>']).to_string());
        rest = &after[end..];
    }
    targets
}

fn is_external(target: &str) -> bool {
    target.contains("://") || target.starts_with("mailto:")
}

/// `a/../b` to `b`, without touching the file system.
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// What is wrong with one link of `page`, if anything.
fn broken(page: &Path, target: &str) -> Option<String> {
    if target.is_empty() {
        return Some("empty link target".into());
    }
    let (file, anchor) = match target.split_once('#') {
        Some((file, anchor)) => (file, Some(anchor)),
        None => (target, None),
    };
    let linked = if file.is_empty() {
        page.to_path_buf()
    } else {
        normalise(&page.parent().unwrap_or(Path::new("")).join(file))
    };
    let on_disk = root().join(&linked);
    if !on_disk.exists() {
        return Some(format!("{} does not exist", linked.display()));
    }
    let anchor = anchor?;
    if linked.extension().is_none_or(|ext| ext != "md") {
        return None;
    }
    let known = anchors(&read(&linked));
    if known.contains(anchor) {
        None
    } else {
        Some(format!(
            "{} has no heading with the anchor #{anchor} (its anchors: {})",
            linked.display(),
            known.into_iter().collect::<Vec<_>>().join(", ")
        ))
    }
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = read(&page);
        for (number, line) in prose_lines(&text) {
            for target in link_targets(line) {
                if is_external(&target) {
                    continue;
                }
                checked += 1;
                if let Some(why) = broken(&page, &target) {
                    failures.push(format!(
                        "{}:{number}: link ({target}): {why}",
                        page.display()
                    ));
                }
            }
        }
    }
    assert!(checked > 0, "no relative link found in README.md or docs/");
    assert!(
        failures.is_empty(),
        "broken links:\n{}",
        failures.join("\n")
    );
}

/// One entry a layout table names, or `ls` shows.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    name: String,
    dir: bool,
}

impl std::fmt::Display for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", self.name, if self.dir { "/" } else { "" })
    }
}

/// A layout table: the directory it describes, whether it names directories
/// only, and its entries with their lines.
struct LayoutTable {
    marker_line: usize,
    dir: String,
    dirs_only: bool,
    entries: Vec<(usize, Entry)>,
}

fn layout_tables(text: &str) -> Vec<LayoutTable> {
    let lines: Vec<(usize, &str)> = prose_lines(text);
    let mut tables = Vec::new();
    for (position, &(number, line)) in lines.iter().enumerate() {
        let Some(spec) = line
            .trim()
            .strip_prefix("<!-- layout:")
            .and_then(|rest| rest.strip_suffix("-->"))
        else {
            continue;
        };
        let mut words = spec.split_whitespace();
        let dir = words
            .next()
            .unwrap_or(".")
            .trim_end_matches('/')
            .to_string();
        let dirs_only = words.next() == Some("dirs");
        let rows = lines[position + 1..]
            .iter()
            .skip_while(|(_, l)| l.trim().is_empty())
            .take_while(|(_, l)| l.trim_start().starts_with('|'))
            .skip(2);
        let entries = rows
            .map(|&(row_number, row)| {
                let cell = row
                    .trim()
                    .trim_start_matches('|')
                    .split('|')
                    .next()
                    .unwrap_or("");
                let name = cell.trim().trim_matches('`');
                let entry = match name.strip_suffix('/') {
                    Some(dir) => Entry {
                        name: dir.to_string(),
                        dir: true,
                    },
                    None => Entry {
                        name: name.to_string(),
                        dir: false,
                    },
                };
                (row_number, entry)
            })
            .collect();
        tables.push(LayoutTable {
            marker_line: number,
            dir,
            dirs_only,
            entries,
        });
    }
    tables
}

/// What `ls DIR` shows of the repository: entries git tracks or would track
/// (untracked but not ignored) that exist, without dot entries.
fn listed(dir: &str) -> BTreeSet<Entry> {
    let base = root().join(dir);
    let git = Command::new("git")
        .current_dir(&base)
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
            "--",
            ".",
        ])
        .output();
    let mut entries = BTreeSet::new();
    match git {
        Ok(out) if out.status.success() => {
            for path in out.stdout.split(|&b| b == 0).filter(|p| !p.is_empty()) {
                let path = String::from_utf8_lossy(path);
                let mut parts = path.splitn(2, '/');
                let name = parts.next().unwrap_or_default().to_string();
                let dir = parts.next().is_some();
                if !name.starts_with('.') && base.join(&name).exists() {
                    entries.insert(Entry { name, dir });
                }
            }
        }
        _ => {
            // No git (a source tarball): what is there, less what builds and
            // Python leave behind.
            for entry in fs::read_dir(&base).unwrap_or_else(|e| panic!("reading {dir}: {e}")) {
                let entry = entry.unwrap_or_else(|e| panic!("reading {dir}: {e}"));
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') || name == "target" || name == "__pycache__" {
                    continue;
                }
                let dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
                entries.insert(Entry { name, dir });
            }
        }
    }
    entries
}

#[test]
fn the_layout_tables_name_what_ls_shows() {
    let page = Path::new(LAYOUT_PAGE);
    let tables = layout_tables(&read(page));
    assert!(
        !tables.is_empty(),
        "{LAYOUT_PAGE}: no layout table (a `<!-- layout: DIR -->` line before a table)"
    );
    let mut failures = Vec::new();
    for table in tables {
        let where_ = format!(
            "{LAYOUT_PAGE}:{} (layout of {}/)",
            table.marker_line, table.dir
        );
        if table.entries.is_empty() {
            failures.push(format!("{where_}: no table rows follow the marker"));
            continue;
        }
        let shown: BTreeSet<Entry> = listed(&table.dir)
            .into_iter()
            .filter(|e| !table.dirs_only || e.dir)
            .collect();
        let mut named = BTreeSet::new();
        for (line, entry) in &table.entries {
            if table.dirs_only && !entry.dir {
                failures.push(format!(
                    "{LAYOUT_PAGE}:{line}: `{entry}`: this table names directories only"
                ));
            }
            if !named.insert(entry.clone()) {
                failures.push(format!("{LAYOUT_PAGE}:{line}: `{entry}` is named twice"));
            }
            if !shown.contains(entry) {
                let other = Entry {
                    name: entry.name.clone(),
                    dir: !entry.dir,
                };
                let why = if shown.contains(&other) {
                    format!("`ls {}` shows it as `{other}`", table.dir)
                } else {
                    format!("`ls {}` does not show it", table.dir)
                };
                failures.push(format!("{LAYOUT_PAGE}:{line}: `{entry}`: {why}"));
            }
        }
        for entry in shown.difference(&named) {
            failures.push(format!(
                "{where_}: `ls {}` shows `{entry}`, which the table does not name",
                table.dir
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "layout tables out of date:\n{}",
        failures.join("\n")
    );
}

#[test]
fn the_readme_is_a_front_page_with_helm_install_near_the_top() {
    let text = read(Path::new("README.md"));
    let lines = text.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md:{lines}: {lines} lines, more than the {README_MAX_LINES} a front page may have; move sections to docs/"
    );
    let helm = text
        .lines()
        .position(|line| line.contains("helm install"))
        .map(|index| index + 1);
    match helm {
        Some(line) => assert!(
            line <= HELM_INSTALL_WITHIN,
            "README.md:{line}: the first `helm install` is past line {HELM_INSTALL_WITHIN}"
        ),
        None => panic!("README.md: no `helm install`"),
    }
}

#[test]
fn the_readme_starts_with_run_it_and_test_it() {
    let text = read(Path::new("README.md"));
    let sections: Vec<(usize, &str)> = prose_lines(&text)
        .into_iter()
        .filter_map(|(number, line)| {
            heading(line)
                .filter(|(level, _)| *level == 2)
                .map(|(_, title)| (number, title))
        })
        .take(README_FIRST_SECTIONS.len())
        .collect();
    for (position, want) in README_FIRST_SECTIONS.iter().enumerate() {
        match sections.get(position) {
            Some((_, title)) if title == want => {}
            Some((line, title)) => panic!(
                "README.md:{line}: section {} is \"{title}\", expected \"{want}\"",
                position + 1
            ),
            None => panic!(
                "README.md: fewer than {} `## ` sections; expected \"{want}\"",
                position + 1
            ),
        }
    }
}

#[test]
fn slugs_follow_githubs_rules() {
    assert_eq!(
        slug("PVC delivery (GKM's modes)"),
        "pvc-delivery-gkms-modes"
    );
    assert_eq!(
        slug("Image volumes (Kubernetes 1.36)"),
        "image-volumes-kubernetes-136"
    );
    assert_eq!(slug("The `gkm` command"), "the-gkm-command");
    assert_eq!(slug("`hack/`"), "hack");
    assert_eq!(slug("snake_case and-dash"), "snake_case-and-dash");
    assert_eq!(
        slug("GPUs a cache fits, through DRA"),
        "gpus-a-cache-fits-through-dra"
    );
    let dup = anchors("# A\n## A\n```\n# not a heading\n```\n### A\n");
    assert_eq!(
        dup,
        ["a", "a-1", "a-2"]
            .into_iter()
            .map(String::from)
            .collect::<BTreeSet<_>>()
    );
}

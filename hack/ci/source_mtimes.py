#!/usr/bin/env python3
"""Keeps a warm CI build warm on a fresh clone.

Cargo decides that a workspace crate must be rebuilt when one of its source
files is newer than its last build. A fresh clone makes every file new, so
each CI run rebuilt (and re-linted) every workspace crate although most of
them had not changed since the run before. With this script:

  source_mtimes.py record MANIFEST    # after a run that built the whole tree
  source_mtimes.py restore MANIFEST   # on the next clone, before any build

`record` writes what git knows of each tracked file (`git ls-files -s`:
mode, blob id, path).
`restore` gives every file whose mode, content and path are unchanged since
the recorded run an old modification time (2000-01-01), so that cargo finds
it older than that run's build; a changed or new file keeps its fresh time,
and every crate that reads it is rebuilt. It then deletes MANIFEST: a run
that fails before recording again leaves a build of unknown content behind,
and the run after it rebuilds from fresh times, as without this script.

This is sound only while nothing but CI builds into the target directory the
manifest lives in (.ci/run's default, $HOME/.cache/gkm-ci/target).
"""

import os
import subprocess
import sys

OLD = 946684800  # 2000-01-01T00:00:00Z


def ls_files():
    """`git ls-files -s -z`: mode, blob id, stage and path of each file."""
    return subprocess.run(
        ["git", "ls-files", "-s", "-z"], check=True, capture_output=True
    ).stdout


def entries(listing):
    """The (mode, blob, path) of each file in a `git ls-files -s -z` listing."""
    files = set()
    for record in listing.split(b"\0"):
        if record:
            meta, path = record.split(b"\t", 1)
            mode, blob, _stage = meta.split(b" ")
            files.add((mode, blob, path))
    return files


def record(manifest):
    os.makedirs(os.path.dirname(manifest) or ".", exist_ok=True)
    with open(manifest + ".tmp", "wb") as f:
        f.write(ls_files())
    os.replace(manifest + ".tmp", manifest)


def restore(manifest):
    try:
        with open(manifest, "rb") as f:
            built = entries(f.read())
    except FileNotFoundError:
        print("source times: no record of a whole build; every crate is rebuilt")
        return
    os.remove(manifest)
    now = entries(ls_files())
    unchanged = now & built
    for mode, _blob, path in unchanged:
        os.utime(path, (OLD, OLD), follow_symlinks=mode != b"120000")
    print(
        f"source times: {len(now) - len(unchanged)} of {len(now)} files changed "
        "since the last whole build; only the crates that read them are rebuilt"
    )


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("record", "restore"):
        sys.exit("usage: source_mtimes.py record|restore MANIFEST")
    {"record": record, "restore": restore}[sys.argv[1]](sys.argv[2])

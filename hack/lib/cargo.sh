# shellcheck shell=bash
# The one place gkm's scripts learn where cargo builds. Source it; it sets
# ROOT (the workspace root) from its own place unless ROOT is set.

ROOT=${ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}

# The target directory cargo itself uses (CARGO_TARGET_DIR, build.target-dir
# in a configuration file, or the workspace's target/), printed.
cargo_target_dir() {
  (cd "$ROOT" && cargo metadata --no-deps --format-version 1) |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])'
}

# Sets EXTENDER to a release gkm-scheduler-extender built from this tree,
# unless EXTENDER already names a binary.
extender_binary() {
  if [[ -z ${EXTENDER:-} ]]; then
    (cd "$ROOT" && cargo build --release -q -p gkm-scheduler-extender --bin gkm-scheduler-extender)
    EXTENDER=$(cargo_target_dir)/release/gkm-scheduler-extender
  fi
}

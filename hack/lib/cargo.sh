# shellcheck shell=bash
# What the benchmark scripts share about building with cargo. Source it
# after setting ROOT (the workspace root).

# The target directory cargo itself uses (it may be set by configuration
# or by a wrapper), printed.
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

#!/usr/bin/env bash
# The whole test suite, as README.md gives it and CI runs it:
#   1. the pinned real components (hack/components.sh; cached, a warm run builds nothing),
#   2. formatting, lints, and every test (unit, integration against the real
#      components, doc tests, examples),
#   3. a check that no process started by the tests outlived them.
#
#   hack/test.sh          # everything (CI)
#   hack/test.sh --fast   # formatting, lints, and every test that starts no
#                         # real component (no apiserver, registry, kubelet,
#                         # cosign, helm): unit, property and doc tests, and
#                         # the integration tests that do not use gkm-testenv
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*"; }

# The integration test targets, as `-p PACKAGE --test NAME`, whose sources
# (the file and the `mod` files it includes) start no real component: they
# never name gkm-testenv or gkm-local, the crates that start them.
fast_test_targets() {
  local file dir pkg name mods m
  for file in gkm-*/tests/*.rs gkm-k8s/*/tests/*.rs bins/*/tests/*.rs; do
    dir=$(dirname "$file")
    mods=("$file")
    for m in $(sed -n 's/^ *mod \([a-z_0-9]*\);.*/\1/p' "$file"); do
      [[ -e $dir/$m/mod.rs ]] && mods+=("$dir/$m/mod.rs")
      [[ -e $dir/$m.rs ]] && mods+=("$dir/$m.rs")
    done
    grep -qE 'gkm_testenv|gkm_local' "${mods[@]}" && continue
    pkg=$(sed -n 's/^name = "\(.*\)"/\1/p' "$(dirname "$dir")/Cargo.toml" | head -1)
    name=$(basename "$file" .rs)
    printf -- '-p %s --test %s\n' "$pkg" "$name"
  done
}

if [[ ${1:-} == --fast ]]; then
  step "cargo fmt --check"
  cargo fmt --all -- --check
  step "cargo clippy -D warnings"
  cargo clippy --workspace --all-targets --locked -- -D warnings
  step "cargo test: unit and property tests, examples"
  cargo test --workspace --lib --bins --examples --locked
  step "cargo test: integration tests that start no real component"
  # shellcheck disable=SC2046 # one word per flag
  cargo test --locked $(fast_test_targets)
  step "cargo test --doc"
  cargo test --workspace --doc --locked
  exit 0
fi

hack/components.sh

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo build --bins (the end-to-end tests run the binaries)"
cargo build --workspace --bins --locked

step "cargo test"
cargo test --workspace --all-targets --locked
step "cargo test --doc"
cargo test --workspace --doc --locked

step "no process outlived the tests"
tools_dir=${GKM_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gkm-tools}
if strays=$(pgrep -a -f "$tools_dir/|docker-registry serve|/gkm-test-" ); then
  echo "processes left behind by the tests:" >&2
  echo "$strays" >&2
  exit 1
fi
echo "none"

step "no mount, bridge or network namespace outlived the tests"
leftovers=$(grep -F "/gkm-test-" /proc/self/mountinfo || true)
leftovers+=$(ip -o link show type bridge 2>/dev/null | grep -o "gkmb[0-9a-f]*n[0-9]*" || true)
leftovers+=$(find /var/log/containers -maxdepth 1 -lname "*/gkm-test-*" 2>/dev/null || true)
if [[ -n $leftovers ]]; then
  echo "left behind by the tests:" >&2
  echo "$leftovers" >&2
  exit 1
fi
echo "none"

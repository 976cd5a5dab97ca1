#!/usr/bin/env bash
# The whole test suite, as README.md gives it and CI runs it:
#   1. the pinned real components (hack/components.sh; cached, a warm run builds nothing),
#   2. formatting, lints, and every test (unit, integration against the real
#      components, doc tests, examples),
#   3. a check that no process started by the tests outlived them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

hack/components.sh

step() { printf '\n==> %s\n' "$*"; }

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

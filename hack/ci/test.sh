#!/usr/bin/env bash
# The whole test suite, as README.md gives it and CI runs it:
#   1. the pinned real components (hack/ci/components.sh; cached, a warm run builds nothing),
#   2. formatting, lints, and every test (unit, integration against the real
#      components, doc tests, examples),
#   3. a check that no process started by the tests outlived them.
#
#   hack/ci/test.sh          # everything (CI)
#   hack/ci/test.sh --fast   # formatting, lints, and every test that starts no
#                         # real component (no apiserver, registry, kubelet,
#                         # cosign, helm): unit, property and doc tests, and
#                         # the integration tests that do not use gkm-testenv
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=hack/lib/cargo.sh
. hack/lib/cargo.sh

# Each step says when it began, in seconds since the script started.
step() { printf '\n==> %s (at %ss)\n' "$*" "$SECONDS"; }

# Every integration test target, as `PACKAGE NAME REAL` (REAL is 1 when its
# sources, the file and the `mod` files it includes, name gkm-testenv or
# gkm-local, the crates that start real components).
test_targets() {
  local file dir pkg name mods m real
  for file in gkm-*/tests/*.rs gkm-k8s/*/tests/*.rs bins/*/tests/*.rs; do
    dir=$(dirname "$file")
    mods=("$file")
    for m in $(sed -n 's/^ *mod \([a-z_0-9]*\);.*/\1/p' "$file"); do
      [[ -e $dir/$m/mod.rs ]] && mods+=("$dir/$m/mod.rs")
      [[ -e $dir/$m.rs ]] && mods+=("$dir/$m.rs")
    done
    real=0
    grep -qE 'gkm_testenv|gkm_local' "${mods[@]}" && real=1
    pkg=$(sed -n 's/^name = "\(.*\)"/\1/p' "$(dirname "$dir")/Cargo.toml" | head -1)
    name=$(basename "$file" .rs)
    printf '%s %s %s\n' "$pkg" "$name" "$real"
  done
}

# The integration test targets that start no real component, as
# `-p PACKAGE --test NAME`.
fast_test_targets() {
  test_targets | awk '$3 == 0 { printf "-p %s --test %s\n", $1, $2 }'
}

# Runs every test, unit, integration and doc, as separate `cargo test` jobs,
# and the short soak as one more job,
# GKM_TEST_JOBS (default: the CPU count, at least 2) at a time. The real
# components (apiservers, kubelets, containerd) keep the cores busy, so more
# jobs than cores gain nothing; the tests were built beforehand, so the jobs
# only run them. Each job's output
# is printed whole when it ends; every job runs, and the failed ones are named
# at the end. The jobs start longest first, by the durations the last run
# recorded (hack/ci/job_order.py); without a record, the soak and the
# targets that start real components first: they are the longest.
run_tests_in_parallel() {
  local jobs logs list failed durations
  # On 2 cores, 3 jobs made each job about twice as slow and the whole run
  # slower than 2.
  jobs=${GKM_TEST_JOBS:-$(nproc)}
  (( jobs < 2 )) && jobs=2
  logs=$(mktemp -d)
  list=$logs/jobs
  {
    # The short soak (faults injected while a workload runs on the local
    # stack: hack/soak.sh, docs/development.md#soak) is one job among them,
    # with the binaries built above.
    echo "soak"
    test_targets | awk '$3 == 1 { printf "-p %s --test %s\n", $1, $2 }'
    echo "--workspace --lib --bins --examples"
    echo "--workspace --doc"
    test_targets | awk '$3 == 0 { printf "-p %s --test %s\n", $1, $2 }'
  } > "$logs/listed"
  # Longest first, by the durations the last run recorded beside the build.
  durations=$(cargo_target_dir)/gkm-ci-test-durations
  python3 hack/ci/job_order.py "$logs/listed" "$durations" > "$list"
  echo "$(wc -l < "$list") cargo test jobs, $jobs at a time, longest first"
  cp "$test_binaries" "$logs/binaries"
  # An integration test runs as the executable built before, from its
  # package's directory as cargo runs it; the rest through cargo.
  # shellcheck disable=SC2016 # expanded by the job's shell
  xargs -P "$jobs" -L 1 -a "$list" bash -c '
    log=$0/$(printf "%s" "$*" | tr -c "a-zA-Z0-9_-" _).log
    built=()
    [[ $1 == -p && $3 == --test ]] && read -r -a built < <(awk -v p="$2" -v t="$4" "\$1 == p && \$2 == t { print \$3, \$4; exit }" "$0/binaries")
    label="cargo test $*"
    if [[ $1 == soak ]]; then
      label="soak: ${GKM_SOAK_DURATION:-120} s of faults under load (hack/soak.sh)"
      run() { SOAK_NO_BUILD=1 DURATION=${GKM_SOAK_DURATION:-120} hack/soak.sh; }
    elif [[ ${#built[@]} == 2 ]]; then
      run() { (cd "${built[0]}" && "${built[1]}"); }
    else
      run() { cargo test --locked "$@"; }
    fi
    if run "$@" > "$log" 2>&1; then status=ok; else status=FAILED; echo "$label" >> "$0/failed"; fi
    { printf "\n==> %s: %s in %ss\n" "$label" "$status" "$SECONDS"; cat "$log"; } | flock "$0/out" cat
    echo "$SECONDS $*" | flock "$0/out" tee -a "$0/durations" > /dev/null
  ' "$logs"
  python3 hack/ci/job_order.py --record "$durations" < "$logs/durations"
  failed=0
  if [[ -s $logs/failed ]]; then
    echo
    echo "failed:" >&2
    sed 's/^/  /' "$logs/failed" >&2
    failed=1
  fi
  rm -rf "$logs"
  return "$failed"
}

# The CI scripts' own checks (Python's unittest, no component needed), and
# the crates whose files import no circle keep none
# (hack/ci/import_cycles.py).
ci_script_tests() {
  python3 -m unittest discover -s hack/ci -p '*_test.py' < /dev/null
  local src
  for src in gkm-oci/src gkm-k8s/csi/src; do
    printf '%s: ' "$src"
    python3 hack/ci/import_cycles.py "$src" --check
  done
}

if [[ ${1:-} == --fast ]]; then
  step "hack/ci's own tests, import circles"
  ci_script_tests
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

hack/ci/components.sh

step "hack/ci's own tests, import circles"
ci_script_tests

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

# This also builds the binary of every package that has integration tests
# (target/debug/<bin>, which the end-to-end tests run), with the features the
# tests build with; a `cargo build --bins` before it would build the
# workspace once more only to have these overwrite its binaries. A package
# with binaries but no integration test gets them built on their own.
step "cargo test --no-run (every test target and binary, built once)"
# Each integration test's executable is noted (package, target, package
# directory, executable) so that its job runs it as built here: a `cargo test
# -p PACKAGE` resolves features for that package alone (the workspace's
# `testing` features differ), and would build part of the workspace again.
test_binaries=$(mktemp)
cargo test --workspace --all-targets --locked --no-run --message-format=json-render-diagnostics |
  python3 hack/ci/test_binaries.py > "$test_binaries"
# README's build, as its run command does it (the run-command test runs
# that command as written): the binaries every end-to-end test runs
# (target/debug/<bin>) are these, and the test's own `cargo build --bins`
# finds them fresh instead of relinking them under the running tests.
cargo build --locked --bins

step "cargo test and the soak, in parallel jobs"
run_tests_in_parallel

step "no process outlived the tests"
tools_dir=${GKM_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gkm-tools}
if strays=$(pgrep -a -f "$tools_dir/|docker-registry serve|/gkm-test-" ); then
  echo "processes left behind by the tests:" >&2
  echo "$strays" >&2
  exit 1
fi
# Containers of the real nodes: their processes live in containerd's
# `k8s.io` cgroups and name no test directory. A container process that has
# exited but that init has not reaped yet (state Z, no command line) holds
# nothing: the check waits up to 10 s for such processes to go, then
# passes them, naming them; any other process in those cgroups fails it.
container_pids() {
  local f pid
  for f in $(grep -l ":/k8s.io/" /proc/[0-9]*/cgroup 2>/dev/null); do
    pid=${f#/proc/}
    echo "${pid%/cgroup}"
  done
}
# `PID STATE PARENT COMMAND` for a process, `PID gone` once it is.
describe_pid() {
  local stat
  stat=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1,2)
  echo "$1 ${stat:-gone} $(tr '\0' ' ' < "/proc/$1/cmdline" 2>/dev/null)"
}
live=() zombies=()
for _ in $(seq 20); do
  live=() zombies=()
  for pid in $(container_pids); do
    read -r _ state _ < <(describe_pid "$pid")
    case $state in
      Z) zombies+=("$pid") ;;
      gone) ;;
      *) live+=("$pid") ;;
    esac
  done
  ((${#live[@]} + ${#zombies[@]})) || break
  sleep 0.5
done
if ((${#live[@]})); then
  echo "container processes left behind by the tests (PID STATE PARENT COMMAND):" >&2
  for pid in "${live[@]}"; do describe_pid "$pid" >&2; done
  exit 1
fi
if ((${#zombies[@]})); then
  echo "exited container processes not yet reaped after 10 s (they hold nothing; PID STATE PARENT):"
  for pid in "${zombies[@]}"; do describe_pid "$pid"; done
else
  echo "none"
fi

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

#!/usr/bin/env bash
# The fault-injection soak: the local stack (a real node with gkm from its
# chart, simulated nodes) under a steady workload while faults are injected
# on a seeded schedule; invariants checked throughout; a summary at the end.
# The work is done by the gkm-soak binary (bins/gkm-local/src/soak).
#
#   hack/soak.sh                       # 120 s of faults, a fresh seed
#   DURATION=1800 hack/soak.sh         # a long run
#   SEED=1234 DURATION=300 hack/soak.sh  # replays the run of seed 1234
#
#   DURATION      seconds of faults (default 120); the stack's start and the
#                 final checks come on top (about 2 minutes)
#   SEED          the schedule's seed (printed by every run)
#   SUMMARY       where the JSON summary goes (default target/soak/summary.json)
#   SOAK_DIR      keep logs and state there (default: a temporary directory, removed)
#   SOAK_NO_BUILD=1  use the binaries already built (CI builds them before)
#
# Extra arguments go to gkm-soak (`--dra`: the real node's GPUs through DRA).
# Exits non-zero when an invariant was violated.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=hack/lib/cargo.sh
. hack/lib/cargo.sh

target=$(cargo_target_dir)
if [[ ${SOAK_NO_BUILD:-} != 1 ]]; then
  hack/ci/components.sh debian etcd kubernetes kwok cosign containerd runc helm toxiproxy
  cargo build --locked --workspace --bins
fi
summary=${SUMMARY:-$target/soak/summary.json}
mkdir -p "$(dirname "$summary")"
args=(--duration "${DURATION:-120}" --summary "$summary")
[[ -n ${SEED:-} ]] && args+=(--seed "$SEED")
[[ -n ${SOAK_DIR:-} ]] && args+=(--dir "$SOAK_DIR")
exec "$target/debug/gkm-soak" "${args[@]}" "$@"

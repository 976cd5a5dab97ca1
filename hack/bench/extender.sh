#!/usr/bin/env bash
# Benchmark gkm-scheduler-extender behind a real kube-scheduler: the same
# GPU pods on the same kwok nodes, scheduled without and then with the
# extender, in one run. Prints pods per second for both, the ratio of the
# times (target <= 1.30x), the extender's exact filter / prioritize / bind
# answer times p50, p99 and max (the extender keeps its most recent answer
# times and serves their quantiles at GET /scheduler/latency; filter p99
# target < 5 ms) and its resident memory.
#
#   hack/bench/extender.sh                  # 1000 nodes, 2000 pods
#   NODES=200 PODS=400 hack/bench/extender.sh
#
# Needs the real components (hack/ci/components.sh: etcd, kubernetes, kwok) and
# builds the extender in release mode unless EXTENDER names a binary.
set -euo pipefail

NODES=${NODES:-1000}
PODS=${PODS:-2000}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=hack/lib/cargo.sh
. "$ROOT/hack/lib/cargo.sh"

extender_binary
cd "$ROOT"
exec cargo run -q -p gkm-scheduler-extender --example bench -- "$EXTENDER" "$NODES" "$PODS"

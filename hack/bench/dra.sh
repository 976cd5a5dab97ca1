#!/usr/bin/env bash
# GPU pods through DRA against through gkm's device plugin resources and
# scheduler extender, on the same kwok nodes, in one run:
#
#   DRA       every node has a ResourceSlice of 8 GPUs, as gkm-dra-plugin
#             publishes them (the benchmark runs the plugin's own discovery
#             over a simulated node of 8 H100s and its own slice code), and
#             the chart's DeviceClass gkm-gpu; PODS pods each claim one GPU
#             through a ResourceClaimTemplate. kube-scheduler alone
#             (DynamicResourceAllocation is on by default) places them once
#             kube-controller-manager has made every claim.
#   extender  every node has 8 nvidia.com/gpu (what gkm-device-plugin
#             offers) and its model label; PODS pods ask for one each,
#             kube-scheduler with gkm-scheduler-extender places them.
#
# Prints pods per second for each (first pod bound to last), the ratio
# DRA / extender, kube-scheduler's CPU seconds over that time (from
# /proc/<pid>/stat; also since its start) and the extender's, and writes
# them as JSON to $OUT/summary.json (its path is printed).
#
#   hack/bench/dra.sh                       # 1000 nodes, 2000 pods
#   NODES=50 PODS=100 hack/bench/dra.sh     # a quick smoke run
#
# Needs the real components (hack/ci/components.sh: etcd, kubernetes, kwok,
# helm) and builds the extender in release mode unless EXTENDER names a
# binary.
set -euo pipefail

NODES=${NODES:-1000}
PODS=${PODS:-2000}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-$(mktemp -d /tmp/gkm-bench-dra.XXXXXX)}
# shellcheck source=hack/lib/cargo.sh
. "$ROOT/hack/lib/cargo.sh"

extender_binary
mkdir -p "$OUT"
cd "$ROOT"
cargo run -q -p gkm-scheduler-extender --example bench_dra -- \
  "$EXTENDER" "$NODES" "$PODS" "$OUT/summary.json"
echo "(summary: $OUT/summary.json)" >&2

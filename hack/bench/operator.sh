#!/usr/bin/env bash
# Benchmark gkm's operator and agents at scale, against a baseline revision.
#
# The same scenario runs twice, each on a fresh real control plane (etcd,
# kube-apiserver with an audit log of the operator's and agents' requests,
# kube-controller-manager, kwok) and a real Distribution registry with its
# access log on: first on the BASELINE revision, then on the checked-out
# tree ("after"). NODES kwok nodes get simulated GPUs (T4_PER_TEN, default
# 8, in 10 an NVIDIA T4, sm75, which the CUDA fixture cache fits; the others
# alternately an AMD MI210 and none; 0: no node fits, nothing is extracted
# and every node finds every cache incompatible). CACHES distinct images of
# the fixture (one title each, so one digest each) are pushed and signed
# with cosign (a throwaway key, the caches' policy names it: Enforce, the
# operator's default): SIGNATURES=v3 (default) attaches a sigstore bundle as
# an OCI referrer (cosign v3), SIGNATURES=v2 a `.sig` tag (cosign v2). Then:
#
#   start     the operator and the agents start (Node labels)
#   converge  CACHES GKMCaches are created; timed until every cache reports
#             its digest, every node counted, every sm75 node extracted
#             and every other node finding it incompatible
#   change    CHANGED caches get a new image (spec.image to a new tag); timed
#             the same way
#   pod end   on every sm75 node, a pod's writable view of each cache ends
#             having compiled two entries the cache lacks (the usage record
#             the CSI driver writes, put in the node's store); timed until
#             every cache's status counts the workload on every such node:
#             API writes per pod end (reports, Events, statuses) and the
#             bytes a node report's status grew by
#   idle      nothing changes for IDLE_SECS
#
# A revision that does not converge within CONVERGE_TIMEOUT_SECS (default
# 1800) is measured up to there: how many caches converged, and every
# figure of the converging phase so far; its change and idle phases are
# skipped. That gives a one-run comparison at a scale where the baseline
# takes too long: BASELINE=52c9763 CONVERGE_TIMEOUT_SECS=600 ...
#
# and prints, per figure, baseline, after, the ratio after / baseline and the
# target: API writes by writer (audit log: the operator's and the agents'
# ServiceAccounts) per phase and per changed object, the writes it refused
# (429 when shedding load; kube's client retries those) apart, registry
# requests per phase (access log; tag resolutions apart while idle), time
# to converge, and the operator's RSS (VmRSS, VmHWM) at the end.
#
# The operator runs as its binary, built at each revision, with its default
# flags (resolve interval 5m: an idle window of 600 s sees each tag
# resolved again about twice). The agents run in-process: one process
# (gkm-agent's `agents` example, built at each revision) runs the real agent
# library once per node, each with a client of its own and the binary's
# defaults (resync 30s), without GPU telemetry; a thousand agent processes
# would not fit one machine. Their stores are on /dev/shm (STORES_DIR): a
# thousand agents sharing one disk would wait on each other's fsyncs, which
# no real node does. The harness itself (gkm-local's `bench_operator`
# example) is built from the checked-out tree.
#
# Besides the table, $OUT/summary.json (its path is printed) holds what
# scales, per revision, with the ratios after / baseline when both ran:
# converge_seconds, change_seconds, operator_ and
# agent_writes_per_stored_change (converge and change together),
# agent_watch_events_converge (the apiserver's apiserver_watch_events_total
# for the gkm.io resources the revision's agent RBAC may watch, its reports
# apart: what its agents watch; the operator's one watch of them counts too;
# agent_watched() in the harness), agent_watch_events_idle_per_second (the
# same while nothing changes: the watches' bookmarks) and
# agent_watch_events_converge_beyond_idle_rate, registry_requests_converge and _idle,
# each also by kind (_by_kind: method, what was asked for -- tag, cosign v2
# tag, referrers API, tag-schema index, image or other manifest, layer or
# other blob -- and response code), registry_requests_per_cache_converge
# (all but an extraction's: resolving the tag, finding and reading the
# signature) and _per_extraction_converge (an image's manifest and layer;
# null when nothing was extracted), extractions (registry GETs of a cache
# image's layer), operator_rss_mib and agents_cpu_seconds; "scale" says
# what ran.
#
# "Writes per stored change" divides the audited writes by the changes the
# apiserver stored (new resourceVersions, counted by watches): above 1, some
# writes changed nothing. The operator's stored changes exclude the
# harness's own (cache creations and spec changes).
#
# On 2 shared cores a debug build of NODES=200 CACHES=5 IDLE_SECS=330 takes
# about 25 minutes for both revisions; at 1000 nodes a debug agents process
# on 2 cores times out on its connections and backs off, so the full scale
# wants more cores or PROFILE=release. Extraction bounds the time there:
# with the default T4_PER_TEN=8, 1000 nodes and 50 caches are 40,000
# extractions, which 2 cores (shared by the apiserver, the registry and the
# agents) do at about 600 a minute, over an hour per revision. T4_PER_TEN=1
# keeps every node reading, checking and reporting every cache, and
# extracts 5,000.
#
#   hack/bench/operator.sh                            # 1000 nodes, 50 caches, 600 s idle
#   NODES=50 CACHES=5 IDLE_SECS=30 hack/bench/operator.sh
#   T4_PER_TEN=1 PROFILE=release hack/bench/operator.sh   # 100 of 1000 nodes fit the caches
#   T4_PER_TEN=0 SIGNATURES=v2 PROFILE=release hack/bench/operator.sh  # none does; cosign v2
#   BASELINE=766230b PROFILE=release hack/bench/operator.sh
#
# Needs the real components (hack/ci/components.sh: etcd, kubernetes, kwok,
# debian for the registry, cosign) and the fixture caches.
set -euo pipefail

export NODES=${NODES:-1000} CACHES=${CACHES:-50} T4_PER_TEN=${T4_PER_TEN:-8}
# 5 of the caches change, or all of them when there are fewer.
export CHANGED=${CHANGED:-$(( CACHES < 5 ? CACHES : 5 ))}
export IDLE_SECS=${IDLE_SECS:-600}
# The agents driver (this tree's `agents` example, copied into the baseline)
# calls the agent crate as the crate split left it, so a baseline is that
# revision or later.
BASELINE=${BASELINE:-fb8801d}
# REVISIONS=after runs the checked-out tree alone (its figures, no ratios).
REVISIONS=${REVISIONS:-baseline after}
case $REVISIONS in
  "baseline after" | after) ;;
  *) echo "REVISIONS must be \"baseline after\" or after, not $REVISIONS" >&2; exit 2 ;;
esac
PROFILE=${PROFILE:-debug}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=hack/lib/cargo.sh
. "$ROOT/hack/lib/cargo.sh"
CARGO_TARGET_DIR=$(cargo_target_dir)
export CARGO_TARGET_DIR
OUT=${OUT:-$(mktemp -d /tmp/gkm-bench-operator.XXXXXX)}

case $PROFILE in
  debug) PROFILE_FLAG=() ;;
  release) PROFILE_FLAG=(--release) ;;
  *) echo "PROFILE must be debug or release, not $PROFILE" >&2; exit 2 ;;
esac

# One target directory serves both trees, so dependencies build once. The
# workspace's own crates have the same names in both, and cargo judges them
# fresh by file times, so each tree's own crates (whichever it has) are
# cleaned before its build.
clean_workspace_crates() {
  local args=() manifest name
  while IFS= read -r manifest; do
    name=$(sed -n 's/^name = "\(.*\)"/\1/p' "$manifest" | head -1)
    [[ -n $name ]] && args+=(-p "$name")
  done < <(cd "$1" && find . -name Cargo.toml -not -path './target/*' -not -path './fuzz/*' -not -path './hack/*')
  (cd "$1" && cargo clean -q "${PROFILE_FLAG[@]}" "${args[@]}")
}

# Builds the operator and the agents example in TREE and copies them to DEST.
build_revision() {
  local tree=$1 dest=$2
  mkdir -p "$dest"
  clean_workspace_crates "$tree"
  (cd "$tree" && cargo build -q "${PROFILE_FLAG[@]}" -p gkm-operator --bin gkm-operator \
    -p gkm-agent --example agents)
  cp "$CARGO_TARGET_DIR/$PROFILE/gkm-operator" "$CARGO_TARGET_DIR/$PROFILE/examples/agents" "$dest/"
}

# The harness first: it fails, naming the command that installs it, when a
# component or the fixture cache is missing.
clean_workspace_crates "$ROOT"
(cd "$ROOT" && cargo build -q "${PROFILE_FLAG[@]}" -p gkm-local --example bench_operator)
mkdir -p "$OUT/bin"
cp "$CARGO_TARGET_DIR/$PROFILE/examples/bench_operator" "$OUT/bin/"
BENCH=$OUT/bin/bench_operator
"$BENCH" check

BASE_TREE=$OUT/baseline-tree
cleanup() {
  git -C "$ROOT" worktree remove --force "$BASE_TREE" 2>/dev/null || true
}
trap cleanup EXIT

echo "== building $REVISIONS ($PROFILE)" >&2
if [[ $REVISIONS == "baseline after" ]]; then
  git -C "$ROOT" worktree add --detach -q "$BASE_TREE" "$BASELINE"
  # The agents driver, as this tree has it (it uses only AgentConfig::new
  # and agent::run, which the baseline has too).
  mkdir -p "$BASE_TREE/bins/gkm-agent/examples"
  cp "$ROOT/bins/gkm-agent/examples/agents.rs" "$BASE_TREE/bins/gkm-agent/examples/"
  build_revision "$BASE_TREE" "$OUT/bin/baseline"
fi
build_revision "$ROOT" "$OUT/bin/after"

began=$(date +%s)
for revision in $REVISIONS; do
  tree=$ROOT
  [[ $revision == baseline ]] && tree=$BASE_TREE
  echo "== $revision: $NODES nodes, $CACHES caches, $CHANGED changed, idle ${IDLE_SECS}s" >&2
  "$BENCH" run "$tree" "$OUT/bin/$revision/gkm-operator" "$OUT/bin/$revision/agents" \
    "$OUT/$revision.json"
done
echo "== baseline $BASELINE, after $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- . || echo '+changes'); $(( $(date +%s) - began )) s; load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
baseline_figures=$OUT/baseline.json
[[ $REVISIONS == after ]] && baseline_figures=-
"$BENCH" compare "$baseline_figures" "$OUT/after.json" "$OUT/summary.json"
figures="$OUT/after.json"
[[ $REVISIONS == after ]] || figures="$OUT/baseline.json, $figures"
echo "(figures: $figures; summary: $OUT/summary.json)" >&2

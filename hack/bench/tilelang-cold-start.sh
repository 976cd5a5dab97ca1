#!/usr/bin/env bash
# The compile time a TileLang cache delivered by gkm saves, in one run, on
# the machine it runs on (no GPU needed: TileLang compiles CUDA kernels for
# any target with nvcc from NVIDIA's wheels).
#
# Each round, for the kernels of hack/fixtures/tilelang_kernels.py:
#   1. cold: every kernel compiled for ARCH into an empty
#      TILELANG_CACHE_DIR: the baseline;
#   2. the delivery a node makes: `gkm build` of the cache the cold run
#      left, `gkm extract` of it at ANOTHER path (a pod's own cache path);
#   3. warm: the same kernels against the delivered cache.
# Prints each run's seconds and hits, and the cold/warm ratio (best and
# median over ROUNDS).
#
#   hack/bench/tilelang-cold-start.sh
#   ARCH=sm_80 ROUNDS=3 hack/bench/tilelang-cold-start.sh
#
# Needs TileLang (hack/ci/components.sh tilelang gives tilelang-python;
# PYTHON names another interpreter) and a gkm binary (GKM; built from this
# tree if unset).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=hack/lib/cargo.sh
. "$HERE/../lib/cargo.sh"
tools_dir=${GKM_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gkm-tools}
PYTHON=${PYTHON:-$tools_dir/bin/tilelang-python}
ROUNDS=${ROUNDS:-3}
ARCH=${ARCH:-sm_90a}
KERNELS=(gemm_64x64 gemm_128x128 gemm_64x128)
if ! "$PYTHON" -c 'import tilelang' 2>/dev/null; then
  echo "no TileLang for $PYTHON: run hack/ci/components.sh tilelang, or set PYTHON" >&2
  exit 1
fi
if [[ -z ${GKM:-} ]]; then
  (cd "$ROOT" && cargo build -q -p gkm --bin gkm)
  GKM=$(cargo_target_dir)/debug/gkm
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# compile CACHE: the kernels against CACHE; prints "SECONDS HITS
# KERNEL-SECONDS": the whole process's, and TileLang's own compile or load.
compile() {
  local out=$work/run.json start end
  start=$(date +%s.%N)
  env -i PATH=/usr/bin:/bin HOME="$work/home" TILELANG_CACHE_DIR="$1" TILELANG_PRINT_ON_COMPILATION=0 \
    "$PYTHON" "$ROOT/hack/fixtures/tilelang_kernels.py" "$ARCH" "${KERNELS[@]}" > "$out" 2> "$work/run.log" ||
    { cat "$work/run.log" >&2; exit 1; }
  end=$(date +%s.%N)
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(f"{float(sys.argv[3])-float(sys.argv[2]):.2f}", sum(v == "hit" for v in r["kernels"].values()), "%.3f" % sum(r["seconds"].values()))' \
    "$out" "$start" "$end"
}

colds=() warms=() cold_kernels=() warm_kernels=()
for round in $(seq "$ROUNDS"); do
  rm -rf "$work/cold" "$work/pod" "$work/layout"
  read -r cold cold_hits cold_k < <(compile "$work/cold/cache")
  for step in "build $work/cold/cache -t oci:$work/layout:tl" \
    "extract oci:$work/layout:tl -o $work/pod/home/.tilelang/cache"; do
    # shellcheck disable=SC2086 # one word per argument
    "$GKM" $step > "$work/gkm.log" 2>&1 || { cat "$work/gkm.log" >&2; exit 1; }
  done
  read -r warm warm_hits warm_k < <(compile "$work/pod/home/.tilelang/cache")
  echo "round $round: cold ${cold}s (kernels ${cold_k}s, $cold_hits of ${#KERNELS[@]} hits), delivered ${warm}s (kernels ${warm_k}s, $warm_hits of ${#KERNELS[@]} hits)"
  colds+=("$cold") warms+=("$warm") cold_kernels+=("$cold_k") warm_kernels+=("$warm_k")
done
python3 - "$ARCH" "${colds[*]}" "${warms[*]}" "${cold_kernels[*]}" "${warm_kernels[*]}" <<'PY'
import statistics, sys
arch, cold, warm, cold_k, warm_k = sys.argv[1], *([float(x) for x in a.split()] for a in sys.argv[2:])
print(f"TileLang {arch}, {len(cold)} rounds; cold (an empty cache) is the baseline")
for what, c, w in [("whole process (Python, imports, kernels)", cold, warm), ("TileLang's compile or load", cold_k, warm_k)]:
    print(f"  {what}: cold best {min(c):.3f}s median {statistics.median(c):.3f}s, "
          f"delivered best {min(w):.3f}s median {statistics.median(w):.3f}s, "
          f"cold/delivered best {min(c)/min(w):.1f}x median {statistics.median(c)/statistics.median(w):.1f}x")
PY

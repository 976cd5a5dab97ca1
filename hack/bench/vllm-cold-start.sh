#!/usr/bin/env bash
# The engine start-up a vLLM cache delivered by gkm saves, in one run, on
# the machine it runs on (a CPU here; a GPU node with vLLM installed too).
#
# For each model directory (hack/fixtures/vllm-models/<arch>/ by default:
# a hand-written config.json, dummy weights, no hub), each round:
#   1. cold: an engine start (hack/vllm/engine_start.py) on an empty
#      VLLM_CACHE_ROOT: the baseline;
#   2. the delivery a node makes: `gkm build` of the root the cold start
#      left, `gkm check` of the image against this machine, `gkm extract` of
#      it at ANOTHER path (a pod's own cache path, not the builder's);
#   3. warm: the same start on the delivered root.
# Prints each start's vLLM "init engine" time and the engine's wall time,
# the C++ kernels Inductor built, whether the output tokens are identical,
# and cold/warm ratios (best and median over ROUNDS), and writes every
# run's JSON and a summary into OUT.
#
#   hack/bench/vllm-cold-start.sh                       # CPU, components' vLLM
#   PYTHON=python3 MODELS=dir1:dir2 ROUNDS=3 OUT=dir hack/bench/vllm-cold-start.sh
#
# Needs vLLM (hack/ci/components.sh vllm gives vllm-python; PYTHON names
# another interpreter, e.g. a GPU node's) and a gkm binary (GKM; built
# from this tree if unset).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=hack/lib/cargo.sh
. "$HERE/../lib/cargo.sh"
tools_dir=${GKM_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gkm-tools}
PYTHON=${PYTHON:-$tools_dir/bin/vllm-python}
ROUNDS=${ROUNDS:-1}
TOKENS=${TOKENS:-8}
MODELS=${MODELS:-$(printf '%s:' "$ROOT"/hack/fixtures/vllm-models/*/)}
if ! "$PYTHON" -c 'import vllm' 2>/dev/null; then
  echo "no vLLM for $PYTHON: run hack/ci/components.sh vllm, or set PYTHON" >&2
  exit 1
fi
if [[ -z ${GKM:-} ]]; then
  (cd "$ROOT" && cargo build -q -p gkm --bin gkm)
  GKM=$(cargo_target_dir)/debug/gkm
fi
WORK=$(mktemp -d "${TMPDIR:-/var/tmp}/gkm-vllm-bench.XXXXXX")
OUT=${OUT:-$WORK/out}
mkdir -p "$OUT"
trap 'rm -rf "$WORK/roots" "$WORK/layout"' EXIT

# One engine start on cache root $2 of model $1, its JSON into $3. A scratch
# HOME and TMPDIR, so nothing of the user's caches reaches the engine.
start() {
  mkdir -p "$WORK/scratch"
  env -i PATH=/usr/bin:/bin HOME="$WORK/scratch" TMPDIR="$WORK/scratch" \
    ${CUDA_VISIBLE_DEVICES:+CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES} \
    "$PYTHON" "$ROOT/hack/vllm/engine_start.py" --model "$1" --cache-root "$2" \
    --tokens "$TOKENS" >"$3" 2>"$3.log"
}

IFS=: read -r -a models <<<"$MODELS"
for model in "${models[@]}"; do
  [[ -n $model ]] || continue
  arch=$(basename "$model")
  for round in $(seq 1 "$ROUNDS"); do
    built=$WORK/roots/built/$arch
    delivered=$WORK/roots/pods/$round/$arch/vllm-cache
    rm -rf "$built" "$delivered" "$WORK/layout" "$WORK/scratch"
    echo "== $arch, round $round: cold start on an empty root" >&2
    start "$model" "$built" "$OUT/$arch-$round-cold.json"
    "$GKM" build "$built" -t "oci:$WORK/layout:$arch" >"$OUT/$arch-$round-build.txt" 2>&1
    "$GKM" check "oci:$WORK/layout:$arch" >"$OUT/$arch-$round-check.txt" 2>&1 || true
    mkdir -p "$(dirname "$delivered")"
    "$GKM" extract "oci:$WORK/layout:$arch" --output "$delivered" >/dev/null
    rm -rf "$WORK/scratch"
    echo "== $arch, round $round: warm start on the delivered root at $delivered" >&2
    start "$model" "$delivered" "$OUT/$arch-$round-warm.json"
  done
done

python3 - "$OUT" "$ROUNDS" "${models[@]}" <<'PYEOF'
import json, os, statistics, sys

out, rounds, models = sys.argv[1], int(sys.argv[2]), [m for m in sys.argv[3:] if m]
summary = {"baseline": "the same engine start on an empty VLLM_CACHE_ROOT (cold)", "models": {}}
print(f"{'model':<8} {'start':<5} {'init engine s':>14} {'engine wall s':>14} {'C++ kernels built':>18}  tokens")
for model in models:
    arch = os.path.basename(model.rstrip("/"))
    runs = {"cold": [], "warm": []}
    for r in range(1, rounds + 1):
        for kind in runs:
            with open(f"{out}/{arch}-{r}-{kind}.json") as f:
                runs[kind].append(json.loads(f.read().strip().splitlines()[-1]))
    same = all(c["output_token_ids"] == w["output_token_ids"] for c, w in zip(runs["cold"], runs["warm"]))
    facts = {}
    for kind, reports in runs.items():
        init = [r["init_engine_s"] for r in reports]
        wall = [r["engine_wall_s"] for r in reports]
        built = [r["cpp_kernels_built"] for r in reports]
        facts[kind] = {"init_engine_s": init, "engine_wall_s": wall, "cpp_kernels_built": built}
        print(f"{arch:<8} {kind:<5} {min(init):>14.2f} {min(wall):>14.2f} {max(built):>18}  "
              f"{'identical' if same else 'DIFFERENT'}")
    ratio = lambda key, pick: pick(facts["cold"][key]) / pick(facts["warm"][key])
    facts["ratio_init_engine_best"] = ratio("init_engine_s", min)
    facts["ratio_init_engine_median"] = ratio("init_engine_s", statistics.median)
    facts["ratio_engine_wall_best"] = ratio("engine_wall_s", min)
    facts["ratio_engine_wall_median"] = ratio("engine_wall_s", statistics.median)
    facts["outputs_identical"] = same
    summary["models"][arch] = facts
    print(f"{arch:<8} cold/warm: init engine {facts['ratio_init_engine_best']:.2f}x best, "
          f"{facts['ratio_init_engine_median']:.2f}x median; engine wall "
          f"{facts['ratio_engine_wall_best']:.2f}x best, {facts['ratio_engine_wall_median']:.2f}x median")
with open(f"{out}/summary.json", "w") as f:
    json.dump(summary, f, indent=2)
print(f"runs and summary.json in {out}")
PYEOF

#!/usr/bin/env bash
# A real vLLM engine start on a machine with an NVIDIA GPU, cold against
# warm on every JIT cache gkm delivered: a recording CI cannot make (it has
# no GPU), kept as a fixture like fixtures/cold-start-h100/.
#
# The model is an 8B-class architecture's config.json with seeded dummy
# weights (hack/gpu/models/llama3-8b/: Llama 3 8B's shapes, about 16 GB of
# bfloat16 on the GPU, no download, no tokenizer). Each round:
#   1. cold: hack/vllm/engine_start.py on empty caches: VLLM_CACHE_ROOT,
#      TRITON_CACHE_DIR and a new HOME (where FlashInfer and the other JIT
#      caches a serving engine writes go by default);
#   2. the delivery a node makes, per part the cold start wrote (the vLLM
#      root, the Triton cache, ~/.cache/flashinfer, ~/.tilelang/cache,
#      ~/.cache/tvm-ffi, CuTe DSL's cache): `gkm build` into an OCI layout, `gkm check` of the image against this GPU, the tree deleted,
#      `gkm extract` of the image back at the part's path; a part gkm refuses
#      is recorded with gkm's sentence and not delivered;
#   3. warm: the same start with a new HOME holding only what gkm extracted.
# Whatever else the cold start left in HOME (a cache of no kind gkm knows)
# is listed in the summary as written but not delivered.
# Writes into OUT: run.log, every start's JSON (its vLLM log lines: the
# phases and compile times vLLM reports), gkm's build/check/extract output
# per part, and summary.json with the cold/warm ratios (baseline: the cold
# start) and whether the output tokens were identical.
#
#   GKM=path/to/gkm OUT=dir [PYTHON=python3] [ROUNDS=1] [TOKENS=16] hack/gpu/vllm-cold-start.sh
#
# Needs a vLLM built for CUDA in PYTHON (PyPI's `vllm`), and the GPU's
# memory for the model (an H100 or H200 holds it with room for the KV cache).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
gkm=${GKM:?set GKM to the gkm binary}
out=${OUT:?set OUT to the directory to write the recording into}
python=${PYTHON:-python3}
rounds=${ROUNDS:-1}
tokens=${TOKENS:-16}
model=${MODEL:-$here/models/llama3-8b}

work=/var/tmp/gkm-vllm-gpu
mkdir -p "$out"
rm -rf "$work"
mkdir -p "$work"
exec > >(tee "$out/run.log") 2>&1

echo "== machine"
uname -r
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$gkm" --version
"$python" -c 'import torch, vllm; import triton; print("torch", torch.__version__, "triton", triton.__version__, "vllm", vllm.__version__, torch.cuda.get_device_name(0))' || true

# The parts a start reads and writes, and where each sits.
vllm_root=$work/caches/vllm
triton_dir=$work/caches/triton
home=$work/home
flashinfer_dir=$home/.cache/flashinfer
# TileLang's default TILELANG_CACHE_DIR (the kernels of models that use it).
tilelang_dir=$home/.tilelang/cache
# TVM-FFI's default TVM_FFI_CACHE_DIR (tvm_ffi.cpp's JIT modules).
tvm_ffi_dir=$home/.cache/tvm-ffi
# CuTe DSL's cache, named: its default is below TMPDIR, which each start
# gets anew.
cutedsl_dir=$home/.cache/cutlass_python_cache

# start NAME: one engine start in a new process on the caches above, its
# JSON report in $out/NAME.json, its log in $out/NAME.log.
start() {
  mkdir -p "$home" "$work/tmp" "$vllm_root" "$triton_dir"
  env -u XDG_CACHE_HOME HOME="$home" TMPDIR="$work/tmp" \
    TRITON_CACHE_DIR="$triton_dir" CUTE_DSL_CACHE_DIR="$cutedsl_dir" CUDA_CACHE_DISABLE=1 PYTHONUNBUFFERED=1 \
    "$python" "$root/hack/vllm/engine_start.py" --model "$model" \
    --cache-root "$vllm_root" --tokens "$tokens" >"$out/$1.json" 2>"$out/$1.log"
  "$python" -c 'import json, sys; r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print("%s: init engine %s s, engine wall %.2f s, torch.compile %s s" % (sys.argv[2], r["init_engine_s"], r["engine_wall_s"], r["torch_compile_s"]))' "$out/$1.json" "$1"
}

# deliver ROUND NAME DIR: the node's steps for one part; its name on stdout
# when delivered.
deliver() {
  local round=$1 name=$2 dir=$3 image=oci:$work/layout:$2-$1
  if [[ ! -d $dir ]] || [[ -z $(ls -A "$dir") ]]; then
    echo "== round $round: $name: nothing written" >&2
    return 0
  fi
  echo "== round $round: $name: gkm build, check, extract" >&2
  if ! "$gkm" build "$dir" -t "$image" >"$out/$name-$round-build.txt" 2>&1; then
    echo "== round $round: $name refused by gkm build:" >&2
    cat "$out/$name-$round-build.txt" >&2
    return 0
  fi
  "$gkm" check "$image" >"$out/$name-$round-check.txt" 2>&1 || true
  cat "$out/$name-$round-build.txt" "$out/$name-$round-check.txt" >&2
  rm -rf "$dir"
  mkdir -p "$(dirname "$dir")"
  "$gkm" extract "$image" --output "$dir" >"$out/$name-$round-extract.txt" 2>&1
  echo "$name"
}

for ((round = 1; round <= rounds; round++)); do
  echo "== round $round: cold (empty caches, new HOME)"
  rm -rf "$work/caches" "$home" "$work/tmp" "$work/layout"
  start "cold-$round"
  find "$home" -mindepth 2 -maxdepth 3 -type d | sed "s|^$home/||" | sort >"$out/home-$round.txt"
  # Every part is delivered where it was written (FlashInfer's and Triton's
  # files name that path), then HOME keeps only what gkm extracted.
  delivered=()
  for part in vllm:"$vllm_root" triton:"$triton_dir" flashinfer:"$flashinfer_dir" tilelang:"$tilelang_dir" \
    tvm-ffi:"$tvm_ffi_dir" cutedsl:"$cutedsl_dir"; do
    name=${part%%:*}
    if d=$(deliver "$round" "$name" "${part#*:}") && [[ -n $d ]]; then delivered+=("$d"); fi
  done
  find "$home" -mindepth 1 -maxdepth 2 ! -path "$home/.cache" ! -path "$flashinfer_dir" \
    ! -path "$tvm_ffi_dir" ! -path "$cutedsl_dir" \
    ! -path "$home/.tilelang" ! -path "$tilelang_dir" -exec rm -rf {} +
  rm -rf "$work/tmp"
  printf '%s\n' "${delivered[@]}" >"$out/delivered-$round.txt"
  echo "== round $round: warm (delivered: ${delivered[*]:-none})"
  start "warm-$round"
done

"$python" - "$out" "$rounds" >"$out/summary.json" <<'PYEOF'
import json, statistics, sys

out, rounds = sys.argv[1], int(sys.argv[2])
def report(name):
    with open(f"{out}/{name}.json") as f:
        return json.loads(f.read().strip().splitlines()[-1])
def lines(name):
    with open(f"{out}/{name}") as f:
        return [l.strip() for l in f if l.strip()]
cold = [report(f"cold-{r}") for r in range(1, rounds + 1)]
warm = [report(f"warm-{r}") for r in range(1, rounds + 1)]
delivered = lines("delivered-1.txt")
known = {".cache/flashinfer", ".tilelang/cache", ".cache/tvm-ffi", ".cache/cutlass_python_cache"}
home = [d for d in lines("home-1.txt") if d.count("/") == 1 and d not in known]
def med(rs, key):
    vals = [r[key] for r in rs if r.get(key) is not None]
    return round(statistics.median(vals), 3) if vals else None
summary = {
    "baseline": "the same engine start with empty caches and a new HOME (cold)",
    "parts_delivered": delivered,
    "written_not_delivered": home,
    "cold_init_engine_s": med(cold, "init_engine_s"),
    "warm_init_engine_s": med(warm, "init_engine_s"),
    "cold_engine_wall_s": med(cold, "engine_wall_s"),
    "warm_engine_wall_s": med(warm, "engine_wall_s"),
    "cold_torch_compile_s": med(cold, "torch_compile_s"),
    "warm_torch_compile_s": med(warm, "torch_compile_s"),
    "outputs_identical": all(c["output_token_ids"] == w["output_token_ids"] for c, w in zip(cold, warm)),
    "runs": {"cold": cold, "warm": warm},
}
for key in ("init_engine_s", "engine_wall_s"):
    c, w = summary[f"cold_{key}"], summary[f"warm_{key}"]
    summary[f"ratio_{key}"] = round(c / w, 2) if c and w else None
print(json.dumps(summary, indent=2))
PYEOF
"$python" -c 'import json, sys; s = json.load(open(sys.argv[1])); print("== engine wall %s s cold, %s s warm on the caches gkm delivered (%s): %sx; init engine %s s vs %s s: %sx; outputs identical: %s; written but not delivered: %s" % (s["cold_engine_wall_s"], s["warm_engine_wall_s"], ", ".join(s["parts_delivered"]) or "none", s["ratio_engine_wall_s"], s["cold_init_engine_s"], s["warm_init_engine_s"], s["ratio_init_engine_s"], s["outputs_identical"], ", ".join(s["written_not_delivered"]) or "nothing"))' "$out/summary.json"

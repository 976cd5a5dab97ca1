#!/usr/bin/env bash
# The cold start a cache delivered by gkm saves, recorded on a machine with a
# real NVIDIA GPU, PyTorch and Triton (the workload: hack/gpu/cold_start.py).
#   0. Python, PyTorch and CUDA started once alone, so that every measured run
#      finds the operating system's file cache equally warm;
#   then each round:
#   1. cold: the workload in a new process with an empty TRITON_CACHE_DIR;
#   2. the delivery a node makes: `gkm check` of the tree the workload left
#      against this GPU, `gkm build` of it into an OCI layout, `gkm sign`,
#      the tree deleted, `gkm verify`, then `gkm extract` of the verified
#      image back at the same path (Triton's group files name that path);
#   3. warm: the same workload in a new process against the extracted tree.
# Writes into OUT: summary.json (every run, the times and their ratios, and
# whether the outputs were identical), run.log, check.json (gkm's verdict on
# this GPU), and cache.tar.gz (the tree gkm extracted in the first round).
#
#   GKM=path/to/gkm KEY=key.pem PUB=pub.pem OUT=dir [ROUNDS=2] [DEADLINE_SECS=300] hack/gpu/cold-start.sh
#
# KEY is an unencrypted PKCS#8 private key (`openssl genpkey -algorithm EC
# -pkeyopt ec_paramgen_curve:P-256`), PUB its public key. GPUS=inventory.json
# checks against a simulated inventory instead of the GPU (to try the gkm
# steps on a machine without one; the workload still needs a GPU).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
gkm=${GKM:?set GKM to the gkm binary}
key=${KEY:?set KEY to a private key file}
pub=${PUB:?set PUB to its public key file}
out=${OUT:?set OUT to the directory to write the recording into}
rounds=${ROUNDS:-2}
deadline=${DEADLINE_SECS:-300}
python=${PYTHON:-python3}
gpus=()
[[ -n ${GPUS:-} ]] && gpus=(--gpus "$GPUS")

work=/var/tmp/gkm-cold-start
cache=$work/triton
layout=$work/layout
mkdir -p "$out"
rm -rf "$work"
mkdir -p "$work/runs"
exec > >(tee "$out/run.log") 2>&1
started=$SECONDS

# The driver's own JIT cache off: Triton loads cubins, and nothing but
# TRITON_CACHE_DIR may carry compiled code from one run to the next.
export CUDA_CACHE_DISABLE=1 TRITON_CACHE_DIR=$cache PYTHONUNBUFFERED=1

echo "== machine"
uname -r
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$gkm" --version

# run NAME: the workload in a new process; its report plus the process's
# own wall time in $work/runs/NAME.json.
run() {
  local name=$1 t0 t1
  t0=$(date +%s.%N)
  "$python" "$here/cold_start.py" > "$work/runs/$name.out"
  t1=$(date +%s.%N)
  "$python" - "$work/runs/$name.out" "$t0" "$t1" "$name" > "$work/runs/$name.json" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
report["process_seconds"] = round(float(sys.argv[3]) - float(sys.argv[2]), 3)
report["run"] = sys.argv[4]
print(json.dumps(report))
EOF
  "$python" -c 'import json, sys; r = json.load(open(sys.argv[1])); print("%s: %.2f s workload, %.2f s process, %d compiled, %d host modules built, %d autotune benchmarks" % (r["run"], r["seconds"], r["process_seconds"], r["compiled"], r["host_modules_built"], r["autotune_benchmarks"]))' "$work/runs/$name.json"
}

# deliver ROUND: what a node does with the tree the cold run left.
deliver() {
  local round=$1 image=oci:$layout:round-$1
  echo "== round $round: gkm check, build, sign, verify, extract"
  "$gkm" check "${gpus[@]}" "$cache"
  "$gkm" check "${gpus[@]}" --json "$cache" > "$work/check-$round.json"
  "$gkm" build --json "$cache" -t "$image" > "$work/build-$round.json"
  "$gkm" sign --json --key "$key" "$image" > "$work/sign-$round.json"
  rm -rf "$cache"
  "$gkm" verify --json --key "$pub" "$image" > "$work/verify-$round.json"
  "$gkm" extract --json "${gpus[@]}" "$image" -o "$cache" > "$work/extract-$round.json"
  cat "$work/build-$round.json" "$work/verify-$round.json" "$work/extract-$round.json"
}

echo "== warming the file cache: Python, PyTorch, Triton and CUDA once"
"$python" -c 'import torch, triton; torch.zeros(1, device="cuda"); print(torch.__version__, triton.__version__, torch.cuda.get_device_name(0))'

for ((round = 1; round <= rounds; round++)); do
  if ((round > 1 && SECONDS - started > deadline)); then
    echo "== round $round skipped: $((SECONDS - started)) s spent, DEADLINE_SECS=$deadline"
    break
  fi
  echo "== round $round: cold (empty $cache)"
  rm -rf "$cache"
  mkdir -p "$cache"
  run "cold-$round"
  deliver "$round"
  if ((round == 1)); then
    cp "$work/check-1.json" "$out/check.json"
    tar -C "$work" -czf "$out/cache.tar.gz" triton
  fi
  echo "== round $round: warm (the tree gkm extracted)"
  run "warm-$round"
done

"$python" - "$work" > "$out/summary.json" <<'EOF'
import glob, json, os, statistics, sys
work = sys.argv[1]
runs = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(work, "runs", "*.json")))]
cold = [r for r in runs if r["run"].startswith("cold")]
warm = [r for r in runs if r["run"].startswith("warm")]
def median(rs, field):
    return round(statistics.median(r[field] for r in rs), 3)
def load(name):
    return json.load(open(os.path.join(work, name)))
summary = {
    "gpu": runs[0]["gpu"], "capability": runs[0]["capability"],
    "triton": runs[0]["triton"], "torch": runs[0]["torch"],
    "baseline": "the same workload with an empty TRITON_CACHE_DIR (cold)",
    "cold_seconds": median(cold, "seconds"), "warm_seconds": median(warm, "seconds"),
    "cold_process_seconds": median(cold, "process_seconds"), "warm_process_seconds": median(warm, "process_seconds"),
    "outputs_identical": all(r["outputs"] == runs[0]["outputs"] for r in runs),
    "warm_compiled": max(r["compiled"] for r in warm),
    "warm_host_modules_built": max(r["host_modules_built"] for r in warm),
    "warm_autotune_benchmarks": max(r["autotune_benchmarks"] for r in warm),
    "image": {"build": load("build-1.json"), "verify": load("verify-1.json"), "extract": load("extract-1.json")},
    "runs": runs,
}
summary["ratio"] = round(summary["cold_seconds"] / summary["warm_seconds"], 2)
summary["process_ratio"] = round(summary["cold_process_seconds"] / summary["warm_process_seconds"], 2)
print(json.dumps(summary, indent=2))
EOF
"$python" -c 'import json, sys; s = json.load(open(sys.argv[1])); print("== cold %.2f s, warm %.2f s with the tree gkm delivered: %.1fx (whole process %.2f s vs %.2f s: %.1fx); warm compiled %d; outputs identical: %s" % (s["cold_seconds"], s["warm_seconds"], s["ratio"], s["cold_process_seconds"], s["warm_process_seconds"], s["process_ratio"], s["warm_compiled"], s["outputs_identical"]))' "$out/summary.json"

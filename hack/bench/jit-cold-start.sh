#!/usr/bin/env bash
# The compile time a JIT cache delivered by gkm saves, in one run, on the
# machine it runs on, for the kinds whose package compiles without a GPU:
#   tilelang  TileLang GEMM kernels (hack/fixtures/tilelang_kernels.py),
#             delivered at ANOTHER path (a TileLang cache is bound to none);
#   tvm-ffi   TVM-FFI C++ and CUDA modules (hack/fixtures/tvm_ffi_modules.py,
#             g++ and nvcc), delivered at the path they were built at (a
#             TVM-FFI cache is bound to it);
#   cutedsl   CuTe DSL kernels (hack/fixtures/cutedsl_kernels.py), delivered
#             at ANOTHER path.
#
# Each round:
#   1. cold: every kernel compiled for ARCH into an empty cache: the
#      baseline;
#   2. the delivery a node makes: `gkm build` of the cache the cold run
#      left, `gkm extract` of it where the kind is delivered;
#   3. warm: the same kernels against the delivered cache.
# Prints each run's seconds and hits, and the cold/warm ratio (best and
# median over ROUNDS).
#
#   hack/bench/jit-cold-start.sh tilelang
#   ARCH=sm_80 ROUNDS=3 hack/bench/jit-cold-start.sh tvm-ffi
#
# Needs the kind's package (hack/ci/components.sh tilelang or cutedsl; PYTHON
# names another interpreter) and a gkm binary (GKM; built from this tree if
# unset).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=hack/lib/cargo.sh
. "$HERE/../lib/cargo.sh"
tools_dir=${GKM_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gkm-tools}
KIND=${1:-}
ROUNDS=${ROUNDS:-3}
ARCH=${ARCH:-sm_90a}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Per kind: the interpreter, the module it imports, the script and its
# arguments, the cache's variable and where the delivery goes.
case $KIND in
  tilelang)
    python=${PYTHON:-$tools_dir/bin/tilelang-python} module=tilelang
    script=tilelang_kernels.py args=("$ARCH" gemm_64x64 gemm_128x128 gemm_64x128) report=kernels
    cache_var=TILELANG_CACHE_DIR delivered=$work/pod/home/.tilelang/cache
    extra_env=(TILELANG_PRINT_ON_COMPILATION=0)
    ;;
  tvm-ffi)
    python=${PYTHON:-$tools_dir/tilelang-0.1.15/bin/python} module=tvm_ffi
    script=tvm_ffi_modules.py args=(add_one negate scale shift) report=modules
    cache_var=TVM_FFI_CACHE_DIR delivered=$work/cold/cache
    # The CUDA architecture as TVM_FFI_CUDA_ARCH_LIST spells it: sm_90a is 9.0a.
    [[ $ARCH =~ ^sm_([0-9]+)([0-9])([af]?)$ ]] || { echo "ARCH=$ARCH is not sm_<digits>[a|f]" >&2; exit 2; }
    extra_env=(CXX=g++ CUDA_HOME="$tools_dir/tilelang-0.1.15/cuda-home"
      TVM_FFI_CUDA_ARCH_LIST="${BASH_REMATCH[1]}.${BASH_REMATCH[2]}${BASH_REMATCH[3]}")
    ;;
  cutedsl)
    python=${PYTHON:-$tools_dir/bin/cutedsl-python} module=cutlass
    script=cutedsl_kernels.py args=("$ARCH" add mul sub) report=kernels
    cache_var=CUTE_DSL_CACHE_DIR delivered=$work/pod/home/.cache/cutlass_python_cache
    extra_env=()
    ;;
  *)
    echo "usage: jit-cold-start.sh tilelang|tvm-ffi|cutedsl" >&2
    exit 2
    ;;
esac
if ! "$python" -c "import $module" 2>/dev/null; then
  echo "no $module for $python: run hack/ci/components.sh, or set PYTHON" >&2
  exit 1
fi
if [[ -z ${GKM:-} ]]; then
  (cd "$ROOT" && cargo build -q -p gkm --bin gkm)
  GKM=$(cargo_target_dir)/debug/gkm
fi

# compile CACHE: the kernels against CACHE; prints "SECONDS HITS
# KERNEL-SECONDS COUNT": the whole process's, and the package's own compile
# or load.
compile() {
  local out=$work/run.json start end
  start=$(date +%s.%N)
  env -i PATH=/usr/bin:/bin HOME="$work/home" TMPDIR="$work/home" "$cache_var=$1" "${extra_env[@]}" \
    "$python" "$ROOT/hack/fixtures/$script" "${args[@]}" > "$out" 2> "$work/run.log" ||
    { cat "$work/run.log" >&2; exit 1; }
  end=$(date +%s.%N)
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))[sys.argv[4]]; s=json.load(open(sys.argv[1]))["seconds"]; print(f"{float(sys.argv[3])-float(sys.argv[2]):.2f}", sum(v == "hit" for v in r.values()), "%.3f" % sum(s.values()), len(r))' \
    "$out" "$start" "$end" "$report"
}

mkdir -p "$work/home"
colds=() warms=() cold_kernels=() warm_kernels=()
for round in $(seq "$ROUNDS"); do
  rm -rf "$work/cold" "$work/pod" "$work/layout"
  read -r cold cold_hits cold_k count < <(compile "$work/cold/cache")
  "$GKM" build "$work/cold/cache" -t "oci:$work/layout:jit" > "$work/gkm.log" 2>&1 ||
    { cat "$work/gkm.log" >&2; exit 1; }
  rm -rf "$delivered"
  "$GKM" extract "oci:$work/layout:jit" -o "$delivered" > "$work/gkm.log" 2>&1 ||
    { cat "$work/gkm.log" >&2; exit 1; }
  read -r warm warm_hits warm_k count < <(compile "$delivered")
  echo "round $round: cold ${cold}s (kernels ${cold_k}s, $cold_hits of $count hits), delivered ${warm}s (kernels ${warm_k}s, $warm_hits of $count hits)"
  colds+=("$cold") warms+=("$warm") cold_kernels+=("$cold_k") warm_kernels+=("$warm_k")
done
python3 - "$KIND" "$ARCH" "${colds[*]}" "${warms[*]}" "${cold_kernels[*]}" "${warm_kernels[*]}" <<'PY'
import statistics, sys
kind, arch, cold, warm, cold_k, warm_k = sys.argv[1], sys.argv[2], *([float(x) for x in a.split()] for a in sys.argv[3:])
print(f"{kind} {arch}, {len(cold)} rounds; cold (an empty cache) is the baseline")
for what, c, w in [("whole process (Python, imports, kernels)", cold, warm), ("the package's compile or load", cold_k, warm_k)]:
    print(f"  {what}: cold best {min(c):.3f}s median {statistics.median(c):.3f}s, "
          f"delivered best {min(w):.3f}s median {statistics.median(w):.3f}s, "
          f"cold/delivered best {min(c)/min(w):.1f}x median {statistics.median(c)/statistics.median(w):.1f}x")
PY

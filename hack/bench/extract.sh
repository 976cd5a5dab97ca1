#!/usr/bin/env bash
# Benchmark `gkm extract` against GNU tar and cp on a synthetic Triton-like
# cache (~1 GiB, ~20k files by default).
#
# Prints, for each way of extracting, the best of RUNS wall-clock times and
# its ratio to GNU `tar -x` of the same layer (zstd and gzip) and to `cp -a`
# of the tree. A ratio below 1.00 means gkm was faster.
#
#   hack/bench/extract.sh                 # ~1 GiB, 20k files, 3 runs
#   SIZE_MIB=256 FILES=5000 RUNS=1 hack/bench/extract.sh
#
# Needs: python3, GNU tar with zstd (the zstd binary), docker-registry
# (Debian package `docker-registry`) for the registry rows, and a release
# build of gkm (built if GKM is not set).
set -euo pipefail

SIZE_MIB=${SIZE_MIB:-1024}
FILES=${FILES:-20000}
RUNS=${RUNS:-3}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=hack/lib/cargo.sh
. "$HERE/../lib/cargo.sh"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gkm-bench.XXXXXX")
REGISTRY_PID=
cleanup() {
  [[ -n $REGISTRY_PID ]] && kill "$REGISTRY_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

if [[ -z ${GKM:-} ]]; then
  (cd "$ROOT" && cargo build --release -q -p gkm)
  GKM=$(cargo_target_dir)/release/gkm
fi
for tool in python3 tar zstd; do
  command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 1; }
done

echo "== generating ${SIZE_MIB} MiB in ${FILES} files under $WORK/cache"
python3 "$HERE/synthetic_cache.py" "$WORK/cache" "$SIZE_MIB" "$FILES"
echo "   $(find "$WORK/cache" -type f | wc -l) files, $(du -sh "$WORK/cache" | cut -f1)"

echo "== building images"
"$GKM" build "$WORK/cache" -t "oci:$WORK/layout:zstd" --compression zstd >/dev/null 2>&1
"$GKM" build "$WORK/cache" -t "oci:$WORK/layout:gzip" --compression gzip >/dev/null 2>&1
layer_of() {  # the layer blob of a tag in the layout
  python3 "$HERE/layout_layer.py" "$WORK/layout" "$1"
}
ZST=$(layer_of zstd)
GZ=$(layer_of gzip)
echo "   zstd layer $(du -h "$ZST" | cut -f1), gzip layer $(du -h "$GZ" | cut -f1)"

REMOTE=
if command -v docker-registry >/dev/null || [[ -x /usr/bin/docker-registry ]]; then
  PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  mkdir -p "$WORK/registry"
  cat >"$WORK/registry/config.yml" <<YML
version: 0.1
storage:
  filesystem:
    rootdirectory: $WORK/registry/data
http:
  addr: 127.0.0.1:$PORT
log:
  level: error
YML
  /usr/bin/docker-registry serve "$WORK/registry/config.yml" >"$WORK/registry/log" 2>&1 &
  REGISTRY_PID=$!
  for _ in $(seq 50); do
    curl -sf "http://127.0.0.1:$PORT/v2/" >/dev/null 2>&1 && break
    sleep 0.2
  done
  REMOTE=127.0.0.1:$PORT/bench/cache
  "$GKM" push "oci:$WORK/layout:zstd" "$REMOTE:zstd" --insecure >/dev/null
  "$GKM" push "oci:$WORK/layout:gzip" "$REMOTE:gzip" --insecure >/dev/null
else
  echo "   docker-registry not found: skipping the registry rows (apt-get install -y docker-registry)"
fi

# best_of NAME CMD...: runs CMD (with $OUT a fresh directory) RUNS times.
declare -A BEST
best_of() {
  local name=$1; shift
  local best=
  for _ in $(seq "$RUNS"); do
    rm -rf "$WORK/out"
    export OUT=$WORK/out
    sync
    local t0 t1
    t0=$(date +%s.%N)
    "$@" >/dev/null 2>"$WORK/last.err" || { cat "$WORK/last.err" >&2; exit 1; }
    t1=$(date +%s.%N)
    local t
    t=$(echo "$t1 - $t0" | bc -l)
    if [[ -z $best ]] || (( $(echo "$t < $best" | bc -l) )); then best=$t; fi
  done
  BEST[$name]=$best
  printf "   %-34s %7.3f s\n" "$name" "$best"
}

echo "== extracting (best of $RUNS)"
best_of "cp -a" bash -c 'cp -a "$0" "$OUT"' "$WORK/cache"
best_of "tar -x (zstd)" bash -c 'mkdir "$OUT" && tar --zstd -xf "$0" -C "$OUT"' "$ZST"
best_of "tar -x (gzip)" bash -c 'mkdir "$OUT" && tar -xzf "$0" -C "$OUT"' "$GZ"
best_of "gkm extract layout zstd" "$GKM" extract "oci:$WORK/layout:zstd" -o "$WORK/out" --no-sync
best_of "gkm extract layout gzip" "$GKM" extract "oci:$WORK/layout:gzip" -o "$WORK/out" --no-sync
best_of "gkm extract layout zstd +fsync" "$GKM" extract "oci:$WORK/layout:zstd" -o "$WORK/out"
if [[ -n $REMOTE ]]; then
  best_of "gkm extract registry zstd" "$GKM" extract "$REMOTE:zstd" -o "$WORK/out" --insecure --no-sync
  best_of "gkm extract registry gzip" "$GKM" extract "$REMOTE:gzip" -o "$WORK/out" --insecure --no-sync
fi

echo "== ratios (gkm time / reference time; below 1.00 is faster)"
ratio() { printf "   %-34s / %-14s = %5.2f\n" "$1" "$2" "$(echo "${BEST[$1]} / ${BEST[$2]}" | bc -l)"; }
ratio "gkm extract layout zstd" "tar -x (zstd)"
ratio "gkm extract layout gzip" "tar -x (gzip)"
ratio "gkm extract layout zstd" "cp -a"
ratio "gkm extract layout zstd +fsync" "tar -x (zstd)"
if [[ -n $REMOTE ]]; then
  ratio "gkm extract registry zstd" "tar -x (zstd)"
  ratio "gkm extract registry gzip" "tar -x (gzip)"
  ratio "gkm extract registry zstd" "cp -a"
fi

#!/usr/bin/env bash
# Benchmark delivering a cache from a registry to a mounted view: an EROFS
# twin (one blob pulled, digest checked, fsynced, mounted from the file,
# an overlay view on it) against gkm's tar extraction, GNU tar and `cp -a`
# of the same tree (each then given the same overlay view).
#
# Trees: a synthetic Triton-like cache (~1 GiB, ~20k files, as extract.sh)
# and the real Triton fixture caches. Each tree is built once with
# `gkm build --compression zstd --erofs` and pushed to a local registry
# (Debian's docker-registry, as the tests use). Every delivery is timed
# from the first byte asked of the registry to the view being mounted,
# with what it wrote flushed to disk (EROFS: fsync of the blob; gkm: its
# own syncfs; tar and cp: `sync -f`); between deliveries everything is
# unmounted and removed, then `sync` and `echo 3 > /proc/sys/vm/drop_caches`.
# The order of the four ways rotates every round. Prints best and median of
# RUNS, their ratio to GNU tar, the inodes each delivery wrote into the
# store and the store's disk per digest.
#
#   sudo hack/bench/delivery.sh                  # ~1 GiB, 20k files, 3 runs
#   SIZE_MIB=256 FILES=5000 RUNS=3 hack/bench/delivery.sh
#
# Needs root (mounts, drop_caches), a kernel with EROFS and file-backed
# mounts (Linux 6.12+), python3, curl, zstd, GNU tar, docker-registry and
# mkfs.erofs (`hack/ci/components.sh debian`), and a release build of gkm
# (built if GKM is not set).
set -euo pipefail

SIZE_MIB=${SIZE_MIB:-1024}
FILES=${FILES:-20000}
RUNS=${RUNS:-3}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=hack/lib/cargo.sh
. "$HERE/../lib/cargo.sh"
FIXTURES=${FIXTURES:-$ROOT/../shared/fixtures/caches}
WORK=$(mktemp -d "${TMPDIR:-/var/tmp}/gkm-delivery.XXXXXX")
REGISTRY_PID=
unmount_all() {
  local m
  for m in $(awk -v w="$WORK" 'index($5, w) == 1 {print $5}' /proc/self/mountinfo | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
}
cleanup() {
  unmount_all
  [[ -n $REGISTRY_PID ]] && kill "$REGISTRY_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

[[ $(id -u) == 0 ]] || { echo "delivery.sh mounts and drops caches: run it as root" >&2; exit 1; }
for tool in python3 curl zstd tar mkfs.erofs /usr/bin/docker-registry; do
  command -v "$tool" >/dev/null || {
    echo "missing $tool (hack/ci/components.sh debian installs docker-registry and erofs-utils)" >&2
    exit 1
  }
done
grep -qw erofs /proc/filesystems || { echo "this kernel has no EROFS" >&2; exit 1; }
if [[ -z ${GKM:-} ]]; then
  (cd "$ROOT" && cargo build --release -q -p gkm)
  GKM=$(cargo_target_dir)/release/gkm
fi

echo "== registry"
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
REG=127.0.0.1:$PORT

echo "== trees"
python3 "$HERE/synthetic_cache.py" "$WORK/trees/synthetic" "$SIZE_MIB" "$FILES"
TREES=(synthetic)
for f in triton-vector-add-cuda-sm75 triton-vector-add-rocm-gfx90a; do
  if [[ -d $FIXTURES/$f ]]; then
    cp -a "$FIXTURES/$f" "$WORK/trees/$f"
    TREES+=("$f")
  else
    echo "   no fixture $FIXTURES/$f: skipped"
  fi
done

# layer_of NAME FIELD: the tar layer's digest (FIELD layer) or its EROFS
# twin's (FIELD erofs) in NAME's manifest in the registry.
manifest_field() {
  curl -sf -H 'Accept: application/vnd.oci.image.manifest.v1+json' \
    "http://$REG/v2/bench/$1/manifests/v1" | python3 -c '
import json, sys
layer = json.load(sys.stdin)["layers"][0]
a = layer.get("annotations", {})
print({"layer": layer["digest"], "erofs": a.get("io.gkm.erofs.digest", "")}[sys.argv[1]])' "$2"
}

echo "== building and pushing (gkm build --compression zstd --erofs)"
declare -A TAR_DIGEST EROFS_DIGEST
for t in "${TREES[@]}"; do
  s0=$(date +%s.%N)
  "$GKM" build "$WORK/trees/$t" -t "$REG/bench/$t:v1" --compression zstd --erofs --insecure >/dev/null 2>>"$WORK/gkm.log"
  s1=$(date +%s.%N)
  TAR_DIGEST[$t]=$(manifest_field "$t" layer)
  EROFS_DIGEST[$t]=$(manifest_field "$t" erofs)
  [[ -n ${EROFS_DIGEST[$t]} ]] || { echo "$t: the image names no EROFS twin" >&2; exit 1; }
  blob_size() { curl -sfI "http://$REG/v2/bench/$t/blobs/$1" | tr -d '\r' | awk 'tolower($1)=="content-length:" {print $2}'; }
  printf "   %-30s %6d files  tree %11d B  tar+zstd %11d B  erofs lz4hc %11d B  (built in %.1f s)\n" \
    "$t" "$(find "$WORK/trees/$t" -type f | wc -l)" \
    "$(du -sb --apparent-size "$WORK/trees/$t" | cut -f1)" \
    "$(blob_size "${TAR_DIGEST[$t]}")" "$(blob_size "${EROFS_DIGEST[$t]}")" \
    "$(echo "$s1 - $s0" | bc -l)"
done

STORE=$WORK/store
VIEWS=$WORK/views
mkdir -p "$STORE" "$VIEWS"

# view LOWER: an overlay view at $VIEWS/view with LOWER under a writable upper.
view() {
  mkdir -p "$VIEWS/upper" "$VIEWS/work" "$VIEWS/view"
  mount -t overlay overlay -o "lowerdir=$1,upperdir=$VIEWS/upper,workdir=$VIEWS/work" "$VIEWS/view"
}

blob_url() { echo "http://$REG/v2/bench/$1/blobs/$2"; }
if command -v openssl >/dev/null; then
  sha256() { openssl dgst -sha256 -r; }
else
  sha256() { sha256sum; }
fi

# The four deliveries of tree $1 into $STORE/entry; each ends with the view mounted.
deliver_erofs() {
  local t=$1 digest=${EROFS_DIGEST[$1]}
  mkdir -p "$STORE/entry"
  # The digest is checked as the blob is written, in one pass (OpenSSL's
  # SHA-256 uses the CPU's SHA extensions, as gkm's does; coreutils' does not).
  local got
  got=$(curl -sf "$(blob_url "$t" "$digest")" | tee "$STORE/entry/blob.tmp" | sha256 | cut -d' ' -f1)
  [[ sha256:$got == "$digest" ]] || { echo "digest mismatch" >&2; return 1; }
  sync "$STORE/entry/blob.tmp"
  mv "$STORE/entry/blob.tmp" "$STORE/entry/blob.erofs"
  mkdir -p "$STORE/mnt"
  python3 "$HERE/erofs_mount.py" "$STORE/entry/blob.erofs" "$STORE/mnt"
  view "$STORE/mnt/io.triton.cache"
}
deliver_gkm() {
  "$GKM" extract "$REG/bench/$1:v1" -o "$STORE/entry" --insecure >/dev/null 2>>"$WORK/gkm.log"
  view "$STORE/entry"
}
deliver_tar() {
  mkdir -p "$STORE/entry"
  curl -sf "$(blob_url "$1" "${TAR_DIGEST[$1]}")" | tar --zstd -x -C "$STORE/entry"
  sync -f "$STORE/entry"
  view "$STORE/entry/io.triton.cache"
}
deliver_cp() {
  cp -a "$WORK/trees/$1" "$STORE/entry"
  sync -f "$STORE/entry"
  view "$STORE/entry"
}

settle() {
  unmount_all
  rm -rf "$STORE" "$VIEWS"
  mkdir -p "$STORE" "$VIEWS"
  sync
  echo 3 >/proc/sys/vm/drop_caches
}

WAYS=(erofs gkm tar cp)
declare -A NAME=([erofs]="EROFS blob + mount" [gkm]="gkm extract (tar+zstd)" [tar]="GNU tar -x (tar+zstd)" [cp]="cp -a")
declare -A TIMES INODES DISK
for t in "${TREES[@]}"; do
  expected=$(find "$WORK/trees/$t" -type f | wc -l)
  for ((r = 0; r < RUNS; r++)); do
    for ((i = 0; i < ${#WAYS[@]}; i++)); do
      w=${WAYS[$(((i + r) % ${#WAYS[@]}))]}
      settle
      t0=$(date +%s.%N)
      "deliver_$w" "$t"
      t1=$(date +%s.%N)
      TIMES[$t/$w]+="$(echo "$t1 - $t0" | bc -l) "
      seen=$(find "$VIEWS/view" -type f | wc -l)
      [[ $seen == "$expected" ]] || { echo "$t/$w: the view shows $seen files, expected $expected" >&2; exit 1; }
      INODES[$t/$w]=$(find "$STORE/entry" -xdev | wc -l)
      DISK[$t/$w]=$(du -s --block-size=1 "$STORE/entry" | cut -f1)
    done
  done
done
settle

stats() {  # best and median of the times given
  python3 -c 'import statistics, sys; v = sorted(map(float, sys.argv[1:])); print(f"{v[0]:.3f} {statistics.median(v):.3f}")' "$@"
}
echo "== registry to mounted view: best and median of $RUNS (s), ratio to GNU tar (below 1.00 is faster)"
printf "   %-30s %-24s %8s %8s %8s %8s %8s %14s\n" tree way best median "x tar" "x tar" inodes "store disk B"
printf "   %-30s %-24s %8s %8s %8s %8s %8s %14s\n" "" "" "" "" best median "" ""
for t in "${TREES[@]}"; do
  read -r tar_best tar_median <<<"$(stats ${TIMES[$t/tar]})"
  for w in "${WAYS[@]}"; do
    read -r best median <<<"$(stats ${TIMES[$t/$w]})"
    printf "   %-30s %-24s %8.3f %8.3f %8.2f %8.2f %8d %14d\n" "$t" "${NAME[$w]}" "$best" "$median" \
      "$(echo "$best / $tar_best" | bc -l)" "$(echo "$median / $tar_median" | bc -l)" \
      "${INODES[$t/$w]}" "${DISK[$t/$w]}"
  done
done

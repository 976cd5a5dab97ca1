#!/usr/bin/env bash
# Benchmark `gkm extract` against GNU tar and cp on a synthetic Triton-like
# cache (~1 GiB, ~20k files by default).
#
# Prints, for each way of extracting, the best of RUNS wall-clock times and
# its ratio to GNU `tar -x` of the same layer (zstd and gzip) and to `cp -a`
# of the tree. A ratio below 1.00 means gkm was faster.
#
#   hack/bench-extract.sh                 # ~1 GiB, 20k files, 3 runs
#   SIZE_MIB=256 FILES=5000 RUNS=1 hack/bench-extract.sh
#
# Needs: python3, GNU tar with zstd (the zstd binary), docker-registry
# (Debian package `docker-registry`) for the registry rows, and a release
# build of gkm (built if GKM is not set).
set -euo pipefail

SIZE_MIB=${SIZE_MIB:-1024}
FILES=${FILES:-20000}
RUNS=${RUNS:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gkm-bench.XXXXXX")
REGISTRY_PID=
cleanup() {
  [[ -n $REGISTRY_PID ]] && kill "$REGISTRY_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

if [[ -z ${GKM:-} ]]; then
  (cd "$ROOT" && cargo build --release -q -p gkm)
  GKM=$ROOT/target/release/gkm
fi
for tool in python3 tar zstd; do
  command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 1; }
done

echo "== generating ${SIZE_MIB} MiB in ${FILES} files under $WORK/cache"
python3 - "$WORK/cache" "$SIZE_MIB" "$FILES" <<'PY'
import base64, hashlib, json, os, random, sys
root, size_mib, nfiles = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(42)
per_kernel = 7
kernels = max(1, nfiles // per_kernel)
avg = size_mib * (1 << 20) // (kernels * 5)  # five bulky files per kernel
# Pools sliced per file: PTX-like text compresses ~4x, cubin-like binary ~1.5x.
ops = ["ld.global.f32", "st.global.f32", "add.f32", "mul.rn.f32", "fma.rn.f32", "mov.u32",
       "setp.lt.s32", "bra.uni", "cvt.rn.f32.s32", "shl.b32", "mad.lo.s32", "bar.sync"]
lines, total = [], 0
while total < 32 << 20:
    op = rng.choice(ops)
    line = f"\t{op} \t%r{rng.randrange(4096)}, [%rd{rng.randrange(512)}+{rng.randrange(1 << 16)}];\n"
    lines.append(line)
    total += len(line)
text = "".join(lines).encode()
binary = bytearray()
while len(binary) < 32 << 20:
    binary += rng.randbytes(96) + bytes([rng.randrange(4)]) * 160
binary = bytes(binary)
def piece(pool, n):
    start = rng.randrange(len(pool) - n - 1)
    return pool[start:start + n]
os.makedirs(root)
for k in range(kernels):
    key = base64.b32encode(hashlib.sha256(b"key%d" % k).digest()).decode().rstrip("=")
    d = os.path.join(root, key)
    os.mkdir(d)
    name = f"kernel_{k}"
    h = hashlib.sha256(name.encode()).hexdigest()
    meta = {"hash": h, "target": {"backend": "cuda", "arch": 90, "warp_size": 32}, "num_warps": 4,
            "num_ctas": 1, "num_stages": 3, "ptx_version": 84, "debug": False, "backend_name": "cuda",
            "triton_version": "3.3.0", "shared": 0, "name": name}
    files = {f"{name}.json": json.dumps(meta).encode()}
    sizes = [max(64, int(rng.expovariate(1 / avg))) for _ in range(5)]
    files[f"{name}.cubin"] = piece(binary, min(sizes[0], 8 << 20))
    for ext, n in zip(["ptx", "llir", "ttir", "ttgir"], sizes[1:]):
        files[f"{name}.{ext}"] = b"//\n.version 8.4\n.target sm_90a\n" + piece(text, min(n, 8 << 20))
    files[f"__grp__{name}.json"] = json.dumps(
        {"child_paths": {f: os.path.join(d, f) for f in files}}).encode()
    for f, b in files.items():
        with open(os.path.join(d, f), "wb") as out:
            out.write(b)
PY
echo "   $(find "$WORK/cache" -type f | wc -l) files, $(du -sh "$WORK/cache" | cut -f1)"

echo "== building images"
"$GKM" build "$WORK/cache" -t "oci:$WORK/layout:zstd" --compression zstd >/dev/null 2>&1
"$GKM" build "$WORK/cache" -t "oci:$WORK/layout:gzip" --compression gzip >/dev/null 2>&1
layer_of() {  # the layer blob of a tag in the layout
  python3 - "$WORK/layout" "$1" <<'PY'
import json, sys, os
root, tag = sys.argv[1], sys.argv[2]
index = json.load(open(os.path.join(root, "index.json")))
m = next(d for d in index["manifests"] if d.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag)
blob = lambda d: os.path.join(root, "blobs", *d.split(":"))
manifest = json.load(open(blob(m["digest"])))
print(blob(manifest["layers"][0]["digest"]))
PY
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

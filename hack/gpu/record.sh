#!/usr/bin/env bash
# Records what gkm sees on a machine with a real NVIDIA GPU, for the fixtures
# the tests replay without one (gkm-gpu/tests/fixtures/nvml-<gpu>/ and
# fixtures/caches/triton-vector-add-cuda-sm<arch>/):
#   - `gkm gpus` (table, --json, --labels --vendor-labels) through NVML,
#   - Triton's vector-add kernel compiled and run there (hack/gpu/triton_vector_add.py,
#     needs PyTorch and Triton), its cache, and `gkm check` of that cache and
#     of the sm75 fixture against the GPU.
#
#   GKM=path/to/gkm SM75=path/to/triton-vector-add-cuda-sm75 OUT=dir hack/gpu/record.sh
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
gkm=${GKM:-gkm}
out=${OUT:?set OUT to the directory to write the recordings into}
sm75=${SM75:-$here/../../../shared/fixtures/caches/triton-vector-add-cuda-sm75}
mkdir -p "$out"
exec > >(tee "$out/run.log") 2>&1
echo "== uname"; uname -a; head -2 /etc/os-release
echo "== nvidia-smi"; nvidia-smi
echo "== gkm gpus"; "$gkm" gpus; echo "rc=$?"
"$gkm" gpus --json > "$out/gpus.json"; echo "json rc=$?"
echo "== gkm gpus --labels --vendor-labels"; "$gkm" gpus --labels --vendor-labels; echo "rc=$?"
echo "== triton"
export TRITON_CACHE_DIR=/tmp/triton-vector-add-cuda
rm -rf "$TRITON_CACHE_DIR"
python3 "$here/triton_vector_add.py"; echo "rc=$?"
find "$TRITON_CACHE_DIR" -type f | sort
tar -C "$(dirname "$TRITON_CACHE_DIR")" -czf "$out/triton-vector-add-cuda.tgz" "$(basename "$TRITON_CACHE_DIR")"
echo "== gkm check (the new cache, this GPU)"; "$gkm" check "$TRITON_CACHE_DIR"; echo "rc=$?"
"$gkm" check --json "$TRITON_CACHE_DIR" > "$out/check-new.json"; echo "json rc=$?"
echo "== gkm build + inspect + check of its image"
"$gkm" build "$TRITON_CACHE_DIR" -t oci:/tmp/gkm-layout:new; echo "rc=$?"
"$gkm" inspect oci:/tmp/gkm-layout:new; echo "rc=$?"
"$gkm" check oci:/tmp/gkm-layout:new; echo "rc=$?"
echo "== gkm check (sm75 fixture, this GPU)"; "$gkm" check "$sm75"; echo "rc=$?"
"$gkm" check --json "$sm75" > "$out/check-sm75.json"; echo "json rc=$?"

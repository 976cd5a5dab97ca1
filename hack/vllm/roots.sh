#!/usr/bin/env bash
# Writes hack/fixtures/vllm-roots/<arch>.tar.zst: the VLLM_CACHE_ROOT real
# vLLM (hack/ci/components.sh vllm) leaves after one cold engine start of
# each model in hack/fixtures/vllm-models (hack/vllm/engine_start.py), as
# it is (Inductor's empty locks/ included), with the start's JSON report
# beside it (<arch>.json). The root is compiled at a fixed path,
# /tmp/gkm-vllm-roots/<arch>, which its files name, from a copy of the
# model at /tmp/gkm-vllm-roots/models/<arch>, which the report names.
#
#   hack/vllm/roots.sh
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tools_dir=${GKM_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gkm-tools}
python=$tools_dir/bin/vllm-python
if [[ ! -x $python ]]; then
  echo "no vLLM at $python: run hack/ci/components.sh vllm" >&2
  exit 1
fi
home=/tmp/gkm-vllm-roots
out=$root/hack/fixtures/vllm-roots

exec 9>"$home.lock"
flock 9
rm -rf "$home" && mkdir -p "$home/scratch" "$out"
for model in "$root"/hack/fixtures/vllm-models/*/; do
  arch=$(basename "$model")
  mkdir -p "$home/models" && cp -r "$model" "$home/models/$arch"
  # A scratch HOME and TMPDIR, so nothing of the user's reaches the engine.
  env -i PATH=/usr/bin:/bin HOME="$home/scratch" TMPDIR="$home/scratch" \
    "$python" "$root/hack/vllm/engine_start.py" --model "$home/models/$arch" --cache-root "$home/$arch" \
    > "$out/$arch.json"
  tar -C "$home/$arch" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - . \
    | zstd -q -19 -f -o "$out/$arch.tar.zst"
  echo "$arch: $(du -sb "$home/$arch" | cut -f1) bytes, $(stat -c %s "$out/$arch.tar.zst") compressed" >&2
done

#!/usr/bin/env bash
# Writes fixtures/triton: real Triton caches of the kernels in
# hack/triton-fleet.py, compiled ahead of time for every target of the fleet
# (no GPU needed), one TRITON_CACHE_DIR tree per target, and their
# PROVENANCE. Triton is the pinned one hack/components.sh installs.
#
# Triton's group files (__grp__<kernel>.json) record the absolute path of
# every file of a kernel, and Triton reuses a kernel only when those paths
# exist: a cache is found only at the path it was compiled at. So each
# target is compiled at a fixed path, $home/<target>, and whoever checks a
# delivered fixture puts it there.
#
#   hack/triton-fixtures.sh
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools_dir=${GKM_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gkm-tools}
python=$tools_dir/bin/triton-python
if [[ ! -x $python ]]; then
  echo "no Triton at $python: run hack/components.sh triton" >&2
  exit 1
fi
fleet=$root/hack/triton-fleet.py
out=$root/fixtures/triton
home=/tmp/gkm-triton-fixtures

# The directory a target's cache lives in: cuda/90/32 -> cuda-90-32.
dir_of() { tr / - <<<"$1"; }

# The lock bins/gkm/tests/triton_reuse.rs takes on the same paths.
exec 9>"$home.lock"
flock 9

rm -rf "$out.tmp" && mkdir -p "$out.tmp"
targets=()
while IFS=$'\t' read -r target gpus; do
  targets+=("$target")
  cache=$home/$(dir_of "$target")
  rm -rf "$cache" && mkdir -p "$cache"
  # Each target in a process of its own, as a workload compiles for its GPU.
  "$python" "$fleet" compile --target "$target" --cache "$cache"
  cp -r "$cache" "$out.tmp/" && rm -rf "$cache"
  printf '  %-14s %-16s %s\n' "$target" "$(dir_of "$target")/" "$gpus" >>"$out.tmp/.targets"
done < <("$python" "$fleet" targets)

triton_dir=$("$python" -c 'import os, triton; print(os.path.dirname(triton.__file__))')
tool_version() { "$triton_dir/backends/nvidia/bin/$1" --version | sed -n 's/^Cuda compilation tools, //p'; }
{
  echo "Real Triton caches, one TRITON_CACHE_DIR tree per target, compiled ahead"
  echo "of time without a GPU by hack/triton-fixtures.sh. Unmodified."
  echo
  echo "kernels:  add_kernel (Triton's vector-add tutorial kernel), and scaled_add_kernel"
  echo "          compiled for every config of its autotuning space (hack/triton-fleet.py)"
  echo "triton:   $("$python" -c 'import triton; print(triton.__version__)') (PyPI wheel, hack/triton-requirements.txt) in $triton_dir"
  echo "python:   $("$python" -c 'import platform; print(platform.python_implementation(), platform.python_version())')"
  echo "ptxas:    $(tool_version ptxas); ptxas-blackwell: $(tool_version ptxas-blackwell)"
  echo "cache:    compiled at $home/<directory>, the only path Triton finds it at"
  echo "          (its __grp__ files record the absolute paths)"
  echo "machine:  $(uname -sm), no GPU"
  echo "date:     $(date -u +%Y-%m-%d)"
  echo "command:  hack/components.sh triton && hack/triton-fixtures.sh"
  echo "check:    triton-python hack/triton-fleet.py check --target TARGET --cache DIR"
  echo
  echo "targets (target, directory, GPUs):"
  cat "$out.tmp/.targets"
} >"$out.tmp/PROVENANCE"
rm "$out.tmp/.targets"

rm -rf "$out" && mv "$out.tmp" "$out"
echo "wrote ${#targets[@]} targets into $out ($(du -sh "$out" | cut -f1))"

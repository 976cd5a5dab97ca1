#!/usr/bin/env bash
# Run gkm's cargo-fuzz targets one after another, keep a minimised corpus per
# target under fuzz/corpus/<target>/ and every crash input under
# fuzz/regressions/<target>/ (replayed on stable by
# `cargo test -p gkm-oci --test fuzz_replay`).
#
#   hack/hostile/fuzz.sh [SECONDS] [TARGET...]     # default: 60 seconds, every target
#   hack/hostile/fuzz.sh --install                 # only install cargo-fuzz
#
# cargo-fuzz is installed pinned into $GKM_TOOLS_DIR/cargo-fuzz-$VERSION
# (default ~/.cache/gkm-tools); a second run installs nothing. It needs the
# nightly toolchain (`rustup toolchain install nightly`).
set -euo pipefail

CARGO_FUZZ_VERSION=0.13.2
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tools="${GKM_TOOLS_DIR:-$HOME/.cache/gkm-tools}/cargo-fuzz-$CARGO_FUZZ_VERSION"

if [[ ! -x "$tools/bin/cargo-fuzz" ]]; then
  echo "installing cargo-fuzz $CARGO_FUZZ_VERSION into $tools" >&2
  cargo +nightly install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked --root "$tools"
fi
export PATH="$tools/bin:$PATH"
[[ "${1:-}" == "--install" ]] && exit 0

seconds="${1:-60}"
shift || true
cd "$root/fuzz"
if [[ $# -gt 0 ]]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo +nightly fuzz list)
fi

# Bound memory and input size: the parsers are meant for small documents and
# the machine is shared.
fuzz_flags=(-jobs=1 -workers=1 -rss_limit_mb=2048 -max_len=65536 -timeout=10)

# The features a target needs (its `required-features` in fuzz/Cargo.toml).
features_of() {
  awk -v t="$1" '
    /^\[\[bin\]\]/ { name = "" }
    /^name = / { gsub(/"/, "", $3); name = $3 }
    /^required-features = / && name == t { gsub(/[\[\]" ]/, "", $0); sub(/required-features=/, ""); print }
  ' Cargo.toml
}

failed=()
for target in "${targets[@]}"; do
  # Targets with features build in a target directory of their own, so the
  # two kinds of build do not undo each other's feature set.
  features=()
  f="$(features_of "$target")"
  [[ -n "$f" ]] && features=(--features "$f" --target-dir "target/features-$f")
  corpus="corpus/$target"
  regressions="regressions/$target"
  artifacts="artifacts/$target"
  mkdir -p "$corpus" "$regressions" "$artifacts"
  echo "== $target: ${seconds}s" >&2
  log="$(mktemp)"
  status=0
  cargo +nightly fuzz run "${features[@]}" "$target" "$corpus" -- \
    "${fuzz_flags[@]}" -max_total_time="$seconds" -artifact_prefix="$artifacts/" \
    2>&1 | tee "$log" | grep -E '^(#[0-9]+ +(INITED|DONE|pulse)|==[0-9]+==|SUMMARY|Done [0-9]+ runs|stat::)' >&2 || status=$?
  if ! grep -qE '^Done [0-9]+ runs' "$log" && [[ -z "$(ls -A "$artifacts")" ]]; then
    # Neither finished nor crashed: the build or libFuzzer failed.
    grep -vE '^ +([0-9]+:|at )' "$log" | tail -20 >&2
    echo "   $target did not run" >&2
    failed+=("$target")
    rm -f "$log"
    continue
  fi
  for crash in "$artifacts"/*; do
    [[ -f "$crash" ]] || continue
    cp "$crash" "$regressions/"
    echo "   crash kept as $regressions/$(basename "$crash")" >&2
    rm -f "$crash"
  done
  # Minimise the corpus in place: the fewest inputs covering every edge
  # (hit counts and value profiles left out), so the replay stays small.
  tmp="$(mktemp -d)"
  if ! cargo +nightly fuzz cmin "${features[@]}" "$target" "$corpus" -- \
    -set_cover_merge=1 -use_counters=0 -use_value_profile=0 \
    -rss_limit_mb=2048 -max_len=65536 >"$tmp.log" 2>&1; then
    tail -5 "$tmp.log" >&2
    echo "   minimising $corpus failed" >&2
  fi
  files=$(find "$corpus" -type f | wc -l)
  bytes=$(du -sb "$corpus" | cut -f1)
  execs=$(grep -oE 'exec/s: [0-9]+' "$log" | tail -1 | cut -d' ' -f2 || true)
  runs=$(grep -oE '^Done [0-9]+ runs' "$log" | tail -1 | cut -d' ' -f2 || true)
  echo "RESULT target=$target seconds=$seconds runs=${runs:-?} execs_per_s=${execs:-?} corpus_files=$files corpus_bytes=$bytes crashes=$(find "$regressions" -type f | wc -l)" >&2
  rm -rf "$tmp" "$tmp.log" "$log"
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "did not run: ${failed[*]}" >&2
  exit 1
fi

#!/usr/bin/env bash
# Hostile inputs for `gkm extract`: small images built to make an extractor
# allocate or write without bound (huge PAX headers, GNU long names and long
# links, very many long paths, a zstd frame asking for a 2 GiB window, a
# layer longer than its descriptor says, manifests and configs that do not
# end, a gzip bomb), next to legitimate ones.
#
# Prints a Markdown table: input, compressed size, outcome (the rule or
# error, or "extracted"), peak RSS (from /usr/bin/time -v) and wall time.
# Fails when any peak RSS reaches LIMIT_MIB (default 128).
#
#   hack/hostile/extract.sh
#   GKM=target/release/gkm SCALE_MIB=1024 hack/hostile/extract.sh
#
# Needs: python3, /usr/bin/time (Debian package `time`), and a build of gkm
# (a debug build is made if GKM is not set; peak memory does not depend on
# the profile, only time does).
set -euo pipefail

SCALE_MIB=${SCALE_MIB:-512}
LIMIT_MIB=${LIMIT_MIB:-128}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=hack/lib/cargo.sh
. "$HERE/../lib/cargo.sh"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gkm-hostile.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

if [[ -z ${GKM:-} ]]; then
  (cd "$ROOT" && cargo build -q -p gkm)
  GKM=$(cargo_target_dir)/debug/gkm
fi
for tool in python3 /usr/bin/time; do
  command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 1; }
done

echo "generating inputs in $WORK (scale ${SCALE_MIB} MiB)" >&2
python3 "$HERE/inputs.py" "$WORK" "$SCALE_MIB"

printf '| input | compressed | outcome | peak RSS | time |\n|---|---:|---|---:|---:|\n'
worst=0
for dir in "$WORK"/*/; do
  name=$(basename "$dir")
  blobs=$(du -sb "$dir/blobs" | cut -f1)
  out="$WORK/out-$name"
  set +e
  /usr/bin/time -v -o "$WORK/time.txt" "$GKM" extract --no-sync "oci:$dir:x" -o "$out" \
    >/dev/null 2>"$WORK/err.txt"
  rc=$?
  set -e
  rss_kib=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$WORK/time.txt")
  elapsed=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$WORK/time.txt")
  if [[ $rc -eq 0 ]]; then
    outcome="extracted"
  else
    last=$(grep -v '^\s*$' "$WORK/err.txt" | tail -1)
    rule=$(sed -n 's/.*layer rejected: entry .*": \([a-z0-9-]*\): .*/\1/p' <<<"$last")
    if [[ -n $rule ]]; then
      outcome="rejected: $rule: ${last##*: }"
    else
      outcome="refused: $(sed 's/sha256:\([0-9a-f]\{8\}\)[0-9a-f]*/sha256:\1…/g' <<<"${last#gkm: }")"
    fi
    outcome=$(sed 's/|/\\|/g' <<<"$outcome" | cut -c1-100)
  fi
  rss_mib=$((rss_kib / 1024))
  ((rss_mib > worst)) && worst=$rss_mib
  printf '| %s | %s | %s | %d MiB | %s |\n' "$name" \
    "$(numfmt --to=iec --suffix=B "$blobs")" "$outcome" "$rss_mib" "$elapsed"
  rm -rf "$out"
done
echo
echo "worst peak RSS: ${worst} MiB (limit ${LIMIT_MIB} MiB)"
((worst < LIMIT_MIB))

#!/usr/bin/env bash
# Builds gkm's container images without Docker or any other daemon, as OCI
# image layouts, and optionally pushes them or imports them into containerd.
#
#   hack/images/build.sh                          # release builds, into target/images
#   hack/images/build.sh --profile dev            # debug builds (stripped), faster
#   hack/images/build.sh --push registry.example.com/gkm
#   hack/images/build.sh --import /run/containerd/containerd.sock   # repeatable
#   hack/images/build.sh gkm-operator gkm-agent   # only these
#   hack/images/build.sh --bin-dir DIR            # binaries already built in DIR
#
# Each image is two layers:
#   1. a base of the files the binaries need at run time, taken from pinned
#      Debian bookworm packages: glibc (libc6: libc, libm, the dynamic loader),
#      libgcc-s1 (unwinding) and the Mozilla CA bundle (ca-certificates, for
#      registries over TLS), plus /etc/passwd and /etc/group naming root and
#      the unprivileged user 65532. No shell, no package manager. (The Rust
#      toolchain here has no musl target, so the binaries are glibc ones.)
#   2. the component's stripped binary in /usr/bin.
# Images are reproducible: every file's time is the last commit's time
# (SOURCE_DATE_EPOCH), owners are 0:0, archives are sorted and gzip writes no
# name or time, so the same sources, Cargo.lock and toolchain give the same
# digests. Release builds also map the checkout and Cargo's home out of the
# binaries, so the checkout's path does not matter.
#
# Output, per component NAME, under --out (default target/images):
#   NAME/      an OCI image layout, its image tagged TAG (index.json's
#              org.opencontainers.image.ref.name)
#   NAME.tar   the same layout as one archive, for `ctr images import`,
#              `podman load -i` or `docker load -i` (Docker 25 and later)
#   digests    NAME@DIGEST per line
# --push copies each layout to REGISTRY/NAME:TAG with `gkm push`; --import
# loads each archive into the containerd at each SOCKET given, namespace
# k8s.io.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
# shellcheck source=hack/lib/cargo.sh
. "$root/hack/lib/cargo.sh"

ALL=(gkm-operator gkm-agent gkm-csi gkm-device-plugin gkm-dra-plugin gkm-scheduler-extender gkm)
# Components that need root in their pod (the chart's securityContexts say
# why); every other image runs as 65532.
ROOT_COMPONENTS=" gkm-agent gkm-csi gkm-device-plugin gkm-dra-plugin "
# The Debian packages of the base layer, pinned.
DEBIAN_BASE=(libc6=2.36-9+deb12u14 libgcc-s1=12.2.0-14+deb12u1 ca-certificates=20230311+deb12u1)

profile=release
bin_dir=
out=
push=
imports=()
insecure=
repository=ghcr.io/gkm-rs
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
tag=v$version
components=()
while (($#)); do
  case $1 in
    --profile) profile=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --bin-dir) bin_dir=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --repository) repository=$2; shift 2 ;;
    --push) push=$2; shift 2 ;;
    --insecure) insecure=--insecure; shift ;;
    --import) imports+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) components+=("$1"); shift ;;
  esac
done
((${#components[@]})) || components=("${ALL[@]}")
for c in "${components[@]}"; do
  [[ " ${ALL[*]} " == *" $c "* ]] || { echo "unknown component $c (known: ${ALL[*]})" >&2; exit 2; }
done
[[ $profile == release || $profile == dev ]] || { echo "--profile is release or dev" >&2; exit 2; }
# Release images are compressed hard; dev images quickly (tests build them).
gzip_level=9
[[ $profile == dev ]] && gzip_level=1

target_dir=$(cargo_target_dir)
out=${out:-$target_dir/images}
tools_dir=${GKM_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gkm-tools}
log() { printf '==> %s\n' "$*" >&2; }

revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
source_url=$(sed -n 's/^repository = "\(.*\)"$/\1/p' Cargo.toml | head -1)
licenses=$(sed -n 's/^license = "\(.*\)"$/\1/p' Cargo.toml | head -1)

# --- binaries ---------------------------------------------------------------
packages=()
for c in "${components[@]}"; do packages+=(-p "$c"); done
# --push sends the layouts with the gkm CLI.
[[ -z $push || " ${components[*]} " == *" gkm "* ]] || packages+=(-p gkm)
if [[ -n $bin_dir ]]; then
  log "binaries from $bin_dir"
elif [[ $profile == release ]]; then
  cargo_home=${CARGO_HOME:-$HOME/.cargo}
  export RUSTFLAGS="${RUSTFLAGS:-} --remap-path-prefix=$root=/gkm --remap-path-prefix=$cargo_home=/cargo"
  log "cargo build --release ${components[*]}"
  cargo build --locked --release --bins "${packages[@]}"
  bin_dir=$target_dir/release
else
  log "cargo build ${components[*]}"
  cargo build --locked --bins "${packages[@]}"
  bin_dir=$target_dir/debug
fi

# --- deterministic archives ---------------------------------------------------
# tar of DIR's contents, sorted, owned by 0:0, every time SOURCE_DATE_EPOCH.
det_tar() {
  local dir=$1 dest=$2
  find "$dir" -mindepth 1 -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
  tar -C "$dir" --sort=name --format=gnu --owner=0 --group=0 --numeric-owner \
    --mtime="@$SOURCE_DATE_EPOCH" -cf "$dest" .
}
sha() { sha256sum "$1" | cut -d' ' -f1; }
# Moves FILE into LAYOUT's blobs; prints its digest.
add_blob() {
  local layout=$1 file=$2 digest
  digest=$(sha "$file")
  mkdir -p "$layout/blobs/sha256"
  mv "$file" "$layout/blobs/sha256/$digest"
  echo "$digest"
}

# --- the base layer -------------------------------------------------------------
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
debs=$tools_dir/debs
mkdir -p "$debs"
base=$work/base
mkdir -p "$base"
for spec in "${DEBIAN_BASE[@]}"; do
  name=${spec%%=*} ver=${spec#*=}
  deb=$(ls "$debs/${name}_${ver//:/%3a}_"*.deb 2>/dev/null | head -1 || true)
  if [[ -z $deb ]]; then
    log "apt-get download $spec"
    (cd "$debs" && apt-get -o APT::Sandbox::User=root download -q "$spec" >/dev/null) || {
      echo "cannot download $spec: run apt-get update, or bump DEBIAN_BASE in $0" >&2
      exit 1
    }
    deb=$(ls "$debs/${name}_${ver//:/%3a}_"*.deb | head -1)
  fi
  dpkg-deb -x "$deb" "$work/deb-$name"
done
# Only what the binaries load: the loader, libc, libm, libgcc_s.
lib=lib/x86_64-linux-gnu
mkdir -p "$base/$lib" "$base/lib64" "$base/etc/ssl/certs" "$base/tmp" "$base/usr/bin"
for so in ld-linux-x86-64.so.2 libc.so.6 libm.so.6; do
  cp "$work/deb-libc6/$lib/$so" "$base/$lib/$so"
done
cp "$work/deb-libgcc-s1/$lib/libgcc_s.so.1" "$base/$lib/"
ln -s "/$lib/ld-linux-x86-64.so.2" "$base/lib64/ld-linux-x86-64.so.2"
find "$work/deb-ca-certificates/usr/share/ca-certificates" -name '*.crt' | LC_ALL=C sort |
  xargs cat > "$base/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$base/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' > "$base/etc/group"
chmod 1777 "$base/tmp"
det_tar "$base" "$work/base.tar"
base_diff=$(sha "$work/base.tar")
gzip -n "-$gzip_level" -c "$work/base.tar" > "$work/base.tar.gz"

# --- one image per component ------------------------------------------------------
mkdir -p "$out"
: > "$out/digests.tmp"
for c in "${components[@]}"; do
  layout=$out/$c
  rm -rf "$layout" "$layout.tar"
  mkdir -p "$layout/blobs/sha256"
  printf '{"imageLayoutVersion":"1.0.0"}' > "$layout/oci-layout"

  cp "$work/base.tar.gz" "$work/base-copy.tar.gz"
  base_size=$(stat -c %s "$work/base-copy.tar.gz")
  base_blob=$(add_blob "$layout" "$work/base-copy.tar.gz")

  app=$work/app-$c
  mkdir -p "$app/usr/bin"
  strip --strip-all -o "$app/usr/bin/$c" "$bin_dir/$c"
  det_tar "$app" "$work/app.tar"
  app_diff=$(sha "$work/app.tar")
  gzip -n "-$gzip_level" -c "$work/app.tar" > "$work/app.tar.gz"
  app_size=$(stat -c %s "$work/app.tar.gz")
  app_blob=$(add_blob "$layout" "$work/app.tar.gz")

  user=65532:65532
  [[ $ROOT_COMPONENTS == *" $c "* ]] && user=0:0
  labels=$(jq -cn --arg c "$c" --arg v "$tag" --arg r "$revision" --arg s "$source_url" \
    --arg l "$licenses" --arg t "$created" '{
      "org.opencontainers.image.title": $c,
      "org.opencontainers.image.source": $s,
      "org.opencontainers.image.version": $v,
      "org.opencontainers.image.revision": $r,
      "org.opencontainers.image.licenses": $l,
      "org.opencontainers.image.created": $t}')
  jq -cSn --arg c "$c" --arg u "$user" --arg t "$created" --argjson labels "$labels" \
    --arg debs "${DEBIAN_BASE[*]}" \
    --arg b "sha256:$base_diff" --arg a "sha256:$app_diff" '{
      architecture: "amd64", os: "linux", created: $t,
      config: {User: $u, Entrypoint: ["/usr/bin/\($c)"], Env: ["PATH=/usr/bin"],
               WorkingDir: "/", Labels: $labels},
      rootfs: {type: "layers", diff_ids: [$b, $a]},
      history: [{created: $t, created_by: "hack/images/build.sh: base from Debian \($debs)"},
                {created: $t, created_by: "hack/images/build.sh: /usr/bin/\($c)"}]}' \
    > "$work/config.json"
  config_size=$(stat -c %s "$work/config.json")
  config_blob=$(add_blob "$layout" "$work/config.json")

  jq -cSn --arg cfg "$config_blob" --argjson cs "$config_size" --arg b "$base_blob" --argjson bs "$base_size" \
    --arg a "$app_blob" --argjson appsize "$app_size" --argjson labels "$labels" '{
      schemaVersion: 2,
      mediaType: "application/vnd.oci.image.manifest.v1+json",
      config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: "sha256:\($cfg)", size: $cs},
      layers: [
        {mediaType: "application/vnd.oci.image.layer.v1.tar+gzip", digest: "sha256:\($b)", size: $bs},
        {mediaType: "application/vnd.oci.image.layer.v1.tar+gzip", digest: "sha256:\($a)", size: $appsize}],
      annotations: $labels}' > "$work/manifest.json"
  manifest_size=$(stat -c %s "$work/manifest.json")
  manifest_blob=$(add_blob "$layout" "$work/manifest.json")

  jq -cSn --arg m "$manifest_blob" --argjson ms "$manifest_size" --arg tag "$tag" \
    --arg name "$repository/$c:$tag" '{
      schemaVersion: 2,
      mediaType: "application/vnd.oci.image.index.v1+json",
      manifests: [{mediaType: "application/vnd.oci.image.manifest.v1+json",
                   digest: "sha256:\($m)", size: $ms,
                   annotations: {"org.opencontainers.image.ref.name": $tag,
                                 "io.containerd.image.name": $name}}]}' > "$layout/index.json"
  det_tar "$layout" "$layout.tar"
  echo "$c@sha256:$manifest_blob" >> "$out/digests.tmp"
  log "$c: sha256:$manifest_blob ($(du -sb "$layout/blobs" | cut -f1) bytes)"
done
mv "$out/digests.tmp" "$out/digests"

# --- push / import ------------------------------------------------------------------
if [[ -n $push ]]; then
  for c in "${components[@]}"; do
    log "gkm push $push/$c:$tag"
    "$bin_dir/gkm" push $insecure "oci:$out/$c:$tag" "$push/$c:$tag"
  done
fi
if ((${#imports[@]})); then
  ctr=$(command -v ctr || echo "$tools_dir/bin/ctr")
  for socket in "${imports[@]}"; do
    for c in "${components[@]}"; do
      log "ctr images import $c ($socket)"
      "$ctr" --address "$socket" -n k8s.io images import "$out/$c.tar" >/dev/null
    done
  done
fi
cat "$out/digests"

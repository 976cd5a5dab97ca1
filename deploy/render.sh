#!/bin/sh
# Renders deploy/ from its one source, the Helm chart deploy/helm/gkm:
#   1. the chart's CRDs (deploy/helm/gkm/crds/) from deploy/crds/, which
#      `gkm crds` writes and gkm-k8s/api/tests/crd_files.rs keeps current;
#   2. every other file deploy/kustomization.yaml lists, from the chart
#      template of the same path (helm template --show-only), rendered for
#      the namespace gkm-system with the namespace and the scheduler extender
#      included;
#   3. install.yaml, those files in the kustomization's order.
# Helm is the pinned build from hack/ci/components.sh (or $HELM).
# bins/gkm-local/tests/chart.rs fails when any of these is stale.
set -eu
cd "$(dirname "$0")"
tools_dir=${GKM_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gkm-tools}
helm=${HELM:-$tools_dir/bin/helm}
[ -x "$helm" ] || { echo "no helm at $helm: run hack/ci/components.sh helm" >&2; exit 1; }

rm -rf helm/gkm/crds
mkdir helm/gkm/crds
cp crds/*.yaml helm/gkm/crds/

# The values the flat files are rendered with.
set -- --namespace gkm-system --set namespace.create=true --set schedulerExtender.enabled=true
files=$(sed -n 's/^  - \(.*\.yaml\)$/\1/p' kustomization.yaml)
for file in $files; do
    case $file in crds/*) continue ;; esac
    {
        echo "# Rendered from deploy/helm/gkm/templates/$file by deploy/render.sh; edit the chart."
        "$helm" template gkm helm/gkm "$@" --show-only "templates/$file" |
            sed -e '/^# Source: /d' | sed -e '1{/^---$/d;}'
    } > "$file.tmp"
    mv "$file.tmp" "$file"
done

{
    echo "# gkm: everything in one file (kubectl apply -f install.yaml)."
    echo "# Rendered by deploy/render.sh from the chart deploy/helm/gkm; edit the chart."
    for file in $files; do
        echo "---"
        echo "# Source: $file"
        cat "$file"
    done
} > install.yaml

#!/bin/sh
# Renders deploy/install.yaml from the files deploy/kustomization.yaml lists,
# in that order. The test gkm-k8s/tests/rbac.rs fails when install.yaml and
# the parts disagree.
set -eu
cd "$(dirname "$0")"
{
    echo "# gkm: everything in one file (kubectl apply -f install.yaml)."
    echo "# Rendered by deploy/render.sh from deploy/kustomization.yaml; edit the parts."
    sed -n 's/^  - \(.*\.yaml\)$/\1/p' kustomization.yaml | while read -r file; do
        echo "---"
        echo "# Source: $file"
        cat "$file"
    done
} > install.yaml

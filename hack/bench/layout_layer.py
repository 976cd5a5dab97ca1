"""Prints the path of the first layer blob of the tag TAG in the OCI layout
ROOT (for hack/bench/extract.sh): ROOT TAG."""
import json, sys, os
root, tag = sys.argv[1], sys.argv[2]
index = json.load(open(os.path.join(root, "index.json")))
m = next(d for d in index["manifests"] if d.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag)
blob = lambda d: os.path.join(root, "blobs", *d.split(":"))
manifest = json.load(open(blob(m["digest"])))
print(blob(manifest["layers"][0]["digest"]))

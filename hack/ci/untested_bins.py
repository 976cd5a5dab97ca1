"""Reads `cargo metadata --no-deps --format-version 1` on stdin and prints
`-p PACKAGE` for each package with binaries but no integration test (for
hack/ci/test.sh, which builds their binaries on their own)."""
import json, sys
for package in json.load(sys.stdin)["packages"]:
    kinds = {kind for target in package["targets"] for kind in target["kind"]}
    if "bin" in kinds and "test" not in kinds:
        print("-p", package["name"])

"""Reads `cargo test --no-run --message-format=json-render-diagnostics` on
stdin, passes compiler messages to stderr, and prints each integration
test's executable as `PACKAGE TARGET PACKAGE_DIR EXECUTABLE` (for
hack/ci/test.sh's parallel jobs)."""
import json, os, sys, tomllib
for line in sys.stdin:
    try:
        message = json.loads(line)
    except ValueError:
        continue
    if message.get("reason") == "compiler-message":
        print(message["message"]["rendered"], end="", file=sys.stderr)
    elif (message.get("reason") == "compiler-artifact" and message.get("executable")
            and message["profile"]["test"] and message["target"]["kind"] == ["test"]):
        manifest = message["manifest_path"]
        with open(manifest, "rb") as f:
            package = tomllib.load(f)["package"]["name"]
        print(package, message["target"]["name"], os.path.dirname(manifest), message["executable"])

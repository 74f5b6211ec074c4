#!/usr/bin/env python3
"""Debian stand-in for cargo2rpm's license and vendor-manifest output.

Used by packaging/macros.compat only. Reads `cargo metadata` for the crates
that are really built into streamd's binaries (normal dependencies of the
streamd package on Linux) and prints:
  license          "LICENSE: name version" lines (LICENSE.dependencies)
  license-summary  the distinct license expressions, one a line
  vendor-manifest  "name version" of every vendored crate (cargo-vendor.txt)
"""
import json
import os
import subprocess
import sys
import tomllib


def built_packages():
    meta = json.loads(subprocess.run(
        ["cargo", "metadata", "--offline", "--locked", "--format-version", "1",
         "--filter-platform", os.uname().machine + "-unknown-linux-gnu"],
        check=True, capture_output=True, text=True).stdout)
    pkgs = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    root = next(p["id"] for p in meta["packages"] if p["name"] == "streamd")
    seen, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        for dep in nodes[pid]["deps"]:
            # Build scripts and normal deps end up in the binary; dev-deps don't.
            if any(k["kind"] in (None, "build") for k in dep["dep_kinds"]):
                todo.append(dep["pkg"])
    seen.discard(root)
    return sorted((pkgs[p] for p in seen), key=lambda p: (p["name"], p["version"]))


def main(mode):
    if mode == "vendor-manifest":
        for d in sorted(os.listdir("vendor")):
            with open(os.path.join("vendor", d, "Cargo.toml"), "rb") as f:
                pkg = tomllib.load(f)["package"]
            print(pkg["name"], pkg["version"])
        return
    pkgs = built_packages()
    if mode == "license":
        for p in pkgs:
            print(f'{p.get("license") or "UNKNOWN"}: {p["name"]} {p["version"]}')
    elif mode == "license-summary":
        for lic in sorted({p.get("license") or "UNKNOWN" for p in pkgs}):
            print(lic)
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1])

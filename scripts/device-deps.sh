#!/usr/bin/env bash
# Copies the header-only dependencies (nlohmann/json, CLI11, fmt) and the GoogleTest sources from
# this machine's packages into DIR (default .devcarry/deps, ignored by git), for a machine that
# has no package registry (the GPU machine): configure there with -DDCP_DEVICE_DEPS_DIR=DIR.
set -euo pipefail
dir=${1:-.devcarry/deps}
mkdir -p "$dir/include"
for d in nlohmann CLI fmt; do
  [ -d "/usr/include/$d" ] || { echo "device-deps: /usr/include/$d missing (make deps)" >&2; exit 1; }
  rm -rf "$dir/include/$d"
  cp -r "/usr/include/$d" "$dir/include/"
done
rm -rf "$dir/googletest"
cp -r /usr/src/googletest "$dir/googletest"
du -sh "$dir"

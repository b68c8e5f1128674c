#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: install, build, run the
# quick-start experiment and print the comparison table.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
./build/kvsieve demo "$@"

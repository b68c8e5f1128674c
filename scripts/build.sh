#!/usr/bin/env bash
# Configure and build kvsieve (Release) into build/. Installs dependencies first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${KVS_CMAKE_ARGS:-} >/dev/null
cmake --build build -j"$(nproc)"

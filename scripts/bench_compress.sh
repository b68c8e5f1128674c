#!/usr/bin/env bash
# Benchmark: wall time and peak RSS of `kvsieve compress` for every method on
# synthetic caches at N = 8192 (issue "foundation" bar: seconds on 2 cores).
# Usage: scripts/bench_compress.sh [N] [threads]   (needs build/kvsieve)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-8192}; T=${2:-2}; BIN=./build/kvsieve; TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); threads $T; N $N"
run() { # preset queries methods...
  local preset=$1 q=$2; shift 2
  $BIN synth --preset "$preset" --tokens "$N" --queries "$q" --probes 0 --dtype f16 --out "$TMP/$preset.st" >/dev/null
  printf '\n%s (fp16 dump, Nq %s)\n' "$preset" "$q"
  for m in "$@"; do
    printf '  %-13s ' "$m"
    $BIN compress --kv "$TMP/$preset.st" --method "$m" --ratio 0.2 --threads "$T" --quiet
  done
  rm -f "$TMP/$preset.st"
}
run gemma3-270m all full random streamingllm h2o snapkv lookm meda flashcache
run qwen2.5-vl-7b 32 full random streamingllm snapkv flashcache

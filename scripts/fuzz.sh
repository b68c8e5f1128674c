#!/usr/bin/env bash
# scripts/fuzz.sh [SECONDS] [harness...] -- long libFuzzer runs of the
# harnesses in tests/fuzz (default: every harness, 3600 s each, one after
# the other). Builds them with clang (libFuzzer + ASan + UBSan) in
# build-fuzz/, keeps the grown corpus in build-fuzz/corpus/NAME (outside the
# repository; the seed corpus tests/fuzz/corpus/NAME is read, never written)
# and crash inputs in build-fuzz/crashes/NAME. Prints per harness: seconds,
# executions (libFuzzer's final stats) and crashes (a run stops at its first
# crash, so 0 or 1). Exit status 1 when any harness crashed.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-3600}
shift || true
ALL="gguf tokenize safetensors plan_json server logprobs config datasets ruler"
HARNESSES=${*:-$ALL}
CC_FUZZ=${CC_FUZZ:-clang}
cmake -S . -B build-fuzz -DCMAKE_C_COMPILER="$CC_FUZZ" -DCMAKE_BUILD_TYPE=Debug -DKVSIEVE_SANITIZE=ON \
  -DKVSIEVE_CUDA=OFF -DCMAKE_C_FLAGS="-O1 -fsanitize=fuzzer-no-link" >/dev/null
targets=()
for h in $HARNESSES; do targets+=(--target "fuzz_$h"); done
cmake --build build-fuzz -j"${JOBS:-$(nproc)}" "${targets[@]}" >/dev/null
root=$PWD
count_artifacts() { find "$1" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l; }
status=0
printf '%-12s %8s %12s %8s\n' harness seconds executions crashes
for h in $HARNESSES; do
  corpus=$root/build-fuzz/corpus/$h
  crashes=$root/build-fuzz/crashes/$h
  mkdir -p "$corpus" "$crashes"
  inputs=("$root/tests/fuzz/corpus/$h")
  [ -d "$root/tests/fuzz/regressions/$h" ] && inputs+=("$root/tests/fuzz/regressions/$h")
  log=$root/build-fuzz/fuzz_$h.log
  before=$(count_artifacts "$crashes")
  start=$(date +%s)
  # run from the crash folder: harnesses that write scratch files write them there
  (cd "$crashes" && "$root/build-fuzz/tests/fuzz/fuzz_$h" -max_total_time="$SECS" -print_final_stats=1 \
     -timeout=30 -rss_limit_mb=4096 -artifact_prefix="$crashes/" "$corpus" "${inputs[@]}") >"$log" 2>&1 || true
  secs=$(( $(date +%s) - start ))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  n=$(( $(count_artifacts "$crashes") - before ))
  [ "$n" -gt 0 ] && status=1
  printf '%-12s %8s %12s %8s\n' "$h" "$secs" "${execs:-?}" "$n"
done
exit $status

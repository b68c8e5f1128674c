#!/usr/bin/env bash
# tests/gpu/run.sh -- the one-shot device check: build with CUDA (sm_90 +
# PTX), list the devices, run the GPU parity tests (CTest label "gpu"), run
# the latency benchmark (methods x N = 2K..64K, qwen2.5-vl-7b shape, fp16),
# and print a short summary table last.
#
# usage: tests/gpu/run.sh [OUTDIR]     (default: $OUT, else ./gpu-out)
# Full logs go to OUTDIR: nvidia-smi.txt, configure.log, build.log,
# devices.txt, tests.log, bench.log, overhead.csv, summary.txt.
# Finishes within 8 minutes (each step runs under `timeout`; the benchmark
# gets what is left and skips, visibly, the cells it cannot fit).
# Environment: KVS_GPU_BUILD (build folder, default <repo>/build-gpu),
# KVS_GPU_TOTAL_S (overall limit in seconds, default 470), JOBS.
# What it is not: not a CI step (CI has no GPU); it never resets or
# reconfigures the device.
set -u -o pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUTDIR="${1:-${OUT:-./gpu-out}}"
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
BUILD="${KVS_GPU_BUILD:-$ROOT/build-gpu}"
TOTAL="${KVS_GPU_TOTAL_S:-470}"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 4)}"
T0=$(date +%s)
left() { echo $((TOTAL - ($(date +%s) - T0))); }
SUMMARY="$OUTDIR/summary.txt"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

note "kvsieve GPU check: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), repo $ROOT"
note "git: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo 'no commit')"
(nvidia-smi || echo "nvidia-smi not available") > "$OUTDIR/nvidia-smi.txt" 2>&1

status_cfg=0
timeout $(( $(left) < 120 ? $(left) : 120 )) \
  cmake -S "$ROOT" -B "$BUILD" -DKVSIEVE_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
  > "$OUTDIR/configure.log" 2>&1 || status_cfg=$?
note "configure: rc=$status_cfg (log: configure.log)"
status_build=1
if [ "$status_cfg" -eq 0 ]; then
  status_build=0
  timeout $(( $(left) < 240 ? $(left) : 240 )) \
    cmake --build "$BUILD" -j"$JOBS" --target kvsieve_kernels test_gpu_kernels test_gpu_methods \
    bench_overhead > "$OUTDIR/build.log" 2>&1 || status_build=$?
fi
note "build: rc=$status_build (log: build.log)"

if [ "$status_build" -eq 0 ]; then
  # the CLI needs every module; its failure does not stop the device check
  status_cli=0
  timeout $(( $(left) < 120 ? $(left) : 120 )) \
    cmake --build "$BUILD" -j"$JOBS" --target kvsieve > "$OUTDIR/build-cli.log" 2>&1 || status_cli=$?
  if [ "$status_cli" -eq 0 ]; then
    (cd "$ROOT" && "$BUILD/kvsieve" devices) > "$OUTDIR/devices.txt" 2>&1
    note "kvsieve devices: $(tr '\n' ' ' < "$OUTDIR/devices.txt")"
  else
    note "kvsieve CLI did not build (rc=$status_cli, log: build-cli.log); devices not listed by it"
  fi

  status_tests=0
  timeout $(( $(left) < 150 ? $(left) : 150 )) \
    ctest --test-dir "$BUILD" -L gpu --output-on-failure -V > "$OUTDIR/tests.log" 2>&1 \
    || status_tests=$?
  note "gpu tests: rc=$status_tests (log: tests.log)"
  grep -E "^[0-9]+/[0-9]+ Test|tests passed|checks," "$OUTDIR/tests.log" | tee -a "$SUMMARY"

  remaining=$(( $(left) - 15 ))
  if [ "$remaining" -gt 30 ]; then
    status_bench=0
    timeout "$remaining" "$BUILD/tests/gpu/bench_overhead" --budget-s $((remaining - 20)) \
      --cell-s 60 --csv "$OUTDIR/overhead.csv" > "$OUTDIR/bench.log" 2>&1 || status_bench=$?
    note "benchmark: rc=$status_bench (log: bench.log, rows: overhead.csv)"
  else
    note "benchmark: not run, only ${remaining}s left"
  fi
fi

note "elapsed: $(( $(date +%s) - T0 )) s"
echo
if [ -f "$OUTDIR/bench.log" ]; then
  grep -E '^(bench_overhead:|shape |device copy|attention tiles|SKIP)' "$OUTDIR/bench.log" | tee -a "$SUMMARY"
  sed -n '/^== GPU compression overhead/,$p' "$OUTDIR/bench.log" | tee -a "$SUMMARY"
fi
[ "${status_build:-1}" -eq 0 ] && [ "${status_tests:-1}" -eq 0 ]

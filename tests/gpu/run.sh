#!/usr/bin/env bash
# tests/gpu/run.sh -- the one-shot device check: environment (nvidia-smi,
# nvcc, cmake), build dependencies (tests/gpu/deps.sh), configure + build of
# the CUDA targets only (sm_90 + PTX), the GPU parity tests (CTest label
# "gpu"), the latency benchmark (qwen2.5-vl-7b shape, fp16, N = 2K..64K),
# and a short summary table printed last.
#
# usage: bash tests/gpu/run.sh [OUTDIR]     (default: $OUT, else ./gpu-out)
# On the device machine (no network there):
#   run(command="bash tests/gpu/run.sh $OUT", carry=["build-gpudeps"], timeout_s=480)
# after `bash tests/gpu/deps.sh stage` here (the machine may lack the -dev
# packages the configure step requires; the staged .debs are unpacked into
# /tmp, never into /).
# Logs in OUTDIR, one per step: env.log (nvidia-smi, nvcc, cmake), deps.log,
# configure.log, build.log, tests.log, bench.log, overhead.csv, summary.txt.
# Time: everything runs under an overall cap KVS_GPU_TOTAL_S (default 420 s,
# i.e. 7 min); each step under `timeout`; a failing parity test does not stop
# the benchmark, which gets what is left and skips, visibly, the cells it
# cannot fit (--budget-s). Exit: 0 all passed, 77 no CUDA device (the
# build was checked, nothing ran on a device), 1 anything failed.
# Environment: KVS_GPU_BUILD (build folder, default <repo>/build-gpu),
# KVS_GPU_TOTAL_S, KVS_GPU_BENCH_ARGS (extra benchmark options), JOBS.
# What it is not: not a CI step (CI has no GPU); it never resets or
# reconfigures the device.
set -u -o pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUTDIR="${1:-${OUT:-./gpu-out}}"
mkdir -p "$OUTDIR" || exit 1
OUTDIR=$(cd "$OUTDIR" && pwd)
BUILD="${KVS_GPU_BUILD:-$ROOT/build-gpu}"
TOTAL="${KVS_GPU_TOTAL_S:-420}"
JOBS="${JOBS:-$(nproc 2> /dev/null || echo 4)}"
T0=$(date +%s)
left() { echo $((TOTAL - ($(date +%s) - T0))); }
# cap N: min(N, time left - reserve), at least 1
cap() {
  local c=$(($(left) - ${2:-0}))
  [ "$c" -gt "$1" ] && c=$1
  [ "$c" -lt 1 ] && c=1
  echo "$c"
}
SUMMARY="$OUTDIR/summary.txt"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
status_deps=1 status_cfg=1 status_build=1 status_tests=1 status_bench=1

note "kvsieve GPU check: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), repo $ROOT, cap ${TOTAL}s"
note "git: $(git -C "$ROOT" rev-parse --short HEAD 2> /dev/null || echo 'no commit')" \
     "$(git -C "$ROOT" status --porcelain 2> /dev/null | grep -c . || true) changed files"

# ---- environment -------------------------------------------------------------
{
  echo "== nvidia-smi"
  timeout 20 nvidia-smi 2>&1 || echo "nvidia-smi not available or failed (rc=$?)"
  echo "== nvidia-smi -L"
  timeout 10 nvidia-smi -L 2>&1 || true
  echo "== nvcc --version"
  NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  "$NVCC" --version 2>&1 || echo "nvcc not found"
  echo "== cmake --version"
  cmake --version 2>&1 | head -1
  echo "== uname, cpus"
  uname -a
  nproc 2> /dev/null
} > "$OUTDIR/env.log" 2>&1
dev_line=$(timeout 10 nvidia-smi -L 2>&1 | head -1)
note "device: ${dev_line:-none reported by nvidia-smi}"
note "nvcc: $(grep -m1 -o 'release [0-9.]*, V[0-9.]*' "$OUTDIR/env.log" || echo 'not found')"

# ---- dependencies ------------------------------------------------------------
# shellcheck source=tests/gpu/deps.sh
{ source "$ROOT/tests/gpu/deps.sh" env; } > "$OUTDIR/deps.log" 2>&1 && status_deps=0
note "deps: rc=$status_deps: $(tail -1 "$OUTDIR/deps.log")"

# ---- configure + build (the CUDA targets only) ----------------------------------
if [ "$status_deps" -eq 0 ]; then
  status_cfg=0
  timeout "$(cap 90 240)" cmake -S "$ROOT" -B "$BUILD" -DKVSIEVE_CUDA=ON \
    -DCMAKE_BUILD_TYPE=Release > "$OUTDIR/configure.log" 2>&1 || status_cfg=$?
  note "configure: rc=$status_cfg (log: configure.log)"
fi
if [ "$status_cfg" -eq 0 ]; then
  status_build=0
  timeout "$(cap 240 150)" cmake --build "$BUILD" -j"$JOBS" --target test_gpu_kernels \
    test_gpu_methods test_gpu_attn_mma test_gpu_fc_gemm bench_overhead > "$OUTDIR/build.log" 2>&1 || status_build=$?
  note "build: rc=$status_build in $(($(date +%s) - T0)) s since start (log: build.log)"
  [ "$status_build" -ne 0 ] && grep -m5 -iE "error|Error [0-9]" "$OUTDIR/build.log" | tee -a "$SUMMARY"
fi

# ---- parity tests -----------------------------------------------------------------
if [ "$status_build" -eq 0 ]; then
  status_tests=0
  timeout "$(cap 150 150)" ctest --test-dir "$BUILD" -L gpu -j2 --output-on-failure -V \
    > "$OUTDIR/tests.log" 2>&1 || status_tests=$?
  note "gpu tests: rc=$status_tests (log: tests.log)"
  # ctest -V prefixes a test's own lines with "<test number>: "
  sed 's/^[0-9]*: //' "$OUTDIR/tests.log" |
    grep -E "^SKIP:|^device:|^seed |^[a-z0-9]+ +(F32|F16|BF16) +tc=[01] FAILED|CHECK[A-Z_]* failed|checks, [0-9]+ failures|tests passed|\*\*\*(Skipped|Failed|Timeout)|Exception" |
    awk '!seen[$0]++' | head -40 | tee -a "$SUMMARY"
fi

# ---- benchmark (runs even when a parity test failed) ---------------------------------
BENCH="$BUILD/tests/gpu/bench_overhead"
if [ "$status_build" -eq 0 ] && [ -x "$BENCH" ]; then
  remaining=$(($(left) - 10))
  if [ "$remaining" -gt 30 ]; then
    status_bench=0
    # shellcheck disable=SC2086
    timeout -k 5 "$remaining" "$BENCH" --budget-s $((remaining - 25)) --cell-s 60 \
      --csv "$OUTDIR/overhead.csv" ${KVS_GPU_BENCH_ARGS:-} > "$OUTDIR/bench.log" 2>&1 ||
      status_bench=$?
    case "$status_bench" in
      0) note "benchmark: ok (log: bench.log, rows: overhead.csv)" ;;
      77) note "benchmark: $(grep -m1 '^SKIP' "$OUTDIR/bench.log" || echo 'skipped (rc 77)')" ;;
      124 | 137) note "benchmark: killed at the time cap (${remaining}s); cells so far below" ;;
      *) note "benchmark: rc=$status_bench (log: bench.log)"
         tail -3 "$OUTDIR/bench.log" | tee -a "$SUMMARY" ;;
    esac
  else
    note "benchmark: not run, only ${remaining}s left"
  fi
fi

# ---- verdict and the short table (last) -------------------------------------------
no_device=0
[ "$status_bench" -eq 77 ] && no_device=1
grep -qE "^([0-9]+: )?SKIP: test_gpu" "$OUTDIR/tests.log" 2> /dev/null && no_device=1
if [ "$status_build" -ne 0 ] || [ "$status_tests" -ne 0 ]; then
  verdict=1
elif [ "$no_device" -eq 1 ]; then
  verdict=77
elif [ "$status_bench" -ne 0 ]; then
  verdict=1
else
  verdict=0
fi
note "elapsed: $(($(date +%s) - T0)) s; exit $verdict" \
     "(deps $status_deps, configure $status_cfg, build $status_build, tests $status_tests," \
     "bench $status_bench$([ "$no_device" -eq 1 ] && echo ', no CUDA device'))"
echo
if [ -s "$OUTDIR/bench.log" ]; then
  grep -E '^(bench_overhead:|shape |device copy|attention tiles|attention passes|flashcache routes)' "$OUTDIR/bench.log" | tee -a "$SUMMARY"
  if grep -q '^== GPU compression overhead' "$OUTDIR/bench.log"; then
    sed -n '/^== GPU compression overhead/,$p' "$OUTDIR/bench.log" | tee -a "$SUMMARY"
  else # killed before its table: the cells it printed as it went
    grep -E '^[a-z0-9]+ +N= *[0-9]+' "$OUTDIR/bench.log" | tee -a "$SUMMARY"
  fi
fi
exit "$verdict"

#!/usr/bin/env bash
# tests/gpu/run.sh -- the one-shot device check: environment (nvidia-smi,
# nvcc, cmake), build dependencies (tests/gpu/deps.sh), configure + build of
# the CUDA targets only (sm_90 + PTX), the GPU parity tests (CTest label
# "gpu", the C ABI's CUDA path included), the latency benchmark (fp16, N =
# 2K..64K; the qwen2.5-vl-7b shape first, with the attention-pass and DCT-route
# extras, then gemma3-270m and llava-1.5-7b), compute-sanitizer's memcheck on
# the kernel tests when time is left, and a short summary table printed last.
#
# usage: bash tests/gpu/run.sh [OUTDIR]     (default: $OUT, else ./gpu-out)
# On the device machine (no network there):
#   run(command="bash tests/gpu/run.sh $OUT", carry=["build-gpudeps"], timeout_s=480)
# after `bash tests/gpu/deps.sh stage` here (the machine may lack the -dev
# packages the configure step requires; the staged .debs are unpacked into
# /tmp, never into /).
# Logs in OUTDIR, one per step: env.log (nvidia-smi, nvcc, cmake), deps.log,
# configure.log, build.log, tests.log, bench-SHAPE.log, overhead-SHAPE.csv,
# sanitizer.log, summary.txt. (The device tool returns at most 8 files: pass
# a folder outside $OUT and tar it into $OUT.)
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
    test_gpu_methods test_gpu_attn_mma test_gpu_fc_gemm abi_gpu bench_overhead > "$OUTDIR/build.log" 2>&1 || status_build=$?
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
# Three shapes share what is left: qwen2.5-vl-7b (the bars' shape) 55%,
# gemma3-270m 20%, llava-1.5-7b the rest; each skips, visibly, the cells it
# cannot fit. A sanitizer pass, if any, gets the last 60 s.
BENCH="$BUILD/tests/gpu/bench_overhead"
SHAPES="qwen2.5-vl-7b:55:1 gemma3-270m:20:0 llava-1.5-7b:100:0"
if [ "$status_build" -eq 0 ] && [ -x "$BENCH" ]; then
  status_bench=0
  total_b=$(($(left) - 70))
  for sp in $SHAPES; do
    shape=${sp%%:*} rest=${sp#*:}
    pct=${rest%%:*} extras=${rest#*:}
    remaining=$(($(left) - 70))
    share=$((total_b * pct / 100))
    [ "$share" -gt "$remaining" ] && share=$remaining
    if [ "$share" -lt 30 ]; then
      note "benchmark $shape: not run, only ${share}s left"
      continue
    fi
    rc=0
    # shellcheck disable=SC2086
    timeout -k 5 "$share" "$BENCH" --shape "$shape" --extras "$extras" --budget-s $((share - 15)) \
      --cell-s 60 --csv "$OUTDIR/overhead-$shape.csv" ${KVS_GPU_BENCH_ARGS:-} \
      > "$OUTDIR/bench-$shape.log" 2>&1 || rc=$?
    case "$rc" in
      0) note "benchmark $shape: ok (log: bench-$shape.log, rows: overhead-$shape.csv)" ;;
      77) note "benchmark $shape: $(grep -m1 '^SKIP' "$OUTDIR/bench-$shape.log" || echo 'skipped (rc 77)')"
          status_bench=77 ;;
      124 | 137) note "benchmark $shape: killed at the time cap (${share}s); cells so far below"
                 status_bench=1 ;;
      *) note "benchmark $shape: rc=$rc (log: bench-$shape.log)"
         tail -3 "$OUTDIR/bench-$shape.log" | tee -a "$SUMMARY"
         status_bench=1 ;;
    esac
    [ "$rc" -eq 77 ] && break
  done
fi

# ---- memcheck of the kernel tests (when time is left) ---------------------------------
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ "$status_build" -eq 0 ] && [ -x "$SAN" ] && [ "$(left)" -gt 40 ]; then
  status_san=0
  for t in test_gpu_kernels test_gpu_attn_mma; do
    [ "$(left)" -gt 25 ] || break
    timeout -k 5 "$(cap 60 10)" "$SAN" --tool memcheck --error-exitcode 9 \
      "$BUILD/tests/kernels/$t" >> "$OUTDIR/sanitizer.log" 2>&1 || status_san=$?
  done
  note "memcheck: rc=$status_san: $(grep -m1 -E 'ERROR SUMMARY' "$OUTDIR/sanitizer.log" || echo 'no summary (log: sanitizer.log)')"
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
for log in "$OUTDIR"/bench-*.log; do
  [ -s "$log" ] || continue
  grep -E '^(bench_overhead:|shape |device copy|attention tiles|attention passes|flashcache routes|N=)' "$log" | tee -a "$SUMMARY"
  if grep -q '^== GPU compression overhead' "$log"; then
    sed -n '/^== GPU compression overhead/,$p' "$log" | tee -a "$SUMMARY"
  else # killed before its table: the cells it printed as it went
    grep -E '^[a-z0-9]+ +N= *[0-9]+' "$log" | tee -a "$SUMMARY"
  fi
done
exit "$verdict"

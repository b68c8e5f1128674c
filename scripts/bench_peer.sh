#!/usr/bin/env bash
# bench_peer.sh [--rounds N] [--threads T] [--gen N] [--lens L1,L2] [--cache-types T1,T2] [MODEL...]
# -- kvsieve's engine against llama.cpp's llama-bench on the same GGUF files,
# same machine, same run: prefill tokens/s at 512 and 2048 prompt tokens
# (--lens) and decode tokens/s after each of those prompts, side by side with
# the ratio kvsieve / llama.cpp, for each KV cache type of --cache-types
# (default f16; e.g. f16,q8_0,q4_0: kvsieve --cache-type T against llama-bench
# -ctk T -ctv T, the quantised cache's decode at 8K tokens with --lens 8192).
# Models are registry names (scripts/models.tsv; default: gemma3-270m
# qwen2.5-0.5b smollm2-135m) and must be installed (scripts/install_model.sh).
#
# The peer: llama.cpp as vendored in PyPI's llama-cpp-python sdist (pinned
# below; PyPI is a registry this project may use, a git host is not), unpacked
# into build-peer/ (git-ignored, never committed) and built once: only the
# llama-bench target, CPU only, -DGGML_NATIVE=ON, no HTTPS/CURL.
# Both sides: T threads (default 2), the same KV cache type (default f16,
# kvsieve's default; llama-bench -ctk f16 -ctv f16), greedy decode of --gen tokens
# (default 64). Rounds interleave the two engines (kvsieve 512, llama 512,
# kvsieve 2048, llama 2048 per model, then the next model, then the next round)
# so that load from other processes falls on both alike; the table shows the
# median over rounds. The load average is printed before and after: on a
# shared machine the ratios are the trustworthy part, not the absolute numbers.
# Waiting threads: kvsieve's pool polls for at most 50 us, then sleeps;
# llama.cpp's OpenMP threads spin by default, which on an oversubscribed machine
# collapses its decode (measured here at load 13 on 2 cores: 1.1 tok/s spinning
# against 12.6 with OMP_WAIT_POLICY=passive, Gemma 3 270M). So the peer runs
# with OMP_WAIT_POLICY=passive unless --peer-spin (for a machine to itself).
# Weight repacking: llama-bench's default (--repack 1) moves weights into its
# AMX / repacked buffers where the CPU has them. That path crashed (SIGSEGV in
# ggml_backend_amx_mul_mat) on a Sapphire Rapids VM with AMX-INT8, so each
# model is probed once with the default; where the probe fails the script
# says so and measures llama.cpp with --repack 0 (--peer-repack 0|1 forces one).
# BLAS: kvsieve's prefill is mostly OpenBLAS sgemm, and OpenBLAS picks its
# kernels per CPU unless OPENBLAS_CORETYPE names them; the script prints which
# ones kvsieve runs. Where an environment pins an older core (some machines set
# OPENBLAS_CORETYPE=Haswell on AVX-512 CPUs), run the script under
# `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE` to measure OpenBLAS's own choice.
# --decode-only: decode tok/s alone, for long contexts (--lens 8192) where the
# prefills would take most of the run: kvsieve fills its cache rows with random
# values (`kvsieve bench --fill random`: a decode step costs the same whatever
# the rows hold), every cache type in one interleaved call; llama-bench runs
# only tg GEN at depth L (its depth is a real prefill, not timed). The prefill
# columns then read "-".
# Each measurement's line is printed as it is taken; the table follows at the end.
# What it is not: no accuracy comparison and no timed test; it prints.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
LLAMA_CPP_PYTHON_VERSION=0.3.36
PEER="$ROOT/build-peer"
SRC="$PEER/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
BENCH="$PEER/build/bin/llama-bench"
KVS=${KVSIEVE:-$ROOT/build/kvsieve}
PY=${PYTHON:-python3}
ROUNDS=3 THREADS=2 GEN=64 PEER_WAIT=passive PEER_REPACK=auto
LENS=(512 2048) CTYPES=(f16)
models=()
while [ $# -gt 0 ]; do
  case "$1" in
  --rounds) ROUNDS=$2; shift 2 ;;
  --threads) THREADS=$2; shift 2 ;;
  --gen) GEN=$2; shift 2 ;;
  --build-only) BUILD_ONLY=1; shift ;;
  --decode-only) DECODE_ONLY=1; shift ;;
  --peer-spin) PEER_WAIT=active; shift ;;
  --peer-repack) PEER_REPACK=$2; shift 2 ;;
  --lens) IFS=, read -r -a LENS <<<"$2"; shift 2 ;;
  --cache-types) IFS=, read -r -a CTYPES <<<"$2"; shift 2 ;;
  -h|--help) sed -n '2,41p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  -*) echo "bench_peer: unknown option $1" >&2; exit 2 ;;
  *) models+=("$1"); shift ;;
  esac
done
[ ${#models[@]} -gt 0 ] || models=(gemma3-270m qwen2.5-0.5b smollm2-135m)

# ---- the peer: download (PyPI sdist), unpack, build llama-bench once ----------
if [ ! -x "$BENCH" ]; then
  mkdir -p "$PEER/dl"
  sdist="$PEER/dl/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
  if [ ! -f "$sdist" ]; then
    echo "bench_peer: pip download llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION (sdist) into $PEER/dl" >&2
    "$PY" -m pip download --quiet --disable-pip-version-check --no-binary :all: --no-deps \
      "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$PEER/dl" >&2
  fi
  [ -d "$SRC" ] || tar -xzf "$sdist" -C "$PEER"
  [ -f "$SRC/CMakeLists.txt" ] || { echo "bench_peer: $SRC has no llama.cpp" >&2; exit 1; }
  echo "bench_peer: building llama-bench in $PEER/build (CPU, native)" >&2
  cmake -S "$SRC" -B "$PEER/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_CUDA=OFF \
    -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON \
    >"$PEER/cmake-configure.log" 2>&1 || { tail -30 "$PEER/cmake-configure.log" >&2; exit 1; }
  cmake --build "$PEER/build" -j"$(nproc)" --target llama-bench >"$PEER/cmake-build.log" 2>&1 ||
    { tail -30 "$PEER/cmake-build.log" >&2; exit 1; }
fi
[ -z "${BUILD_ONLY:-}" ] || { echo "$BENCH"; exit 0; }
[ -x "$KVS" ] || { echo "bench_peer: $KVS is missing: build kvsieve first (cmake --build build)" >&2; exit 1; }

# ---- resolve the models --------------------------------------------------------
declare -A PATHS
for m in "${models[@]}"; do
  p=$("$KVS" models --json | "$PY" -c '
import json, sys
for e in json.load(sys.stdin):
    if e["name"] == sys.argv[1]:
        print(e.get("path", ""))' "$m")
  [ -n "$p" ] || { echo "bench_peer: model $m is not installed: run scripts/install_model.sh $m" >&2; exit 1; }
  PATHS[$m]=$p
done

# ---- the peer's weight repacking, per model (see the header) -------------------
declare -A REPACK
for m in "${models[@]}"; do
  if [ "$PEER_REPACK" != auto ]; then
    REPACK[$m]=$PEER_REPACK
  elif OMP_WAIT_POLICY=$PEER_WAIT "$BENCH" -m "${PATHS[$m]}" -t "$THREADS" -r 1 -p 32 -n 0 >/dev/null 2>&1; then
    REPACK[$m]=1
  else
    echo "bench_peer: llama-bench with its default weight repacking failed on $m (rc $?; on this CPU:" \
         "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)); llama.cpp is measured with --repack 0" >&2
    REPACK[$m]=0
  fi
done
echo "llama.cpp weight repacking (--repack):$(for m in "${models[@]}"; do printf ' %s %s' "$m" "${REPACK[$m]}"; done)"

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
load() { cut -d' ' -f1-3 /proc/loadavg; }
rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo "+dirty" || true)
echo "bench_peer: $(date -u '+%Y-%m-%d %H:%M UTC'), kvsieve $rev$dirty, llama.cpp from llama-cpp-python" \
     "$LLAMA_CPP_PYTHON_VERSION, $(nproc) cpus, threads $THREADS, decode $GEN tokens, $ROUNDS rounds," \
     "load average before: $(load)"

# the KV cache types: kvsieve --cache-type T, llama-bench -ctk T -ctv T (q8_0 /
# q4_0 need a kvsieve with GGUF block caches; an older one is refused here)
for T in "${CTYPES[@]}"; do
  "$KVS" bench --help 2>&1 | grep -q -- "--cache-type.*$T" ||
    { echo "bench_peer: this kvsieve has no --cache-type $T" >&2; exit 1; }
done
echo "KV cache types: ${CTYPES[*]} (kvsieve --cache-type T, llama-bench -ctk T -ctv T);" \
     "llama.cpp OMP_WAIT_POLICY=$PEER_WAIT"
# kvsieve's prefill is mostly OpenBLAS sgemm, so the kernels OpenBLAS runs
# (OPENBLAS_CORETYPE, if set, chooses them) decide much of that ratio;
# llama.cpp uses its own kernels.
blas_core=$("$KVS" bench --model "${PATHS[${models[0]}]}" --prompt-len 1 --gen 1 --no-store 2>/dev/null |
  sed -n 's/.*OpenBLAS core \([^,]*\),.*/\1/p')
echo "kvsieve OpenBLAS kernels: ${blas_core:-unknown} (OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE-unset})"

# kvsieve: one run gives prefill at L and decode after L tokens.
run_kvs() { # model len round cache
  "$KVS" bench --model "${PATHS[$1]}" --prompt-len "$2" --gen "$GEN" --threads "$THREADS" --reps 1 \
    --cache-type "$4" --no-store >"$OUT/kvs-$1-$2-$3-$4.txt" 2>&1 || { cat "$OUT/kvs-$1-$2-$3-$4.txt" >&2; return 1; }
  sed -n 's/^median: prefill \([0-9.]*\) tok\/s.*decode \([0-9.]*\) tok\/s.*/\1 \2/p' "$OUT/kvs-$1-$2-$3-$4.txt"
}
# llama-bench: pp L, and tg GEN at depth L (decode after an L-token prompt).
run_peer() { # model len round cache (e.g. llama-bench -ctk q8_0 -ctv q8_0)
  local o="$OUT/$1-$2-$3-$4"
  OMP_WAIT_POLICY=$PEER_WAIT "$BENCH" -m "${PATHS[$1]}" -t "$THREADS" --repack "${REPACK[$1]}" -ctk "$4" -ctv "$4" \
    -r 1 -o csv -p "$2" -n 0 \
    >"$o.pp.csv" 2>"$o.pp.err" || { cat "$o.pp.err" >&2; return 1; }
  OMP_WAIT_POLICY=$PEER_WAIT "$BENCH" -m "${PATHS[$1]}" -t "$THREADS" --repack "${REPACK[$1]}" -ctk "$4" -ctv "$4" \
    -r 1 -o csv -p 0 -n "$GEN" \
    -d "$2" \
    >"$o.tg.csv" 2>"$o.tg.err" || { cat "$o.tg.err" >&2; return 1; }
  "$PY" - "$o.pp.csv" "$o.tg.csv" <<'EOF'
import csv, sys
def ts(path):
    rows = list(csv.DictReader(open(path)))
    return float(rows[-1]["avg_ts"])
print(ts(sys.argv[1]), ts(sys.argv[2]))
EOF
}
# --decode-only: kvsieve decodes after random rows, all types in one call
# (interleaved per repetition); prints "TYPE DECODE" lines.
run_kvs_decode() { # model len round
  local o="$OUT/kvs-$1-$2-$3-decode.txt" types
  types=$(IFS=,; echo "${CTYPES[*]}")
  "$KVS" bench --model "${PATHS[$1]}" --prompt-len "$2" --gen "$GEN" --threads "$THREADS" --reps 1 \
    --cache-types "$types" --fill random --no-store >"$o" 2>&1 || { cat "$o" >&2; return 1; }
  sed -n 's/^median \([a-z0-9_]*\) *: decode \([0-9.]*\) tok\/s.*/\1 \2/p' "$o"
}
run_peer_decode() { # model len round cache: llama-bench tg GEN at depth len
  local o="$OUT/$1-$2-$3-$4"
  OMP_WAIT_POLICY=$PEER_WAIT "$BENCH" -m "${PATHS[$1]}" -t "$THREADS" --repack "${REPACK[$1]}" -ctk "$4" -ctv "$4" \
    -r 1 -o csv -p 0 -n "$GEN" -d "$2" >"$o.tg.csv" 2>"$o.tg.err" || { cat "$o.tg.err" >&2; return 1; }
  "$PY" -c 'import csv, sys; print(float(list(csv.DictReader(open(sys.argv[1])))[-1]["avg_ts"]))' "$o.tg.csv"
}
record() { echo "$*" | tee -a "$OUT/results"; }

for r in $(seq 1 "$ROUNDS"); do
  for m in "${models[@]}"; do
    for L in "${LENS[@]}"; do
      if [ -n "${DECODE_ONLY:-}" ]; then
        kd=$(run_kvs_decode "$m" "$L" "$r")
        for T in "${CTYPES[@]}"; do
          v=$(awk -v t="$T" '$1 == t { print $2 }' <<<"$kd")
          [ -n "$v" ] || { echo "bench_peer: no decode figure for $T in kvsieve's output" >&2; exit 1; }
          record "$m $L $T $r kvs nan $v"
          record "$m $L $T $r peer nan $(run_peer_decode "$m" "$L" "$r" "$T")"
        done
        continue
      fi
      for T in "${CTYPES[@]}"; do
        record "$m $L $T $r kvs $(run_kvs "$m" "$L" "$r" "$T")"
        record "$m $L $T $r peer $(run_peer "$m" "$L" "$r" "$T")"
      done
    done
  done
  echo "bench_peer: round $r of $ROUNDS done, load average $(load)" >&2
done
"$PY" - "$OUT/results" "$THREADS" "$GEN" "$PEER_WAIT" <<'EOF'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
threads, gen, wait = sys.argv[2], sys.argv[3], sys.argv[4]
data = {}
for m, L, T, r, who, pf, dc in rows:
    data.setdefault((m, int(L), T, who), []).append((float(pf), float(dc)))
models = list(dict.fromkeys(r[0] for r in rows))
types = list(dict.fromkeys(r[2] for r in rows))
n_rounds = max(len(v) for v in data.values())
print()
print(f"| model | prompt | KV cache | prefill tok/s kvsieve | llama.cpp | ratio | decode tok/s kvsieve | llama.cpp | ratio |")
print(f"|---|---:|---|---:|---:|---:|---:|---:|---:|")
for m in models:
    for L in sorted({k[1] for k in data if k[0] == m}):
        for T in types:
            k, p = data[(m, L, T, "kvs")], data[(m, L, T, "peer")]
            kp, kd = st.median(x[0] for x in k), st.median(x[1] for x in k)
            pp, pd = st.median(x[0] for x in p), st.median(x[1] for x in p)
            pre = "- | - | -" if kp != kp else f"{kp:.1f} | {pp:.1f} | {kp / pp:.2f}x"  # nan: --decode-only
            print(f"| {m} | {L} | {T} | {pre} | {kd:.2f} | {pd:.2f} | {kd / pd:.2f}x |")
print()
print(f"medians of {n_rounds} interleaved rounds; {threads} threads; KV cache: kvsieve --cache-type T, "
      f"llama.cpp llama-bench -ctk T -ctv T (flash attention auto, OMP_WAIT_POLICY={wait}); decode = {gen} greedy "
      f"tokens after the prompt (llama-bench tg{gen} @ d = prompt). Ratio = kvsieve / llama.cpp (>1: kvsieve faster).")
print("per round (prefill, decode):")
for (m, L, T, who), v in sorted(data.items()):
    print(f"  {m} {L} {T} {who}: " + "  ".join(f"{a:.1f}/{b:.2f}" for a, b in v))
EOF
echo "load average after: $(load)"

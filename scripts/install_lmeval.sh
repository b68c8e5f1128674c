#!/usr/bin/env bash
# install_lmeval.sh -- the Python environment of the lm-evaluation-harness
# tests (tests/lmeval, label lmeval): a virtual environment with lm-eval
# 0.4.13 and its api extra (aiohttp, tenacity, requests: what --model
# local-completions needs; no torch), from the Python package index only.
# Idempotent: a second run only checks the pin and prints the interpreter's
# path. The venv lives at $KVS_LMEVAL_VENV (default ~/.cache/kvsieve/lmeval-venv),
# where tests/lmeval/run_lmeval.py looks for it.
set -euo pipefail
VENV=${KVS_LMEVAL_VENV:-$HOME/.cache/kvsieve/lmeval-venv}
PY=${PYTHON:-python3}
PIN="lm_eval[api]==0.4.13"
if [ -x "$VENV/bin/lm-eval" ] && "$VENV/bin/python" -c "import lm_eval, aiohttp, tenacity" 2>/dev/null &&
   [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("lm_eval"))')" = "0.4.13" ]; then
  echo "$VENV/bin/python"
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV" || { echo "install_lmeval: '$PY -m venv' failed (on Debian: apt-get install python3-venv)" >&2; exit 1; }
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
"$VENV/bin/python" -m pip install --quiet "$PIN" >&2
echo "$VENV/bin/python"

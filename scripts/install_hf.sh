#!/usr/bin/env bash
# install_hf.sh -- the Python environment of the transformers backend
# (kvsieve-hf) and its tests: a virtual environment with torch, transformers
# and friends at pinned versions, from the Python package index only, plus the
# kvsieve binding (python/, put on the venv's path by a .pth file, as the
# editable install of python/pyproject.toml did, so it finds the checkout's
# build/lib/libkvsieve.so; the wheel of the root pyproject.toml would build
# the C project a second time) and a kvsieve-hf command. Idempotent: a second
# run only checks the pins and prints the interpreter's path. Nothing is
# downloaded at run time: the tests build their tiny models from configs, and
# the real text model is the GGUF that scripts/install_model.sh already
# installed.
#
# The venv lives at $KVS_HF_VENV (default ~/.cache/kvsieve/hf-venv). torch
# from the package index is the CUDA build (about 3 GB with its nvidia-*
# wheels); it runs on the CPU when no GPU is present, which is what the tests
# here use. torchvision is there because transformers builds the video
# processors of Qwen2.5-VL and LLaVA-OneVision on it (their processors need one);
# gguf and accelerate because transformers needs both to read a GGUF file.
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
VENV=${KVS_HF_VENV:-$HOME/.cache/kvsieve/hf-venv}
PY=${PYTHON:-python3}
PINS=(torch==2.15.0 torchvision==0.29.2 transformers==5.24.0 tokenizers==0.23.3 safetensors==0.8.0 pillow==13.0.0
      numpy==2.4.6 gguf==0.19.0 accelerate==1.15.0)
STAMP="$VENV/.kvsieve-pins"
want="${PINS[*]} pth:$HERE/python"  # re-install when the pins or the checkout change
if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] &&
   "$VENV/bin/python" -c "import kvsieve, torch, transformers" 2>/dev/null; then
  echo "$VENV/bin/python"
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV" || { echo "install_hf: '$PY -m venv' failed (on Debian: apt-get install python3-venv)" >&2; exit 1; }
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
"$VENV/bin/python" -m pip install --quiet "${PINS[@]}" >&2
"$VENV/bin/python" -m pip uninstall --quiet --yes kvsieve >/dev/null 2>&1 || true  # an older editable install
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$HERE/python" > "$SITE/kvsieve-checkout.pth"
printf '#!/bin/sh\nexec "%s" -m kvsieve.hf "$@"\n' "$VENV/bin/python" > "$VENV/bin/kvsieve-hf"
chmod +x "$VENV/bin/kvsieve-hf"
echo "$want" > "$STAMP"
echo "$VENV/bin/python"

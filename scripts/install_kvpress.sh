#!/usr/bin/env bash
# install_kvpress.sh -- the Python environment of kvsieve's kvpress bridge
# (python/kvsieve/kvpress.py: kvsieve's methods as kvpress presses;
# python/kvsieve/hf/kvpress_rows.py: kvpress presses as kvsieve-hf rows) and
# of its tests (label kvpress).
#
# Why a second venv: kvpress 0.5.5 requires transformers >= 4.56, < 5.3
# (its prefill hook reads the attention module's past_key_values and
# cache_position, which later transformers renamed), while kvsieve-hf's venv
# pins transformers 5.24. kvsieve-hf runs on both (engine.cache_keyword), so
# this venv holds transformers 5.2.0 + kvpress 0.5.5 and takes everything else
# (torch 2.15, torchvision, numpy, safetensors, pillow, accelerate...) from
# the hf venv: a .pth line puts the hf venv's site-packages on its path AFTER
# its own, so its own transformers / tokenizers / huggingface_hub shadow the
# hf venv's and torch (3 GB) is not downloaded twice. pip sees the hf venv's
# packages as installed and never touches them ("outside environment").
# Idempotent: a second run only checks the pins and prints the interpreter.
#
# The venv lives at $KVS_KVPRESS_VENV (default ~/.cache/kvsieve/kvpress-venv);
# it needs the hf venv (scripts/install_hf.sh, run first here unless
# KVS_HF_PYTHON names that venv's python).
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
HF_PY=${KVS_HF_PYTHON:-$(bash "$HERE/scripts/install_hf.sh")}  # the hf venv's python
VENV=${KVS_KVPRESS_VENV:-$HOME/.cache/kvsieve/kvpress-venv}
PINS=(kvpress==0.5.5 transformers==5.2.0 tokenizers==0.22.2 huggingface-hub==1.33.0 datasets==5.2.0
      pandas==2.3.3 peft==0.21.2 fire==0.6.0 cachetools==5.5.2)
HF_SITE=$("$HF_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
STAMP="$VENV/.kvsieve-pins"
want="${PINS[*]} hf:$HF_SITE pth:$HERE/python"
if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] &&
   "$VENV/bin/python" -c "import kvsieve, torch, kvpress" 2>/dev/null; then
  echo "$VENV/bin/python"
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  # from the hf venv's interpreter: the .pth below needs the same Python version
  "$HF_PY" -m venv "$VENV" || { echo "install_kvpress: '$HF_PY -m venv' failed (on Debian: apt-get install "\
"python3-venv)" >&2; exit 1; }
fi
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$HF_SITE" > "$SITE/kvsieve-hf-venv.pth"
echo "$HERE/python" > "$SITE/kvsieve-checkout.pth"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
"$VENV/bin/python" -m pip install --quiet "${PINS[@]}" >&2
"$VENV/bin/python" -c "import transformers, kvpress, torch; assert transformers.__version__ == '5.2.0', transformers.__file__" >&2
printf '#!/bin/sh\nexec "%s" -m kvsieve.hf "$@"\n' "$VENV/bin/python" > "$VENV/bin/kvsieve-hf"
chmod +x "$VENV/bin/kvsieve-hf"
echo "$want" > "$STAMP"
echo "$VENV/bin/python"

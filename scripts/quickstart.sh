#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: install, build, install the
# default model (Gemma 3 270M, idempotent), run the quick-start experiment
# (every method x budgets 0.2 and 0.5 on a needle-in-a-haystack grid, the
# embedded backend started and stopped by the runner) and print the
# head-to-head table. Arguments are passed to `kvsieve run` (e.g. --db PATH,
# -D 'dataset.per_cell=1'); running it again resumes and reprints the table.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
bash scripts/install_model.sh >/dev/null
./build/kvsieve run experiments/quickstart.lua "$@"

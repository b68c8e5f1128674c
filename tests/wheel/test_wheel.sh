#!/usr/bin/env bash
# test_wheel.sh PYTHON SOURCE_DIR -- build the kvsieve wheel from SOURCE_DIR,
# install it into a fresh venv in a temporary folder and use it there, away
# from the checkout (temporary cwd, no PYTHONPATH, no KVSIEVE_LIBRARY):
#   1. the wheel holds the binding, kvsieve-hf, kvsieve/bin/kvsieve and
#      kvsieve/libkvsieve.so.1 (one file, no .so.1.0.0 copy);
#   2. `kvsieve --version` and `kvsieve methods` through the venv's entry point;
#   3. `kvsieve synth` + `kvsieve compress` make a dump and a plan;
#   4. Python in the venv loads the wheel's library, compresses that dump
#      through the binding and gets the CLI's plan (sane budgets and indices).
# Exits non-zero at the first step that fails. KVS_WHEEL_KEEP=1 keeps the folder.
set -euo pipefail
PY=${1:?usage: test_wheel.sh PYTHON SOURCE_DIR}
SRC=$(cd "${2:?usage: test_wheel.sh PYTHON SOURCE_DIR}" && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvsieve-wheel.XXXXXX")
if [ "${KVS_WHEEL_KEEP:-0}" = "1" ]; then echo "wheel_install: keeping $TMP"; else trap 'rm -rf "$TMP"' EXIT; fi
step() { echo "== wheel_install: $*"; }
fail() { echo "wheel_install: FAILED: $*" >&2; exit 1; }
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PIP_NO_INPUT=1
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
unset KVSIEVE_LIBRARY KVSIEVE_CLI PYTHONPATH PYTHONHOME

step "building the wheel from $SRC"
t0=$(date +%s)
"$PY" -m pip wheel -v "$SRC" -w "$TMP/dist" --no-deps >"$TMP/build.log" 2>&1 ||
  { tail -40 "$TMP/build.log" >&2; fail "pip wheel (log above)"; }
shopt -s nullglob
wheels=("$TMP"/dist/kvsieve-*.whl)
[ ${#wheels[@]} -eq 1 ] || fail "expected one kvsieve wheel in $TMP/dist, found ${#wheels[@]}"
WHL=${wheels[0]}
echo "built $(basename "$WHL") ($(du -k "$WHL" | cut -f1) KiB) in $(( $(date +%s) - t0 )) s"
grep -E "kvsieve: CUDA kernels" "$TMP/build.log" | sed 's/^ *//' || true

step "the wheel's files"
"$PY" - "$WHL" <<'PYEOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
for n in names:
    print("  " + n)
need = ["kvsieve/__init__.py", "kvsieve/_lib.py", "kvsieve/_cli.py", "kvsieve/safetensors.py",
        "kvsieve/hf/__main__.py", "kvsieve/bin/kvsieve", "kvsieve/libkvsieve.so.1"]
missing = [n for n in need if n not in names]
extra = [n for n in names if n.startswith("kvsieve/libkvsieve.so") and n != "kvsieve/libkvsieve.so.1"]
junk = [n for n in names if "__pycache__" in n or n.endswith(".a") or "/tests/" in n]
entry = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
text = zipfile.ZipFile(sys.argv[1]).read(entry[0]).decode() if entry else ""
bad = [e for e in ("kvsieve = kvsieve._cli:main", "kvsieve-hf = kvsieve.hf.__main__:main") if e not in text]
if missing or extra or junk or bad:
    sys.exit("missing %s, extra library copies %s, not wanted %s, entry points missing %s"
             % (missing, extra, junk, bad))
PYEOF

step "a fresh venv with the wheel"
"$PY" -m venv "$TMP/venv" || fail "$PY -m venv (on Debian: apt-get install python3-venv)"
VPY=$TMP/venv/bin/python
"$VPY" -m pip install --quiet --no-index --no-deps "$WHL" || fail "pip install $WHL"
mkdir "$TMP/run"
cd "$TMP/run"
export PYTHONNOUSERSITE=1

step "kvsieve --version; kvsieve methods (the entry point $TMP/venv/bin/kvsieve)"
[ -x "$TMP/venv/bin/kvsieve" ] || fail "no kvsieve entry point in the venv"
"$TMP/venv/bin/kvsieve" --version || fail "kvsieve --version"
"$TMP/venv/bin/kvsieve" methods >methods.txt || fail "kvsieve methods"
cat methods.txt
for m in full snapkv h2o flashcache; do
  grep -qw "$m" methods.txt || fail "kvsieve methods does not list $m"
done
"$TMP/venv/bin/kvsieve-hf" --help >/dev/null || fail "kvsieve-hf --help"

step "kvsieve synth + kvsieve compress"
"$TMP/venv/bin/kvsieve" synth --preset tiny --tokens 96 --queries 96 --image-frac 0.3 --seed 3 \
  --out dump.safetensors || fail "kvsieve synth"
"$TMP/venv/bin/kvsieve" compress --kv dump.safetensors --method snapkv --ratio 0.25 --plan plan.json \
  --out out.safetensors --quiet || fail "kvsieve compress"

step "a compression through the binding in the venv"
"$VPY" - "$TMP/venv" <<'PYEOF' || fail "the binding in the venv"
import json, os, sys
venv = os.path.realpath(sys.argv[1])
import kvsieve
here = os.path.realpath(os.path.dirname(kvsieve.__file__))
lib = os.path.realpath(kvsieve.library_path())
print("kvsieve from", here)
print("library", lib, "abi", kvsieve.abi_version(), "|", kvsieve.build_info())
assert here.startswith(venv + os.sep), "kvsieve imported from outside the venv: %s" % here
assert lib == os.path.join(here, "libkvsieve.so.1"), "not the wheel's library: %s" % lib
names = [m["name"] for m in kvsieve.methods()]
assert "snapkv" in names and len(names) >= 5, names
f = kvsieve.safetensors.load("dump.safetensors")
L = len([n for n in f.tensors if n.endswith(".k")])
layers = [(f["layers.%d.k" % l], f["layers.%d.v" % l], f["layers.%d.q" % l]) for l in range(L)]
with kvsieve.Context(threads=2) as ctx:
    ctx.set_cache(layers, f["modality"] if "modality" in f else None)
    plan = ctx.compress("snapkv", ratio=0.25)
    info = plan.info()
    N, H = info["n_tokens"], info["n_kv_heads"]
    budgets = plan.budgets
    assert len(budgets) == L >= 1 and N == 96 and H >= 1, (budgets, info)
    assert sum(budgets) == L * int(0.25 * N), (budgets, N)
    for l, B in enumerate(budgets):
        rows = plan.indices(l)
        assert len(rows) == H and all(len(r) == B and r == sorted(set(r)) and 0 <= r[0] and r[-1] < N
                                      for r in rows), (l, B)
    with open("plan.json") as fh:
        assert plan.to_dict() == json.load(fh), "the binding's plan differs from kvsieve compress's"
    print("plan: %d layers x %d kv heads, %d of %d tokens kept a layer, total %d; equals the CLI's"
          % (L, H, budgets[0], N, info["total_kept"]))
PYEOF
step "passed"

#!/usr/bin/env bash
# test_dump_cli.sh KVSIEVE -- the dump's optional W_o and reconstruction
# statistic end to end: `kvsieve synth --wo E --recon` writes them, and
# `kvsieve compress` then runs criticalkv, criticaladakv and kvzip on the file
# (exact plans, counted by an independent reader); a dump without them is
# refused by name, naming the tensor the file lacks; bad flag values are clean
# errors.
set -u
BIN=$1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
expect_fail() { # "words" cmd...: a clean non-zero exit with the words in stderr
  local words=$1; shift
  "$@" >"$TMP/out" 2>"$TMP/err"; local rc=$?
  if [ $rc -eq 0 ] || [ $rc -ge 128 ]; then bad "expected a clean failure (rc $rc): $*"; return; fi
  grep -qF -- "$words" "$TMP/err" && ok || { bad "no '$words' in the error of: $*"; cat "$TMP/err" >&2; }
}
count_plan() { # plan.json L N ratio: every layer's rows sum to Hkv x budget, the total to L x B
  python3 - "$@" <<'PY'
import json, math, sys
p = json.load(open(sys.argv[1])); L = int(sys.argv[2]); N = int(sys.argv[3]); r = float(sys.argv[4])
B = max(1, min(N, math.floor(r * N + 1e-9)))
assert len(p["layers"]) == L and sum(l["budget"] for l in p["layers"]) == L * B
for l in p["layers"]:
    cnt = l.get("counts", [l["budget"]] * len(l["heads"]))
    assert sum(cnt) == len(l["heads"]) * l["budget"] and all(len(h) == c for h, c in zip(l["heads"], cnt))
PY
}

args=(--layers 3 --q-heads 4 --kv-heads 2 --head-dim 8 --tokens 80 --seed 2)
"$BIN" synth "${args[@]}" --wo 24 --recon --dtype bf16 --out "$TMP/x.safetensors" >"$TMP/out" 2>&1 \
  && grep -q "W_o E 24, recon" "$TMP/out" && ok || { bad "synth --wo --recon"; cat "$TMP/out" >&2; }
"$BIN" synth "${args[@]}" --out "$TMP/plain.safetensors" >/dev/null 2>&1 && ok || bad "synth plain"
for m in criticalkv criticaladakv kvzip; do
  if "$BIN" compress --kv "$TMP/x.safetensors" --method "$m" --ratio 0.25 --plan "$TMP/p.json" --quiet \
       >"$TMP/out" 2>"$TMP/err"; then
    count_plan "$TMP/p.json" 3 80 0.25 && ok || bad "plan of $m"
  else
    bad "compress $m on a dump with wo and recon: $(cat "$TMP/err")"
  fi
done
for m in criticalkv criticaladakv; do
  expect_fail "method $m needs each layer's output projection W_o; layer 0 of this cache view has none (the embedded engine provides it; cache files without layers.{l}.wo" \
    "$BIN" compress --kv "$TMP/plain.safetensors" --method "$m" --ratio 0.25 --plan "$TMP/p.json" --quiet
done
expect_fail "cache files without layers.{l}.recon" \
  "$BIN" compress --kv "$TMP/plain.safetensors" --method kvzip --ratio 0.25 --plan "$TMP/p.json" --quiet
# W_o alone does not give kvzip its statistic, nor recon alone criticalkv its W_o
"$BIN" synth "${args[@]}" --wo 4 --out "$TMP/wo.safetensors" >/dev/null 2>&1 && ok || bad "synth --wo alone"
expect_fail "method kvzip needs the context-reconstruction statistic" \
  "$BIN" compress --kv "$TMP/wo.safetensors" --method kvzip --ratio 0.25 --plan "$TMP/p.json" --quiet
"$BIN" compress --kv "$TMP/wo.safetensors" --method criticalkv --ratio 0.25 --plan "$TMP/p.json" --quiet \
  >/dev/null 2>&1 && ok || bad "criticalkv with --wo alone"
expect_fail "--wo" "$BIN" synth "${args[@]}" --wo 0 --out "$TMP/bad.safetensors"
expect_fail "--wo needs a value" "$BIN" synth "${args[@]}" --wo
"$BIN" synth --help | grep -q -- "--recon" && ok || bad "synth --help does not list --recon"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]

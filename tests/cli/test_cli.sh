#!/usr/bin/env bash
# test_cli.sh KVSIEVE -- drives the real binary like a user would:
#  1. `methods` lists the 30 methods (presets with their composition) and the parts;
#  2. synth + compress for every method at ratio 0.2 on several shapes: the
#     plan JSON has exact budgets (sum = L * floor(0.2 N), equal counts per
#     head, sorted unique indices in range), checked by an independent reader;
#  3. bad input gets a clear message and a non-zero exit, never a crash.
set -u
BIN=$1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }

# expect_fail "words" cmd... : non-zero exit (not a signal) and the words in stderr
expect_fail() {
  local words=$1; shift
  "$@" >"$TMP/out" 2>"$TMP/err"; local rc=$?
  if [ $rc -eq 0 ] || [ $rc -ge 128 ]; then bad "expected a clean failure (rc $rc): $*"; return; fi
  grep -qF -- "$words" "$TMP/err" && ok || { bad "no '$words' in the error of: $*"; cat "$TMP/err" >&2; }
}

# 1. methods
out=$("$BIN" methods) || bad "methods failed"
for m in full random streamingllm h2o snapkv lookm meda flashcache knorm tova keydiff pyramidkv chunkkv expected_attention pyramid_tova adakv ada_pyramidkv ada_flashcache lagkv criticalkv criticaladakv cur leverage cake simlayerkv qfilters compactor finch think kvzip; do
  echo "$out" | grep -q "^$m\$" && ok || bad "methods does not list $m"
done
"$BIN" methods --json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert len(d)==30' && ok || bad "methods --json"

# 2. exact budgets on several shapes
check_plan() { # plan.json L N ratio
  python3 - "$@" <<'PY'
import json, math, sys
p = json.load(open(sys.argv[1])); L = int(sys.argv[2]); N = int(sys.argv[3]); r = float(sys.argv[4])
B = max(1, min(N, math.floor(r * N + 1e-9)))
assert p["n_tokens"] == N and len(p["layers"]) == L, "shape"
want = L * (N if p["method"] == "full" else B)
assert sum(l["budget"] for l in p["layers"]) == want, "global budget %d != %d" % (sum(l["budget"] for l in p["layers"]), want)
for li, l in enumerate(p["layers"]):
    # ragged layers: head h keeps counts[h], the counts sum to heads x budget
    cnt = l.get("counts", [l["budget"]] * len(l["heads"]))
    assert sum(cnt) == len(l["heads"]) * l["budget"], "layer %d: counts sum %d" % (li, sum(cnt))
    for h, c in zip(l["heads"], cnt):
        assert len(h) == c, "layer %d: head count %d != %d" % (li, len(h), c)
        assert all(0 <= i < N for i in h), "range"
        assert all(a < b for a, b in zip(h, h[1:])), "sorted unique"
PY
}
shapes=("--preset tiny:2:300" "--preset gemma3-270m:18:512" "--layers 3 --q-heads 6 --kv-heads 3 --head-dim 32:3:257")
for s in "${shapes[@]}"; do
  IFS=: read -r args L N <<<"$s"
  # shellcheck disable=SC2086
  "$BIN" synth $args --tokens "$N" --seed 3 --image-frac 0.3 --dtype f16 --out "$TMP/c.safetensors" >/dev/null \
    || { bad "synth $args"; continue; }
  for m in criticalkv criticaladakv; do # a cache file holds no W_o: refused by name
    expect_fail "needs each layer's output projection W_o" \
      "$BIN" compress --kv "$TMP/c.safetensors" --method "$m" --ratio 0.2 --plan "$TMP/p.json" --quiet
  done
  # nor KVzip's context-reconstruction statistic (the engine's extra forward pass): refused by name
  expect_fail "method kvzip needs the context-reconstruction statistic" \
    "$BIN" compress --kv "$TMP/c.safetensors" --method kvzip --ratio 0.2 --plan "$TMP/p.json" --quiet
  for m in full random streamingllm h2o snapkv lookm meda flashcache knorm tova keydiff pyramidkv chunkkv expected_attention pyramid_tova adakv ada_pyramidkv ada_flashcache lagkv cur leverage cake simlayerkv qfilters compactor finch think; do
    outarg=(--out "$TMP/o.safetensors")
    case $m in ada*) outarg=() ;; esac # ragged plans: the [Hkv, B, d] dump cannot hold them (refused below)
    if "$BIN" compress --kv "$TMP/c.safetensors" --method "$m" --ratio 0.2 --plan "$TMP/p.json" \
         "${outarg[@]}" --quiet >"$TMP/out" 2>"$TMP/err"; then
      check_plan "$TMP/p.json" "$L" "$N" 0.2 && ok || bad "plan of $m on $args"
    else
      bad "compress $m on $args: $(cat "$TMP/err")"
    fi
  done
done
"$BIN" fidelity --kv "$TMP/c.safetensors" --ratio 0.2 >"$TMP/out" 2>&1 && grep -q "| flashcache |" "$TMP/out" && ok \
  || { bad "fidelity"; cat "$TMP/out" >&2; }

# 2b. methods composed from parts: --method '{...}' on compress and fidelity; the plan keeps
# exact budgets, the sinks are kept, the method is named by its canonical JSON; a description of
# a preset's composition gives the preset's plan; `methods` shows compositions and parts
out=$("$BIN" methods) || bad "methods failed"
echo "$out" | grep -qF 'composition: {"score":"snapkv","allocate":"pyramid","keep":{"window":8}' && ok \
  || bad "methods does not show pyramidkv's composition"
echo "$out" | grep -q '^scorer    expected_attention' && ok || bad "methods does not list the scorer parts"
"$BIN" methods --json | python3 -c '
import json, sys
d = {m["name"]: m for m in json.load(sys.stdin)}
assert d["tova"]["composition"]["score"] == "tova" and d["tova"]["composition"]["keep"] == {"window": 1}
assert "composition" not in d["snapkv"] and d["snapkv"]["params"][0]["name"] == "window"' && ok \
  || bad "methods --json compositions"
"$BIN" methods --json --parts | python3 -c '
import json, sys
p = {(x["kind"], x["name"]): x for x in json.load(sys.stdin)}
assert ("scorer", "flashcache") in p and ("pick", "chunk") in p and ("keep", "sinks") in p
g = p[("scorer", "flashcache")]["params"][0]
assert g["name"] == "gamma" and g["type"] == "float" and g["default"] == "0.2" and g["range"] == "[1e-09, 1]"' \
  && ok || bad "methods --json --parts"
C='{"name":"k4","score":"knorm","allocate":"pyramid","keep":{"sinks":4,"window":2},"pick":"chunk","params":{"chunk":3}}'
if "$BIN" compress --kv "$TMP/c.safetensors" --method "$C" --ratio 0.2 --plan "$TMP/p.json" >"$TMP/out" 2>"$TMP/err"; then
  check_plan "$TMP/p.json" "$L" "$N" 0.2 && ok || bad "plan of a composed method"
  grep -qF '{"score":"knorm","allocate":"pyramid","keep":{"sinks":4,"window":2},"pick":"chunk","merge":"none","params":{"beta":20,"recent_frac":0,"chunk":3}} on' "$TMP/out" \
    && ok || { bad "composed method not named by its canonical JSON"; cat "$TMP/out" >&2; }
  python3 - "$TMP/p.json" "$N" <<'PY' && ok || bad "composed: sinks / window not kept"
import json, sys
p = json.load(open(sys.argv[1])); N = int(sys.argv[2])
for l in p["layers"]:
    B = l["budget"]; s = min(4, B); w = min(2, B - s)  # sinks first, then the window
    for h in l["heads"]:
        assert all(t in h for t in list(range(s)) + list(range(N - w, N))), (B, h[:6])
PY
else
  bad "compress composed: $(cat "$TMP/err")"
fi
"$BIN" compress --kv "$TMP/c.safetensors" --method pyramidkv --ratio 0.2 --plan "$TMP/a.json" --quiet >/dev/null \
  && "$BIN" compress --kv "$TMP/c.safetensors" --ratio 0.2 --plan "$TMP/b.json" --quiet \
       --method '{"score":"snapkv","allocate":"pyramid","keep":{"window":8}}' >/dev/null \
  && python3 -c 'import json,sys; a,b=(json.load(open(f)) for f in sys.argv[1:]); assert a["layers"]==b["layers"]' \
       "$TMP/a.json" "$TMP/b.json" && ok || bad "composed pyramidkv != pyramidkv"
"$BIN" fidelity --kv "$TMP/c.safetensors" --ratio 0.2 \
  --methods 'tova,{"score":"tova","allocate":"pyramid","keep":{"window":1}},knorm' >"$TMP/out" 2>&1 \
  && grep -qF '| {"score":"tova","allocate":"pyramid"' "$TMP/out" && grep -q "| knorm |" "$TMP/out" && ok \
  || { bad "fidelity with a composed method"; cat "$TMP/out" >&2; }
expect_fail "score: unknown scorer 'tovaa' (did you mean 'tova'?)" \
  "$BIN" compress --kv "$TMP/c.safetensors" --method '{"score":"tovaa"}' --ratio 0.2
expect_fail "params.chunk: parameter chunk = 0 is out of range" \
  "$BIN" compress --kv "$TMP/c.safetensors" --method '{"score":"knorm","pick":"chunk","params":{"chunk":0}}' --ratio 0.2
expect_fail "out of range" \
  "$BIN" compress --kv "$TMP/c.safetensors" --method '{"score":"knorm"}' --param parts=0 --ratio 0.2
expect_fail "not valid JSON" "$BIN" compress --kv "$TMP/c.safetensors" --method '{"score":' --ratio 0.2
# AdaKV and SnapKV at one ratio keep the same KV bytes (ragged heads vs equal heads)
"$BIN" compress --kv "$TMP/c.safetensors" --method adakv --ratio 0.25 >"$TMP/ada" 2>&1 || bad "adakv bytes"
"$BIN" compress --kv "$TMP/c.safetensors" --method snapkv --ratio 0.25 >"$TMP/snap" 2>&1 || bad "snapkv bytes"
ab=$(grep -o 'kept KV bytes [0-9]* of [0-9]*' "$TMP/ada"); sb=$(grep -o 'kept KV bytes [0-9]* of [0-9]*' "$TMP/snap")
[ -n "$ab" ] && [ "$ab" = "$sb" ] && grep -q "ragged heads" "$TMP/ada" && grep -q "equal heads" "$TMP/snap" && ok \
  || bad "adakv vs snapkv bytes: '$ab' vs '$sb'"
expect_fail "ragged" "$BIN" compress --kv "$TMP/c.safetensors" --method adakv --ratio 0.25 --out "$TMP/o.safetensors"
# the head allocator composes: "allocate": "adakv" (uniform layers, AdaKV heads) gives adakv's plan;
# "heads" puts it over any scorer and layer allocator; a wrong name is refused naming the field
"$BIN" compress --kv "$TMP/c.safetensors" --method adakv --ratio 0.25 --plan "$TMP/pa.json" --quiet >/dev/null 2>&1 \
  && "$BIN" compress --kv "$TMP/c.safetensors" --method '{"score":"snapkv","allocate":"adakv","keep":{"window":32}}' \
       --ratio 0.25 --plan "$TMP/pb.json" --quiet >/dev/null 2>&1 \
  && python3 -c 'import json,sys; a,b=(json.load(open(f))["layers"] for f in sys.argv[1:]); assert a==b' "$TMP/pa.json" "$TMP/pb.json" \
  && ok || bad "allocate adakv composition differs from the adakv preset"
"$BIN" compress --kv "$TMP/c.safetensors" --method '{"score":"tova","allocate":"pyramid","heads":"adakv","keep":{"window":1}}' \
  --ratio 0.25 >"$TMP/out" 2>&1 && grep -q "ragged heads" "$TMP/out" && ok || bad "heads adakv over tova + pyramid"
expect_fail "heads: unknown heads 'adakvv' (did you mean 'adakv'?)" \
  "$BIN" compress --kv "$TMP/c.safetensors" --method '{"score":"tova","heads":"adakvv"}' --ratio 0.2

# 3. errors
"$BIN" synth --preset tiny --tokens 64 --queries 8 --out "$TMP/w.safetensors" >/dev/null || bad "synth window"
expect_fail "ratio" "$BIN" compress --kv "$TMP/w.safetensors" --method snapkv --ratio 0
expect_fail "ratio" "$BIN" compress --kv "$TMP/w.safetensors" --method snapkv --ratio 1.5
expect_fail "did you mean 'snapkv'" "$BIN" compress --kv "$TMP/w.safetensors" --method snapk --ratio 0.2
expect_fail "did you mean 'gamma'" "$BIN" compress --kv "$TMP/w.safetensors" --method flashcache --ratio 0.2 --param gama=0.1
expect_fail "out of range" "$BIN" compress --kv "$TMP/w.safetensors" --method flashcache --ratio 0.2 --param gamma=2
expect_fail "Nq=8" "$BIN" compress --kv "$TMP/w.safetensors" --method h2o --ratio 0.2
expect_fail "window" "$BIN" compress --kv "$TMP/w.safetensors" --method snapkv --ratio 0.2 --param window=32
"$BIN" synth --preset tiny --tokens 64 --queries none --out "$TMP/nq.safetensors" >/dev/null || bad "synth no queries"
expect_fail "needs the queries" \
  "$BIN" compress --kv "$TMP/nq.safetensors" --method '{"score":"expected_attention"}' --ratio 0.2
head -c 100 "$TMP/w.safetensors" >"$TMP/trunc.safetensors"
expect_fail "trunc.safetensors" "$BIN" compress --kv "$TMP/trunc.safetensors" --method full --ratio 0.2
expect_fail "missing.safetensors" "$BIN" compress --kv "$TMP/missing.safetensors" --method full --ratio 0.2
expect_fail "unknown command" "$BIN" frobnicate
expect_fail "--tokens" "$BIN" synth --preset tiny --tokens 0 --out "$TMP/z.safetensors"

echo "cli_end_to_end: $pass passed, $fail failed"
[ "$fail" -eq 0 ]

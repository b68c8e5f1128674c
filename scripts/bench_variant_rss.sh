#!/bin/bash
# bench_variant_rss.sh -- peak RSS of `kvsieve serve` over one request with many compression variants.
#
# What it is: starts BIN serve (--ctx 8192, --batch max(64, N), 2 threads, nice 10) under /usr/bin/time -v,
# sends one /completion of a 4,001-token prompt (random token ids, seed 1) with N variants (20 presets x
# kept ratios 0.75, 0.5, 0.25, 0.125 x query-agnostic / query-aware, the first N of them; the question as
# suffix; n_predict 32, greedy), stops the server and prints its peak RSS and wall time. OUT.json keeps each
# variant's text, bytes_after, tokens_after and same_as, to compare two builds (they must be identical).
# What it is not: a timing benchmark (the server is niced and the machine shared).
#
# usage: scripts/bench_variant_rss.sh BIN MODEL N OUT [PORT]
#   e.g. scripts/bench_variant_rss.sh build/kvsieve smollm2-135m 64 /tmp/after64
set -euo pipefail
BIN=$1 MODEL=$2 NVAR=$3 OUT=$4 PORT=${5:-18431}
M=$(cat ~/.cache/kvsieve/models/$MODEL.path)
nice -n 10 /usr/bin/time -v "$BIN" serve --model "$M" --port "$PORT" --threads 2 --ctx 8192 \
    --batch $((NVAR > 64 ? NVAR : 64)) 2>"$OUT.time" &
TP=$!
for _ in $(seq 1 120); do curl -s "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.5; done
nice -n 10 python3 - "$PORT" "$NVAR" "$OUT.json" <<'EOF'
import json, random, sys, time, urllib.error, urllib.request
port, nvar, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
random.seed(1)
prompt = [1] + [random.randrange(100, 40000) for _ in range(4000)]
methods = ["snapkv", "adakv", "lookm", "h2o", "think", "pyramidkv", "streamingllm", "tova", "knorm", "keydiff",
           "chunkkv", "expected_attention", "ada_pyramidkv", "lagkv", "criticalkv", "cur", "leverage", "cake",
           "compactor", "meda"]
q = " What is the special magic number mentioned in the text above? Answer:"
vs = [{"method": m, "ratio": r, "suffix": q, "compress_suffix": aware}
      for m in methods for r in (0.75, 0.5, 0.25, 0.125) for aware in (False, True)][:nvar]
body = {"prompt": prompt, "n_predict": 32, "temperature": 0, "kv_compression": {"variants": vs}}
req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=json.dumps(body).encode(),
                             headers={"Content-Type": "application/json"})
t = time.time()
try:
    r = json.load(urllib.request.urlopen(req, timeout=3600))
except urllib.error.HTTPError as e:
    sys.exit(f"HTTP {e.code}: {e.read().decode()[:500]}")
outs = r.get("variants", [r])
print(f"{len(outs)} variants in {time.time() - t:.1f} s")
json.dump([[o.get("content"), o["kv"].get("bytes_after"), o["kv"].get("tokens_after"), o.get("same_as")]
           for o in outs], open(out, "w"))
EOF
kill -TERM "$(pgrep -P $TP -x kvsieve)"
wait $TP || true
grep -E "Maximum resident|Elapsed" "$OUT.time"

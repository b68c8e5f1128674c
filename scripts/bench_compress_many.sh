#!/usr/bin/env bash
# bench_compress_many.sh -- the compress step of one request with several
# ratios per method: `kvsieve serve` + one /completion request carrying
# 4 ratios x {h2o, lookm, meda, snapkv, flashcache} (20 variants) on a ~2K-token
# prompt; prints each variant's compress_ms and the request's total.
# Variants sharing a method and its parameters observe the cache once
# (docs/serving.md), so compare two builds with it:
#   bash scripts/bench_compress_many.sh [KVSIEVE_BINARY] [MODEL] [THREADS]
# Not a test: it prints timings and checks nothing.
set -euo pipefail
BIN=${1:-build/kvsieve}
MODEL=${2:-$HOME/.cache/kvsieve/models/qwen2.5-0.5b.gguf}
THREADS=${3:-2}
PORT=$((20000 + RANDOM % 20000))
LOG=$(mktemp)
"$BIN" serve --model "$MODEL" --port "$PORT" --threads "$THREADS" --ctx 4096 --slots 1 >"$LOG" 2>&1 &
SRV=$!
trap 'kill $SRV 2>/dev/null || true; rm -f "$LOG"' EXIT
for _ in $(seq 120); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
    sleep 1
done
python3 - "$PORT" <<'PY'
import json, sys, time, urllib.request
port = sys.argv[1]
para = ("Record {i}: the depot at {city} shipped {n} crates of {item} on day {d}; "
        "the inspector noted that seal {s} was intact and the manifest matched. ")
cities, items = ["Lyon", "Osaka", "Quito", "Perth", "Oslo"], ["tin", "rice", "silk", "glass", "salt"]
text = "".join(para.format(i=i, city=cities[i % 5], n=17 * i % 97, item=items[i * 3 % 5], d=i % 31,
                           s=1000 + 7 * i) for i in range(64))
prompt = text + "\nQuestion: how many crates did record 12 ship? Answer:"
variants = [{"method": m, "ratio": r, "name": f"{m}@{r}"}
            for m in ["h2o", "lookm", "meda", "snapkv", "flashcache"] for r in [0.75, 0.5, 0.25, 0.125]]
req = {"prompt": prompt, "n_predict": 8, "temperature": 0, "kv_compression": {"variants": variants}}
t0 = time.time()
r = urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/completion",
                           data=json.dumps(req).encode(), headers={"Content-Type": "application/json"}))
body = json.loads(r.read())
wall = time.time() - t0
vs = body["variants"]
tot, per = 0.0, {}
for v in vs:
    ms = v["timings"]["compress_ms"]
    tot += ms
    m = v["name"].split("@")[0]
    per[m] = per.get(m, 0.0) + ms
    print(f'{v["name"]:18s} compress_ms {ms:9.1f}  {json.dumps(v["content"])}')
print("prompt tokens", body["variants"][0]["timings"].get("prompt_n"), "prompt_ms",
      round(body["variants"][0]["timings"].get("prompt_ms", 0)))
print("per method (4 ratios):", {k: round(x) for k, x in per.items()})
print(f"total compress_ms {tot:.0f} over {len(vs)} variants; request wall {wall:.1f} s")
PY

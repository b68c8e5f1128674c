"""bench_kvpress.py -- kvsieve against kvpress 0.5.5 on the same prompts,
weights and threads (scripts/bench_kvpress.sh runs it; --help lists the
options).

What it is: one run of three sides on a slice of experiments/leaderboard.lua
(query-agnostic, RULER):
  kvsieve        `kvsieve serve` started with the arguments the embedded
                 backend uses, and `kvsieve run experiments/leaderboard.lua
                 -D ...` against it (one request per sample carries every
                 method x ratio; one prefill per sample), on a temporary
                 database. The requests pass through a recording proxy in
                 this process: it keeps each request (the exact prompt, the
                 suffix, the variants, max_tokens) and its answer. Wall and
                 CPU time cover the server's start (model load) to the run's
                 end.
  kvpress grid   kvpress as its own evaluation runs it: per sample and press
                 x ratio, a fresh KVPressTextGenerationPipeline._forward
                 (prefill of the context under `with press(model)`, then
                 kvpress's greedy generate_answer on the question).
  kvpress shared the fastest arrangement kvpress allows: per sample ONE
                 prefill without a press, recording each attention layer's
                 forward-hook arguments (hidden states, position embeddings,
                 cache position); per press x ratio the DynamicCache is
                 deep-copied and the press's own forward_hook is called on
                 each layer with those arguments (a press compresses a layer
                 from that layer's inputs only, and the prefill's hidden
                 states do not depend on the press: compression happens after
                 the layer's attention), then generate_answer.
Both kvpress modes get the token ids kvsieve's server made of the recorded
prompt and suffix (its /tokenize), so the chat template of kvpress's
preprocess is not applied; the weights are the same GGUF file, loaded by
kvsieve-hf's Engine (transformers' GGUF reader, dequantised to float32),
attention "sdpa" (kvpress's attention patch wraps it). Greedy decoding
stops at kvsieve's end-of-generation tokens (the GGUF's eos plus the
<|im_end|>-style end-of-turn tokens the vocabulary has) or at the request's
max_tokens. kvpress's answers are scored by kvsieve itself: a second
`kvsieve run` per mode against a replaying proxy that forwards /tokenize to
the server and answers each recorded request with kvpress's texts, so the
RULER metric, the samples and the cells are kvsieve's.

What it is not: no GPU, no query-aware setting (kvpress's pipeline is
query-agnostic), no press kvsieve has no preset for. Method parameters:
kvsieve's snapkv / pyramidkv / adakv are given kvpress's defaults (window 64,
kernel 5, average pooling); the differences that remain are listed in
DIFFERENCES (printed with the table).
"""
import argparse
import copy
import http.client
import http.server
import json
import os
import pickle
import random
import resource
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# kvsieve preset -> the kvpress press (kvsieve.hf.kvpress_rows syntax); None: no press
PRESSES = {
    "full": None,
    "streamingllm": "StreamingLLMPress()",
    "snapkv": "SnapKVPress()",
    "tova": "TOVAPress()",
    "knorm": "KnormPress()",
    "expected_attention": "ExpectedAttentionPress()",
    "pyramidkv": "PyramidKVPress()",
    "adakv": "AdaKVPress(press=SnapKVPress())",
}
# kvsieve parameters set to kvpress's defaults (SnapKVPress: window_size 64, kernel_size 5, avg_pool1d)
KVSIEVE_PARAMS = {m: "window=64,kernel=5,pool='avg'" for m in ("snapkv", "pyramidkv", "adakv")}
DIFFERENCES = [
    "avg pooling: kvpress's avg_pool1d counts the zero padding at the two ends (count_include_pad), kvsieve "
    "divides by the real elements (the kernel//2 edge tokens of snapkv / pyramidkv / adakv)",
    "pyramidkv: kvpress's layer budgets (round(q_len * ratio) per layer, its own schedule) and kvsieve's "
    "'pyramid' allocation are both PyramidKV's linear schedule with beta 20 but round differently",
    "adakv: kvpress keeps every row and masks the evicted ones with a fake key; kvsieve removes them "
    "(ragged heads); the selection rule is the same (alpha 0.2 safeguard)",
    "expected_attention: kvpress averages RoPE over the next n_future_positions=512 positions; see "
    "`kvsieve methods` for kvsieve's statistics",
    "weights and cache: kvsieve runs the GGUF's quantised weights with an f16 KV cache (kvsieve serve's "
    "default), transformers dequantises the weights to float32 and keeps a float32 cache: logits differ in the "
    "last bits, so a near-tie (in a score that picks tokens, or in greedy decoding) can make answers diverge",
]


def log(*a):
    print("[bench_kvpress]", *a, file=sys.stderr, flush=True)


# ---- the proxy between `kvsieve run` and `kvsieve serve` ------------------------------------------
class Proxy:
    """Forwards every request to the upstream server. mode "record": keeps
    each kv_compression request and its answer. mode "replay": answers a
    kv_compression request from `replies` (key -> answer) instead."""

    def __init__(self, upstream_port, mode, replies=None):
        self.up = upstream_port
        self.mode = mode
        self.replies = replies or {}
        self.records = []
        self.lock = threading.Lock()
        proxy = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _do(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                status, ctype, out = proxy.handle(self.command, self.path, body, self.headers)
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = _do

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def forward(self, method, path, body, headers):
        c = http.client.HTTPConnection("127.0.0.1", self.up, timeout=4 * 3600)
        h = {k: v for k, v in headers.items() if k.lower() in ("content-type", "authorization")}
        c.request(method, path, body=body or None, headers=h)
        r = c.getresponse()
        out = r.read()
        c.close()
        return r.status, r.getheader("Content-Type") or "application/json", out

    def handle(self, method, path, body, headers):
        req = None
        if method == "POST" and b"kv_compression" in body:
            req = json.loads(body)
        if req is not None and self.mode == "replay":
            key = prompt_key(req)
            if key not in self.replies:
                return 500, "application/json", json.dumps({"error": {"message": "bench_kvpress: no recorded "
                                                                                  "answer for this prompt"}}).encode()
            return 200, "application/json", json.dumps(self.replies[key]).encode()
        status, ctype, out = self.forward(method, path, body, headers)
        if req is not None and status == 200:
            with self.lock:
                self.records.append((req, json.loads(out)))
        return status, ctype, out

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def prompt_key(req):
    v = req["kv_compression"]["variants"]
    return (req["prompt"], v[0].get("suffix", "") if v else "")


def variant_key(v):
    return (v["method"], round(float(v.get("ratio", 1.0)), 6))


# ---- kvsieve ---------------------------------------------------------------------------------------
def start_server(kvsieve, model, threads, logf):
    """`kvsieve serve` as eval/embedded.c starts it; returns (process, port)."""
    p = subprocess.Popen([kvsieve, "serve", "--model", model, "--host", "127.0.0.1", "--port", "0", "--slots",
                          "1", "--threads", str(threads), "--batch", "128"], stdout=logf, stderr=logf)
    t0 = time.time()
    while time.time() - t0 < 600:
        if p.poll() is not None:
            raise RuntimeError("kvsieve serve exited (%d); log: %s" % (p.returncode, logf.name))
        with open(logf.name) as f:
            for line in f:
                if "listening on http://" in line:
                    port = int(line.split("listening on http://", 1)[1].split()[0].rsplit(":", 1)[1])
                    if get(port, "/health")[0] == 200:
                        return p, port
        time.sleep(0.2)
    p.kill()
    raise RuntimeError("kvsieve serve did not listen within 600 s; log: %s" % logf.name)


def stop_server(p):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def get(port, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        c.request("POST" if body is not None else "GET", path,
                  body=json.dumps(body) if body is not None else None,
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read()
    except OSError:
        return 0, b""
    finally:
        c.close()


def run_args(a, port, db):
    d = ["dataset.n=%d" % a.n, "dataset.tasks={%s}" % ",".join('"%s"' % t for t in a.tasks),
         "dataset.lengths={%d}" % a.length, "methods={%s}" % ",".join('"%s"' % m for m in a.methods),
         "budgets={%s}" % ",".join(repr(r) for r in a.ratios), "setting='query_agnostic'",
         "backend={url='http://127.0.0.1:%d'}" % port, "variants_per_request=128"]
    given = ["%s={%s}" % (m, KVSIEVE_PARAMS[m]) for m in a.methods if m in KVSIEVE_PARAMS]
    if given:
        d.append("params={%s}" % ",".join(given))
    cmd = [a.kvsieve, "run", os.path.join(ROOT, "experiments", "leaderboard.lua"), "--experiment",
           "leaderboard-" + a.model, "--db", db, "--quiet"]
    for x in d:
        cmd += ["-D", x]
    return cmd


def read_db(db):
    """(sample id, method, kept ratio) -> (prediction, ruler score)."""
    con = sqlite3.connect(db)
    cols = [r[1] for r in con.execute("PRAGMA table_info(cells)")]
    sid = "sample_id" if "sample_id" in cols else "sample"
    rows = con.execute("SELECT c.%s, c.method, c.budget_ratio, r.prediction, s.value FROM cells c "
                       "JOIN results r ON r.cell_key = c.key "
                       "LEFT JOIN scores s ON s.cell_key = c.key AND s.metric = 'ruler'" % sid).fetchall()
    con.close()
    out = {}
    for sample, method, ratio, pred, score in rows:
        r = 1.0 if method == "full" or ratio is None or ratio <= 0 else round(float(ratio), 6)
        out[(sample, method, r)] = (pred if pred is not None else "", score)
    return out


def kvsieve_split(db):
    """Wall s by stage, from the server's own timings: prefill (once per
    request), compress (per variant), decode (the variants of a
    request decode in one batch: the longest variant's time)."""
    con = sqlite3.connect(db)
    rows = con.execute("SELECT c.sample_id, r.prefill_ms, r.compress_ms, r.decode_ms FROM cells c "
                       "JOIN results r ON r.cell_key = c.key").fetchall()
    con.close()
    pre, dec = {}, {}
    comp = 0.0
    for sample, p, cm, d in rows:
        pre[sample] = p or 0.0
        dec[sample] = max(dec.get(sample, 0.0), d or 0.0)
        comp += cm or 0.0
    return {"prefill": sum(pre.values()) / 1e3, "compress": comp / 1e3, "decode": sum(dec.values()) / 1e3}


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


# ---- kvpress ---------------------------------------------------------------------------------------
class KvpressSide:
    def __init__(self, model_path, threads, eog):
        import torch
        torch.set_num_threads(threads)
        import kvpress  # noqa: F401  (registers the pipeline, patches the attention functions)
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()
        from kvsieve.hf.engine import Engine
        from kvsieve.hf import kvpress_rows
        self.torch, self.rows = torch, kvpress_rows
        t0 = time.perf_counter()
        eng = Engine(model_path, device="cpu", dtype="auto", threads=threads)
        self.model, self.tok = eng.model, eng.tokenizer
        self.model.set_attn_implementation("sdpa")  # kvpress's own setting; Engine installs kvsieve's
        self.model.generation_config.eos_token_id = sorted(eog)
        from transformers import pipeline
        self.pipe = pipeline("kv-press-text-generation", model=self.model, tokenizer=self.tok)
        lm = self.model.model.language_model if hasattr(self.model.model, "language_model") else self.model.model
        self.lm = lm
        self.attn = [ly.self_attn for ly in lm.layers]
        self.load_s = time.perf_counter() - t0
        self.errors = {}  # (mode, method) -> kvpress's error
        self.split = {"prefill": 0.0, "copy+compress": 0.0, "question+decode": 0.0}  # shared mode, wall s

    def failed(self, mode, v, exc):
        """None for the answer of a variant kvpress raised on; the first
        error per (mode, method) is kept for the report."""
        msg = "%s: %s" % (type(exc).__name__, str(exc).splitlines()[0][:160] if str(exc) else "")
        self.errors.setdefault((mode, v["method"]), msg)
        log("kvpress %s: %s at ratio %s failed: %s" % (mode, v["method"], v.get("ratio", 1), msg))
        return None

    def press(self, v):
        src = PRESSES[v["method"]]
        if src is None:
            return None
        return self.rows.build("kvpress:" + src, {}, float(v["ratio"]), None)

    def _clear_masks(self):
        for m in self.attn:
            if hasattr(m, "masked_key_indices"):
                m.masked_key_indices = None

    def grid(self, ctx, q, variants, cap):
        out = []
        with self.torch.inference_mode():
            for v in variants:
                self._clear_masks()
                try:
                    ans = self.pipe._forward({"context_ids": ctx, "questions_ids": [q]}, max_new_tokens=cap,
                                             press=self.press(v))[0]
                except Exception as exc:  # kvpress's own failure: reported per method, not hidden
                    ans = self.failed("grid", v, exc)
                out.append(ans)
        self._clear_masks()
        return out

    def shared(self, ctx, q, variants, cap):
        from transformers import DynamicCache
        torch = self.torch
        rec = {}

        def hook(module, args, kwargs, output):
            rec[module.layer_idx] = (module, kwargs, output)

        hooks = [m.register_forward_hook(hook, with_kwargs=True) for m in self.attn]
        out = []
        t = self.split
        try:
            with torch.inference_mode():
                t0 = time.perf_counter()
                cache = DynamicCache()
                self.model.model(input_ids=ctx, past_key_values=cache)
                for h in hooks:
                    h.remove()
                hooks = []
                t["prefill"] += time.perf_counter() - t0
                n = ctx.shape[1]
                for v in variants:
                    t0 = time.perf_counter()
                    self._clear_masks()
                    c = copy.deepcopy(cache)
                    p = self.press(v)
                    try:
                        if p is not None:
                            # what `with press(model)` sets up before its hooks run
                            # (presses such as ExpectedAttention read module.rotary_emb)
                            p.post_init_from_model(self.model)
                            for l in sorted(rec):
                                module, kw, o = rec[l]
                                module.rotary_emb = self.lm.rotary_emb
                                p.forward_hook(module, [], dict(kw, past_key_values=c), o)
                        failed = None
                    except Exception as exc:  # the press's own failure, as in grid
                        failed = exc
                    t1 = time.perf_counter()
                    t["copy+compress"] += t1 - t0
                    try:
                        if failed is not None:
                            raise failed
                        ans = self.pipe.generate_answer(question_ids=q, cache=c, context_length=n,
                                                        max_new_tokens=cap)
                    except Exception as exc:  # as in grid
                        ans = self.failed("shared", v, exc)
                    out.append(ans)
                    t["question+decode"] += time.perf_counter() - t1
        finally:
            for h in hooks:
                h.remove()
            self._clear_masks()
        return out


def run_kvpress(side, mode, prompts):
    """{prompt key: [answer per variant]}, wall s, CPU s."""
    fn = side.grid if mode == "grid" else side.shared
    torch = side.torch
    answers = {}
    w0, c0 = time.perf_counter(), time.process_time()
    for i, p in enumerate(prompts):
        ctx = torch.tensor([p["ctx_ids"]])
        q = torch.tensor([p["q_ids"]])
        t = time.perf_counter()
        answers[p["key"]] = fn(ctx, q, p["variants"], p["cap"])
        log("kvpress %s: prompt %d/%d (%d + %d tokens, %d variants) %.1f s" % (
            mode, i + 1, len(prompts), ctx.shape[1], q.shape[1], len(p["variants"]), time.perf_counter() - t))
    return answers, time.perf_counter() - w0, time.process_time() - c0


# ---- statistics ------------------------------------------------------------------------------------
def mean_ci(xs, b=1000, seed=7):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None, None, None
    m = sum(xs) / len(xs)
    rng = random.Random(seed)
    ms = sorted(sum(rng.choice(xs) for _ in xs) / len(xs) for _ in range(b))
    return m, ms[int(0.025 * b)], ms[min(b - 1, int(0.975 * b))]


def pct(x):
    return "-" if x is None else "%.0f%%" % (100 * x)


def fmt_ci(t):
    m, lo, hi = t
    return "-" if m is None else "%.3f [%.2f, %.2f]" % (m, lo, hi)


def main():
    ap = argparse.ArgumentParser(description="kvsieve vs kvpress 0.5.5 on a slice of the leaderboard")
    ap.add_argument("--model", default="qwen2.5-0.5b", help="registry name (experiments/leaderboard.lua)")
    ap.add_argument("--tasks", default="niah_single_1,vt")
    ap.add_argument("--n", type=int, default=2, help="samples per task")
    ap.add_argument("--methods", default=",".join(PRESSES))
    ap.add_argument("--ratios", default="0.75,0.5,0.25,0.125", help="kept shares (kvpress: 1 - compression_ratio)")
    ap.add_argument("--length", type=int, default=4096, help="RULER max sequence length in tokens")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--modes", default="grid,shared", help="kvpress arrangements to run")
    ap.add_argument("--kvsieve", required=True, help="the kvsieve binary")
    ap.add_argument("--workdir", help="keep databases and logs here (default: a temporary folder)")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--report-from", help="print the report of an earlier run from its WORKDIR/state.pickle")
    a = ap.parse_args()
    if a.report_from:
        with open(a.report_from, "rb") as f:
            state = pickle.load(f)
        state[0].out = a.out
        return report(*state)
    a.tasks = [t for t in a.tasks.split(",") if t]
    a.methods = [m for m in a.methods.split(",") if m]
    a.ratios = [float(r) for r in a.ratios.split(",") if r]
    a.modes = [m for m in a.modes.split(",") if m]
    for m in a.methods:
        if m not in PRESSES:
            ap.error("--methods: %s has no kvpress press here (one of %s)" % (m, ", ".join(PRESSES)))
    for m in a.modes:
        if m not in ("grid", "shared"):
            ap.error("--modes: %s is not grid or shared" % m)
    model_path = None
    for cand in (os.path.expanduser("~/.cache/kvsieve/models/%s.path" % a.model),):
        if os.path.isfile(cand):
            model_path = open(cand).read().strip()
    if not model_path or not os.path.isfile(model_path):
        ap.error("--model %s: no GGUF path in ~/.cache/kvsieve/models/%s.path (scripts/install_model.sh %s)"
                 % (a.model, a.model, a.model))
    work = a.workdir or tempfile.mkdtemp(prefix="bench_kvpress.")
    os.makedirs(work, exist_ok=True)
    log("work folder", work, "; model", model_path, "; threads", a.threads)

    # 1. kvsieve, timed, through the recording proxy
    for f in ("kvsieve.db", "kvpress-grid.db", "kvpress-shared.db"):
        for ext in ("", "-wal", "-shm"):
            if os.path.exists(os.path.join(work, f + ext)):
                os.remove(os.path.join(work, f + ext))
    slog = open(os.path.join(work, "serve.log"), "w")
    c0, w0 = children_cpu(), time.perf_counter()
    srv, port = start_server(a.kvsieve, a.model, a.threads, slog)
    proxy = Proxy(port, "record")
    try:
        with open(os.path.join(work, "run-kvsieve.log"), "w") as rl:
            r = subprocess.run(run_args(a, proxy.port, os.path.join(work, "kvsieve.db")), stdout=rl, stderr=rl)
        if r.returncode != 0:
            raise SystemExit("bench_kvpress: kvsieve run failed (%d); logs %s, %s" % (r.returncode, rl.name, slog.name))
    finally:
        proxy.close()
        stop_server(srv)
    ks_wall, ks_cpu = time.perf_counter() - w0, children_cpu() - c0
    log("kvsieve: %.1f s wall, %.1f s CPU, %d requests" % (ks_wall, ks_cpu, len(proxy.records)))
    records = {prompt_key(q): (q, ans) for q, ans in proxy.records}

    # 2. the prompts as kvsieve's server tokenised them (a fresh server, not timed)
    srv, port = start_server(a.kvsieve, a.model, a.threads, slog)
    try:
        info = json.loads(get(port, "/tokenizer_info")[1])
        prompts = []
        for key, (q, ans) in records.items():
            st, b = get(port, "/tokenize", {"content": key[0], "add_special": True})
            st2, b2 = get(port, "/tokenize", {"content": key[1], "add_special": False})
            if st != 200 or st2 != 200:
                raise SystemExit("bench_kvpress: /tokenize failed: %s %s" % (b[:200], b2[:200]))
            prompts.append({"key": key, "ctx_ids": json.loads(b)["tokens"], "q_ids": json.loads(b2)["tokens"],
                            "variants": q["kv_compression"]["variants"], "cap": int(q["max_tokens"])})
        with open(os.path.join(work, "prompts.json"), "w") as f:
            json.dump([dict(p, key=list(p["key"])) for p in prompts], f)

        # 3. kvpress, each mode timed
        side = KvpressSide(model_path, a.threads, set())
        vocab = side.tok.get_vocab()
        eog = {vocab[t] for t in ("<end_of_turn>", "<|eot_id|>", "<|im_end|>", "<|end|>") if t in vocab}
        if info.get("eos_token_id") is not None:
            eog.add(int(info["eos_token_id"]))
        side.model.generation_config.eos_token_id = sorted(eog)
        log("kvpress: model loaded in %.1f s; stop tokens %s" % (side.load_s, sorted(eog)))
        kp = {}
        for mode in a.modes:
            ans, wall, cpu = run_kvpress(side, mode, prompts)
            kp[mode] = {"answers": ans, "wall_s": wall, "cpu_s": cpu}
            log("kvpress %s: %.1f s wall, %.1f s CPU" % (mode, wall, cpu))

        # 4. kvpress's answers scored by kvsieve (replay)
        for mode in a.modes:
            replies = {}
            for key, (q, resp) in records.items():
                r2 = copy.deepcopy(resp)
                for v, out, text in zip(q["kv_compression"]["variants"], r2["variants"], kp[mode]["answers"][key]):
                    out["content"] = text or ""  # a failed variant: left out of the report's figures
                    out["tokens_predicted"] = len(side.tok(text or "", add_special_tokens=False)["input_ids"])
                replies[key] = r2
            rp = Proxy(port, "replay", replies)
            try:
                db = os.path.join(work, "kvpress-%s.db" % mode)
                with open(os.path.join(work, "run-kvpress-%s.log" % mode), "w") as rl:
                    r = subprocess.run(run_args(a, rp.port, db), stdout=rl, stderr=rl)
                if r.returncode != 0:
                    raise SystemExit("bench_kvpress: the replay run of kvpress %s failed (%d); log %s"
                                     % (mode, r.returncode, rl.name))
            finally:
                rp.close()
            kp[mode]["cells"] = read_db(db)
            kp[mode]["failed"] = {variant_key(v) for key, (q, _) in records.items()
                                  for v, t in zip(q["kv_compression"]["variants"], kp[mode]["answers"][key])
                                  if t is None}
            kp[mode]["errors"] = {m: e for (md, m), e in side.errors.items() if md == mode}
    finally:
        stop_server(srv)
        slog.close()
    ks = read_db(os.path.join(work, "kvsieve.db"))
    split = {"kvsieve": kvsieve_split(os.path.join(work, "kvsieve.db"))}
    if "shared" in kp:
        split["kvpress shared"] = side.split
    state = (a, ks, ks_wall, ks_cpu, kp, side.load_s, len(prompts), split)
    with open(os.path.join(work, "state.pickle"), "wb") as f:
        pickle.dump(state, f)  # --report-from prints the report again from it
    report(*state)


def report(a, ks, ks_wall, ks_cpu, kp, load_s, n_prompts, split):
    modes = list(kp)
    rows = []
    for m in a.methods:
        keys = sorted(k for k in ks if k[1] == m)
        row = {"method": m, "n": len(keys), "kvsieve": mean_ci([ks[k][1] for k in keys])}
        for mode in modes:
            cells = kp[mode]["cells"]
            missing = [k for k in keys if k not in cells]
            if missing:
                raise SystemExit("bench_kvpress: kvpress %s has no cell %s" % (mode, missing[0]))
            ok = [k for k in keys if (k[1], k[2]) not in kp[mode]["failed"]]
            row["failed_" + mode] = len(keys) - len(ok)
            row["error_" + mode] = kp[mode]["errors"].get(m)
            row[mode] = mean_ci([cells[k][1] for k in ok])
            row["agree_" + mode] = (sum(ks[k][0].strip() == cells[k][0].strip() for k in ok) / len(ok)
                                    if ok else None)
            row["disagree_" + mode] = [{"sample": k[0], "ratio": k[2], "kvsieve": ks[k][0], "kvpress": cells[k][0],
                                        "score_kvsieve": ks[k][1], "score_kvpress": cells[k][1]}
                                       for k in ok if ks[k][0].strip() != cells[k][0].strip()]
        if len(modes) == 2:
            c0, c1 = kp[modes[0]]["cells"], kp[modes[1]]["cells"]
            ok = [k for k in keys if all((k[1], k[2]) not in kp[md]["failed"] for md in modes)]
            row["agree_%s_%s" % tuple(modes)] = (sum(c0[k][0].strip() == c1[k][0].strip() for k in ok) / len(ok)
                                                 if ok else None)
        rows.append(row)
    fastest = min(modes, key=lambda md: kp[md]["wall_s"])
    speed = kp[fastest]["wall_s"] / ks_wall
    fastest_cpu = min(modes, key=lambda md: kp[md]["cpu_s"])
    speed_cpu = kp[fastest_cpu]["cpu_s"] / ks_cpu
    hdr = "| method | n | kvsieve RULER | " + " | ".join("kvpress %s RULER" % md for md in modes) + " | " + \
          " | ".join("agree %s" % md for md in modes) + (" | agree grid-shared |" if len(modes) == 2 else " |")
    print("\nmodel %s, tasks %s, n %d, length %d, kept ratios %s, query-agnostic, %d threads; %d prompts\n" % (
        a.model, ",".join(a.tasks), a.n, a.length, ",".join(str(r) for r in a.ratios), a.threads, n_prompts))
    print(hdr)
    print("|" + "---|" * (hdr.count("|") - 1))
    for r in rows:
        cells = [r["method"], str(r["n"]), fmt_ci(r["kvsieve"])] + \
                [fmt_ci(r[md]) + (" (%d failed)" % r["failed_" + md] if r["failed_" + md] else "") for md in modes] + \
                [pct(r["agree_" + md]) for md in modes]
        if len(modes) == 2:
            cells.append(pct(r["agree_%s_%s" % tuple(modes)]))
        print("| " + " | ".join(cells) + " |")
    print("\n| side | wall s | CPU s |\n|---|---|---|")
    print("| kvsieve (serve start to run end, model load included) | %.1f | %.1f |" % (ks_wall, ks_cpu))
    for md in modes:
        print("| kvpress %s (model loaded once, %.1f s, not included) | %.1f | %.1f |" % (
            md, load_s, kp[md]["wall_s"], kp[md]["cpu_s"]))
    print("\nspeed-up: kvpress %s (the faster) / kvsieve = %.1fx wall (bar: >= 10x); CPU time: kvpress %s / "
          "kvsieve = %.1fx" % (fastest, speed, fastest_cpu, speed_cpu))
    for r in rows:
        for md in modes:
            if r["error_" + md]:
                print("kvpress %s failed on %s (%d of %d cells; left out of its score and agreement): %s" % (
                    md, r["method"], r["failed_" + md], r["n"], r["error_" + md]))
    for side, d in split.items():
        print("where the time goes, %s (wall s): %s" % (side, ", ".join("%s %.1f" % kv for kv in d.items())))
    print("\ndifferences that remain:\n" + "\n".join("- " + d for d in DIFFERENCES))
    for r in rows:
        for md in modes:
            for d in r["disagree_" + md][:3]:
                print("disagree %s %s %s ratio %g: kvsieve %r (%s) vs kvpress %r (%s)" % (
                    md, r["method"], d["sample"], d["ratio"], d["kvsieve"][:60], d["score_kvsieve"],
                    d["kvpress"][:60], d["score_kvpress"]))
    if a.out:
        res = {"model": a.model, "tasks": a.tasks, "n": a.n, "length": a.length, "ratios": a.ratios,
               "threads": a.threads, "prompts": n_prompts, "kvsieve_wall_s": ks_wall, "kvsieve_cpu_s": ks_cpu,
               "kvpress_load_s": load_s, "kvpress": {md: {"wall_s": kp[md]["wall_s"], "cpu_s": kp[md]["cpu_s"]}
                                                      for md in modes},
               "split_wall_s": split, "faster_kvpress": fastest, "speedup": speed, "speedup_cpu": speed_cpu, "methods": rows, "differences": DIFFERENCES}
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

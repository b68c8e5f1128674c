#!/usr/bin/env python3
"""run_lmeval.py -- lm-evaluation-harness (lm-eval 0.4.13, --model
local-completions, tokenizer_backend=remote) against `kvsieve serve` on the
default model on loopback, on the local tasks of tests/lmeval/tasks/.

What it is: one CTest case per configuration (argv --config):
  full     no server default: kvs_easy_mc, kvs_ppl, kvs_needle_gen and
           kvs_needle_gen_snapkv (kv_compression in the task's
           generation_kwargs, so only its requests compress);
  snapkv   --kv-compression {"method":"snapkv","ratio":0.5}: kvs_easy_mc and
           kvs_needle_gen, every request compressed once (an unchunked
           compression follows the prompt, so the multiple-choice scores equal
           the full run's);
  chunked  --kv-compression {"method":"streamingllm","ratio":0.25,"chunk":16}:
           kvs_ppl and kvs_easy_mc, the prompt compressed after every 16
           tokens, so the perplexity differs from the full run's.
Scores: lm-eval's results JSON under OUT/<config>/, and OUT/<config>/scores.json
({task: {metric: value}}, the server's default, the compressions counted by
/metrics: requests compressed). The compressed configurations compare with OUT/full/scores.json
(CTest runs `full` first: a fixture).
What it is not: a benchmark (no timing is asserted); it needs the lm-eval
virtual environment (scripts/install_lmeval.sh) and fails loudly without it.
"""
import argparse
import glob
import json
import math
import os
import re
import subprocess
import sys
import time
import urllib.request

CONFIGS = {
    "full": (None, ["kvs_easy_mc", "kvs_ppl", "kvs_needle_gen", "kvs_needle_gen_snapkv"]),
    "snapkv": ('{"method":"snapkv","ratio":0.5}', ["kvs_easy_mc", "kvs_needle_gen"]),
    "chunked": ('{"method":"streamingllm","ratio":0.25,"chunk":16}', ["kvs_ppl", "kvs_easy_mc"]),
}
N_DOCS = {"kvs_easy_mc": 5, "kvs_ppl": 3, "kvs_needle_gen": 4, "kvs_needle_gen_snapkv": 4}
N_CHOICES = 3  # every kvs_easy_mc question has three choices

failures = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what, flush=True)
    if not cond:
        failures.append(what)


def start_server(kvsieve, default_kc, log_path):
    cmd = [kvsieve, "serve", "--model", "default", "--port", "0", "--prepend-bos",
           "--threads", str(os.cpu_count() or 1)]
    if default_kc:
        cmd += ["--kv-compression", default_kc]
    log = open(log_path, "w+")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while time.time() < deadline:
        log.seek(0)
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", log.read())
        if m:
            return proc, int(m.group(1))
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    log.seek(0)
    sys.exit("kvsieve serve did not start:\n" + log.read())


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
        return r.read().decode()


def compressions(port):
    m = re.search(r"^kvsieve_compressions_total (\d+)", get(port, "/metrics"), re.M)
    return int(m.group(1)) if m else -1


def run_lmeval(venv, src, port, tasks, out):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               HF_HOME=os.path.join(out, "hf-home"), HF_DATASETS_CACHE=os.path.join(out, "hf-datasets"))
    cmd = [os.path.join(venv, "bin", "lm-eval"), "run", "--model", "local-completions",
           "--tasks", *tasks, "--include_path", os.path.join(src, "tests", "lmeval", "tasks"),
           "--batch_size", "1", "--output_path", out, "--log_samples",
           "--model_args", f"base_url=http://127.0.0.1:{port}/v1/completions,tokenizer_backend=remote,"
                           "tokenized_requests=True,model=kvsieve,max_retries=1,timeout=600"]
    with open(os.path.join(out, "lm-eval.log"), "w") as log:
        rc = subprocess.call(cmd, cwd=src, env=env, stdout=log, stderr=subprocess.STDOUT)
    if rc != 0:
        with open(os.path.join(out, "lm-eval.log")) as f:
            tail = f.read()[-4000:]
        sys.exit(f"lm-eval exited {rc}:\n{tail}")
    found = sorted(glob.glob(os.path.join(out, "**", "results_*.json"), recursive=True), key=os.path.getmtime)
    if not found:
        sys.exit(f"lm-eval wrote no results_*.json under {out}")
    with open(found[-1]) as f:
        res = json.load(f)["results"]
    # {"kvs_easy_mc": {"acc,none": 1.0, "acc_stderr,none": 0, ...}} -> {task: {metric: value}}
    return {t: {k.split(",")[0]: v for k, v in m.items() if "stderr" not in k and k != "alias"} for t, m in res.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvsieve", required=True)
    ap.add_argument("--src", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--config", required=True, choices=sorted(CONFIGS))
    ap.add_argument("--venv", default=os.environ.get("KVS_LMEVAL_VENV",
                                                       os.path.expanduser("~/.cache/kvsieve/lmeval-venv")))
    a = ap.parse_args()
    if not os.access(os.path.join(a.venv, "bin", "lm-eval"), os.X_OK):
        sys.exit(f"no lm-eval in {a.venv}: run scripts/install_lmeval.sh (or set KVS_LMEVAL_VENV)")
    default_kc, tasks = CONFIGS[a.config]
    out = os.path.join(a.out, a.config)
    os.makedirs(out, exist_ok=True)
    for old in glob.glob(os.path.join(out, "**", "results_*.json"), recursive=True):
        os.remove(old)
    proc, port = start_server(a.kvsieve, default_kc, os.path.join(out, "server.log"))
    try:
        health = json.loads(get(port, "/health"))
        check(health.get("kv_compression") == (json.loads(default_kc) if default_kc else None),
              f"/health reports the default kv_compression {health.get('kv_compression')}")
        c0 = compressions(port)
        scores = run_lmeval(a.venv, a.src, port, tasks, out)
        n_comp = compressions(port) - c0
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    with open(os.path.join(out, "scores.json"), "w") as f:
        json.dump({"config": a.config, "kv_compression": default_kc, "compressions": n_comp, "scores": scores}, f,
                  indent=1)
    print(json.dumps(scores, indent=1))

    full = None
    if a.config != "full":
        try:
            with open(os.path.join(a.out, "full", "scores.json")) as f:
                full = json.load(f)["scores"]
        except OSError:
            sys.exit("no full/scores.json: run the lmeval_full test first (a CTest fixture)")
    mc = scores.get("kvs_easy_mc", {})
    ppl = scores.get("kvs_ppl", {})
    if a.config == "full":
        check(mc.get("acc") == 1.0, f"kvs_easy_mc acc {mc.get('acc')} == 1 (trivially easy questions)")
        check(math.isfinite(ppl.get("word_perplexity", math.nan)) and ppl["word_perplexity"] > 1,
              f"kvs_ppl word_perplexity {ppl.get('word_perplexity')} finite and > 1")
        em = scores.get("kvs_needle_gen", {}).get("exact_match", 0)
        check(em >= 0.75, f"kvs_needle_gen exact_match {em} >= 0.75")
        check(n_comp == N_DOCS["kvs_needle_gen_snapkv"],
              f"only kvs_needle_gen_snapkv's requests compressed (generation_kwargs): {n_comp} compressions, "
              f"{N_DOCS['kvs_needle_gen_snapkv']} requests")
        check("exact_match" in scores.get("kvs_needle_gen_snapkv", {}), "kvs_needle_gen_snapkv scored")
    elif a.config == "snapkv":
        n_req = N_DOCS["kvs_easy_mc"] * N_CHOICES + N_DOCS["kvs_needle_gen"]
        check(n_comp == n_req, f"the default compressed every request: {n_comp} compressions, {n_req} requests")
        check(mc.get("acc") == full["kvs_easy_mc"]["acc"],
              "kvs_easy_mc acc equals the full run's (an unchunked compression follows the prompt)")
        check("exact_match" in scores.get("kvs_needle_gen", {}), "kvs_needle_gen scored under compression")
    else:
        n_req = N_DOCS["kvs_easy_mc"] * N_CHOICES + N_DOCS["kvs_ppl"]
        check(n_comp == n_req, f"the default compressed every request: {n_comp} requests compressed, {n_req} sent")
        wp, fp = ppl.get("word_perplexity", math.nan), full["kvs_ppl"]["word_perplexity"]
        check(math.isfinite(wp) and wp > 1, f"kvs_ppl word_perplexity {wp} finite and > 1 under chunked compression")
        check(wp != fp, f"kvs_ppl word_perplexity {wp} differs from the full cache's {fp}")
        check(0 <= mc.get("acc", -1) <= 1, f"kvs_easy_mc acc {mc.get('acc')} under chunked compression")
    if failures:
        sys.exit(f"{len(failures)} check(s) failed")


if __name__ == "__main__":
    main()

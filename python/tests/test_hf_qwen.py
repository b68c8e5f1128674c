"""test_hf_qwen.py -- kvsieve-hf against kvsieve serve on the same real model.

The installed qwen2.5-0.5b GGUF (Qwen2.5-Coder-0.5B-Instruct, Q4_K_M) is
loaded twice: by transformers (its GGUF reader dequantises to fp32) behind
kvsieve-hf, and by kvsieve's own engine behind `kvsieve serve` (Q4_K weights,
fp16 cache). Both get the same prompts with the same variants, greedy.

What it checks: the two tokenizers give the same ids; every variant answers
on both; the greedy answers are compared token by token and the agreement
is printed (issue 12, item 5d: they may differ where quantised arithmetic
flips a near tie, so the bar is loose: the full variant's first token agrees
on most prompts); and it prints prefill, per-variant compress and decode
times of both backends and the adapter's hand-off / gather overhead (the
issue's performance table). Label model: skipped visibly without the GGUF.
"""
import http.client
import json
import os
import socket
import subprocess
import threading
import time
import unittest

try:
    import torch
    import transformers  # noqa: F401
except ImportError as exc:
    raise unittest.SkipTest("kvsieve-hf tests need torch and transformers (scripts/install_hf.sh): %s" % exc)

from tests import hf_tiny

CLI = os.environ.get("KVSIEVE_CLI")
GGUF = hf_tiny.gguf_model_path()
PROMPTS = [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "# Python: read a CSV file and print the sum of the second column\nimport csv\n",
    "The secret code is 7412. Remember it. " + "Filler text about nothing in particular. " * 20 +
    "Question: what is the secret code? Answer: The secret code is",
    "// C: reverse a singly linked list in place\nstruct node { int v; struct node *next; };\n",
]
VARIANTS = [{"name": "full", "method": "full"}] + [
    {"name": m, "method": m, "ratio": 0.5} for m in ("streamingllm", "h2o", "snapkv", "flashcache")]
N_PREDICT = 12


def post(port, path, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    out = json.loads(r.read())
    c.close()
    if r.status != 200:
        raise AssertionError("%s %s -> %d %s" % (port, path, r.status, out))
    return out


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


@unittest.skipUnless(GGUF, "qwen2.5-0.5b GGUF not installed (scripts/install_model.sh qwen2.5-0.5b)")
@unittest.skipUnless(CLI, "KVSIEVE_CLI not set")
class TestAgainstKvsieveServe(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(2)
        from kvsieve.hf.engine import Engine
        from kvsieve.hf.server import Server
        t0 = time.perf_counter()
        cls.eng = Engine(GGUF, alias="qwen2.5-0.5b", threads=2)
        cls.load_s = time.perf_counter() - t0
        cls.hf = Server(cls.eng, port=0)
        threading.Thread(target=cls.hf.serve_forever, daemon=True).start()
        cls.c_port = free_port()
        cls.proc = subprocess.Popen([CLI, "serve", "--model", GGUF, "--port", str(cls.c_port), "--threads", "2",
                                     "--slots", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                c = http.client.HTTPConnection("127.0.0.1", cls.c_port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                time.sleep(0.2)
        else:
            raise RuntimeError("kvsieve serve did not come up")

    @classmethod
    def tearDownClass(cls):
        cls.proc.terminate()
        cls.proc.wait(30)
        cls.hf.httpd.shutdown()
        cls.hf.httpd.server_close()

    def test_same_tokens_and_compared_answers(self):
        for p in PROMPTS:
            a = post(self.hf.port, "/tokenize", {"content": p, "add_special": True})["tokens"]
            b = post(self.c_port, "/tokenize", {"content": p, "add_special": True})["tokens"]
            self.assertEqual(a, b, "tokenizers disagree on %r" % p[:40])
        rows, agree_first, agree_all, total = [], {}, {}, 0
        times = {"hf": {}, "serve": {}}
        for p in PROMPTS:
            body = {"prompt": p, "n_predict": N_PREDICT, "temperature": 0, "kv_compression": {"variants": VARIANTS}}
            rh = post(self.hf.port, "/completion", body)
            rc = post(self.c_port, "/completion", body)
            total += 1
            for vh, vc in zip(rh["variants"], rc["variants"]):
                name = vh["name"]
                th, tc = vh["tokens"], vc["tokens"]
                same = 0
                while same < min(len(th), len(tc)) and th[same] == tc[same]:
                    same += 1
                agree_first[name] = agree_first.get(name, 0) + (same >= 1 or (not th and not tc))
                agree_all[name] = agree_all.get(name, 0) + (th == tc)
                rows.append((name, same, len(th), len(tc)))
                for k, v in (("hf", vh), ("serve", vc)):
                    t = times[k].setdefault(name, {"prefill_ms": 0.0, "compress_ms": 0.0, "decode_ms": 0.0,
                                                   "decode_n": 0, "gather_ms": 0.0, "handoff_ms": 0.0})
                    t["prefill_ms"] += v["timings"]["prompt_ms"]
                    t["compress_ms"] += v["kv"]["compress_ms"]
                    t["decode_ms"] += v["timings"]["predicted_ms"]
                    t["decode_n"] += v["timings"]["predicted_n"]
                    t["gather_ms"] += v["kv"].get("gather_ms", v["kv"].get("copy_ms", 0.0))
                    t["handoff_ms"] += v["kv"].get("handoff_ms", 0.0)
        print("\nkvsieve-hf (transformers %s, fp32 from the GGUF, loaded in %.1f s) vs kvsieve serve (Q4_K_M, "
              "f16 cache), %d prompts, greedy %d tokens" % (transformers.__version__, self.load_s, total, N_PREDICT))
        print("| variant | first token agrees | all %d tokens agree |" % N_PREDICT)
        print("|---|---:|---:|")
        for v in VARIANTS:
            n = v["name"]
            print("| %s | %d/%d | %d/%d |" % (n, agree_first[n], total, agree_all[n], total))
        print("| variant | backend | prefill ms | compress ms | gather ms | hand-off ms | decode tok/s |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for v in VARIANTS:
            for k in ("hf", "serve"):
                t = times[k][v["name"]]
                tps = 1e3 * t["decode_n"] / t["decode_ms"] if t["decode_ms"] > 0 else 0.0
                print("| %s | %s | %.1f | %.3f | %.3f | %.3f | %.1f |" % (
                    v["name"], "kvsieve-hf" if k == "hf" else "kvsieve serve", t["prefill_ms"] / total,
                    t["compress_ms"] / total, t["gather_ms"] / total, t["handoff_ms"] / total, tps))
        m = self.hf.m
        print("adapter: %d bytes copied by libkvsieve over the run (0 = every tensor read in place)" % m["bytes_copied"])
        self.assertEqual(m["bytes_copied"], 0, "transformers' cache tensors should be read in place")
        self.assertGreaterEqual(agree_first["full"], total - 1, "full variants disagree on the first token too often")


if __name__ == "__main__":
    unittest.main()

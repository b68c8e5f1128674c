"""test_kvpress_rows.py -- kvpress presses as kvsieve-hf variants
(`kvpress:<PressClass>(args)`, kvsieve/hf/kvpress_rows.py) on the tiny Qwen2
of test_kvpress.py, through kvsieve-hf's HTTP server.

What it checks:
  rows      one request with kvsieve's snapkv and kvpress's SnapKVPress and
            KnormPress as variants: each kvpress row keeps kvpress's
            compute_n_kept(N, 1 - ratio) rows per layer and decodes exactly
            the tokens of kvpress run by hand (`with press(model):` prefill,
            greedy decode at positions N...), with and without a suffix;
            params are keyword arguments of the press; nested presses parse;
  refusals  400 naming kv_compression.method for an unknown class, a wrong
            keyword, a token budget, compression_ratio in the arguments, a
            decoding press, a per-head masking press (AdaKVPress: ragged);
            400 naming kv_spans with spans.
Run by CTest (tests/kvpress) with the kvpress venv's python.
"""
import http.client
import json
import threading
import unittest

import torch
import transformers
import kvpress
from kvpress.utils import compute_n_kept

from kvsieve.hf.engine import Engine
from kvsieve.hf.server import Server
from tests.test_kvpress import PROMPT, decode, load, model_dir


class KvpressRowsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.engine = Engine(model_dir())
        cls.srv = Server(cls.engine, port=0, queue=2)
        threading.Thread(target=cls.srv.serve_forever, daemon=True).start()
        cls.model = load("sdpa")
        cls.ids = cls.engine.encode(PROMPT).batch["input_ids"]
        cls.N = cls.ids.shape[1]

    @classmethod
    def tearDownClass(cls):
        cls.srv.httpd.shutdown()
        cls.srv.httpd.server_close()

    def post(self, body):
        c = http.client.HTTPConnection("127.0.0.1", self.srv.port, timeout=300)
        c.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, json.loads(r.read())

    def by_hand(self, press, n, suffix=""):
        """kvpress run by hand: prefill under the press, optional suffix chunk, greedy tokens."""
        cache = transformers.DynamicCache(config=self.model.config)
        with torch.inference_mode(), press(self.model):
            out = self.model(input_ids=self.ids, past_key_values=cache, logits_to_keep=1)
        kept = [ly.keys.shape[2] for ly in cache.layers]
        logits, pos = out.logits[0, -1].float(), self.N
        if suffix:
            sfx = self.engine.tokenize(suffix, add_special=False)
            with torch.inference_mode():
                o = self.model(input_ids=torch.tensor([sfx]), past_key_values=cache,
                               position_ids=torch.arange(pos, pos + len(sfx)).view(1, -1), logits_to_keep=1)
            logits, pos = o.logits[0, -1].float(), pos + len(sfx)
        return decode(self.model, cache, logits, pos, n)[0], kept

    def test_rows_beside_ours(self):
        variants = [{"method": "snapkv", "ratio": 0.5, "params": {"window": 8}},
                    {"method": "kvpress:SnapKVPress(window_size=8, kernel_size=5)", "ratio": 0.5},
                    {"method": "kvpress:KnormPress", "ratio": 0.25},
                    {"method": "kvpress:SnapKVPress", "ratio": 0.5, "params": {"window_size": 8},
                     "suffix": " where does the cat sleep?"},
                    {"method": "kvpress:ChunkKVPress(press=SnapKVPress(window_size=8), chunk_length=4)",
                     "ratio": 0.5}]
        st, out = self.post({"prompt": PROMPT, "n_predict": 6, "ignore_eos": True,
                             "kv_compression": {"variants": variants}})
        self.assertEqual(st, 200, out)
        rows = out["variants"]
        self.assertEqual([r["kv"]["method"] for r in rows], [v["method"] for v in variants])
        refs = [(kvpress.SnapKVPress(compression_ratio=0.5, window_size=8, kernel_size=5), 0.5, ""),
                (kvpress.KnormPress(compression_ratio=0.75), 0.25, ""),
                (kvpress.SnapKVPress(compression_ratio=0.5, window_size=8), 0.5, variants[3]["suffix"]),
                (kvpress.ChunkKVPress(press=kvpress.SnapKVPress(compression_ratio=0.5, window_size=8),
                                      chunk_length=4), 0.5, "")]
        for row, (press, ratio, suffix) in zip(rows[1:], refs):
            with self.subTest(method=row["kv"]["method"]):
                toks, kept = self.by_hand(press, 6, suffix)
                self.assertEqual(row["tokens"], toks)
                self.assertEqual([ly["tokens_after"] for ly in row["kv"]["layers"]], kept)
                if "Chunk" not in row["kv"]["method"]:
                    self.assertEqual(kept, [compute_n_kept(self.N, 1 - ratio)] * 3)
                self.assertIn("kvpress", row["kv"]["note"])
        self.assertEqual([ly["tokens_after"] for ly in rows[0]["kv"]["layers"]], [self.N // 2] * 3)

    def test_refusals(self):
        cases = [({"method": "kvpress:NoSuchPress()", "ratio": 0.5}, "not a press"),
                 ({"method": "kvpress:SnapKVPress(window=3)", "ratio": 0.5}, "window"),
                 ({"method": "kvpress:SnapKVPress()", "tokens": 32}, "ratio"),
                 ({"method": "kvpress:SnapKVPress(compression_ratio=0.5)", "ratio": 0.5}, "compression_ratio"),
                 ({"method": "kvpress:DecodingPress(base_press=KnormPress())", "ratio": 0.5}, "DecodingPress"),
                 ({"method": "kvpress:SnapKVPress(", "ratio": 0.5}, "PressClass"),
                 ({"method": "kvpress:AdaKVPress(press=SnapKVPress(window_size=8))", "ratio": 0.5}, "ragged")]
        for kc, word in cases:
            with self.subTest(method=kc["method"]):
                st, out = self.post({"prompt": PROMPT, "n_predict": 2, "kv_compression": kc})
                self.assertEqual(st, 400, out)
                self.assertEqual(out["error"]["field"], "kv_compression.method")
                self.assertIn(word, out["error"]["message"])
        st, out = self.post({"prompt": PROMPT, "n_predict": 2, "kv_spans": [{"start": 0, "end": 9}],
                             "kv_compression": {"method": "kvpress:KnormPress", "ratio": 0.5}})
        self.assertEqual(st, 400, out)
        self.assertEqual(out["error"]["field"], "kv_spans")


if __name__ == "__main__":
    unittest.main()

"""test_hf_scoring.py -- kvsieve-hf's lm-evaluation-harness contract on a tiny
random-weight Qwen2 text model (test_hf_server.model_dir): /tokenizer_info,
vLLM's /tokenize and /detokenize fields, /v1/completions with echo and
logprobs (scoring.py), --api-key and the --kv-compression default.

What it checks: every echoed and generated log-prob equals a float64
recomputation of the logits by a separate copy of the model (transformers'
eager attention, not kvsieve-hf's) within 2e-5; the top entries are the
recomputation's top tokens and hold the chosen token's value bit for bit;
the continuation is the recomputation's greedy one; the four prompt forms give
one indexed choice each, the same numbers as one prompt alone; -inf is clamped
to -9999.0; the continuation under a compression variant is the plain path's
under the same variant; 401 comes before the body is read (no 413, no work).
Run by CTest (tests/hf) like test_hf_server.
"""
import http.client
import json
import threading
import unittest

try:
    import torch
    import transformers
except ImportError as exc:  # visible skip: the suite's hf label needs scripts/install_hf.sh
    raise unittest.SkipTest("kvsieve-hf tests need torch and transformers (scripts/install_hf.sh): %s" % exc)

from tests.test_hf_server import PROMPT, Client, engine, model_dir
from kvsieve.hf import scoring
from kvsieve.hf.server import Server

torch.set_num_threads(2)
_REF = {}


def reference(ids):
    """float64 log-softmax of every position's logits, from a separate fp64 copy of the model."""
    if "m" not in _REF:
        m = transformers.AutoModelForCausalLM.from_pretrained(model_dir("text"), dtype=torch.float64,
                                                              attn_implementation="eager")
        _REF["m"] = m.eval()
    with torch.inference_mode():
        logits = _REF["m"](input_ids=torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits, dim=-1)


def serve(**kw):
    srv = Server(engine("text"), port=0, **kw)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, Client(srv.port)


def stop(srv):
    srv.httpd.shutdown()
    srv.httpd.server_close()


class TestTokenizerEndpoints(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv, cls.c = serve()
        cls.tok = engine("text").tokenizer

    @classmethod
    def tearDownClass(cls):
        stop(cls.srv)

    def test_tokenizer_info_as_lm_eval_reads_it(self):
        s, info, _ = self.c.call("GET", "/tokenizer_info")
        self.assertEqual(s, 200, info)
        self.assertEqual((info["eos_token"], info["eos_token_id"]), ("<|im_end|>", self.tok.eos_token_id))
        self.assertEqual((info["pad_token"], info["pad_token_id"]), ("<|endoftext|>", self.tok.pad_token_id))
        self.assertEqual((info["bos_token"], info["bos_token_id"], info["add_bos_token"]), (None, None, False))
        self.assertEqual(info["vocab_size"], len(self.tok))
        self.assertEqual(info["max_model_len"], engine("text").n_ctx)
        # lm-eval's remote tokenizer finds the eos id by tokenizing its text
        s, r, _ = self.c.post("/tokenize", {"prompt": info["eos_token"], "add_special_tokens": False})
        self.assertEqual(r["tokens"], [info["eos_token_id"]])

    def test_tokenize_both_shapes_and_detokenize_both_names(self):
        text = "the quick brown fox"
        ids = self.tok(text, add_special_tokens=False)["input_ids"]
        s, r, _ = self.c.post("/tokenize", {"prompt": text, "add_special_tokens": False})
        self.assertEqual((s, r), (200, {"tokens": ids, "count": len(ids), "max_model_len": engine("text").n_ctx}))
        s, r, _ = self.c.post("/tokenize", {"content": text})
        self.assertEqual((s, r), (200, {"tokens": ids}))
        s, r, _ = self.c.post("/tokenize", {"content": text, "with_pieces": True})
        self.assertEqual("".join(t["piece"] for t in r["tokens"]), text)
        s, r, _ = self.c.post("/detokenize", {"tokens": ids})
        self.assertEqual((s, r), (200, {"content": text, "prompt": text}))
        for body, field in (({}, "content"), ({"prompt": 3}, "prompt"), ({"content": "a", "add_special": 1},
                            "add_special")):
            s, r, _ = self.c.post("/tokenize", body)
            self.assertEqual((s, r["error"]["field"]), (400, field), r)
        for body, field in (({}, "tokens"), ({"tokens": [1, "x"]}, "tokens[1]"), ({"tokens": [10 ** 6]}, "tokens[0]")):
            s, r, _ = self.c.post("/detokenize", body)
            self.assertEqual((s, r["error"]["field"]), (400, field), r)


class TestScoring(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv, cls.c = serve()
        cls.tok = engine("text").tokenizer
        cls.ids = cls.tok(PROMPT[:120], add_special_tokens=False)["input_ids"]

    @classmethod
    def tearDownClass(cls):
        stop(cls.srv)

    def score(self, prompt, **kw):
        body = {"prompt": prompt, "echo": True, "logprobs": 3, "max_tokens": 4, "temperature": 0, **kw}
        s, r, _ = self.c.post("/v1/completions", body)
        self.assertEqual(s, 200, r)
        return r

    def test_logprobs_equal_a_float64_recomputation(self):
        r = self.score([self.ids])
        self.assertEqual(len(r["choices"]), 1)
        ch = r["choices"][0]
        lo = ch["logprobs"]
        n = len(self.ids)
        self.assertEqual(len(lo["tokens"]), n + 4)
        all_ids = list(self.ids)
        for _ in range(4):  # the recomputation's own greedy continuation
            all_ids.append(int(torch.argmax(reference(all_ids)[-1])))
        ref = reference(all_ids)
        self.assertEqual(lo["tokens"][n:], [self.tok.decode([t]) for t in all_ids[n:]])
        self.assertIsNone(lo["token_logprobs"][0])
        self.assertIsNone(lo["top_logprobs"][0])
        exact = 0
        for i in range(1, n + 4):
            want = ref[i - 1, all_ids[i]].item()
            got = lo["token_logprobs"][i]
            self.assertAlmostEqual(got, want, delta=2e-5, msg="position %d" % i)
            top = lo["top_logprobs"][i]
            piece = lo["tokens"][i]
            self.assertIn(piece, top)
            self.assertGreaterEqual(top[piece], got)  # two tokens with one text keep the larger
            exact += top[piece] == got
            # the top 3 of the recomputation (texts), unless a near-tie makes the order float noise
            v, ix = torch.topk(ref[i - 1], 4)
            if (v[2] - v[3]).item() > 1e-4:
                self.assertEqual(set(top) - {piece}, {self.tok.decode([t]) for t in ix[:3].tolist()} - {piece})
        self.assertGreater(exact, n // 2)
        # text_offset: where each token's text starts in the choice's text
        self.assertEqual(ch["text"], "".join(lo["tokens"]))
        self.assertEqual(lo["text_offset"], [len("".join(lo["tokens"][:i])) for i in range(n + 4)])
        self.assertEqual(ch["finish_reason"], "length")
        self.assertEqual(r["usage"], {"prompt_tokens": n, "completion_tokens": 4, "total_tokens": n + 4})

    def test_greedy_flag_is_exact_as_lm_eval_computes_it(self):
        # lm-eval: is_greedy = token_logprob == max(top_logprobs.values()) at every continuation position
        lo = self.score([self.ids], max_tokens=1, logprobs=1)["choices"][0]["logprobs"]
        ref = reference(self.ids)
        for i in range(1, len(self.ids)):
            best = int(torch.argmax(ref[i - 1]))
            margin = torch.topk(ref[i - 1], 2).values
            if (margin[0] - margin[1]).item() < 1e-4:
                continue
            is_greedy = lo["token_logprobs"][i] == max(lo["top_logprobs"][i].values())
            self.assertEqual(is_greedy, best == self.ids[i], "position %d" % i)
        gen = lo["top_logprobs"][-1]
        self.assertEqual(max(gen.values()), lo["token_logprobs"][-1])  # the generated token is the greedy one

    def test_prompt_forms_one_choice_each(self):
        text = PROMPT[:60]
        ids = self.tok(text)["input_ids"]
        one = self.score(ids, logprobs=2)["choices"][0]
        for prompt, n in ((text, 1), ([text, text[:30]], 2), (ids, 1), ([ids, ids[:9], ids], 3)):
            r = self.score(prompt, logprobs=2)
            self.assertEqual([c["index"] for c in r["choices"]], list(range(n)))
            self.assertEqual(r["choices"][0]["logprobs"]["tokens"], one["logprobs"]["tokens"])
            for a, b in zip(r["choices"][0]["logprobs"]["token_logprobs"][1:], one["logprobs"]["token_logprobs"][1:]):
                self.assertAlmostEqual(a, b, delta=1e-5)
        r = self.score([ids, ids[:9]], echo=False)
        self.assertEqual(len(r["choices"][1]["logprobs"]["tokens"]), 4)  # no echo: the continuation only
        r = self.score([ids, ids[:9]], logprobs=None, echo=False)
        self.assertIsNone(r["choices"][0]["logprobs"])

    def test_minus_infinity_is_clamped(self):
        rows = torch.tensor([[0.0, float("-inf"), 1.0]])
        ch, tops = scoring._record(rows, [1], 3)
        self.assertEqual(ch, [-9999.0])
        self.assertEqual(tops[0][-1], (1, -9999.0))
        json.dumps(ch, allow_nan=False)

    def test_refused_with_the_field(self):
        for extra, field in (({"temperature": 0.5}, "temperature"), ({"stop": ["x"]}, "stop"),
                             ({"logprobs": 21}, "logprobs"), ({"stream": True}, "stream"),
                             ({"max_tokens": 0, "echo": False}, "max_tokens"), ({"n": 2}, "n"),
                             ({"prompt": [self.ids, [10 ** 6]]}, "prompt[1][0]"),
                             ({"kv_compression": {"variants": [{"method": "full"}, {"method": "full"}]}},
                              "kv_compression"),
                             ({"kv_compression": {"method": "snapkv", "ratio": 0.5, "suffix": "x"}},
                              "kv_compression.suffix"),
                             ({"kv_compression": {"method": "snapkv", "ratio": 0.5, "chunk": 1.5}},
                              "kv_compression.chunk")):
            body = {"prompt": [self.ids], "echo": True, "logprobs": 1, "max_tokens": 1, **extra}
            s, r, _ = self.c.post("/v1/completions", body)
            self.assertEqual((s, r["error"]["field"]), (400, field), r)

    def test_continuation_under_compression_is_the_plain_paths(self):
        kc = {"method": "snapkv", "ratio": 0.4, "params": {"window": 4}}
        r = self.score([self.ids], max_tokens=6, kv_compression=kc, logprobs=1)
        ch = r["choices"][0]
        self.assertEqual(ch["kv"]["method"], "snapkv")
        full = self.score([self.ids], max_tokens=6, logprobs=1)["choices"][0]
        n = len(self.ids)
        # the prompt is scored on the full prefill either way
        self.assertEqual(ch["logprobs"]["token_logprobs"][:n], full["logprobs"]["token_logprobs"][:n])
        s, plain, _ = self.c.post("/v1/completions", {"prompt": self.ids, "max_tokens": 6, "ignore_eos": False,
                                                      "kv_compression": kc})
        self.assertEqual(s, 200, plain)
        self.assertEqual(ch["text"][len(self.tok.decode(self.ids)):], plain["choices"][0]["text"])


def masked_reference(ids, visible):
    """float64 log-softmax of every position's logits when position i attends
    to visible[i] (a set of earlier positions and itself) only."""
    reference([0])  # loads the fp64 copy
    N = len(ids)
    see = torch.zeros(N, N, dtype=torch.bool)
    for i, vis in enumerate(visible):
        see[i, sorted(vis)] = True
    mask = torch.zeros(N, N, dtype=torch.float64).masked_fill(~see, -1e300)[None, None]
    with torch.inference_mode():
        return torch.log_softmax(_REF["m"](input_ids=torch.tensor([ids]), attention_mask=mask).logits[0], dim=-1)


def streaming_visible(N, C, B, S):
    """StreamingLLM (S sinks, budget B tokens) chunked by C over N positions:
    (what each position sees, the rows held at the end, the chunks log). After
    each chunk the rows held are the first S and the last B - S when over B."""
    visible, held, chunks = [], [], []
    for a in range(0, N, C):
        b = min(a + C, N)
        for i in range(a, b):
            visible.append(set(held) | set(range(a, i + 1)))
        held = held + list(range(a, b))
        if len(held) > B:
            chunks.append({"seen": b, "rows_before": len(held), "rows_after": B})
            held = held[:S] + held[len(held) - (B - S):]
    return visible, held, chunks


class TestChunked(unittest.TestCase):
    """kv_compression.chunk: StreamingLLM (sinks + recent: which rows it keeps is known without the
    library) chunked over a 70-token prompt against a float64 recomputation with those rows masked."""

    @classmethod
    def setUpClass(cls):
        cls.srv, cls.c = serve()
        cls.tok = engine("text").tokenizer
        cls.ids = cls.tok(PROMPT[:150], add_special_tokens=False)["input_ids"]

    @classmethod
    def tearDownClass(cls):
        stop(cls.srv)

    def test_streamingllm_chunks_equal_a_masked_recomputation(self):
        C, B, S, n_gen = 8, 12, 2, 3
        kc = {"method": "streamingllm", "tokens": B, "params": {"sinks": S}, "chunk": C}
        s, r, _ = self.c.post("/v1/completions", {"prompt": [self.ids], "echo": True, "logprobs": 1,
                                                  "max_tokens": n_gen, "kv_compression": kc})
        self.assertEqual(s, 200, r)
        ch = r["choices"][0]
        N = len(self.ids)
        visible, held, want_chunks = streaming_visible(N, C, B, S)
        self.assertEqual(ch["kv"]["chunks"], want_chunks)
        all_ids = list(self.ids)
        # generated token k (position N + k) sees the rows held after the last chunk and the tokens since
        gen_vis = [set(held) | set(range(N, N + k + 1)) for k in range(n_gen)]
        for g in range(n_gen):  # the masked recomputation's greedy continuation
            all_ids.append(int(torch.argmax(masked_reference(all_ids, visible + gen_vis[:g])[N + g - 1])))
        vis = visible + gen_vis
        ref = masked_reference(all_ids, vis)
        lo = ch["logprobs"]
        self.assertEqual(lo["tokens"][N:], [self.tok.decode([t]) for t in all_ids[N:]])
        for i in range(1, N + n_gen):
            self.assertAlmostEqual(lo["token_logprobs"][i], ref[i - 1, all_ids[i]].item(), delta=2e-5,
                                   msg="position %d" % i)
        # masking made a difference after the first compression, so the check above can fail
        full = reference(all_ids)
        self.assertGreater(max(abs(full[i - 1, all_ids[i]].item() - lo["token_logprobs"][i]) for i in range(17, N)),
                           1e-3)
        # the plain path decodes the same continuation from the same chunked cache
        s, plain, _ = self.c.post("/v1/completions", {"prompt": self.ids, "max_tokens": n_gen, "kv_compression": kc})
        self.assertEqual(s, 200, plain)
        self.assertEqual(plain["choices"][0]["text"], self.tok.decode(all_ids[N:]))
        self.assertEqual((plain["kv"]["chunk"], plain["kv"]["chunks"]), (C, want_chunks))

    def test_one_chunk_is_the_unchunked_request(self):
        kc = {"method": "snapkv", "tokens": 20, "params": {"window": 4}}
        body = {"prompt": [self.ids], "echo": True, "logprobs": 2, "max_tokens": 4}
        one = self.c.post("/v1/completions", dict(body, kv_compression=dict(kc, chunk=len(self.ids))))[1]
        unchunked = self.c.post("/v1/completions", dict(body, kv_compression=kc))[1]
        self.assertEqual(one["choices"][0]["logprobs"], unchunked["choices"][0]["logprobs"])

    def test_refused(self):
        snap = {"method": "snapkv", "ratio": 0.5, "params": {"window": 8}}
        for kc, field in ((dict(snap, chunk=0), "kv_compression.chunk"), (dict(snap, chunk=4), "kv_compression.chunk"),
                          ({"method": "h2o", "ratio": 0.5, "chunk": 16}, "kv_compression.chunk"),
                          ({"variants": [dict(snap, chunk=16), {"method": "full"}]}, "kv_compression.variants[0].chunk")):
            s, r, _ = self.c.post("/v1/completions", {"prompt": self.ids, "max_tokens": 2, "kv_compression": kc})
            self.assertEqual((s, r["error"]["field"]), (400, field), r)


class TestKeyAndDefault(unittest.TestCase):
    def test_api_key(self):
        srv, c = serve(api_key="s3cret", max_body=1 << 10)
        try:
            def call(path, body=None, headers=None, raw=None):
                h = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
                data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
                h.request("POST" if data is not None else "GET", path, body=data, headers=headers or {})
                resp = h.getresponse()
                out = resp.status, json.loads(resp.read())
                h.close()
                return out
            self.assertEqual(call("/health")[0], 200)
            before = srv.m["prefills"]
            s, r = call("/v1/completions", {"prompt": "x", "max_tokens": 2})
            self.assertEqual((s, r["error"]["type"], r["error"]["field"]), (401, "authentication_error",
                                                                             "authorization"))
            self.assertIn("missing", r["error"]["message"])
            s, r = call("/tokenizer_info", headers={"Authorization": "Bearer wrong"})
            self.assertEqual((s, r["error"]["message"]), (401, "invalid API key"))
            # the body is never read: a body over --max-body is 401, not 413
            s, r = call("/v1/completions", raw=b"{" * 4096, headers={"Authorization": "Basic s3cret"})
            self.assertEqual(s, 401)
            self.assertEqual((srv.m["prefills"], srv.m["requests"].get("/v1/completions")), (before, 2))
            for hdr in ({"Authorization": "Bearer s3cret"}, {"Authorization": "bearer s3cret"},
                        {"X-Api-Key": "s3cret"}):
                s, r = call("/tokenize", {"prompt": "a b"}, hdr)
                self.assertEqual(s, 200, (hdr, r))
        finally:
            stop(srv)

    def test_default_kv_compression(self):
        with self.assertRaises(ValueError):
            Server(engine("text"), port=0, kv_compression={"method": "snapkv"})  # no budget
        with self.assertRaises(ValueError):
            Server(engine("text"), port=0, kv_compression='{"method": "nosuch", "ratio": 0.5}')
        srv, c = serve(kv_compression='{"method": "snapkv", "ratio": 0.5}')
        try:
            self.assertEqual(c.call("GET", "/health")[1]["kv_compression"], {"method": "snapkv", "ratio": 0.5})
            s, r, _ = c.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 2})
            self.assertEqual((s, r["kv"]["method"], r["kv"]["budget"]), (200, "snapkv", {"ratio": 0.5}), r)
            self.assertLess(r["kv"]["tokens_after"], r["kv"]["tokens_before"])
            s, r, _ = c.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "kv_compression": {"method": "full"}})
            self.assertEqual((s, r["kv"]["method"]), (200, "full"))
            s, r, _ = c.post("/v1/completions", {"prompt": [PROMPT], "echo": True, "logprobs": 1, "max_tokens": 1})
            self.assertEqual((s, r["choices"][0]["kv"]["method"]), (200, "snapkv"))
        finally:
            stop(srv)


if __name__ == "__main__":
    unittest.main()

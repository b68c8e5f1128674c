"""test_kvpress.py -- kvsieve's methods as kvpress presses (kvsieve/kvpress.py)
with kvpress 0.5.5 on a tiny random-weight Qwen2 built here (nothing is
downloaded).

What it checks:
  budget     compression_ratio (kvpress: share removed) becomes kvsieve's kept
             share: every layer keeps floor(N (1 - cr)) rows, kvpress's own
             compute_n_kept for the same ratios; 0 leaves the cache alone;
  same       the cache KvsievePress leaves (every layer's K and V, bit for bit)
             and the greedy tokens equal kvsieve-hf's for the same method,
             prompt and budget: presets, a merging method, a cross-layer
             allocator, a composition dict (also one spelling out adakv);
  pipeline   kvpress's `kv-press-text-generation` pipeline with the press
             answers what kvsieve-hf answers for the pipeline's own context
             and question tokens;
  ragged     adakv: layers become RaggedLayers holding only the kept rows
             (bytes counted, the prompt's full tensors freed), whose decode
             equals kvpress's own per-head masking of the full cache (logits
             within 1e-5, same tokens); two questions in one pipeline call
             answer as two separate calls (the answer is dropped from the
             ragged cache between them);
  refusals   unknown method / parameter, a ratio outside [0, 1), the press
             inside ComposedPress, a ragged plan under eager attention.
Run by CTest (tests/kvpress) with the kvpress venv's python
(scripts/install_kvpress.sh), PYTHONPATH and KVSIEVE_LIBRARY set.
"""
import gc
import math
import os
import tempfile
import unittest
import weakref

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
import transformers
import kvpress
from kvpress.utils import compute_n_kept

import kvsieve
from kvsieve.hf.engine import Engine
from kvsieve.hf.server import GenSettings, Variant
from kvsieve.kvpress import KvsievePress, RaggedLayer, kept_share
from tests import hf_tiny

transformers.logging.set_verbosity_error()
torch.set_num_threads(2)
PROMPT = "the quick brown fox jumps over the lazy dog while the small cat sleeps in the warm sun. " * 3
_DIR = {}


def model_dir():
    """A tiny Qwen2 (GQA: 4 query heads, 2 KV heads, 3 layers) saved once per process."""
    if "d" not in _DIR:
        d = tempfile.mkdtemp(prefix="kvs-kvpress-")
        tok = hf_tiny.make_tokenizer(d)
        torch.manual_seed(0)
        cfg = transformers.Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                       num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                       max_position_embeddings=4096, eos_token_id=tok.eos_token_id,
                                       pad_token_id=tok.pad_token_id)
        transformers.Qwen2ForCausalLM(cfg).save_pretrained(d)
        _DIR["d"] = d
    return _DIR["d"]


def load(attn="sdpa"):
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir(), attn_implementation=attn).eval()


def prefill(model, ids, press):
    """The press's prefill on a fresh cache: (cache, last logits)."""
    cache = transformers.DynamicCache(config=model.config)
    with torch.inference_mode(), press(model):
        out = model(input_ids=ids, past_key_values=cache, logits_to_keep=1)
    return cache, out.logits[0, -1].float()


def decode(model, cache, logits, start, n):
    """n greedy tokens from a cache, positions from `start`: (tokens, logits of each step)."""
    toks, seen = [], [logits]
    with torch.inference_mode():
        for i in range(n):
            toks.append(int(seen[-1].argmax()))
            o = model(input_ids=torch.tensor([[toks[-1]]]), position_ids=torch.tensor([[start + i]]),
                      past_key_values=cache)
            seen.append(o.logits[0, -1].float())
    return toks, seen


class KvsievePressTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.engine = Engine(model_dir())
        cls.prompt = cls.engine.encode(PROMPT)
        cls.ids = cls.prompt.batch["input_ids"]
        cls.N = cls.prompt.n_tokens
        cls.model = load("sdpa")

    def hf(self, method, params, ratio, n=8, suffix=()):
        """kvsieve-hf's cache and greedy tokens for one variant."""
        e = self.engine
        v = Variant("kv", "", method, params, ratio, None, "")
        pre = e.prefill(self.prompt, e.queries_wanted([v], self.N))
        ctx, _ = e.new_context(pre)
        try:
            plan, cache, _st = e.compress(ctx, pre, v)
            kv = [(cache.layers[l].keys.clone(), cache.layers[l].values.clone()) for l in range(e.n_layers)]
            g = GenSettings()
            g.limit, g.ignore_eos = n, True
            toks = e.generate(pre, cache, list(suffix), g, lambda: False).toks
        finally:
            ctx.close()
        return kv, toks

    def test_budget_conversion(self):
        self.assertEqual(kept_share(0.75), 0.25)
        for cr in (0.1, 0.25, 0.5, 0.75, 0.9):
            press = KvsievePress("knorm", compression_ratio=cr)
            cache, _ = prefill(self.model, self.ids, press)
            want = max(1, math.floor(self.N * (1 - cr) + 1e-9))
            self.assertEqual(want, compute_n_kept(self.N, cr), cr)
            self.assertEqual(press.last["budgets"], [want] * 3, cr)
            self.assertEqual([ly.keys.shape[2] for ly in cache.layers], [want] * 3, cr)
        press = KvsievePress("knorm", compression_ratio=0.0)
        cache, _ = prefill(self.model, self.ids, press)
        self.assertIsNone(press.last)
        self.assertEqual([ly.keys.shape[2] for ly in cache.layers], [self.N] * 3)

    def test_same_as_kvsieve_hf(self):
        cases = [("snapkv", {"window": 8}), ("flashcache", {}), ("streamingllm", {}), ("h2o", {}),
                 ("lookm", {}), ("pyramidkv", {"window": 8}),
                 ({"score": "tova", "allocate": "pyramid", "keep": {"sinks": 4}}, {})]
        for method, params in cases:
            with self.subTest(method=method):
                kv, toks = self.hf(kvsieve.kvpress.method_name(method), params, 0.5)
                press = KvsievePress(method, compression_ratio=0.5, **params)
                cache, logits = prefill(self.model, self.ids, press)
                for l, (k, v) in enumerate(kv):
                    self.assertTrue(torch.equal(cache.layers[l].keys, k), "layer %d keys" % l)
                    self.assertTrue(torch.equal(cache.layers[l].values, v), "layer %d values" % l)
                mine, _ = decode(self.model, cache, logits, self.N, 8)
                self.assertEqual(mine, toks)
                if method == "pyramidkv":  # budgets moved between layers: one plan over all layers
                    self.assertEqual(len(set(press.last["budgets"])), 3)
                    self.assertEqual(sum(press.last["budgets"]), 3 * (self.N // 2))

    def tokenizer(self):
        tok = transformers.AutoTokenizer.from_pretrained(model_dir())
        tok.bos_token = "<|im_start|>"  # kvpress's pipeline prepends bos_token to a context without a chat template
        return tok

    def test_pipeline(self):
        tok = self.tokenizer()
        pipe = transformers.pipeline("kv-press-text-generation", model=self.model, tokenizer=tok, device="cpu")
        question = "where does the cat sleep?"
        inputs = pipe.preprocess(PROMPT, questions=[question], answer_prefix="", max_context_length=4096)
        ctx_ids, q_ids = inputs["context_ids"][0].tolist(), inputs["questions_ids"][0][0].tolist()
        e = self.engine
        for method, params in (("snapkv", {"window": 8}), ("flashcache", {})):
            with self.subTest(method=method):
                press = KvsievePress(method, compression_ratio=0.6, **params)
                answer = pipe(PROMPT, question=question, press=press, max_new_tokens=6)["answer"]
                v = Variant("kv", "", method, params, 0.4, None, "")
                pre = e.prefill(e.encode_ids(ctx_ids), e.queries_wanted([v], len(ctx_ids)))
                ctx, _ = e.new_context(pre)
                try:
                    _p, cache, _st = e.compress(ctx, pre, v)
                    g = GenSettings()
                    g.limit = 6
                    gen = e.generate(pre, cache, q_ids, g, lambda: False)
                finally:
                    ctx.close()
                self.assertEqual(sum(press.last["budgets"]), 3 * int(len(ctx_ids) * 0.4))  # flashcache: DBA moves them
                self.assertEqual(answer, gen.text)

    def test_ragged_adakv(self):
        e = self.engine
        press = KvsievePress("adakv", compression_ratio=0.5)
        cache = transformers.DynamicCache(config=self.model.config)
        refs = {}

        def grab(module, args, kwargs, output):  # runs after the press's hook: layers before the last are whole
            if module.layer_idx < 2:
                refs[module.layer_idx] = weakref.ref(kwargs["past_key_values"].layers[module.layer_idx].keys)

        hooks = []
        try:
            with torch.inference_mode(), press(self.model):
                hooks += [m.self_attn.register_forward_hook(grab, with_kwargs=True) for m in self.model.model.layers]
                out = self.model(input_ids=self.ids, past_key_values=cache, logits_to_keep=1)
        finally:
            for h in hooks:
                h.remove()
        gc.collect()
        self.assertEqual(sorted(refs), [0, 1])
        for l, r in refs.items():
            self.assertIsNone(r(), "layer %d: the prompt's full keys are still alive" % l)
        # the same plan through the binding on kvsieve-hf's prefill: per-head kept rows
        v = Variant("kv", "", "adakv", {}, 0.5, None, "")
        pre = e.prefill(self.prompt, e.queries_wanted([v], self.N))
        B = self.N // 2
        with kvsieve.Context() as ctx:
            ctx.begin(e.n_layers)
            for l, (k, vv, q) in enumerate(pre.layers):
                ctx.set_layer(l, k, vv, q)
            ctx.set_modality(pre.prompt.modality)
            plan = ctx.compress("adakv", {}, ratio=0.5)
            kept = [[plan.head_indices(l, h) for h in range(2)] for l in range(e.n_layers)]
            plan.free()
        for l, ly in enumerate(cache.layers):
            self.assertIsInstance(ly, RaggedLayer)
            counts = [len(x) for x in kept[l]]
            self.assertEqual(ly.counts, counts)
            self.assertNotEqual(counts[0], counts[1], "layer %d is not ragged; the test needs it" % l)
            self.assertEqual(sum(counts), 2 * B)
            k_full = pre.layers[l][0][0]
            want_k = torch.cat([k_full[h, kept[l][h]] for h in range(2)])
            self.assertTrue(torch.equal(ly.k_rows, want_k), "layer %d kept rows" % l)
            row = 2 * 16 * 4  # K and V rows of d = 16 floats
            self.assertEqual(ly.nbytes(), sum(counts) * row + ly.valid.numel() + 8 * sum(counts))
            self.assertLess(ly.nbytes(), 2 * self.N * row // 2 + 1024)
        self.assertEqual(press.last["head_counts"], {l: [len(x) for x in kept[l]] for l in range(3)})
        mine, mine_logits = decode(self.model, cache, out.logits[0, -1].float(), self.N, 6)
        # reference: the full cache, evicted rows masked by kvpress's own mechanism (fake keys)
        ref = transformers.DynamicCache(config=self.model.config)
        with torch.inference_mode():
            o = self.model(input_ids=self.ids, past_key_values=ref, logits_to_keep=1)
        for l, m in enumerate(self.model.model.layers):
            hs, ss = [], []
            for h in range(2):
                gone = sorted(set(range(self.N)) - set(kept[l][h]))
                hs += [h] * len(gone)
                ss += gone
            m.self_attn.masked_key_indices = (torch.zeros(len(hs), dtype=torch.long), torch.tensor(hs),
                                              torch.tensor(ss))
        try:
            theirs, their_logits = decode(self.model, ref, o.logits[0, -1].float(), self.N, 6)
        finally:
            for m in self.model.model.layers:
                m.self_attn.masked_key_indices = None
        self.assertEqual(mine, theirs)
        for a, b in zip(mine_logits, their_logits):
            self.assertLess(float((a - b).abs().max()), 1e-5)

    def test_ragged_pipeline_two_questions(self):
        tok = self.tokenizer()
        pipe = transformers.pipeline("kv-press-text-generation", model=self.model, tokenizer=tok, device="cpu")
        qs = ["where does the cat sleep?", "what does the fox do?"]
        press = KvsievePress("adakv", compression_ratio=0.5)
        both = pipe(PROMPT, questions=qs, press=press, max_new_tokens=5)["answers"]
        self.assertTrue(press.last["head_counts"])
        alone = [pipe(PROMPT, question=q, press=press, max_new_tokens=5)["answer"] for q in qs]
        self.assertEqual(both, alone)

    def test_composition_dict(self):
        """A composition spelling out the adakv preset makes its ragged plan."""
        desc = {"score": "snapkv", "allocate": "adakv", "keep": {"window": 32}}
        a, b = KvsievePress(desc, compression_ratio=0.5), KvsievePress("adakv", compression_ratio=0.5)
        ca, _ = prefill(self.model, self.ids, a)
        cb, _ = prefill(self.model, self.ids, b)
        self.assertTrue(a.last["head_counts"])
        self.assertEqual(a.last["head_counts"], b.last["head_counts"])
        for la, lb in zip(ca.layers, cb.layers):
            self.assertTrue(torch.equal(la.k_rows, lb.k_rows))
        with self.assertRaisesRegex(kvsieve.KvsError, "did you mean 'snapkv'"):
            KvsievePress({"score": "snapkvv"}, compression_ratio=0.5)

    def test_refusals(self):
        with self.assertRaises(kvsieve.KvsError):
            KvsievePress("snapkvv", compression_ratio=0.5)
        with self.assertRaises(kvsieve.KvsError):
            KvsievePress("snapkv", compression_ratio=0.5, windoww=3)
        for cr in (1.0, -0.1):
            with self.assertRaises(ValueError):
                KvsievePress("snapkv", compression_ratio=cr)
        composed = kvpress.ComposedPress([KvsievePress("knorm", compression_ratio=0.5)])
        with self.assertRaisesRegex(RuntimeError, "ComposedPress"):
            prefill(self.model, self.ids, composed)
        with self.assertRaisesRegex(ValueError, "sdpa"):
            prefill(load("eager"), self.ids, KvsievePress("adakv", compression_ratio=0.5))


if __name__ == "__main__":
    unittest.main()

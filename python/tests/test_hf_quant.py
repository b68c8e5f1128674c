"""test_hf_quant.py -- kvsieve-hf's Q8_0 / Q4_0 cache (kvsieve/hf/quant.py) against the engine's rows.

What it checks: on random rows (normal values, outliers, constant and zero
blocks, ties in magnitude, values whose scale is an fp16 subnormal, exact
halves of a step), for q8_0 and q4_0 and head sizes 32 .. 256, the torch
blocks equal the engine's (kvs_cache_from_f32, run through
tests/backend/kvquant_tool.c, KVSIEVE_KVQUANT_TOOL) byte for byte and the
round trip its read (kvs_cache_to_f32) element for element; row_bytes is the
blocks' size; QuantCache stores round-tripped rows in the cache dtype for a
compression's update and for each decoded token's; an Engine with -ctk q8_0
-ctv q4_0 on a tiny Qwen2 (head size 32) stores the prefill's rows
round-tripped, reports the blocks' bytes (the formula's, full and SnapKV at
0.5), its cache type and how it is applied, and decodes; bad arguments are
refused. What it is not: a model test.

Run: cd python && KVSIEVE_KVQUANT_TOOL=../build/tests/backend/kvquant_tool \\
     ~/.cache/kvsieve/hf-venv/bin/python -m unittest tests.test_hf_quant -v
"""
import os
import subprocess
import tempfile
import unittest

import numpy as np
import torch

from kvsieve.hf import quant


def tool():
    path = os.environ.get("KVSIEVE_KVQUANT_TOOL")
    if not path or not os.access(path, os.X_OK):
        raise RuntimeError("KVSIEVE_KVQUANT_TOOL (build/tests/backend/kvquant_tool) is not set or not "
                           "executable: %r" % path)
    return path


def run_c(x, ctype):
    """The engine's (block bytes [rows][...], read-back fp32 [rows][n]) of x [rows][n] fp32."""
    rows, n = x.shape
    with tempfile.TemporaryDirectory() as tmp:
        src, ob, oy = (os.path.join(tmp, f) for f in ("in.f32", "out.blocks", "out.f32"))
        x.numpy().astype(np.float32).tofile(src)
        out = subprocess.run([tool(), ctype, str(rows), str(n), src, ob, oy], capture_output=True, text=True)
        if out.returncode:
            raise AssertionError("kvquant_tool failed: " + out.stderr)
        b = np.fromfile(ob, dtype=np.uint8).reshape(rows, -1)
        y = np.fromfile(oy, dtype=np.float32).reshape(rows, n)
    return torch.from_numpy(b), torch.from_numpy(y)


def rows_for(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((24, n), generator=g)
    x[1] *= 1e3                       # large
    x[2] *= 1e-6                      # scales in fp16's subnormal range
    x[3, :32] = 0.0                   # a zero block
    x[4, :32] = 0.75                  # a constant block
    x[5, 3], x[5, 9] = 2.0, -2.0      # equal magnitudes: the first one sets Q4_0's sign
    x[6, :32] = torch.arange(32) * 0.5 - 8.0  # steps and their halves
    x[7, 5] = 40.0                    # one outlier
    x[8] = torch.round(x[8] * 4) / 4  # exact quarters: ties after scaling
    return x


class QuantTest(unittest.TestCase):
    def test_blocks_and_round_trip_match_the_engine(self):
        for ctype in ("q8_0", "q4_0"):
            for n, seed in ((32, 1), (64, 2), (128, 3), (256, 4)):
                x = rows_for(n, seed)
                cb, cy = run_c(x, ctype)
                pb = quant.blocks(x, ctype)
                py = quant.round_trip(x, ctype)
                self.assertEqual(tuple(pb.shape), tuple(cb.shape), (ctype, n))
                bad = (pb != cb).nonzero()
                self.assertEqual(bad.shape[0], 0, "%s n %d: blocks differ at %s" % (ctype, n, bad[:5].tolist()))
                self.assertTrue(torch.equal(py, cy), "%s n %d: round trip differs, max %g" %
                                (ctype, n, float((py - cy).abs().max())))
                self.assertEqual(cb.shape[1], quant.row_bytes(ctype, n))
                self.assertFalse(torch.equal(py, x), "%s: the round trip changed nothing" % ctype)

    def test_cache_stores_round_tripped_rows(self):
        import transformers
        cfg = transformers.Qwen2Config(hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                                       num_hidden_layers=2, intermediate_size=64, vocab_size=64)
        c = quant.QuantCache("q8_0", "q4_0", config=cfg)
        g = torch.Generator().manual_seed(7)
        k = torch.randn((1, 2, 5, 64), generator=g).to(torch.bfloat16)
        v = torch.randn((1, 2, 5, 64), generator=g).to(torch.bfloat16)
        ko, vo = c.update(k, v, 0)
        self.assertEqual(ko.dtype, torch.bfloat16)
        self.assertTrue(torch.equal(ko, quant.round_trip(k, "q8_0").to(torch.bfloat16)))
        self.assertTrue(torch.equal(vo, quant.round_trip(v, "q4_0").to(torch.bfloat16)))
        k1 = torch.randn((1, 2, 1, 64), generator=g).to(torch.bfloat16)  # a decoded token's row
        ko, vo = c.update(k1, k1, 0)
        self.assertEqual(ko.shape[2], 6)
        self.assertTrue(torch.equal(ko[:, :, 5:], quant.round_trip(k1, "q8_0").to(torch.bfloat16)))
        self.assertTrue(torch.equal(vo[:, :, 5:], quant.round_trip(k1, "q4_0").to(torch.bfloat16)))
        f = quant.QuantCache("f16", "f16", config=cfg)
        ko, _ = f.update(k, v, 0)
        self.assertTrue(torch.equal(ko, k))

    def test_engine_serves_a_quantised_cache(self):
        import shutil
        import types
        import transformers
        from tests import hf_tiny
        from kvsieve.hf.engine import Engine
        from kvsieve.hf.server import GenSettings, Server, Variant
        d = tempfile.mkdtemp(prefix="kvs-hf-quant-")
        try:
            tok = hf_tiny.make_tokenizer(d)
            torch.manual_seed(0)
            cfg = transformers.Qwen2Config(vocab_size=len(tok), hidden_size=128, intermediate_size=128,
                                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                           max_position_embeddings=1024, eos_token_id=tok.eos_token_id,
                                           pad_token_id=tok.pad_token_id)  # head size 32: whole blocks
            transformers.Qwen2ForCausalLM(cfg).save_pretrained(d)
            plain = Engine(d, alias="tiny")
            eng = Engine(d, alias="tiny", cache_type_k="q8_0", cache_type_v="q4_0")
            self.assertEqual(eng.info()["cache_type"], "q8_0/q4_0")
            self.assertIn("round-tripped", eng.info()["cache_quant"])
            prompt = eng.encode("the quick brown fox jumps over the lazy dog " * 4)
            g = GenSettings()
            g.limit, g.ignore_eos = 4, True
            for method, ratio in (("full", 1.0), ("snapkv", 0.5)):
                v = Variant("v", method, method, {}, ratio, None, "")
                for e in (plain, eng):
                    pre = e.prefill(prompt, e.queries_wanted([v], prompt.n_tokens))
                    ctx, _ = e.new_context(pre) if method != "full" else (None, 0.0)
                    plan, cache, st = e.compress(ctx, pre, v)
                    kv = Server.kv_json(types.SimpleNamespace(engine=e), pre, v, st, None, None, 0.0, None)
                    H, N = 2, prompt.n_tokens
                    B = st["budgets"][0]
                    row = H * (32 * 4 * 2 if e is plain else 34 + 18)  # fp32 model: 4 bytes a value
                    self.assertEqual(kv["bytes_after"], 2 * B * row, (method, kv["bytes_after"]))
                    self.assertEqual(kv["bytes_before"], 2 * N * row)
                    self.assertEqual(kv["cache_type"], "f16" if e is plain else "q8_0/q4_0")
                    gen = e.generate_batch(pre, [cache], [], g, lambda: False)[0]
                    self.assertEqual(len(gen.toks), 4)
                    if plan is not None:
                        plan.free()
                    if ctx is not None:
                        ctx.close()
            # the stored rows are the prefill's, round-tripped into the cache types
            pre = eng.prefill(prompt, 0)
            _plan, c1, _st = eng.compress(None, pre, Variant("v", "full", "full", {}, 1.0, None, ""))
            for l, (k, v, _q) in enumerate(pre.layers):
                self.assertTrue(torch.equal(c1.layers[l].keys, quant.round_trip(k, "q8_0").to(k.dtype)))
                self.assertTrue(torch.equal(c1.layers[l].values, quant.round_trip(v, "q4_0").to(v.dtype)))
            with self.assertRaisesRegex(ValueError, "--cache-type-k 'q5_0'"):
                Engine(d, cache_type_k="q5_0")
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_refusals(self):
        with self.assertRaisesRegex(ValueError, "q8_0 or q4_0"):
            quant.round_trip(torch.zeros(32), "q5_0")
        with self.assertRaisesRegex(ValueError, "whole blocks of 32"):
            quant.round_trip(torch.zeros(48), "q8_0")
        with self.assertRaisesRegex(ValueError, "head size 80"):
            quant.row_bytes("q4_0", 80)
        self.assertEqual(quant.row_bytes("q8_0", 64), 68)
        self.assertEqual(quant.row_bytes("q4_0", 64), 36)
        self.assertEqual(quant.row_bytes("f16", 64, 2), 128)


if __name__ == "__main__":
    unittest.main()

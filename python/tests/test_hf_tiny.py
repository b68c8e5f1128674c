"""test_hf_tiny.py -- the fixtures of kvsieve-hf's tests (tests/hf_tiny.py).

What it checks: the trained tokenizer is deterministic and has every special
token at its fixed id; the tiny Qwen2.5-VL and LLaVA-OneVision build, save and
load back offline through the Auto classes with identical weights; their
processors turn one image plus the model's placeholder into the expected
number of image tokens and pixel inputs; a forward pass with use_cache=True
returns a DynamicCache of [1, Hkv, N, d] per layer; greedy generation is
deterministic and not stuck on one token; Qwen2.5-VL's decode positions after
a prefill are t + rope_deltas (the recipe hf_tiny's docstring gives); the real
qwen2.5-0.5b loads from its GGUF (skipped, with the reason, when not
installed). What it is not: a test of kvsieve-hf itself.

Run: cd python && HF_HUB_OFFLINE=1 ~/.cache/kvsieve/hf-venv/bin/python -m unittest tests.test_hf_tiny -v
The GGUF class (GgufTextModel) takes 60-110 s on 2 shared cores (the load
dequantises 0.5B weights); all the others together about 20 s. Each class
can be run alone (python -m unittest tests.test_hf_tiny.TinyQwen25VL), so a
test runner can register the fast classes and GgufTextModel separately.
"""
import io
import os
import shutil
import sys
import tempfile
import unittest

# tqdm bars (the GGUF dequantisation) are noise in a test log.
os.environ.setdefault("TQDM_DISABLE", "1")
from tests import hf_tiny as H  # sets HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE first

import torch
import transformers
from PIL import Image

torch.set_num_threads(2)
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()


def pil(w, h, seed):
    return Image.open(io.BytesIO(H.make_image(None, w, h, seed)))


def max_run(tokens):
    """Length of the longest run of one repeated token."""
    best = cur = 1
    for a, b in zip(tokens, tokens[1:]):
        cur = cur + 1 if a == b else 1
        best = max(best, cur)
    return best


class Tokenizer(unittest.TestCase):
    def test_deterministic_and_special_tokens(self):
        with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2:
            t1 = H.make_tokenizer(d1)
            H.make_tokenizer(d2)
            with open(os.path.join(d1, "tokenizer.json"), "rb") as f1, open(os.path.join(d2, "tokenizer.json"), "rb") as f2:
                self.assertEqual(f1.read(), f2.read(), "two trainings gave different tokenizer.json")
            self.assertEqual(len(t1), H.VOCAB_TARGET)
            for i, s in enumerate(H.SPECIAL_TOKENS):
                self.assertEqual(t1.convert_tokens_to_ids(s), i, s)
                self.assertEqual(t1(f"a{s}b", add_special_tokens=False).input_ids.count(i), 1, s)
            self.assertEqual(t1.eos_token, "<|im_end|>")
            self.assertEqual(t1.pad_token, "<|endoftext|>")
            text = "Describe the image in one sentence. The secret word is orange."
            ids = t1(text, add_special_tokens=False).input_ids
            # Trained merges: far fewer tokens than bytes, and a lossless round trip.
            self.assertLess(len(ids), len(text) // 2)
            self.assertEqual(t1.decode(ids), text)
            # Text outside the corpus still encodes (byte fallback of byte-level BPE).
            odd = "Zürich 🙂 qxv"
            self.assertEqual(t1.decode(t1(odd, add_special_tokens=False).input_ids), odd)
            t3 = transformers.AutoTokenizer.from_pretrained(d1)
            self.assertEqual(t3(text).input_ids, t1(text).input_ids)


class Images(unittest.TestCase):
    def test_png_deterministic(self):
        a = H.make_image(None, 56, 40, seed=3)
        self.assertEqual(a, H.make_image(None, 56, 40, seed=3))
        self.assertNotEqual(a, H.make_image(None, 56, 40, seed=4))
        self.assertEqual(a[:8], b"\x89PNG\r\n\x1a\n")
        img = Image.open(io.BytesIO(a))
        self.assertEqual((img.mode, img.size), ("RGB", (56, 40)))
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "x.png")
            self.assertEqual(H.make_image(path, 56, 40, seed=3), a)
            with open(path, "rb") as f:
                self.assertEqual(f.read(), a)

    def test_image_positions(self):
        class Cfg:
            image_token_id, video_token_id = 5, 6
        self.assertEqual(H.image_positions(Cfg, torch.tensor([[1, 5, 5, 2, 6, 3]])), [0, 1, 1, 0, 1, 0])
        self.assertEqual(H.image_positions(Cfg, [7, 5]), [0, 1])
        with self.assertRaisesRegex(ValueError, "one sequence"):
            H.image_positions(Cfg, torch.zeros(2, 3, dtype=torch.long))


class GgufErrors(unittest.TestCase):
    def test_missing_file_names_it(self):
        with self.assertRaisesRegex(FileNotFoundError, "/nonexistent/q.gguf"):
            H.make_text_qwen_from_gguf("/nonexistent/q.gguf")

    def test_unreadable_file_names_it(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "junk.gguf")
            with open(path, "wb") as f:
                f.write(b"not a gguf file at all")
            with self.assertRaisesRegex(RuntimeError, "junk.gguf"):
                H.make_text_qwen_from_gguf(path)


class _TinyModel:
    """Shared checks; subclasses set build, placeholder, and the expected
    token counts."""
    build = None
    placeholder = None
    family = None

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix=f"hf_tiny_{cls.family}_")
        cls.dir = os.path.join(cls.tmp, "model")
        cls.built, cls.built_processor = cls.build(cls.dir, seed=0)
        cls.model, cls.processor = H.load(cls.dir)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def prompt(self, question="What is in the image?"):
        return f"<|im_start|>user\n{self.placeholder}{question}<|im_end|>\n<|im_start|>assistant\n"

    def inputs(self, w=56, h=56, seed=1, question="What is in the image?"):
        return self.processor(text=[self.prompt(question)], images=[pil(w, h, seed)], return_tensors="pt")

    def test_reload_is_identical(self):
        a, b = self.built.state_dict(), self.model.state_dict()
        self.assertEqual(sorted(a), sorted(b))
        for k in a:
            self.assertTrue(torch.equal(a[k], b[k]), k)
        self.assertEqual(type(self.model).__name__, type(self.built).__name__)
        self.assertEqual(type(self.processor).__name__, type(self.built_processor).__name__)
        self.assertEqual(self.model.dtype, torch.float32)
        tok = self.processor.tokenizer
        self.assertEqual(self.model.config.image_token_id, tok.convert_tokens_to_ids(self.image_token))
        self.assertEqual(self.model.config.video_token_id, tok.convert_tokens_to_ids(self.video_token))
        self.assertEqual(self.model.config.get_text_config().vocab_size, len(tok))
        # Same seed, same weights; another seed, other weights.
        d = os.path.join(self.tmp, "again")
        again, _ = self.build(d, seed=0)
        other, _ = self.build(os.path.join(self.tmp, "other"), seed=1)
        k = "lm_head.weight"
        self.assertTrue(torch.equal(again.state_dict()[k], a[k]))
        self.assertFalse(torch.equal(other.state_dict()[k], a[k]))

    def test_processor_image_tokens(self):
        for (w, h), want in self.image_tokens.items():
            inp = self.inputs(w, h)
            pos = H.image_positions(self.model.config, inp["input_ids"])
            self.assertEqual(sum(pos), want, f"{w}x{h}")
            ids = inp["input_ids"][0].tolist()
            first = pos.index(1)
            # One contiguous span of placeholders where the prompt put the image.
            self.assertEqual(pos[first:first + want], [1] * want)
            self.assertEqual(ids[first], self.model.config.image_token_id)
            self.check_pixels(inp, w, h)
        text_only = self.processor(text=["<|im_start|>user\nHow many shapes?<|im_end|>\n"], return_tensors="pt")
        self.assertEqual(sum(H.image_positions(self.model.config, text_only["input_ids"])), 0)

    def test_chat_template_places_the_image(self):
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in the image?"}]}]
        text = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        self.assertEqual(text, self.prompt())

    def test_forward_cache_shapes(self):
        inp = self.inputs()
        n = inp["input_ids"].shape[1]
        with torch.no_grad():
            out = self.model(**inp, use_cache=True)
            other = self.model(**self.inputs(seed=2), use_cache=True)
        self.assertIsInstance(out.cache, transformers.DynamicCache)
        tc = self.model.config.get_text_config()
        hkv, d = tc.num_key_value_heads, tc.hidden_size // tc.num_attention_heads
        self.assertEqual(len(out.cache.layers), tc.num_hidden_layers)
        for i, layer in enumerate(out.cache.layers):
            self.assertEqual(tuple(layer.keys.shape), (1, hkv, n, d), f"layer {i} keys")
            self.assertEqual(tuple(layer.values.shape), (1, hkv, n, d), f"layer {i} values")
        self.assertEqual(tuple(out.logits.shape), (1, n, tc.vocab_size))
        self.assertTrue(torch.isfinite(out.logits).all())
        # The image reaches the logits: another image, other last-position logits.
        self.assertGreater((out.logits[0, -1] - other.logits[0, -1]).abs().max().item(), 1e-3)

    def test_greedy_generation_deterministic(self):
        runs = []
        for _ in range(2):
            with torch.no_grad():
                inp = self.inputs()
                g = self.model.generate(**inp, max_new_tokens=8, min_new_tokens=8, do_sample=False)
            runs.append(g[0, inp["input_ids"].shape[1]:].tolist())
        self.assertEqual(len(runs[0]), 8)
        self.assertEqual(runs[0], runs[1])
        # Not degenerate: on a few prompts, no token repeats for the whole answer.
        for seed, q in [(1, "What is in the image?"), (2, "How many shapes are there?"),
                        (3, "Describe the image in one sentence.")]:
            with torch.no_grad():
                inp = self.inputs(seed=seed, question=q)
                g = self.model.generate(**inp, max_new_tokens=8, min_new_tokens=8, do_sample=False)
            toks = g[0, inp["input_ids"].shape[1]:].tolist()
            self.assertLess(max_run(toks), 5, f"seed {seed}: {toks}")
            self.assertGreaterEqual(len(set(toks)), 4, f"seed {seed}: {toks}")


class TinyQwen25VL(_TinyModel, unittest.TestCase):
    build = staticmethod(H.make_tiny_qwen25vl)
    placeholder = H.QWEN_IMAGE_PLACEHOLDER
    family = "qwen"
    image_token, video_token = "<|image_pad|>", "<|video_pad|>"
    # Resized to multiples of 28 within QWEN_MIN/MAX_PIXELS; tokens = patches / merge^2.
    image_tokens = {(56, 56): 4, (112, 56): 8, (28, 28): 4, (224, 224): 16}

    def check_pixels(self, inp, w, h):
        t, gh, gw = inp["image_grid_thw"][0].tolist()
        self.assertEqual(t, 1)
        self.assertEqual(tuple(inp["pixel_values"].shape), (t * gh * gw, 3 * 2 * 14 * 14))
        self.assertEqual(gh * gw // 4, self.image_tokens[(w, h)])
        # The processor's own modality ids are the same mask (0 text, 1 image).
        self.assertEqual(inp["mm_token_type_ids"][0].tolist(), H.image_positions(self.model.config, inp["input_ids"]))
        ids = inp["input_ids"][0].tolist()
        first = ids.index(self.model.config.image_token_id)
        self.assertEqual(ids[first - 1], self.model.config.vision_start_token_id)
        self.assertEqual(ids[first + gh * gw // 4], self.model.config.vision_end_token_id)

    def test_mrope_decode_positions(self):
        """The decode recipe of hf_tiny's docstring: after a prefill of N
        tokens, token t sits at position t + rope_deltas on all 3 axes; a
        hand-driven greedy loop with explicit position_ids equals generate()."""
        m = self.model
        inp = self.inputs(112, 56)
        n = inp["input_ids"].shape[1]
        with torch.no_grad():
            m.model.rope_deltas = None  # state left by an earlier call
            out = m(**inp, use_cache=True)
            delta = m.model.rope_deltas
            # 8 image tokens in a 2 x 4 merged grid take max(2, 4) = 4 positions.
            self.assertEqual(delta.tolist(), [[4 - 8]])
            pos, d2 = m.model.get_rope_index(inp["input_ids"], mm_token_type_ids=inp["mm_token_type_ids"],
                                             image_grid_thw=inp["image_grid_thw"])
            self.assertTrue(torch.equal(d2, delta))
            self.assertEqual(pos[:, 0, -1].tolist(), [n - 1 + delta.item()] * 3)
            cache, nxt, manual = out.cache, out.logits[0, -1].argmax(), []
            for t in range(n, n + 8):
                manual.append(int(nxt))
                pid = (torch.tensor([[t]]) + delta).view(1, 1, 1).expand(3, 1, 1)
                o = m(input_ids=nxt.view(1, 1), position_ids=pid, cache=cache, use_cache=True)
                cache, nxt = o.cache, o.logits[0, -1].argmax()
            # Positions without the delta are a different model input.
            wrong = m(input_ids=torch.tensor([[manual[0]]]), position_ids=torch.tensor([[n]]),
                      cache=m(**inp, use_cache=True).cache, use_cache=True).logits[0, -1]
            right = m(input_ids=torch.tensor([[manual[0]]]), position_ids=torch.tensor([[n]]) + delta,
                      cache=m(**inp, use_cache=True).cache, use_cache=True).logits[0, -1]
            self.assertGreater((wrong - right).abs().max().item(), 1e-3)
            m.model.rope_deltas = None
            g = m.generate(**inp, max_new_tokens=8, min_new_tokens=8, do_sample=False)
        self.assertEqual(manual, g[0, n:].tolist())


class TinyLlavaOneVision(_TinyModel, unittest.TestCase):
    build = staticmethod(H.make_tiny_llava)
    placeholder = H.LLAVA_IMAGE_PLACEHOLDER
    family = "llava"
    image_token, video_token = "<image>", "<video>"
    # anyres: 4 base tokens (one 28x28 crop, 2x2 patches) + the best-fit
    # pinpoint grid unpadded to the aspect ratio + one newline per grid row.
    image_tokens = {(56, 56): 24, (56, 28): 4 + 8 + 2, (28, 28): 4 + 4 + 2}

    def check_pixels(self, inp, w, h):
        pv = inp["pixel_values"]
        self.assertEqual(pv.dim(), 5)
        self.assertEqual(tuple(pv.shape[2:]), (3, H.LLAVA_CROP, H.LLAVA_CROP))
        self.assertEqual(inp["image_sizes"][0].tolist(), [h, w])


@unittest.skipIf(H.gguf_model_path() is None,
                 "qwen2.5-0.5b GGUF not installed (~/.cache/kvsieve/models/qwen2.5-0.5b.path; "
                 "scripts/install_model.sh installs it)")
class GgufTextModel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model, cls.tokenizer, cls.info = H.make_text_qwen_from_gguf()
        i = cls.info
        print(f"\n[hf_tiny] {i['path']}: loaded in {i['load_s']:.1f} s (tokenizer {i['tokenizer_s']:.1f} s, "
              f"model {i['model_s']:.1f} s), peak RSS {i['maxrss_mib']:.0f} MiB", file=sys.stderr)

    def test_config_and_tokenizer(self):
        c = self.model.config
        self.assertEqual((c.model_type, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
                          c.hidden_size), ("qwen2", 24, 14, 2, 896))
        self.assertEqual(self.model.dtype, torch.float32)
        self.assertEqual(self.tokenizer.eos_token, "<|im_end|>")
        text = "def add(a, b):\n    return a + b\n"
        ids = self.tokenizer(text, add_special_tokens=False).input_ids
        self.assertEqual(self.tokenizer.decode(ids), text)

    def test_cache_and_greedy_answer(self):
        enc = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": "Write a Python function that adds two numbers."}],
            add_generation_prompt=True, return_tensors="pt", return_dict=True)
        n = enc["input_ids"].shape[1]
        with torch.no_grad():
            out = self.model(**enc, use_cache=True)
            g = self.model.generate(**enc, max_new_tokens=8, do_sample=False)
        for i, layer in enumerate(out.cache.layers):
            self.assertEqual(tuple(layer.keys.shape), (1, 2, n, 64), f"layer {i}")
        answer = self.tokenizer.decode(g[0, n:], skip_special_tokens=True)
        # Real weights: the coder model's greedy answer talks about Python.
        self.assertIn("Python", answer, answer)


if __name__ == "__main__":
    unittest.main()

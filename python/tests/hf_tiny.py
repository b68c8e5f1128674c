"""hf_tiny.py -- test fixtures for kvsieve-hf: tiny random-weight vision-language
models, their tokenizer and processors, built from configs in-process, plus the
real text model qwen2.5-0.5b loaded from kvsieve's installed GGUF.

What it is: a helper module the backend's tests import. Everything is made
here, deterministically and offline (nothing comes from a hub): a byte-level
BPE tokenizer trained on a fixed corpus, a tiny Qwen2.5-VL and a tiny
LLaVA-OneVision (SigLIP tower, Qwen2 text model with GQA), each saved with its
processor so that `AutoProcessor.from_pretrained(dir)` and
`AutoModelForImageTextToText.from_pretrained(dir)` load it back, and small
PNG images. What it is not: a test (test_hf_tiny.py is), nor a model of any
quality: the weights are random, only shapes, token bookkeeping and
determinism are real.

Requirements beyond torch/transformers (transformers 5.24): torchvision,
because Qwen2_5_VLProcessor and LlavaOnevisionProcessor both own a video
processor and transformers' video processors are torchvision-only (without it
`require_torchvision()` raises a message saying so instead of transformers'
unrelated AttributeError about VIDEO_PROCESSOR_MAPPING); accelerate, which
`from_pretrained(..., gguf_file=...)` refuses to run without.

Where the image tokens are (what the modality mask must mark):
    image positions = (input_ids[0] == model.config.image_token_id)
  Qwen2.5-VL also has video positions (input_ids == config.video_token_id);
  its processor returns `mm_token_type_ids` (0 text, 1 image, 2 video), which
  is the same mask. The <|vision_start|>/<|vision_end|> brackets are text
  tokens. LLaVA-OneVision's config names them image_token_index /
  video_token_index (image_token_id / video_token_id are aliases).
  `image_positions()` below does this for both families.

Qwen2.5-VL decode after a prefill (M-RoPE): the prefill forward computes 3-D
positions from mm_token_type_ids and image_grid_thw and stores
model.model.rope_deltas, shape [B, 1] = (max position + 1) - prefill length
(negative when images are present: an image of h x w merged tokens takes only
max(h, w) positions). A decode token at sequence index t (t = N for the first
generated token after an N-token prefill) sits at position t + rope_deltas on
all three axes. Without position_ids the model derives t from
cache.get_seq_length(), i.e. from layer 0's length, which is wrong once the
cache has been compressed; pass position_ids explicitly, shape [3, B, 1] (or
[B, 1], which the text model expands to 3 rows). transformers 5.24 has no
cache_position argument and calls the cache argument `cache` (past_key_values
is a deprecated alias; the output's field is `.cache`). Two silent traps:
the prefill must get the processor's mm_token_type_ids (without them the
model falls back to 1-D positions, no error, other logits); and rope_deltas
is state left on the model by the previous request: a text-only prefill does
not reset it, so a decode that relies on it uses the last image prompt's
delta. Reset model.model.rope_deltas = None before each prefill, or pass
position_ids always. LLaVA-OneVision has plain 1-D positions (t = N, N+1...).
"""
import os
import resource
import time

# Offline before transformers is imported: fixtures never touch a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import torch
import transformers
from PIL import Image
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

# Qwen2.5-VL's own special tokens, then LLaVA-OneVision's placeholders. One
# tokenizer serves both families: every special token either family's
# processor or chat template looks up is in it, at fixed ids 0..8.
SPECIAL_TOKENS = [
    "<|endoftext|>",  # pad (and Qwen's document end)
    "<|im_start|>",
    "<|im_end|>",  # eos of both chat templates
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",  # Qwen2.5-VL image placeholder
    "<|video_pad|>",  # Qwen2.5-VL video placeholder
    "<image>",  # LLaVA-OneVision image placeholder
    "<video>",  # LLaVA-OneVision video placeholder
]
VOCAB_TARGET = 640

# The training corpus: fixed, plain English about pictures, so that prompts
# used in tests split into a few real merges rather than single bytes.
CORPUS = """\
The picture shows a red square on a white table. Next to the square there is a blue circle and a small green
triangle. The light comes from the left window, so the shadows fall to the right. What is in the image? There is
a red square, a blue circle and a green triangle. How many shapes are there? There are three shapes.
A cat sits on the mat near the door. The dog sleeps under the chair. The bird is on the roof of the house.
Describe the image in one sentence. A quiet kitchen with a wooden table, two chairs and a bowl of apples.
Is the sky blue? Yes, the sky is blue and there are a few white clouds. Is the water cold? No, the water is warm.
The first image shows a street at night with yellow lights. The second image shows the same street in the
morning, with people walking to work and a bus waiting at the corner. Compare the two images and answer the
question: which image was taken later in the day? The answer is the second image.
Find the needle in the haystack: the secret word is hidden somewhere in the long text below. Read every line
carefully and tell me the secret word. The secret word is orange. The secret number is forty two.
A user asks the assistant a question about a document and the assistant gives a short answer. The assistant
answers with one word when the question asks for one word. Please answer yes or no. Please count the objects.
The number of red cars in the parking lot is seven. The number of blue cars is four. The total is eleven.
Write a short story about a robot who learns to paint. The robot paints the sea, the mountains and the city.
Each morning the robot mixes new colors: orange, purple, grey and brown. In the evening it looks at its work.
Table one lists the results of the first experiment and table two lists the second. The values are close.
The model reads the text and the images together, keeps the important tokens in its cache and drops the rest.
"""

CHAT_TEMPLATE = {
    # A simple ChatML template; image parts become the family's placeholder
    # (the processor then expands it to the image's token count).
    "qwen": (
        "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
        "{% if message['content'] is string %}{{ message['content'] }}"
        "{% else %}{% for part in message['content'] %}"
        "{% if part['type'] in ['image', 'image_url'] %}<|vision_start|><|image_pad|><|vision_end|>"
        "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
        "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    "llava": (
        "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
        "{% if message['content'] is string %}{{ message['content'] }}"
        "{% else %}{% for part in message['content'] %}"
        "{% if part['type'] in ['image', 'image_url'] %}<image>\n"
        "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
        "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
}

# The placeholder a raw (non-chat) prompt puts where one image goes.
QWEN_IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
LLAVA_IMAGE_PLACEHOLDER = "<image>\n"

# Qwen2.5-VL image processor bounds: images are resized to multiples of 28
# (patch 14 x merge 2) with min_pixels <= h*w <= max_pixels, so a 56x56 image
# is 4x4 patches = 4 image tokens and no image exceeds 16 tokens.
QWEN_MIN_PIXELS = 56 * 56
QWEN_MAX_PIXELS = 112 * 112

# LLaVA-OneVision: SigLIP crops of 28x28 with patch 14 (2x2 = 4 tokens per
# crop), anyres grid up to 2x2 crops.
LLAVA_CROP = 28
LLAVA_PATCH = 14
LLAVA_PINPOINTS = [[28, 28], [28, 56], [56, 28], [56, 56]]

TEXT_INIT_STD = 0.3


def require_torchvision():
    """Raise a RuntimeError naming the missing package when torchvision is
    absent: transformers 5.24 builds Qwen2.5-VL's and LLaVA-OneVision's video
    processors on it, so neither processor can be made or loaded without it."""
    try:
        import torchvision  # noqa: F401
    except ImportError as e:
        raise RuntimeError(
            "hf_tiny: torchvision is not installed in this Python "
            f"({e}); transformers {transformers.__version__} needs it for the video processors owned by "
            "Qwen2_5_VLProcessor and LlavaOnevisionProcessor (install it next to torch, "
            "e.g. torchvision==0.29.2 for torch 2.15)") from e


def make_tokenizer(dir=None):
    """A fast byte-level BPE tokenizer trained in-process on CORPUS (vocab
    VOCAB_TARGET incl. SPECIAL_TOKENS at ids 0..8), wrapped as transformers'
    PreTrainedTokenizerFast with eos <|im_end|> and pad <|endoftext|>.
    Deterministic: the same corpus and trainer settings give the same
    tokenizer.json. Saved with save_pretrained when dir is given. Returns the
    tokenizer."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_TARGET,
        special_tokens=SPECIAL_TOKENS,
        # Every byte is in the vocabulary, so any text (and any byte sequence
        # a random model emits) encodes and decodes.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS], trainer=trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    for i, s in enumerate(SPECIAL_TOKENS):
        if fast.convert_tokens_to_ids(s) != i:
            raise RuntimeError(f"hf_tiny: special token {s} got id {fast.convert_tokens_to_ids(s)}, expected {i}")
    if dir is not None:
        fast.save_pretrained(dir)
    return fast


def _token_ids(tokenizer):
    return {s: tokenizer.convert_tokens_to_ids(s) for s in SPECIAL_TOKENS}


def _seeded_init(model_class, config, seed):
    """Build a model with torch.manual_seed(seed) in force, in fp32, eval mode."""
    torch.manual_seed(seed)
    model = model_class(config)
    return model.to(torch.float32).eval()


def make_tiny_qwen25vl(dir, seed=0):
    """A random-weight Qwen2_5_VLForConditionalGeneration (text: 2 layers,
    hidden 64, 4 query heads, 2 KV heads, head_dim 16, M-RoPE sections
    [2, 3, 3]; vision: depth 2, hidden 32, patch 14, merge 2, out 64) with its
    Qwen2_5_VLProcessor (Qwen2VLImageProcessor with QWEN_MIN/MAX_PIXELS,
    Qwen2VLVideoProcessor, make_tokenizer(), the "qwen" chat template), both
    saved into dir (created if needed). Returns (model, processor)."""
    require_torchvision()
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    os.makedirs(dir, exist_ok=True)
    tokenizer = make_tokenizer()
    ids = _token_ids(tokenizer)
    config = transformers.Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
            # mrope_section splits head_dim/2 = 8 rotary frequencies over
            # (temporal, height, width).
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
            bos_token_id=None, eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
            initializer_range=TEXT_INIT_STD),
        vision_config=dict(
            depth=2, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3, patch_size=14,
            spatial_merge_size=2, temporal_patch_size=2, window_size=56, out_hidden_size=64,
            fullatt_block_indexes=[1]),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False)
    model = _seeded_init(transformers.Qwen2_5_VLForConditionalGeneration, config, seed)
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    image_processor = Qwen2VLImageProcessor(min_pixels=QWEN_MIN_PIXELS, max_pixels=QWEN_MAX_PIXELS)
    video_processor = Qwen2VLVideoProcessor(min_pixels=QWEN_MIN_PIXELS, max_pixels=QWEN_MAX_PIXELS)
    processor = transformers.Qwen2_5_VLProcessor(
        image_processor=image_processor, tokenizer=tokenizer, video_processor=video_processor,
        chat_template=CHAT_TEMPLATE["qwen"])
    model.save_pretrained(dir)
    processor.save_pretrained(dir)
    return model, processor


def make_tiny_llava(dir, seed=0):
    """A random-weight LlavaOnevisionForConditionalGeneration (SigLIP tower:
    2 layers, hidden 32, image 28, patch 14; Qwen2 text model: 2 layers,
    hidden 64, 4 query heads, 2 KV heads, head_dim 16; anyres grid
    LLAVA_PINPOINTS, feature strategy "full") with its LlavaOnevisionProcessor
    (LlavaOnevisionImageProcessor at 28x28 crops, LlavaOnevisionVideoProcessor,
    make_tokenizer(), the "llava" chat template, num_image_tokens 4), both
    saved into dir. A 56x56 image gives 24 <image> tokens (4 base + 4x4 grid +
    4 row newlines). Returns (model, processor)."""
    require_torchvision()
    from transformers.models.llava_onevision.image_processing_llava_onevision import LlavaOnevisionImageProcessor
    from transformers.models.llava_onevision.video_processing_llava_onevision import LlavaOnevisionVideoProcessor

    os.makedirs(dir, exist_ok=True)
    tokenizer = make_tokenizer()
    ids = _token_ids(tokenizer)
    config = transformers.LlavaOnevisionConfig(
        vision_config=dict(
            model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, image_size=LLAVA_CROP, patch_size=LLAVA_PATCH, vision_use_head=False),
        text_config=dict(
            model_type="qwen2", vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            bos_token_id=None, eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
            tie_word_embeddings=False, initializer_range=TEXT_INIT_STD),
        image_token_index=ids["<image>"], video_token_index=ids["<video>"],
        vision_feature_select_strategy="full", vision_feature_layer=-1,
        image_grid_pinpoints=LLAVA_PINPOINTS, vision_aspect_ratio="anyres_max_9",
        tie_word_embeddings=False)
    model = _seeded_init(transformers.LlavaOnevisionForConditionalGeneration, config, seed)
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    image_processor = LlavaOnevisionImageProcessor(
        size={"height": LLAVA_CROP, "width": LLAVA_CROP}, image_grid_pinpoints=LLAVA_PINPOINTS)
    video_processor = LlavaOnevisionVideoProcessor(size={"height": LLAVA_CROP, "width": LLAVA_CROP})
    processor = transformers.LlavaOnevisionProcessor(
        image_processor=image_processor, tokenizer=tokenizer, video_processor=video_processor,
        num_image_tokens=(LLAVA_CROP // LLAVA_PATCH) ** 2, vision_feature_select_strategy="full",
        vision_aspect_ratio="anyres_max_9", chat_template=CHAT_TEMPLATE["llava"])
    model.save_pretrained(dir)
    processor.save_pretrained(dir)
    return model, processor


def load(dir):
    """(model, processor) loaded back from dir through the Auto classes, the
    way kvsieve-hf loads a model id or path; fp32, eval mode."""
    processor = transformers.AutoProcessor.from_pretrained(dir)
    model = transformers.AutoModelForImageTextToText.from_pretrained(dir, dtype=torch.float32).eval()
    return model, processor


def make_image(path, w, h, seed):
    """A deterministic w x h RGB PNG: smooth colour gradients plus seeded
    noise, so different seeds give different pixels (and different vision
    features). Writes it to path unless path is None. Returns the PNG bytes."""
    import io
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255.0 / max(w - 1, 1), y * 255.0 / max(h - 1, 1),
                     np.full((h, w), 255.0 * rng.random())], axis=-1)
    pixels = np.clip(base + rng.normal(0, 40, size=(h, w, 3)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="PNG")
    data = buf.getvalue()
    if path is not None:
        with open(path, "wb") as f:
            f.write(data)
    return data


def image_positions(config, input_ids):
    """The modality of each position of one sequence: a list of 0 (text) / 1
    (image or video placeholder) from input_ids (a [1, N] or [N] tensor or a
    list) and the model's config (Qwen2.5-VL: image_token_id and
    video_token_id; LLaVA-OneVision: image_token_index / video_token_index,
    aliased as image_token_id / video_token_id)."""
    ids = torch.as_tensor(input_ids)
    if ids.dim() == 2:
        if ids.shape[0] != 1:
            raise ValueError(f"image_positions: one sequence expected, got input_ids of shape {tuple(ids.shape)}")
        ids = ids[0]
    marked = torch.zeros_like(ids, dtype=torch.bool)
    for name in ("image_token_id", "video_token_id"):
        tid = getattr(config, name, None)
        if tid is not None:
            marked |= ids == tid
    return marked.to(torch.int32).tolist()


def gguf_model_path():
    """The installed qwen2.5-0.5b GGUF (from ~/.cache/kvsieve/models/
    qwen2.5-0.5b.path, written by scripts/install_model.sh), or None when the
    path file or the GGUF is missing."""
    pointer = os.path.expanduser("~/.cache/kvsieve/models/qwen2.5-0.5b.path")
    if not os.path.isfile(pointer):
        return None
    with open(pointer) as f:
        path = f.read().strip()
    return path if os.path.isfile(path) else None


def make_text_qwen_from_gguf(path=None, dtype=torch.float32):
    """The real text model qwen2.5-0.5b (Qwen2.5-Coder-0.5B-Instruct, Q4_K_M
    GGUF) loaded through transformers' GGUF reader, dequantised to dtype:
    AutoTokenizer/AutoModelForCausalLM.from_pretrained(folder, gguf_file=name),
    offline. path defaults to gguf_model_path(). Returns (model, tokenizer,
    info) where info = {"path", "load_s", "tokenizer_s", "model_s",
    "maxrss_mib"} (wall times of the two loads, peak RSS of this process so
    far). Measured here (2 shared cores): tokenizer 17 s, model 44 s on an
    idle machine (up to 110 s in all under load), peak RSS 4.2 GiB; the
    model is 630M fp32 parameters (the GGUF's output.weight is not tied to
    the embeddings). The loaded model cannot be save_pretrained (transformers
    marks GGUF-loaded models unserialisable), so each process pays the load. Raises FileNotFoundError when the
    GGUF is not installed, RuntimeError naming the file when transformers
    cannot read it."""
    if path is None:
        path = gguf_model_path()
        if path is None:
            raise FileNotFoundError(
                "hf_tiny: qwen2.5-0.5b GGUF not installed (~/.cache/kvsieve/models/qwen2.5-0.5b.path "
                "missing or pointing at no file; scripts/install_model.sh installs it)")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"hf_tiny: GGUF {path} does not exist")
    try:
        import accelerate  # noqa: F401
    except ImportError as e:
        raise RuntimeError(
            f"hf_tiny: transformers {transformers.__version__} loads a GGUF model only with accelerate installed "
            f"({e}); install it next to transformers (accelerate==1.15.0)") from e
    folder, name = os.path.split(os.path.abspath(path))
    t0 = time.perf_counter()
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
        t1 = time.perf_counter()
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype)
    except Exception as e:
        raise RuntimeError(f"hf_tiny: transformers {transformers.__version__} could not load {path}: {e}") from e
    t2 = time.perf_counter()
    info = {"path": path, "load_s": t2 - t0, "tokenizer_s": t1 - t0, "model_s": t2 - t1,
            "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}
    return model.eval(), tokenizer, info


if __name__ == "__main__":
    # python -m tests.hf_tiny qwen25vl|llava DIR [SEED]: write a tiny model folder that
    # `kvsieve-hf serve --model DIR` serves (for trying the backend by hand; random weights).
    import sys
    if len(sys.argv) not in (3, 4) or sys.argv[1] not in ("qwen25vl", "llava"):
        sys.exit("usage: python -m tests.hf_tiny qwen25vl|llava DIR [SEED]")
    seed = int(sys.argv[3]) if len(sys.argv) == 4 else 0
    (make_tiny_qwen25vl if sys.argv[1] == "qwen25vl" else make_tiny_llava)(sys.argv[2], seed=seed)
    print("wrote a tiny random %s to %s" % (sys.argv[1], sys.argv[2]))

"""kvsieve.hf -- kvsieve-hf, the transformers backend of kvsieve.

An HTTP server that speaks `kvsieve serve`'s API (so the runner's
backend{ url = ... } drives it unchanged) over a Hugging Face transformers
model: transformers and torch run the forward passes (vision-language models
included: Qwen2.5-VL, LLaVA-style), kvsieve's own C library (libkvsieve,
through the kvsieve binding) makes every compression plan on the model's own
cache tensors, and the engine gathers each layer's kept rows back.

    kvsieve-hf serve --model Qwen/Qwen2.5-VL-7B-Instruct --device cuda --dtype bfloat16
    kvsieve-hf dump  --model DIR --prompt-file p.txt --image a.png --queries -1 -o cache.safetensors

Modules: attention.py (the mask-free attention that makes per-layer cache
lengths exact), engine.py (model, inputs, prefill, plans, gather, decode),
server.py (HTTP), dump.py (cache dumps), kvpress_rows.py (`kvpress:<Press>(args)`
variants: kvpress presses on the same request), __main__.py (the command line),
kivi.py (KIVI quantisation of a gathered cache: kernels/kivi.c's torch twin).
Needs torch, transformers, pillow and safetensors (scripts/install_hf.sh);
the kvsieve binding itself needs none of them.
"""

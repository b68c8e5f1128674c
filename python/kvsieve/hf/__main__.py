"""__main__.py -- the kvsieve-hf command line: `serve` and `dump`.

    kvsieve-hf serve --model ID_OR_PATH [--device cpu|cuda[:N]] [--dtype auto|float32|float16|bfloat16]
                     [--host 127.0.0.1] [--port 8080] [--alias NAME] [--threads N] [--queue N]
                     [--n-predict-max N] [--drain-timeout S] [--max-body BYTES] [--max-conn N]
                     [--variant-batch N] [--api-key KEY] [--kv-compression JSON]
                     [--cache-type f16|q8_0|q4_0] [-ctk T] [-ctv T]
    kvsieve-hf dump  --model ID_OR_PATH (--prompt TEXT | --prompt-file F) [--image F]... [--queries N]
                     [--dtype-out F32|F16|BF16] -o OUT.safetensors

--api-key (default: the environment variable KVSIEVE_API_KEY) requires
`Authorization: Bearer KEY` on every endpoint but /health. --kv-compression
is the kv_compression of requests that carry none (lm-evaluation-harness
sends no custom fields), e.g. '{"method": "snapkv", "ratio": 0.25}'.

--cache-type (K and V; -ctk / -ctv each): q8_0 and q4_0 store every row
kept after the prefill and every decoded row as the engine's GGUF blocks
would read back (kvsieve/hf/quant.py; each response's kv stats say so in
cache_quant).

A .gguf file as --model is read through transformers' GGUF loader (text
models). Images in a dump prompt go where its `<__media__>` markers are
(one per --image, in order). This file is the only place that exits.
"""
import argparse
import os
import signal
import sys
import threading


def _engine(a):
    from .engine import Engine
    ct = getattr(a, "cache_type", "f16")
    return Engine(a.model, device=a.device, dtype=a.dtype, threads=a.threads, alias=getattr(a, "alias", None),
                  cache_type_k=getattr(a, "cache_type_k", None) or ct, cache_type_v=getattr(a, "cache_type_v", None) or ct)


def cmd_serve(a):
    import json
    from .server import Server
    key = a.api_key if a.api_key is not None else os.environ.get("KVSIEVE_API_KEY") or None
    if a.api_key == "":
        raise ValueError("--api-key must not be empty")
    kc = None
    if a.kv_compression is not None:
        try:
            kc = json.loads(a.kv_compression)
        except ValueError as exc:
            raise ValueError("--kv-compression is not valid JSON: %s" % exc)
    eng = _engine(a)
    srv = Server(eng, host=a.host, port=a.port, queue=a.queue, n_predict_max=a.n_predict_max,
                 drain_timeout=a.drain_timeout, max_body=a.max_body, max_conn=a.max_conn,
                 variant_batch=a.variant_batch, api_key=key, kv_compression=kc)

    def on_term(signum, _frame):
        threading.Thread(target=srv.drain_and_stop, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    print("kvsieve-hf: serving %s (%s, %s layers, %s) on http://%s:%d%s%s" % (
        eng.alias, eng.arch, eng.n_layers, eng.device, a.host, srv.port, " (API key required)" if key else "",
        " (default kv_compression %s)" % json.dumps(kc) if kc is not None else ""), file=sys.stderr, flush=True)
    srv.serve_forever()
    print("kvsieve-hf: stopped", file=sys.stderr, flush=True)
    return 0


def cmd_dump(a):
    from . import dump
    from .engine import IMAGE_MARKER, RequestError
    from PIL import Image
    eng = _engine(a)
    if (a.prompt is None) == (a.prompt_file is None):
        raise SystemExit("kvsieve-hf dump: give exactly one of --prompt or --prompt-file")
    text = a.prompt if a.prompt is not None else open(a.prompt_file, encoding="utf-8").read()
    images = []
    for p in a.image or []:
        try:
            images.append(Image.open(p).convert("RGB"))
        except OSError as exc:
            raise SystemExit("kvsieve-hf dump: --image %s: %s" % (p, exc))
    if images and text.count(IMAGE_MARKER) == 0:
        text = IMAGE_MARKER * len(images) + text  # no markers: the images go first
    try:
        prompt = eng.encode(text, images)
        t, meta = dump.write(a.output, eng, prompt, a.queries, a.dtype_out)
    except RequestError as exc:
        raise SystemExit("kvsieve-hf dump: %s: %s" % (exc.field or "prompt", exc.message))
    print("kvsieve-hf: wrote %s: %s layers, %s tokens (%s image), %d tensors" % (
        a.output, eng.n_layers, meta["n_prompt"], meta["n_image_tokens"], len(t)), file=sys.stderr)
    return 0


def main(argv=None):
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    ap = argparse.ArgumentParser(prog="kvsieve-hf", description="kvsieve's transformers backend")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("serve", "dump"):
        p = sub.add_parser(name)
        p.add_argument("--model", required=True, help="hub id, local folder, or .gguf file")
        p.add_argument("--device", default="cpu")
        p.add_argument("--dtype", default="auto", help="auto | float32 | float16 | bfloat16")
        p.add_argument("--threads", type=int, default=1, help="libkvsieve threads for compress / apply")
        if name == "serve":
            p.add_argument("--host", default="127.0.0.1")
            p.add_argument("--port", type=int, default=8080)
            p.add_argument("--alias", default=None)
            p.add_argument("--cache-type", default="f16", help="KV cache type of K and V: f16 (the model dtype), "
                           "q8_0, q4_0 (GGUF blocks round-tripped in torch: kvsieve/hf/quant.py)")
            p.add_argument("-ctk", "--cache-type-k", default=None, help="K's cache type (default --cache-type)")
            p.add_argument("-ctv", "--cache-type-v", default=None, help="V's cache type (default --cache-type)")
            p.add_argument("--queue", type=int, default=16)
            p.add_argument("--n-predict-max", type=int, default=4096)
            p.add_argument("--drain-timeout", type=float, default=10.0)
            p.add_argument("--max-body", type=int, default=256 << 20)
            p.add_argument("--max-conn", type=int, default=256)
            p.add_argument("--variant-batch", type=int, default=8,
                           help="variants of a request decoded together per forward pass (1: one by one)")
            p.add_argument("--api-key", default=None,
                           help="require `Authorization: Bearer KEY` on all but /health (default: $KVSIEVE_API_KEY)")
            p.add_argument("--kv-compression", default=None,
                           help="kv_compression JSON for requests that carry none")
        else:
            p.add_argument("--prompt")
            p.add_argument("--prompt-file")
            p.add_argument("--image", action="append")
            p.add_argument("--queries", type=int, default=0, help="last N queries per layer; -1 every position")
            p.add_argument("--dtype-out", default="F32", choices=["F32", "F16", "BF16"])
            p.add_argument("-o", "--output", required=True)
    a = ap.parse_args(argv)
    try:
        return cmd_serve(a) if a.cmd == "serve" else cmd_dump(a)
    except ValueError as exc:
        print("kvsieve-hf: %s" % exc, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

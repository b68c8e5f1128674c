"""test_hf_lmeval.py -- lm-evaluation-harness 0.4.13 (`lm_eval --model
local-completions`, tokenizer_backend=remote, token-id requests) against
`kvsieve-hf serve --api-key` on the tiny random-weight Qwen2 text model
(test_hf_server.model_dir), on the local tasks in tests/hf/lmeval: a
multiple-choice task, a generate_until task and a perplexity
(loglikelihood_rolling) task.

Random weights make the scores meaningless, so what is checked is what can
fail: every log-likelihood lm-eval records equals a float64 recomputation by a
separate copy of the model on the tokens lm-eval would have sent (1e-4), its
is_greedy flag equals the recomputation's argmax test, the accuracy it reports
is the one those log-likelihoods give, each generation is the recomputation's
greedy continuation cut at the stop string. Then the generate_until and
perplexity tasks again against a server started with a chunked StreamingLLM
--kv-compression: each text's log-likelihood equals the recomputation with
the evicted rows masked (and differs from the unmasked one), each answer is
the one a request naming that kv_compression gets.
KVSIEVE_LMEVAL names the lm_eval executable (the venv scripts/test.sh makes);
without it the test fails.
"""
import glob
import json
import os
import subprocess
import sys
import tempfile
import unittest

try:
    import torch
except ImportError as exc:  # visible skip: the suite's hf label needs scripts/install_hf.sh
    raise unittest.SkipTest("kvsieve-hf tests need torch and transformers (scripts/install_hf.sh): %s" % exc)

from tests.test_hf_scoring import masked_reference, reference, streaming_visible
from tests.test_hf_server import Client, _free_port, engine, model_dir

LMEVAL = os.environ.get("KVSIEVE_LMEVAL", os.path.expanduser("~/.cache/kvsieve/lmeval-venv/bin/lm_eval"))
TASKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "hf", "lmeval")
KEY = "test-key"
NEAR_TIE = 1e-4  # top-2 log-prob gap below which fp32 and fp64 may pick different tokens


class Served:
    """kvsieve-hf serve on the tiny model, in a subprocess, with the API key."""

    def __init__(self, *extra):
        self.port = _free_port()
        self.p = subprocess.Popen([sys.executable, "-m", "kvsieve.hf", "serve", "--model", model_dir("text"),
                                   "--port", str(self.port), "--api-key", KEY, *extra],
                                  stderr=subprocess.PIPE, text=True)
        for line in self.p.stderr:  # transformers may warn first
            if "serving" in line:
                break
        else:
            raise AssertionError("kvsieve-hf serve did not start (exit %s)" % self.p.wait())

    def stop(self):
        self.p.terminate()
        self.p.wait(60)


def lm_eval(port, tasks, out):
    if not os.access(LMEVAL, os.X_OK):
        raise AssertionError("lm_eval not found at %s (KVSIEVE_LMEVAL; scripts/test.sh installs lm-eval 0.4.13)"
                             % LMEVAL)
    env = dict(os.environ, OPENAI_API_KEY=KEY, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               HF_DATASETS_CACHE=os.path.join(out, "datasets"), TOKENIZERS_PARALLELISM="false")
    args = ("base_url=http://127.0.0.1:%d/v1/completions,tokenizer_backend=remote,tokenized_requests=True,"
            "auth_token=%s,model=tiny" % (port, KEY))
    r = subprocess.run([LMEVAL, "--model", "local-completions", "--tasks", ",".join(tasks), "--include_path", ".",
                        "--batch_size", "1", "--model_args", args, "--output_path", out, "--log_samples"],
                       cwd=TASKS, env=env, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise AssertionError("lm_eval failed (%d):\n%s" % (r.returncode, r.stderr[-4000:]))
    with open(glob.glob(os.path.join(out, "*", "results_*.json"))[0]) as f:
        res = json.load(f)["results"]
    samples = {}
    for t in tasks:
        with open(glob.glob(os.path.join(out, "*", "samples_%s_*.jsonl" % t))[0]) as f:
            samples[t] = [json.loads(line) for line in f]
    return res, samples


def encode(text):
    return engine("text").tokenizer(text, add_special_tokens=False)["input_ids"]


def pair(context, continuation):
    """lm-eval's _encode_pair: trailing spaces move to the continuation; the
    continuation's tokens are the whole's after the context's."""
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    whole, ctx = encode(context + continuation), encode(context)
    return ctx, whole[len(ctx):]


def loglikelihood(ctx, cont):
    """(sum of log p(cont | ctx), is_greedy or None on a near-tie) from the float64 recomputation."""
    ids = ctx + cont
    ref = reference(ids)
    ll, greedy = 0.0, True
    for i in range(len(ctx), len(ids)):
        ll += ref[i - 1, ids[i]].item()
        top = torch.topk(ref[i - 1], 2)
        if (top.values[0] - top.values[1]).item() < NEAR_TIE:
            greedy = None if greedy else greedy
        elif int(top.indices[0]) != ids[i]:
            greedy = False
    return ll, greedy


def greedy_text(ids, n, stop):
    """The recomputation's greedy continuation of n tokens (or to EOS), cut at
    the stop string; None when a step is a near-tie."""
    eng = engine("text")
    out = list(ids)
    for _ in range(n):
        row = reference(out)[-1]
        top = torch.topk(row, 2)
        if (top.values[0] - top.values[1]).item() < NEAR_TIE:
            return None
        t = int(top.indices[0])
        if t in eng.eos_ids:
            break
        out.append(t)
    text = eng.tokenizer.decode(out[len(ids):], skip_special_tokens=True)
    return text.split(stop)[0]


class TestLmEval(unittest.TestCase):
    def test_three_tasks_against_a_recomputation(self):
        srv = Served()
        out = tempfile.mkdtemp(prefix="kvs-lmeval-")
        try:
            res, samples = lm_eval(srv.port, ["kvs_hf_mc", "kvs_hf_gen", "kvs_hf_ppl"], out)
        finally:
            srv.stop()
        # multiple choice: each choice's log-likelihood and greedy flag, then the accuracy
        correct, checked = [], 0
        for s in samples["kvs_hf_mc"]:
            lls = []
            for k in range(len(s["doc"]["choices"])):
                a = s["arguments"]["gen_args_%d" % k]
                got_ll, got_greedy = float(s["resps"][k][0][0]), s["resps"][k][0][1] == "True"
                want_ll, want_greedy = loglikelihood(*pair(a["arg_0"], a["arg_1"]))
                self.assertAlmostEqual(got_ll, want_ll, delta=1e-4, msg="doc %d choice %d" % (s["doc_id"], k))
                if want_greedy is not None:
                    self.assertEqual(got_greedy, want_greedy, "doc %d choice %d" % (s["doc_id"], k))
                lls.append(want_ll)
                checked += 1
            correct.append(float(max(range(len(lls)), key=lls.__getitem__) == s["doc"]["answer"]))
        self.assertEqual(checked, 24)
        self.assertAlmostEqual(res["kvs_hf_mc"]["acc,none"], sum(correct) / len(correct), places=9)
        # perplexity: each text scored whole after lm-eval's prefix token (EOS: the tokenizer has no BOS)
        eos = engine("text").tokenizer.eos_token_id
        for s in samples["kvs_hf_ppl"]:
            want, _g = loglikelihood([eos], encode(s["doc"]["text"]))
            self.assertAlmostEqual(float(s["resps"][0][0]), want, delta=1e-4)
        # generate_until: the greedy continuation, cut at "\n"
        compared = 0
        for s in samples["kvs_hf_gen"]:
            want = greedy_text(encode(s["arguments"]["gen_args_0"]["arg_0"]), 8, "\n")
            if want is not None:
                self.assertEqual(s["resps"][0][0], want, "doc %d" % s["doc_id"])
                compared += 1
        self.assertGreaterEqual(compared, 3)

    def test_server_default_chunked_compression(self):
        # StreamingLLM chunked: which rows it keeps is known without the library (test_hf_scoring)
        C, B, S = 8, 12, 2
        kc = {"method": "streamingllm", "tokens": B, "params": {"sinks": S}, "chunk": C}
        srv = Served("--kv-compression", json.dumps(kc))
        out = tempfile.mkdtemp(prefix="kvs-lmeval-")
        try:
            c = Client(srv.port)
            c.headers = {"Authorization": "Bearer " + KEY}
            _res, samples = lm_eval(srv.port, ["kvs_hf_gen", "kvs_hf_ppl"], out)
            self.assertGreater(c.metric("kvsieve_compressions_total"), 0)
            # perplexity under chunked compression: each text's log-likelihood over the rows held
            eos, differs = engine("text").tokenizer.eos_token_id, 0
            for s in samples["kvs_hf_ppl"]:
                ids = [eos] + encode(s["doc"]["text"])
                ref = masked_reference(ids, streaming_visible(len(ids), C, B, S)[0])
                want = sum(ref[i - 1, ids[i]].item() for i in range(1, len(ids)))
                self.assertAlmostEqual(float(s["resps"][0][0]), want, delta=1e-4)
                differs += abs(want - loglikelihood([eos], ids[1:])[0]) > 1e-3
            self.assertGreater(differs, 0)  # the compression changed what was scored
            # generations: what a request naming that kv_compression gets
            for s in samples["kvs_hf_gen"]:
                ids = encode(s["arguments"]["gen_args_0"]["arg_0"])
                st, r, _ = c.post("/v1/completions", {"prompt": ids, "max_tokens": 8, "stop": ["\n"],
                                                      "kv_compression": kc})
                self.assertEqual(st, 200, r)
                self.assertEqual(r["kv"]["chunk"], C)
                self.assertEqual(s["resps"][0][0], r["choices"][0]["text"], "doc %d" % s["doc_id"])
        finally:
            srv.stop()

if __name__ == "__main__":
    unittest.main()

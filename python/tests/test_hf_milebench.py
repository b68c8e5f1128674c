"""test_hf_milebench.py -- a MileBench task end to end: `kvsieve run` (the C
runner) against kvsieve-hf serving the tiny random Qwen2.5-VL, on a task file
with images made here.

What it checks: the runner's MileBench loader reads the images, the client
sends them as multimodal_data with one marker per image, kvsieve-hf turns
them into image tokens, every method at the budget answers, the rows land in
the store and `kvsieve report` prints the table. The answers of a
random-weight model are noise; only the plumbing is checked.
"""
import json
import os
import sqlite3
import subprocess
import tempfile
import threading
import unittest

try:
    import torch
    import transformers  # noqa: F401
    import torchvision  # noqa: F401
except ImportError as exc:
    raise unittest.SkipTest("kvsieve-hf tests need torch, torchvision and transformers "
                            "(scripts/install_hf.sh): %s" % exc)

from tests import hf_tiny
from tests.test_hf_server import engine

CLI = os.environ.get("KVSIEVE_CLI")
METHODS = ["full", "random", "streamingllm", "h2o", "snapkv", "lookm", "meda", "flashcache"]


@unittest.skipUnless(CLI, "KVSIEVE_CLI not set")
class TestMileBenchEndToEnd(unittest.TestCase):
    def test_run_against_kvsieve_hf(self):
        from kvsieve.hf.server import Server
        tmp = tempfile.mkdtemp(prefix="kvs-hf-milebench-")
        task = os.path.join(tmp, "TinyTask")
        os.makedirs(os.path.join(task, "images"))
        data = []
        for i in range(3):
            a, b = "s%d_a.png" % i, "s%d_b.png" % i
            hf_tiny.make_image(os.path.join(task, "images", a), 56, 56, 10 * i + 1)
            hf_tiny.make_image(os.path.join(task, "images", b), 84, 56, 10 * i + 2)
            data.append({"sample_id": "s%d" % i, "task_instruction_id": 0,
                         "task_instance": {"context": "First {image#1}, then {image#2}. Which one is wider?",
                                           "images_path": [a, b], "choice_list": ["the first", "the second"]},
                         "response": "the second"})
        path = os.path.join(task, "TinyTask.json")
        with open(path, "w") as f:
            json.dump({"meta_data": {"task": "TinyTask", "question_type": "multi-choice",
                                     "task_instruction": ["Answer with one of the choices."]}, "data": data}, f)
        srv = Server(engine("qwen25vl"), port=0)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        try:
            cfg = os.path.join(tmp, "mb.lua")
            with open(cfg, "w") as f:
                f.write("""experiment {
  name = "mb-tiny", kind = "task",
  backend = { url = "http://127.0.0.1:%d" },
  dataset = milebench { path = %s },
  methods = { %s },
  budgets = { 0.5 },
  metrics = { "choice" },
  n_predict = 4,
}
""" % (srv.port, json.dumps(path), ", ".join(json.dumps(m) for m in METHODS)))
            db = os.path.join(tmp, "mb.db")
            r = subprocess.run([CLI, "run", cfg, "--db", db], capture_output=True, text=True, timeout=600)
            self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
            self.assertIn("flashcache", r.stdout)
            self.assertEqual(srv.m["prefills"], 3, "one prefill per sample")
            self.assertEqual(srv.m["images"], 6, "two images per sample reached the server")
            con = sqlite3.connect(db)
            n = con.execute("select count(*) from results").fetchone()[0]
            con.close()
            self.assertGreaterEqual(n, 3 * len(METHODS))
            rep = subprocess.run([CLI, "report", "--db", db, "--experiment", "mb-tiny"], capture_output=True,
                                 text=True, timeout=120)
            self.assertEqual(rep.returncode, 0, rep.stderr)
            for m in METHODS:
                self.assertIn(m, rep.stdout)
        finally:
            srv.httpd.shutdown()
            srv.httpd.server_close()


if __name__ == "__main__":
    unittest.main()

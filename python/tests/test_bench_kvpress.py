"""test_bench_kvpress.py -- scripts/bench_kvpress.sh on its smallest slice:
smollm2-135m, one RULER task (niah_single_1) x one sample at 1,024 tokens,
methods full and snapkv at kept ratio 0.25, both kvpress arrangements.

What it checks: the script exits 0; its table has the header and one
well-formed row per method (three RULER cells "mean [lo, hi]" with values in
[0, 1], three agreement percentages in [0, 100]); the JSON (--out) has per
method n = 1, agreements in [0, 1] that match the table's rounded
percentages, and kvpress's two arrangements agree on `full` (both run the
same prefill and the same greedy decode without a press, so a difference is
a bug of the shared arrangement); the times and the speed-up are numbers.
What it does not: no assertion on times (the machine may be loaded) or on
kvsieve's agreement with kvpress (quantised vs dequantised weights).
Needs the installed model smollm2-135m and the RULER data. Run by CTest
(tests/kvpress, label kvpress) with the kvpress venv's python.
"""
import json
import os
import re
import subprocess
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
METHODS = ["full", "snapkv"]
CI = re.compile(r"^(\d+\.\d{3}) \[(\d+\.\d{2}), (\d+\.\d{2})\]$")
PCT = re.compile(r"^(\d{1,3})%$")


class BenchKvpressTest(unittest.TestCase):
    def test_smallest_slice(self):
        with tempfile.TemporaryDirectory(prefix="bench_kvpress_test.") as work:
            out = os.path.join(work, "out.json")
            r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "bench_kvpress.sh"), "--model", "smollm2-135m",
                                "--tasks", "niah_single_1", "--n", "1", "--methods", ",".join(METHODS), "--ratios",
                                "0.25", "--length", "1024", "--threads", "2", "--workdir",
                                os.path.join(work, "w"), "--out", out],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1700)
            print(r.stdout[-6000:])
            self.assertEqual(r.returncode, 0, "bench_kvpress.sh failed")
            lines = r.stdout.splitlines()
            hdr = [i for i, l in enumerate(lines) if l.startswith("| method | n | kvsieve RULER")]
            self.assertEqual(len(hdr), 1, "one results table")
            cols = [c.strip() for c in lines[hdr[0]].strip("|").split("|")]
            self.assertEqual(cols, ["method", "n", "kvsieve RULER", "kvpress grid RULER", "kvpress shared RULER",
                                    "agree grid", "agree shared", "agree grid-shared"])
            rows = {}
            for l in lines[hdr[0] + 2:hdr[0] + 2 + len(METHODS)]:
                cells = [c.strip() for c in l.strip("|").split("|")]
                self.assertEqual(len(cells), len(cols), l)
                rows[cells[0]] = cells
            self.assertEqual(sorted(rows), sorted(METHODS))
            with open(out) as f:
                res = json.load(f)
            by = {m["method"]: m for m in res["methods"]}
            for m, cells in rows.items():
                self.assertEqual(cells[1], "1")
                for c in cells[2:5]:
                    g = CI.match(c)
                    self.assertIsNotNone(g, "RULER cell %r" % c)
                    lo, mean, hi = float(g.group(2)), float(g.group(1)), float(g.group(3))
                    self.assertTrue(0 <= lo <= mean + 0.005 and mean <= hi + 0.005 and hi <= 1, c)
                for c, key in zip(cells[5:8], ["agree_grid", "agree_shared", "agree_grid_shared"]):
                    g = PCT.match(c)
                    self.assertIsNotNone(g, "agreement cell %r" % c)
                    self.assertTrue(0 <= by[m][key] <= 1)
                    self.assertEqual(int(g.group(1)), round(100 * by[m][key]))
                self.assertEqual(by[m]["n"], 1)
                self.assertEqual(len(by[m]["disagree_grid"]), round((1 - by[m]["agree_grid"]) * by[m]["n"]))
            self.assertEqual(by["full"]["agree_grid_shared"], 1.0, "kvpress grid and shared differ without a press")
            for k in ("kvsieve_wall_s", "kvsieve_cpu_s", "speedup", "speedup_cpu"):
                self.assertIsInstance(res[k], float, k)
            for md in ("grid", "shared"):
                self.assertIsInstance(res["kvpress"][md]["wall_s"], float)
            self.assertIn("speed-up: kvpress", r.stdout)


if __name__ == "__main__":
    unittest.main()

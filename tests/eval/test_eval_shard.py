#!/usr/bin/env python3
"""test_eval_shard.py KVSIEVE -- `kvsieve run --shard I/N` and `kvsieve merge`
driven like a user would, with no model:

1. fidelity (synthetic caches): a single run, and N = 3 shard processes run
   at once into their own databases; the shards are disjoint and cover the
   grid; their merge holds exactly the single run's cells with the same
   values (every column and score but the timings) and its report rows have
   the same n, means and CIs; every shard run is kept (shard, merged_from);
   merging again changes nothing; scripts/slurm/kvsieve-array.sbatch run
   as three array tasks (Slurm's variables set by hand) does the same;
   overhead shards' latency rows and a bench run's engine_bench row travel
   with their runs, once.
2. conflicts: a hand-made copy with one changed score and KV size: the merge
   exits 1, lists both values and writes nothing; --keep first / last keep
   the one asked for; an input at another schema version, a missing file
   and OUT itself as input are refused.
3. task kind against fake backends (http.server threads answering
   deterministic content with random timings): 3 shards, one backend each;
   every request carries all the variants of its (sample, mode), each
   request is sent by exactly one shard, together they send what a single
   run sends, and the merge equals the single run; ignore_eos = true sends
   "ignore_eos": true and no stop string, is part of the cell key, and
   variants_per_request = 1 sends one variant per request.
4. the leaderboard through scripts/slurm/kvsieve-array.sbatch with
   KVSIEVE_BOARD_MODEL (a model the file does not name: a derived copy) as
   a 2-task array against fake backends that also tokenize: each shard run
   stores its accounting (cells, requests, wall and CPU seconds, and the
   server clocks the fake answered: one prefill per request, every
   variant's compression, the longest decode) and prints it; the merge
   keeps both runs; `kvsieve report --board` of the merge writes
   provenance.json whose accounting is the sum of the shards'; RULER
   requests carry no stop string and the task's tokens_to_generate.
"""
import hashlib
import http.server
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading

BIN = sys.argv[1]
TMP = tempfile.mkdtemp(prefix="kvs-shard-")
fails = 0


def check(cond, what):
    global fails
    if not cond:
        fails += 1
        print("FAIL:", what, file=sys.stderr)


def run(*args, ok=True):
    p = subprocess.run([BIN] + list(args), cwd=TMP, capture_output=True, text=True)
    if ok and p.returncode != 0:
        check(False, "kvsieve %s: exit %d\n%s" % (" ".join(args), p.returncode, p.stderr))
    return p


def timing(metric):
    return metric.endswith("_ms") or metric.endswith("_tok_s")


def rows(db):
    """{key: (cell columns, result values, non-timing scores)} of a database."""
    h = sqlite3.connect(os.path.join(TMP, db))
    out = {}
    for r in h.execute(
        "SELECT c.key, c.experiment, c.kind, c.definition, c.model, c.model_hash, c.dataset,"
        " c.dataset_version, c.sample_id, c.shape, c.n_tokens, c.seed, c.method, c.label, c.params,"
        " c.budget_ratio, c.budget_tokens, c.prompt_hash, r.prediction, r.decode_tokens,"
        " r.kv_bytes_before, r.kv_bytes_after FROM cells c JOIN results r ON r.cell_key = c.key"):
        out[r[0]] = [r[1:], {}]
    for k, m, v in h.execute("SELECT cell_key, metric, value FROM scores"):
        if not timing(m):
            out[k][1][m] = v
    h.close()
    return out


def q(db, sql):
    h = sqlite3.connect(os.path.join(TMP, db))
    v = h.execute(sql).fetchall()
    h.close()
    return v


def report_means(db):
    p = run("report", "--db", db, "--format", "json")
    d = json.loads(p.stdout) if p.returncode == 0 else {"rows": []}
    return {(r["experiment"], r["variant"], r.get("budget_ratio"), r.get("budget_tokens"),
             r["metric"]): (r["n"], r["mean"], r["ci_lo"], r["ci_hi"]) for r in d["rows"]
            if not timing(r["metric"])}


def close(x, y):
    return x == y or (x is not None and y is not None and abs(x - y) <= 1e-12 * max(1.0, abs(x)))


def same_means(a, b, what):
    check(a.keys() == b.keys(), what + ": the same report rows")
    for k in a:
        if k in b:
            check(a[k][0] == b[k][0] and all(close(x, y) for x, y in zip(a[k][1:], b[k][1:])),
                  "%s: %s: n, mean, CI %s vs %s" % (what, k, a[k], b[k]))


# ---- 1. fidelity: shards, merge == single run -------------------------------------------

with open(os.path.join(TMP, "fid.lua"), "w") as f:
    f.write("""experiment {
  name = "shardfid",
  dataset = synthetic { shape = "tiny", n_tokens = { 64, 96 }, seeds = { 1, 2, 3 } },
  methods = { "full", "random", "streamingllm", "h2o", "snapkv", "flashcache" },
  budgets = { 0.25, 0.5 },
  params = { snapkv = { window = 8 }, random = { seed = { 1, 2 } } },
}
""")
N_CELLS = 6 * (1 + 6 * 2)
run("run", "fid.lua", "--db", "single.db", "--quiet")
procs = [subprocess.Popen([BIN, "run", "fid.lua", "--db", "s%d.db" % i, "--shard", "%d/3" % i,
                           "--quiet"], cwd=TMP) for i in range(3)]
for p in procs:
    check(p.wait() == 0, "a shard process failed")
single = rows("single.db")
check(len(single) == N_CELLS, "single run: %d cells, want %d" % (len(single), N_CELLS))
shards = [rows("s%d.db" % i) for i in range(3)]
keys = [set(s) for s in shards]
check(all(len(k) > 0 for k in keys), "every shard has cells")
check(not (keys[0] & keys[1]) and not (keys[0] & keys[2]) and not (keys[1] & keys[2]),
      "shards are disjoint")
check(keys[0] | keys[1] | keys[2] == set(single), "the shards cover the grid")


def shard_of(text, n):  # the documented partition, written independently
    return int(hashlib.sha256(text.encode()).hexdigest()[:16], 16) % n


check(all(shard_of(k, 3) == i for i in range(3) for k in keys[i]),
      "each cell is in the shard of the first 64 bits of SHA-256(its key)")
for i in range(3):
    check(q("s%d.db" % i, "SELECT shard, n_cells FROM runs") == [("%d/3" % i, len(keys[i]))],
          "shard %d's run records its shard and cell count" % i)
# a dry run lists exactly the shard's cells
p = run("run", "fid.lua", "--db", "dry.db", "--dry-run", "--shard", "1/3")
check("%d total" % len(keys[1]) in p.stdout, "dry run of shard 1 counts its cells")

p = run("merge", "merged.db", "s0.db", "s1.db", "s2.db")
check(rows("merged.db") == single, "merge of the 3 shards equals the single run (keys and values)")
check(q("merged.db", "SELECT count(*), count(DISTINCT shard) FROM runs") == [(3, 3)],
      "the merge keeps the 3 shard runs")
check(q("merged.db", "SELECT count(*) FROM runs WHERE merged_from LIKE '%s_.db#1'") == [(3,)],
      "merged_from names each run's database and id")
check(q("merged.db", "SELECT count(*) FROM results WHERE run_id NOT IN (SELECT id FROM runs)")
      == [(0,)], "results point at the copied runs")
check(sorted(q("merged.db", "SELECT r.run_id, count(*) FROM results r GROUP BY r.run_id")) ==
      sorted((rid, len(keys[int(sh[0])])) for rid, sh in q("merged.db", "SELECT id, shard FROM runs")),
      "each result belongs to the run of its shard")
same_means(report_means("merged.db"), report_means("single.db"), "report of the merge")
# idempotent: the same inputs again, and the single run's (identical values, other run)
p = run("merge", "merged.db", "s0.db", "s1.db", "s2.db")
check("0 runs copied (3 already there)" in p.stderr and "%d identical" % N_CELLS in p.stderr,
      "merging again copies nothing: " + p.stderr)
p = run("merge", "merged.db", "single.db")
check("0 results copied, %d identical duplicates" % N_CELLS in p.stderr and " 0 conflicts" in p.stderr,
      "the single run's results are duplicates of the shards': " + p.stderr)
check(rows("merged.db") == single, "still the single run's rows")
check(q("merged.db", "SELECT count(*) FROM runs") == [(4,)], "the single run's provenance is kept too")

# the Slurm array script, its tasks run here one after another with Slurm's variables
SBATCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "slurm",
                      "kvsieve-array.sbatch")
for i in range(3):
    env = dict(os.environ, SLURM_ARRAY_TASK_ID=str(i), SLURM_ARRAY_TASK_MIN="0",
               SLURM_ARRAY_TASK_MAX="2", SLURM_ARRAY_JOB_ID="77", SLURM_SUBMIT_DIR=TMP,
               SLURM_CPUS_PER_TASK="1", KVSIEVE_CONFIG="fid.lua", KVSIEVE_BIN=BIN)
    p = subprocess.run(["bash", SBATCH], env=env, capture_output=True, text=True)
    check(p.returncode == 0, "slurm task %d: exit %d: %s" % (i, p.returncode, p.stderr[-2000:]))
    check(set(rows("results/shards/77/shard-%d-of-3.db" % i)) == keys[i],
          "slurm task %d ran shard %d/3" % (i, i))
p = run("merge", "slurm.db", *["results/shards/77/shard-%d-of-3.db" % i for i in range(3)])
check(rows("slurm.db") == single, "the merge of the Slurm tasks' databases equals the single run")
env = dict(os.environ, SLURM_ARRAY_TASK_ID="1", SLURM_ARRAY_TASK_MIN="1", SLURM_ARRAY_TASK_MAX="2",
           SLURM_SUBMIT_DIR=TMP, KVSIEVE_CONFIG="fid.lua", KVSIEVE_BIN=BIN)
p = subprocess.run(["bash", SBATCH], env=env, capture_output=True, text=True)
check(p.returncode == 2 and "0-(N-1)" in p.stderr, "an array that does not start at 0 is refused")

# overhead cells carry latency rows: they travel with their results, once
with open(os.path.join(TMP, "ovh.lua"), "w") as f:
    f.write('experiment {\n'
            '  name = "shardovh", kind = "overhead",\n'
            '  dataset = synthetic { shape = "tiny", n_tokens = { 64, 128 }, seeds = { 1 } },\n'
            '  methods = { "full", "random", "streamingllm" },\n'
            '  budgets = 0.5, device = "cpu", dtype = "f32", threads = 1, repeats = 2, warmup = 0,\n'
            '}\n')
procs = [subprocess.Popen([BIN, "run", "ovh.lua", "--db", "o%d.db" % i, "--shard", "%d/3" % i,
                           "--quiet"], cwd=TMP, stdout=subprocess.DEVNULL) for i in range(3)]
for p in procs:
    check(p.wait() == 0, "an overhead shard process failed")
run("merge", "omerged.db", "o0.db", "o1.db", "o2.db")
run("merge", "omerged.db", "o2.db", "o1.db")
lat = sorted(sum((q("o%d.db" % i, "SELECT cell_key, method, n_tokens, median_ms FROM latency")
                  for i in range(3)), []))
check(len(lat) == 2 * 3 and sorted(q("omerged.db", "SELECT cell_key, method, n_tokens, median_ms "
                                                   "FROM latency")) == lat,
      "the merge holds each shard's latency rows once")
check(q("omerged.db", "SELECT count(*) FROM latency l JOIN results r ON r.cell_key = l.cell_key "
                      "WHERE l.run_id = r.run_id") == [(6,)], "latency rows point at their run")
run("run", "ovh.lua", "--db", "osingle.db", "--quiet")
p = run("merge", "omerged.db", "osingle.db")
check("1 runs copied" in p.stderr and "6 identical duplicates" in p.stderr and
      q("omerged.db", "SELECT count(*) FROM latency") == [(6,)],
      "another run's measurements of the same cells are duplicates: its latency rows stay out")
# engine_bench rows (a `kvsieve bench` run, written by hand here) travel with their run, once
shutil.copy(os.path.join(TMP, "o0.db"), os.path.join(TMP, "bench.db"))
h = sqlite3.connect(os.path.join(TMP, "bench.db"))
h.execute("INSERT INTO runs(experiment, kind, config_text, config_hash, host, started_at, status, pid)"
          " VALUES('bench', 'bench', '', 'x', 'h', '2001-01-01T00:00:00Z', 'done', 4)")
rid = h.execute("SELECT max(id) FROM runs").fetchone()[0]
h.execute("INSERT INTO engine_bench(run_id, model, model_sha256, device, prompt_len, gen_tokens,"
          " threads, repetitions, prefill_tok_s, decode_tok_s, build_type, finished_at)"
          " VALUES(?, 'm', 'abc', 'cpu', 512, 64, 2, 3, 100.5, 30.25, 'release', 'now')", (rid,))
h.commit()
h.close()
run("merge", "omerged.db", "bench.db")
run("merge", "omerged.db", "bench.db")
check(q("omerged.db", "SELECT e.model, e.decode_tok_s, r.kind FROM engine_bench e JOIN runs r ON "
                      "r.id = e.run_id") == [("m", 30.25, "bench")],
      "the bench row is copied once, with its run")

# ---- 2. conflicts ------------------------------------------------------------------------

shutil.copy(os.path.join(TMP, "single.db"), os.path.join(TMP, "bad.db"))
h = sqlite3.connect(os.path.join(TMP, "bad.db"))
key = h.execute("SELECT c.key FROM cells c WHERE c.method = 'snapkv' ORDER BY c.key LIMIT 1").fetchone()[0]
old = h.execute("SELECT value FROM scores WHERE cell_key = ? AND metric = 'mean_rel_err'", (key,)).fetchone()[0]
h.execute("UPDATE scores SET value = value + 0.5 WHERE cell_key = ? AND metric = 'mean_rel_err'", (key,))
h.execute("UPDATE results SET kv_bytes_after = 7 WHERE cell_key = ?", (key,))
# a different run of the same cells (so the run is new), with a timing that differs only
h.execute("UPDATE runs SET started_at = '2000-01-01T00:00:00Z', pid = 1")
h.execute("UPDATE scores SET value = value * 3 WHERE metric = 'compress_ms'")
h.commit()
h.close()
before = q("merged.db", "SELECT count(*) FROM runs")
p = run("merge", "merged.db", "bad.db", ok=False)
check(p.returncode == 1, "a conflict exits 1 (got %d)" % p.returncode)
check(("conflict: cell " + key) in p.stderr and "mean_rel_err" in p.stderr and
      "kv_bytes_after" in p.stderr and ("%.17g" % old) in p.stderr and " vs 7 (" in p.stderr,
      "the conflict is listed with both values: " + p.stderr)
check(p.stderr.count("conflict: cell") == 1, "only the changed cell conflicts (timings do not)")
check("compress_ms" not in p.stderr, "timings are not compared")
check(q("merged.db", "SELECT count(*) FROM runs") == before and rows("merged.db") == single,
      "a refused merge writes nothing")
p = run("merge", "merged.db", "bad.db", "--keep", "first")
check(q("merged.db", "SELECT value FROM scores WHERE cell_key = '%s' AND metric = 'mean_rel_err'" % key)
      == [(old,)], "--keep first keeps the value already there")
check(q("merged.db", "SELECT count(*) FROM runs") == [(before[0][0] + 1,)], "the new run is kept")
p = run("merge", "kl.db", "single.db", "bad.db", "--keep", "last")
v = q("kl.db", "SELECT value FROM scores WHERE cell_key = '%s' AND metric = 'mean_rel_err'" % key)
check(len(v) == 1 and abs(v[0][0] - (old + 0.5)) < 1e-12, "--keep last takes the later value")
check(q("kl.db", "SELECT kv_bytes_after FROM results WHERE cell_key = '%s'" % key) == [(7,)],
      "--keep last replaces the whole result")
p = run("merge", "kl.db", "bad.db", ok=False)
check(p.returncode == 0, "after --keep last the later value stands: merging it again is no conflict")
p = run("merge", "kl2.db", "single.db", "bad.db", ok=False)
check(p.returncode == 1 and not os.path.exists(os.path.join(TMP, "kl2.db-x")),
      "a conflict between two inputs is found before writing")
check(q("kl2.db", "SELECT count(*) FROM results") == [(0,)], "... and nothing is written")
shutil.copy(os.path.join(TMP, "single.db"), os.path.join(TMP, "old.db"))
h = sqlite3.connect(os.path.join(TMP, "old.db"))
h.execute("UPDATE schema_version SET version = 3")
h.commit()
h.close()
p = run("merge", "x.db", "old.db", ok=False)
check(p.returncode == 1 and "schema version 3" in p.stderr, "an older schema is refused: " + p.stderr)
p = run("merge", "x.db", "nope.db", ok=False)
check(p.returncode == 1 and "nope.db" in p.stderr and not os.path.exists(os.path.join(TMP, "nope.db")),
      "a missing input is refused (and not created)")
p = run("merge", "merged.db", "merged.db", ok=False)
check(p.returncode == 1 and "output database itself" in p.stderr, "OUT as input is refused")
p = run("merge", "x.db", ok=False)
check(p.returncode == 2, "merge without inputs is a usage error")
p = run("run", "fid.lua", "--db", "x.db", "--experiment", "nope", ok=False)
check(p.returncode == 1 and "no experiment 'nope'" in p.stderr and "'shardfid'" in p.stderr,
      "--experiment with an unknown name lists the file's experiments: " + p.stderr)
p = run("run", "fid.lua", "--db", "single.db", "--experiment", "shardfid", "--dry-run")
check("%d total, %d already done" % (N_CELLS, N_CELLS) in p.stdout, "--experiment NAME runs that one")
p = run("run", "fid.lua", "--db", "x.db", "--shard", "3/3", ok=False)
check(p.returncode == 2 and "--shard 3/3" in p.stderr, "--shard I/N needs I < N")

# ---- 3. task kind over fake backends -----------------------------------------------------


class Fake(http.server.BaseHTTPRequestHandler):
    log = None  # set per server

    def log_message(self, *a):
        pass

    def send(self, obj):
        b = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    def do_GET(self):
        if self.path == "/v1/models":
            self.send({"data": [{"id": "fake", "meta": {"name": "fake-model", "size": 123456789}}]})
        else:
            self.send_error(404)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.log.append(body)
        out = []
        for v in body["kv_compression"]["variants"]:
            seed = json.dumps([body["prompt"], v.get("suffix"), v["method"], v.get("ratio")])
            h = hashlib.sha256(seed.encode()).hexdigest()
            full = v["method"] == "full"
            out.append({"content": "answer " + h[:8], "tokens_predicted": body["max_tokens"],
                        "stop_type": "limit",
                        "timings": {"prompt_n": 50 + len(body["prompt"]) % 7,
                                    "prompt_ms": random.uniform(1, 9),
                                    "predicted_n": body["max_tokens"],
                                    "predicted_ms": random.uniform(1, 9),
                                    "compress_ms": random.uniform(1, 9)},
                        "kv": {"bytes_before": 4096, "bytes_after": 4096 if full else
                               int(4096 * v["ratio"]), "note": "fake"}})
        self.send({"variants": out})


def fake_server():
    s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Fake)
    s.log = []
    threading.Thread(target=s.serve_forever, daemon=True).start()
    return s


TASK = """experiment {
  name = "shardtask", kind = "task",
  backend = { url = "http://127.0.0.1:1" },
  dataset = niah { lengths = { 64 }, depths = { 0.1, 0.3, 0.5, 0.7, 0.9 }, per_cell = 2, seed = 3 },
  methods = { "full", "snapkv", "streamingllm" },
  budgets = { 0.25, 0.5 },
  mode = { "query_aware", "query_agnostic" },
  metrics = { "contains" },
  n_predict = 5,
}
"""
with open(os.path.join(TMP, "task.lua"), "w") as f:
    f.write(TASK)
VARIANTS = 1 + 2 * 2
SAMPLES = 10
UNITS = SAMPLES * 2


def url_of(s):
    return "backend={url='http://127.0.0.1:%d'}" % s.server_address[1]


def req_id(b):
    return (b["prompt"], b["kv_compression"]["variants"][0].get("suffix"))


one = fake_server()
run("run", "task.lua", "-D", url_of(one), "--db", "tsingle.db", "--quiet")
fakes = [fake_server() for _ in range(3)]
procs = [subprocess.Popen([BIN, "run", "task.lua", "-D", url_of(fakes[i]), "--db", "t%d.db" % i,
                           "--shard", "%d/3" % i, "--quiet"], cwd=TMP,
                          stdout=subprocess.DEVNULL) for i in range(3)]
for p in procs:
    check(p.wait() == 0, "a task shard process failed")
check(len(one.log) == UNITS, "single task run: %d requests, want %d" % (len(one.log), UNITS))
sent = [[req_id(b) for b in f.log] for f in fakes]
check(all(len(b["kv_compression"]["variants"]) == VARIANTS for f in fakes for b in f.log),
      "every shard request carries all variants of its sample and mode")
check(sum(len(s) for s in sent) == UNITS and set(sum(sent, [])) == {req_id(b) for b in one.log},
      "each request is sent by exactly one shard; together they send the single run's")
check(all(len(s) > 0 for s in sent), "every task shard got work")
for i in range(3):
    got = {(v[0][0], v[0][7], "mode=query_agnostic" in v[0][2]) for v in rows("t%d.db" % i).values()}
    check(all(shard_of("task-unit\n%s\n%s\n%s" % (e, "query_agnostic" if agn else "query_aware",
                                                   sid), 3) == i for e, sid, agn in got),
          "task shard %d holds the units of its partition key" % i)
check(all("ignore_eos" not in b and b.get("stop") == ["\n"] for b in one.log),
      "without ignore_eos: no ignore_eos field, the newline stop")
p = run("merge", "tmerged.db", "t0.db", "t1.db", "t2.db")
tsingle = rows("tsingle.db")
check(len(tsingle) == UNITS * VARIANTS and rows("tmerged.db") == tsingle,
      "task: the merge of 3 shards equals the single run")
same_means(report_means("tmerged.db"), report_means("tsingle.db"), "task report of the merge")
check(q("tsingle.db", "SELECT DISTINCT model_bytes FROM cells") == [(123456789,)],
      "cells record the model file size the backend reports")

# ignore_eos and variants_per_request
ie = fake_server()
run("run", "task.lua", "-D", url_of(ie), "-D", "ignore_eos=true", "-D", "variants_per_request=1",
    "-D", "mode='query_aware'", "--db", "tie.db", "--quiet")
check(len(ie.log) == SAMPLES * VARIANTS and all(len(b["kv_compression"]["variants"]) == 1 for b in ie.log),
      "variants_per_request = 1: one variant per request")
check(all(b.get("ignore_eos") is True and "stop" not in b and b["max_tokens"] == 5 for b in ie.log),
      "ignore_eos = true: sent, with no stop string")
defs = q("tie.db", "SELECT definition FROM cells")
check(len(defs) == SAMPLES * VARIANTS and all("n_predict=5 stop=none ignore_eos=1\n" in d for (d,) in defs),
      "ignore_eos is in the cell definition")
aware = {k for k, v in tsingle.items() if "mode=query_aware" in v[0][2]}
check(not (set(rows("tie.db")) & aware), "ignore_eos changes the cell keys")
p = run("run", "task.lua", "-D", "ignore_eos=1", "--db", "x.db", "--dry-run", ok=False)
check(p.returncode != 0 and "ignore_eos" in p.stderr, "ignore_eos must be a boolean: " + p.stderr)
p = run("run", "fid.lua", "-D", "ignore_eos=true", "--db", "x.db", "--dry-run", ok=False)
check(p.returncode != 0 and "ignore_eos" in p.stderr, "ignore_eos is for kind task only")

# ---- 4. the leaderboard as a Slurm array: accounting of shards, merge, board ------------


class FakeRuler(Fake):
    """Fake plus /tokenize (one token per word, and BOS); it keeps, per
    completion request, the timings it answered, for the accounting."""

    def do_POST(self):
        if self.path != "/tokenize":
            return Fake.do_POST(self)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send({"tokens": list(range(len(body["content"].split()) + 1))})

    def send(self, obj):
        if "variants" in obj:
            self.server.answered.append([v["timings"] for v in obj["variants"]])
        Fake.send(self, obj)


def fake_ruler():
    s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeRuler)
    s.log, s.answered = [], []
    threading.Thread(target=s.serve_forever, daemon=True).start()
    return s


# a leaderboard file in the shape of experiments/leaderboard.lua: the script
# runs one model of it, here one the file does not name (a derived copy)
BOARD = """local models = { "m0", "m1" }
for _, model in ipairs(models) do
  experiment {
    name = "leaderboard-" .. model, kind = "task",
    backend = { url = "http://127.0.0.1:1", model = model },
    dataset = ruler { lengths = { 1024 }, n = 3, seed = 1, tasks = { "niah_single_1", "vt" } },
    methods = { "full", "snapkv" },
    budgets = { 0.5, 0.25 },
    setting = { "query_agnostic", "query_aware" },
    metrics = { "ruler" },
  }
end
"""
with open(os.path.join(TMP, "board.lua"), "w") as f:
    f.write(BOARD)
bfakes = [fake_ruler() for _ in range(2)]
bprocs = []
for i in range(2):
    env = dict(os.environ, SLURM_ARRAY_TASK_ID=str(i), SLURM_ARRAY_TASK_MIN="0",
               SLURM_ARRAY_TASK_MAX="1", SLURM_ARRAY_JOB_ID="88", SLURM_SUBMIT_DIR=TMP,
               SLURM_CPUS_PER_TASK="1", KVSIEVE_CONFIG="board.lua", KVSIEVE_BOARD_MODEL="fake",
               KVSIEVE_BIN=BIN, KVSIEVE_DEFINES="-D backend.url=http://127.0.0.1:%d"
               % bfakes[i].server_address[1])
    bprocs.append(subprocess.Popen(["bash", SBATCH], env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True))
berr = []
for i, p in enumerate(bprocs):
    out, err = p.communicate()
    berr.append(err)
    check(p.returncode == 0, "board task %d: exit %d: %s" % (i, p.returncode, err[-2000:]))
    check("--experiment leaderboard-fake" in err and "\naccounting: " in err,
          "board task %d runs leaderboard-fake and prints its accounting: %s" % (i, err[-600:]))
derived = os.path.join(TMP, "results/shards/88/leaderboard-fake.lua")
check(os.path.exists(derived) and open(derived).read().startswith('local models = { "fake" }'),
      "KVSIEVE_BOARD_MODEL writes the config with that one model")
SH = ["results/shards/88/shard-%d-of-2.db" % i for i in range(2)]
ACCT = ("SELECT n_done, requests, wall_s, cpu_s, prefill_ms, compress_ms, decode_ms, cpu_scope,"
        " experiment FROM runs")
shard_runs = [q(db, ACCT) for db in SH]
check(all(len(r) == 1 for r in shard_runs), "one run per board shard")
for i, r in enumerate(shard_runs):
    if len(r) != 1:
        continue
    n_done, req, wall, cpu, pf, cm, dc, scope, exp = r[0]
    ans = bfakes[i].answered
    check(exp == "leaderboard-fake" and n_done == sum(len(a) for a in ans) and n_done > 0,
          "board shard %d stored its answered cells: %s" % (i, r))
    check(req == len(ans) and wall > 0 and cpu > 0 and "not counted" in scope,
          "board shard %d: requests, wall and CPU seconds, CPU scope: %s" % (i, r))
    # the server's clocks: per request one prefill, every variant's compression, the longest decode
    want = (sum(a[0]["prompt_ms"] for a in ans), sum(t["compress_ms"] for a in ans for t in a),
            sum(max(t["predicted_ms"] for t in a) for a in ans))
    check(all(abs(x - y) < 1e-6 for x, y in zip((pf, cm, dc), want)),
          "board shard %d: prefill/compress/decode ms %s, the fake answered %s" % (i, (pf, cm, dc), want))
p = run("merge", "board.db", *SH)
merged = q("board.db", ACCT + " ORDER BY id")
check(sorted(merged) == sorted(sum(shard_runs, [])), "the merge keeps both shard runs' accounting")
p = run("report", "--db", "board.db", "--experiment", "leaderboard-fake", "--board", "boardout")
check(p.returncode == 0, "report --board of the merged shards: " + p.stderr[-1000:])
try:
    prov = json.load(open(os.path.join(TMP, "boardout", "provenance.json")))
except (OSError, ValueError) as ex:
    prov = {}
    check(False, "provenance.json: %s" % ex)
acc = prov.get("accounting", {})
tot = [sum(r[k] for r in sum(shard_runs, [])) for k in range(7)]
check(acc.get("runs") == 2 and acc.get("runs_not_measured") == 0 and acc.get("cells") == tot[0]
      and acc.get("requests") == tot[1], "provenance sums the shards' runs: %s vs %s" % (acc, tot))
check(abs(acc.get("wall_s", -1) - tot[2]) <= 0.051 and abs(acc.get("cpu_s", -1) - tot[3]) <= 0.051,
      "provenance: wall and CPU seconds are the shards' sums: %s vs %s" % (acc, tot))
ts = acc.get("time_s", {})
check(all(abs(ts.get(k, -1) - tot[j] / 1e3) <= 0.051
          for k, j in (("prefill", 4), ("compress", 5), ("decode", 6))),
      "provenance: prefill/compress/decode seconds are the shards' sums: %s vs %s" % (ts, tot))
check(abs(acc.get("cells_per_cpu_s", -1) - tot[0] / tot[3]) <= 1e-4 * max(1, tot[0] / tot[3]),
      "provenance: cells per CPU-second of the sums")
check(len(prov.get("runs", [])) == 2 and all("cpu_s" in r and r.get("shard") in ("0/2", "1/2")
                                             for r in prov.get("runs", [])),
      "provenance lists both shard runs with their accounting")
check(all("stop" not in b and b["max_tokens"] in (128, 30) for f in bfakes for b in f.log),
      "RULER requests: no stop string, each task's tokens_to_generate (niah 128, vt 30) as the cap")

for s in [one, ie] + fakes + bfakes:
    s.shutdown()
if fails == 0:
    shutil.rmtree(TMP)
    print("test_eval_shard: all checks passed")
else:
    print("test_eval_shard: %d check(s) failed; files kept in %s" % (fails, TMP), file=sys.stderr)
sys.exit(1 if fails else 0)

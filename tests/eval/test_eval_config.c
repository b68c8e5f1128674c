/* test_eval_config.c -- Lua configs: errors name file:line and the field
 * (syntax, unknown key with a suggestion, wrong type, out-of-range budget,
 * method parameters through the registry), grid counts and key stability,
 * -D overrides, the sandbox (no os.execute/io.popen/require, io.open
 * read-only and only below the config's folder), and methods composed from
 * parts (a table in `methods`: label, identity, stable keys, errors), presets()
 * and the shipped experiments/leaderboard.lua. */
#include "eval_test_util.h"
#include "kvs_eval.h"
#include "test_util.h"

static char dir[64];

/* Load text as <dir>/name; expect failure whose message has all needles. */
static void expect_error(const char *name, const char *text, const char *n1, const char *n2,
                         int line) {
    char path[256];
    kvs_config cfg;
    kvs_err err = {0};
    eval_write(dir, name, text, path, sizeof path);
    kvs_status rc = kvs_config_load(path, NULL, 0, &cfg, &err);
    CHECK_MSG(rc != KVS_OK, "%s: expected an error", name);
    char want[300];
    snprintf(want, sizeof want, "%s:%d:", path, line);
    CHECK_MSG(strstr(err.msg, want) != NULL, "%s: wanted '%s' in: %s", name, want, err.msg);
    CHECK_MSG(!n1 || strstr(err.msg, n1), "%s: wanted '%s' in: %s", name, n1, err.msg);
    CHECK_MSG(!n2 || strstr(err.msg, n2), "%s: wanted '%s' in: %s", name, n2, err.msg);
    if (rc == KVS_OK) kvs_config_free(&cfg);
}

static kvs_status load(const char *name, const char *text, const char *const *ov, int n_ov,
                       kvs_config *cfg, kvs_err *err) {
    char path[256];
    eval_write(dir, name, text, path, sizeof path);
    return kvs_config_load(path, ov, n_ov, cfg, err);
}

static const char *GOOD =
    "-- a fidelity sweep\n"
    "experiment {\n"
    "  name = \"grid\",\n"
    "  kind = \"fidelity\",\n"
    "  dataset = synthetic { shape = { \"tiny\", shape { layers = 2, q_heads = 4, kv_heads = 2, head_dim = 8 } },\n"
    "                        n_tokens = { 64, 128 }, seeds = { 1, 2, 3 } },\n"
    "  methods = { \"full\", \"random\", \"flashcache\" },\n"
    "  budgets = { 0.1, 0.2, 0.5 },\n"
    "  params = { flashcache = { gamma = { 0.1, 0.2 } } },\n"
    "}\n";

static void test_errors(void) {
    expect_error("syntax.lua",
                 "experiment {\n  name = \"x\",\n  budgets = { 0.1 0.2 },\n}\n", "'}' expected",
                 NULL, 3);
    expect_error("unknown.lua",
                 "experiment {\n  name = \"x\",\n  dataset = synthetic { shape = \"tiny\", n_tokens = 64 },\n"
                 "  methods = { \"full\" },\n  budget = 0.2,\n}\n",
                 "unknown key 'budget'", "did you mean 'budgets'", 5);
    expect_error("type.lua",
                 "experiment {\n  name = \"x\",\n  dataset = synthetic { shape = \"tiny\", n_tokens = 64 },\n"
                 "  methods = { \"full\" },\n  budgets = { 0.2 },\n  threads = \"two\",\n}\n",
                 "threads", "expected a whole number in [1, 256]", 6);
    expect_error("range.lua",
                 "experiment {\n  name = \"x\",\n  dataset = synthetic { shape = \"tiny\", n_tokens = 64 },\n"
                 "  methods = { \"full\" },\n\n  budgets = { 0.1, 1.5 },\n}\n",
                 "budgets[2]: 1.5 out of range", "ratio in (0, 1]", 6);
    expect_error("negbudget.lua",
                 "experiment { name = \"x\", dataset = synthetic { shape = \"tiny\", n_tokens = 64 },\n"
                 "  methods = { \"full\" }, budgets = -0.5 }\n",
                 "budgets: -0.5 out of range", NULL, 2);
    expect_error("method.lua",
                 "experiment {\n  name = \"x\",\n  dataset = synthetic { shape = \"tiny\", n_tokens = 64 },\n"
                 "  methods = { \"full\", \"snapkvv\" },\n  budgets = { 0.2 },\n}\n",
                 "methods[2]", "did you mean 'snapkv'", 4);
    expect_error("param.lua",
                 "experiment {\n  name = \"x\",\n  dataset = synthetic { shape = \"tiny\", n_tokens = 64 },\n"
                 "  methods = { \"flashcache\" },\n  budgets = { 0.2 },\n"
                 "  params = {\n    flashcache = {\n      gamma = { 0.1, 7 },\n    },\n  },\n}\n",
                 "params.flashcache.gamma[2]", "gamma", 8);
    expect_error("paramname.lua",
                 "experiment {\n  name = \"x\",\n  dataset = synthetic { shape = \"tiny\", n_tokens = 64 },\n"
                 "  methods = { \"flashcache\" },\n  budgets = { 0.2 },\n"
                 "  params = { flashcache = { gama = 0.1 } },\n}\n",
                 "params.flashcache.gama", "gamma", 6);
    expect_error("parammethod.lua",
                 "experiment {\n  name = \"x\",\n  dataset = synthetic { shape = \"tiny\", n_tokens = 64 },\n"
                 "  methods = { \"flashcache\" },\n  budgets = { 0.2 },\n"
                 "  params = { snapkv = { window = 8 } },\n}\n",
                 "params.snapkv", "not in methods", 6);
    expect_error("dataset.lua",
                 "experiment {\n  name = \"x\",\n  dataset = synthetic {\n    shape = \"tiny\",\n"
                 "    n_tokens = 64,\n    seed = 3,\n  },\n  methods = { \"full\" },\n  budgets = 0.2,\n}\n",
                 "dataset.seed: unknown key 'seed'", "did you mean 'seeds'", 6);
    expect_error("local.lua",
                 "local ds = synthetic {\n  shape = \"tiny\",\n  n_tokens = 64,\n  probes = 0,\n}\n"
                 "experiment {\n  name = \"x\",\n  dataset = ds,\n  methods = { \"full\" },\n  budgets = 0.2,\n}\n",
                 "dataset.probes: 0 out of range [1, 4096]", NULL, 4);
    expect_error("shape.lua",
                 "experiment {\n  name = \"x\",\n  dataset = synthetic { shape = \"tinyy\", n_tokens = 64 },\n"
                 "  methods = { \"full\" },\n  budgets = 0.2,\n}\n",
                 "dataset.shape", "tinyy", 3);
    expect_error("ntokens.lua",
                 "experiment {\n  name = \"x\",\n  dataset = synthetic { shape = \"tiny\",\n"
                 "     n_tokens = { 64, 8 } },\n  methods = { \"full\" },\n  budgets = 0.2,\n}\n",
                 "dataset.n_tokens[2]: 8 out of range [16,", NULL, 4);
    expect_error("kindmix.lua",
                 "experiment {\n  name = \"x\",\n  kind = \"fidelity\",\n"
                 "  dataset = niah { lengths = 1024, depths = 0.5 },\n  methods = { \"full\" },\n"
                 "  budgets = 0.2,\n}\n",
                 "dataset", "niah{...} is for kind 'task'", 4);
    expect_error("kind.lua", "experiment {\n  name = \"x\",\n  kind = \"fidelty\",\n}\n",
                 "kind: 'fidelty' is not one of: fidelity, overhead, task", NULL, 3);
    expect_error("missing.lua",
                 "experiment {\n  name = \"x\",\n  dataset = synthetic { shape = \"tiny\", n_tokens = 64 },\n"
                 "  budgets = 0.2,\n}\n",
                 "methods: missing (required)", NULL, 1);
    expect_error("runtime.lua", "local x = nil\nlocal y = x.field\n", "attempt to index", NULL, 2);
}

static void test_grid(void) {
    kvs_config cfg;
    kvs_err err = {0};
    CHECK_OK(load("good.lua", GOOD, NULL, 0, &cfg, &err), &err);
    if (err.code) return;
    CHECK_EQ_INT(cfg.n_experiments, 1);
    kvs_experiment *e = &cfg.experiments[0];
    CHECK_EQ_INT(e->n_shapes, 2);
    CHECK(!strcmp(e->shapes[1].name, "custom-L2-Hq4-Hkv2-d8"));
    CHECK_EQ_INT(e->n_variants, 4); /* full, random, flashcache x2 gamma */
    CHECK(!strcmp(e->variants[2].label, "flashcache gamma=0.1"));
    CHECK(!strcmp(e->variants[3].label, "flashcache gamma=0.2"));
    CHECK(strstr(e->variants[3].params_json, "\"gamma\":\"0.2\"") != NULL);
    kvs_cell *cells = NULL;
    int n = 0;
    CHECK_OK(kvs_grid_expand(e, &cells, &n, &err), &err);
    /* 2 shapes x 2 N x 3 seeds x (full 1 + random 3 + flashcache 2x3) */
    CHECK_EQ_INT(n, 2 * 2 * 3 * (1 + 3 + 6));
    int dup = 0;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) dup += !strcmp(cells[i].key, cells[j].key);
    CHECK_EQ_INT(dup, 0);
    /* keys are stable across loads and change with any defining field */
    kvs_config cfg2;
    kvs_cell *cells2 = NULL;
    int n2 = 0;
    CHECK_OK(load("good2.lua", GOOD, NULL, 0, &cfg2, &err), &err);
    CHECK_OK(kvs_grid_expand(&cfg2.experiments[0], &cells2, &n2, &err), &err);
    CHECK_EQ_INT(n2, n);
    for (int i = 0; i < n && i < n2; i++) CHECK(!strcmp(cells[i].key, cells2[i].key));
    free(cells2);
    kvs_config_free(&cfg2);
    const char *ov[] = {"budgets={0.3}", "dataset.n_tokens=256", "params.flashcache.gamma=0.15"};
    CHECK_OK(load("good3.lua", GOOD, ov, 3, &cfg2, &err), &err);
    if (!err.code) {
        kvs_experiment *e2 = &cfg2.experiments[0];
        CHECK_EQ_INT(e2->n_budgets, 1);
        CHECK_NEAR(e2->budgets[0].ratio, 0.3, 0);
        CHECK_EQ_INT(e2->n_lengths, 1);
        CHECK_EQ_INT(e2->lengths[0], 256);
        CHECK_EQ_INT(e2->n_variants, 3);
        CHECK(strcmp(cfg2.hash, cfg.hash) != 0); /* overrides are part of the config hash */
        CHECK(cfg2.overrides && strstr(cfg2.overrides, "-D budgets={0.3}"));
        CHECK_OK(kvs_grid_expand(e2, &cells2, &n2, &err), &err);
        CHECK_EQ_INT(n2, 2 * 1 * 3 * (1 + 1 + 1));
        /* the full cell for (tiny, 256, seed 1) differs from N=64's */
        CHECK(strcmp(cells2[0].key, cells[0].key) != 0);
        free(cells2);
        kvs_config_free(&cfg2);
    }
    const char *bad[] = {"budgets=2.5"};
    CHECK_FAILS(load("good4.lua", GOOD, bad, 1, &cfg2, &err), KVS_ERR_INVALID, &err,
                "-D budgets=2.5: budgets: 2.5 out of range");
    const char *bad2[] = {"nothere.x=1"};
    CHECK_FAILS(load("good5.lua", GOOD, bad2, 1, &cfg2, &err), KVS_ERR_INVALID, &err,
                "'nothere' is not a table");
    free(cells);
    kvs_config_free(&cfg);
}

static void test_kinds(void) {
    kvs_config cfg;
    kvs_err err = {0};
    const char *task =
        "experiment {\n  name = \"needle\", kind = \"task\",\n"
        "  backend = backend { url = \"http://localhost:8080\" },\n  model = \"gemma3-270m\",\n"
        "  dataset = niah { lengths = { 1024, 2048 }, depths = { 0.1, 0.5, 0.9 }, per_cell = 2, seed = 7 },\n"
        "  methods = { \"full\", \"snapkv\", \"flashcache\" },\n  budgets = { 0.2, 0.5 },\n"
        "  metrics = { \"contains\" },\n}\n";
    CHECK_OK(load("task.lua", task, NULL, 0, &cfg, &err), &err);
    if (!err.code) {
        kvs_experiment *e = &cfg.experiments[0];
        CHECK_EQ_INT(e->kind, KVS_KIND_TASK);
        CHECK(!strcmp(e->backend_url, "http://localhost:8080"));
        kvs_cell *cells;
        int n;
        CHECK_OK(kvs_grid_expand(e, &cells, &n, &err), &err);
        CHECK_EQ_INT(n, 2 * 3 * 2 * (1 + 2 + 2));
        free(cells);
        kvs_config_free(&cfg);
    }
    const char *oh =
        "experiment {\n  name = \"lat\", kind = \"overhead\", repeats = 20, device = \"cpu\",\n"
        "  dataset = synthetic { shape = \"qwen2.5-vl-7b\", n_tokens = { 2048, 4096 } },\n"
        "  methods = { \"snapkv\", \"flashcache\" },\n  budgets = 0.2,\n}\n";
    CHECK_OK(load("oh.lua", oh, NULL, 0, &cfg, &err), &err);
    if (!err.code) {
        kvs_cell *cells;
        int n;
        CHECK_EQ_INT(cfg.experiments[0].repeats, 20);
        CHECK_OK(kvs_grid_expand(&cfg.experiments[0], &cells, &n, &err), &err);
        CHECK_EQ_INT(n, 2 * 2);
        free(cells);
        kvs_config_free(&cfg);
    }
    const char *ohbad =
        "experiment {\n  name = \"lat\", kind = \"overhead\",\n  repeats = 0,\n"
        "  dataset = synthetic { shape = \"tiny\", n_tokens = 64 },\n  methods = { \"full\" },\n  budgets = 0.2,\n}\n";
    CHECK_FAILS(load("ohbad.lua", ohbad, NULL, 0, &cfg, &err), KVS_ERR_INVALID, &err,
                "ohbad.lua:3: repeats: 0 out of range [1, 100000]");
    const char *mix =
        "experiment {\n  name = \"f\",\n  dataset = synthetic { shape = \"tiny\", n_tokens = 64 },\n"
        "  methods = { \"full\" },\n  budgets = 0.2,\n  metrics = { \"contains\" },\n}\n";
    CHECK_FAILS(load("mix.lua", mix, NULL, 0, &cfg, &err), KVS_ERR_INVALID, &err,
                "mix.lua:6: metrics: not used by kind 'fidelity'");
}

/* -D with --experiment: the overrides reach that experiment only (the file's others need not have the field) */
static void test_only(void) {
    kvs_config cfg;
    kvs_err err = {0};
    char path[256];
    eval_write(dir, "only.lua",
               "experiment { name = \"a\", dataset = synthetic { shape = \"tiny\", n_tokens = 64 },"
               " methods = \"full\", budgets = 0.5 }\n"
               "experiment { name = \"b\", dataset = synthetic { shape = \"tiny\", n_tokens = 64 },"
               " methods = \"full\", budgets = 0.5 }\n",
               path, sizeof path);
    const char *ov[1] = {"budgets={0.25,0.125}"};
    CHECK_OK(kvs_config_load_only(path, "b", ov, 1, &cfg, &err), &err);
    if (!err.code) {
        CHECK_EQ_INT(cfg.n_experiments, 2);
        CHECK_EQ_INT(cfg.experiments[0].n_budgets, 1);
        CHECK_EQ_INT(cfg.experiments[1].n_budgets, 2);
        kvs_config_free(&cfg);
    }
    const char *bad[1] = {"dataset.nope=1"}; /* unknown to both: an error for "b" ... */
    CHECK_FAILS(kvs_config_load_only(path, "b", bad, 1, &cfg, &err), KVS_ERR_INVALID, &err, "nope");
    memset(&err, 0, sizeof err);
    CHECK_OK(kvs_config_load_only(path, "c", bad, 1, &cfg, &err), &err); /* ... and none with no "c" */
    if (!err.code) kvs_config_free(&cfg);
    CHECK_FAILS(kvs_config_load(path, bad, 1, &cfg, &err), KVS_ERR_INVALID, &err, "nope");
}

static void test_sandbox(void) {
    kvs_config cfg;
    kvs_err err = {0};
    char path[256];
    eval_write(dir, "name.txt", "from-file", path, sizeof path);
    const char *base = "experiment { name = NAME, dataset = synthetic { shape = \"tiny\", n_tokens = 64 },"
                       " methods = \"full\", budgets = 0.5 }\n";
    char text[2048];
    snprintf(text, sizeof text,
             "assert(os.execute == nil and io.popen == nil and require == nil)\n"
             "assert(dofile == nil and loadfile == nil and package == nil and os.remove == nil)\n"
             "assert(load(string.dump(function() end)) == nil)\n"
             "assert(#presets() == %d and presets()[1] == \"full\")\n"
             "local n = method_needs(\"lookm\")\n"
             "assert(#n == 2 and n[1] == \"q_all\" and n[2] == \"modality\")\n"
             "assert(#method_needs(\"full\") == 0 and method_needs(\"snapkv\")[1] == \"q_window\")\n"
             "assert(method_needs(\"criticalkv\")[2] == \"w_o\")\n"
             "local f = assert(io.open(\"name.txt\"))\nNAME = f:read(\"l\")\nf:close()\n%s",
             kvs_methods_count(), base);
    CHECK_OK(load("sandbox.lua", text, NULL, 0, &cfg, &err), &err);
    if (!err.code) {
        CHECK(!strcmp(cfg.experiments[0].name, "from-file"));
        kvs_config_free(&cfg);
    }
    CHECK_FAILS(load("exec.lua", "os.execute(\"true\")\n", NULL, 0, &cfg, &err), KVS_ERR_INVALID,
                &err, "exec.lua:1: attempt to call a nil value (field 'execute')");
    CHECK_FAILS(load("popen.lua", "\nio.popen(\"ls\")\n", NULL, 0, &cfg, &err), KVS_ERR_INVALID,
                &err, "popen.lua:2:");
    CHECK_FAILS(load("outside.lua", "local f = io.open(\"/etc/hostname\")\n", NULL, 0, &cfg, &err),
                KVS_ERR_INVALID, &err, "outside the config's folder");
    CHECK_FAILS(load("dotdot.lua", "local f = io.open(\"../\")\n", NULL, 0, &cfg, &err),
                KVS_ERR_INVALID, &err, "outside the config's folder");
    CHECK_FAILS(load("write.lua", "local f = io.open(\"name.txt\", \"w\")\n", NULL, 0, &cfg, &err),
                KVS_ERR_INVALID, &err, "read-only");
    CHECK_FAILS(load("loop.lua", "local i = 0\nwhile true do i = i + 1 end\n", NULL, 0, &cfg, &err),
                KVS_ERR_INVALID, &err, "loop.lua:2: the config ran for more than");
    CHECK_FAILS(load("none.lua", "local x = 1\n", NULL, 0, &cfg, &err), KVS_ERR_INVALID, &err,
                "no experiment{...}");
    CHECK_FAILS(load("needs.lua", "\nlocal n = method_needs(\"snapkvv\")\n", NULL, 0, &cfg, &err),
                KVS_ERR_INVALID, &err, "needs.lua:2: method_needs: unknown method 'snapkvv' (did you mean 'snapkv'?");
    /* memory: one huge string, and a table growing until the ceiling (before the
     * instruction cap); each an error naming the file, never the machine's memory */
    CHECK_FAILS(load("rep.lua", "local s = string.rep(\"x\", 1 << 30)\n", NULL, 0, &cfg, &err),
                KVS_ERR_INVALID, &err, "rep.lua: the config used more than 256 MiB of memory");
    CHECK_FAILS(load("grow.lua", "local t = {}\nfor i = 1, 1e9 do t[i] = string.rep(\"y\", 4000) .. i end\n",
                     NULL, 0, &cfg, &err),
                KVS_ERR_INVALID, &err, "grow.lua: the config used more than 256 MiB of memory");
}

/* The shipped experiments/fidelity.lua loads and has the documented grid. */
static void test_shipped(const char *golden_dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/../../../experiments/fidelity.lua", golden_dir);
    kvs_config cfg;
    kvs_err err = {0};
    CHECK_OK(kvs_config_load(path, NULL, 0, &cfg, &err), &err);
    if (err.code) return;
    kvs_experiment *e = &cfg.experiments[0];
    CHECK(!strcmp(e->name, "fidelity"));
    CHECK_EQ_INT(e->n_shapes, 2);
    CHECK_EQ_INT(e->n_budgets, 3);
    int methods = 0;
    for (int i = 0; i < e->n_variants; i++)
        methods += i == 0 || e->variants[i].method != e->variants[i - 1].method;
    int need_wo = 0; /* synthetic caches have no W_o nor a reconstruction pass: CriticalKV and KVzip run in
                        experiments/methods.lua */
    for (int i = 0; i < kvs_methods_count(); i++)
        need_wo += (kvs_method_at(i)->needs & (KVS_NEED_W_O | KVS_NEED_RECON)) != 0;
    CHECK_EQ_INT(methods, kvs_methods_count() - need_wo); /* every registered method but those */
    CHECK_EQ_INT(e->queries, -1);              /* H2O, LOOK-M, MEDA need all queries */
    kvs_cell *cells;
    int n;
    CHECK_OK(kvs_grid_expand(e, &cells, &n, &err), &err);
    CHECK_EQ_INT(n, 2 * 2 * (1 + (e->n_variants - 1) * 3));
    free(cells);
    kvs_config_free(&cfg);
}

/* experiments/leaderboard.lua: one experiment{} per model, every
 * registered method (presets(): the registry at run time, in its order), four
 * kept ratios, both settings, 20 samples per task; -D and presets() agree. */
static void test_leaderboard(const char *golden_dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/../../../experiments/leaderboard.lua", golden_dir);
    kvs_config cfg;
    kvs_err err = {0};
    CHECK_OK(kvs_config_load(path, NULL, 0, &cfg, &err), &err);
    if (err.code) return;
    CHECK_EQ_INT(cfg.n_experiments, 3);
    static const char *const names[3] = {"leaderboard-qwen2.5-0.5b", "leaderboard-smollm2-135m",
                                         "leaderboard-gemma3-270m"};
    for (int x = 0; x < cfg.n_experiments && x < 3; x++) {
        const kvs_experiment *e = &cfg.experiments[x];
        CHECK_MSG(!strcmp(e->name, names[x]), "experiment %d is '%s'", x, e->name);
        CHECK(!strcmp(e->model, names[x] + strlen("leaderboard-")));
        CHECK_EQ_INT(e->n_variants, kvs_methods_count());
        for (int i = 0; i < e->n_variants && i < kvs_methods_count(); i++)
            CHECK(e->variants[i].method == kvs_method_at(i));
        CHECK_EQ_INT(e->n_budgets, 4);
        CHECK_EQ_INT(e->n_modes, 2);
        CHECK_EQ_INT(e->per_cell, 20);
    }
    kvs_config_free(&cfg);
    const char *ov[2] = {"methods={\"full\",\"tova\"}", "dataset.n=2"};
    CHECK_OK(kvs_config_load(path, ov, 2, &cfg, &err), &err);
    if (err.code) return;
    CHECK_EQ_INT(cfg.experiments[1].n_variants, 2);
    CHECK_EQ_INT(cfg.experiments[1].per_cell, 2);
    kvs_config_free(&cfg);
}

/* A composed method in `methods` (a table): one variant labelled by its
 * name, identified by its canonical JSON: the cell keys are stable across
 * loads, do not depend on the label or on how the description is written,
 * and change with the composition; errors name file:line, the list entry,
 * the field and the part. */
static const char *COMPOSED_FMT =
    "experiment {\n"
    "  name = \"comp\",\n"
    "  kind = \"fidelity\",\n"
    "  dataset = synthetic { shape = \"tiny\", n_tokens = 64, seeds = { 1 } },\n"
    "  methods = { \"snapkv\", %s },\n"
    "  budgets = { 0.2, 0.5 },\n"
    "}\n";

static int composed_keys(const char *name, const char *table, kvs_config *cfg, kvs_cell **cells,
                         int *n) {
    char text[1024];
    snprintf(text, sizeof text, COMPOSED_FMT, table);
    kvs_err err = {0};
    CHECK_OK(load(name, text, NULL, 0, cfg, &err), &err);
    if (err.code) return 0;
    CHECK_OK(kvs_grid_expand(&cfg->experiments[0], cells, n, &err), &err);
    if (err.code) {
        kvs_config_free(cfg);
        return 0;
    }
    return 1;
}

static void test_composed(void) {
    kvs_config a, b, c, d;
    kvs_cell *ca, *cb, *cc, *cd;
    int na, nb, nc, nd;
    const char *ta = "{ name = \"ada_tova\", score = \"tova\", allocate = \"pyramid\", "
                     "keep = { sinks = 4, window = 8 }, pick = \"chunk\", params = { chunk = 5 } }";
    /* the same composition written otherwise (defaults spelled out, keep as
     * a list plus params) and under another name */
    const char *tb = "{ name = \"other\", score = \"tova\", allocate = \"pyramid\", "
                     "keep = { \"sinks\", \"window\" }, pick = \"chunk\", merge = \"none\", "
                     "params = { chunk = 5, sinks = 4, window = 8, beta = 20 } }";
    const char *tc = "{ score = \"tova\", allocate = \"pyramid\", keep = { sinks = 4, window = 8 }, "
                     "pick = \"chunk\", params = { chunk = 6 } }";
    if (!composed_keys("comp_a.lua", ta, &a, &ca, &na)) return;
    kvs_experiment *e = &a.experiments[0];
    CHECK_EQ_INT(e->n_variants, 2);
    CHECK_EQ_INT(na, 4);
    CHECK(!strcmp(e->variants[1].label, "ada_tova"));
    const char *want = "{\"score\":\"tova\",\"allocate\":\"pyramid\",\"keep\":{\"sinks\":4,"
                       "\"window\":8},\"pick\":\"chunk\",\"merge\":\"none\",\"params\":{"
                       "\"beta\":20,\"recent_frac\":0,\"chunk\":5}}";
    CHECK_MSG(!strcmp(e->variants[1].method->name, want), "composed name: %s",
              e->variants[1].method->name);
    CHECK(strstr(e->variants[1].params_json, "\"chunk\":\"5\"") != NULL);
    CHECK(strstr(ca[2].def, want) != NULL); /* the cell's definition holds the identity */
    if (composed_keys("comp_a2.lua", ta, &d, &cd, &nd)) { /* stable across loads */
        CHECK_EQ_INT(nd, na);
        for (int i = 0; i < na && i < nd; i++) CHECK(!strcmp(ca[i].key, cd[i].key));
        free(cd);
        kvs_config_free(&d);
    }
    if (composed_keys("comp_b.lua", tb, &b, &cb, &nb)) { /* label / spelling: same keys */
        CHECK(!strcmp(b.experiments[0].variants[1].label, "other"));
        CHECK_EQ_INT(nb, na);
        for (int i = 0; i < na && i < nb; i++) CHECK(!strcmp(ca[i].key, cb[i].key));
        free(cb);
        kvs_config_free(&b);
    }
    if (composed_keys("comp_c.lua", tc, &c, &cc, &nc)) { /* another chunk: other keys */
        CHECK(!strcmp(c.experiments[0].variants[1].label, "tova+pyramid+sinks+window+chunk"));
        CHECK(!strcmp(ca[0].key, cc[0].key)); /* snapkv's cells unchanged */
        CHECK(strcmp(ca[2].key, cc[2].key) != 0);
        free(cc);
        kvs_config_free(&c);
    }
    free(ca);
    kvs_config_free(&a);
    char text[1024];
    snprintf(text, sizeof text, COMPOSED_FMT, "{ score = \"tovaa\" }");
    expect_error("comp_e1.lua", text, "methods[2]", "score: unknown scorer 'tovaa' (did you mean 'tova'?)",
                 5);
    snprintf(text, sizeof text, COMPOSED_FMT, "{ score = \"snapkv\", params = { window = 0 } }");
    expect_error("comp_e2.lua", text, "params.window: parameter window = 0 is out of range",
                 "(read by scorer snapkv)", 5);
    snprintf(text, sizeof text, COMPOSED_FMT, "{ score = \"snapkv\", keep = { sinks = print } }");
    expect_error("comp_e3.lua", text, "methods[2]", "keep: sinks: a function cannot be part", 5);
    snprintf(text, sizeof text, COMPOSED_FMT, "{ score = \"snapkv\" }, { score = \"snapkv\", name = \"x\" }");
    expect_error("comp_e4.lua", text, "methods[3]", "listed twice", 5);
    snprintf(text, sizeof text, COMPOSED_FMT, "{ score = \"tova\", name = \"snapkv\" }");
    expect_error("comp_e5.lua", text, "methods[2]", "name: 'snapkv' already names a method", 5);
    snprintf(text, sizeof text, COMPOSED_FMT,
             "{ score = \"tova\", name = \"x\" }, { score = \"knorm\", name = \"x\" }");
    expect_error("comp_e6.lua", text, "methods[3]", "name: 'x' already names", 5);
}

int main(int argc, char **argv) {
    if (argc > 1) test_shipped(argv[1]);
    if (argc > 1) test_leaderboard(argv[1]);
    if (eval_tmpdir(dir, "cfg")) {
        fprintf(stderr, "mkdtemp failed\n");
        return 1;
    }
    test_errors();
    test_grid();
    test_kinds();
    test_sandbox();
    test_only();
    test_composed();
    eval_rmdir(dir);
    return kvs_test_finish("test_eval_config");
}

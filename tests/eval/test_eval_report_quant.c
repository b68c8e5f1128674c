/* test_eval_report_quant.c -- rows of several KV cache types in one task
 * experiment (experiments/quant.lua): the Markdown report of a fixed database
 * must match golden/report-quant.md byte for byte (KVS_UPDATE_GOLDEN=1
 * rewrites it). Checked there and here: a cell's cache type (the
 * " kv_cache=T" of its definition) is part of its row ("snapkv @q4_0",
 * before a " [mode]" tag), so two cache types never merge; Δ vs full is
 * against the f16 full row; the kv_kept_mb (bytes) column; the equal-memory
 * table pairs full @q4_0 with snapkv at 0.25 and full @q8_0 with snapkv at
 * 0.5 (their bytes within 25%), and nothing else. And a config may define
 * one experiment name once per cache type, not twice for the same one.
 * argv[1] is the golden folder. */
#include "eval_test_util.h"
#include "kvs_eval.h"
#include "test_util.h"

#include <sqlite3.h>

static char dir[64];

/* Full f16 cache: 100 MiB. Rows: (cache, method, budget); kv bytes are the
 * formula's (f16 per kept token, Q8_0 34/64 and Q4_0 18/64 of it). */
static void build_db(const char *db) {
    kvs_store *s = NULL;
    kvs_err err = {0};
    CHECK_OK(kvs_store_open(db, &s, &err), &err);
    if (!s) return;
    CHECK(sqlite3_exec(kvs_store_db(s),
                       "INSERT INTO runs(id, experiment, kind, config_path, config_text, config_hash,"
                       " git_rev, host, device, versions, kvsieve_version, started_at, ended_at,"
                       " status, pid, n_cells, n_done) VALUES"
                       "(1, 'quant', 'task', 'quant.lua', 'experiment{}', '11', NULL, 'host',"
                       " 'cpu: test', '{}', '0.1.0', '2026-01-01T00:00:00Z', NULL, 'done', 1, 1, 1)",
                       NULL, NULL, NULL) == SQLITE_OK);
    static const char *const caches[3] = {"", "q8_0", "q4_0"};
    static const double per64[3] = {64, 34, 18};
    static const char *const modes[2] = {"query_aware", "query_agnostic"};
    for (int ci = 0; ci < 3; ci++)
        for (int mo = 0; mo < 2; mo++)
            for (int v = 0; v < 3; v++) { /* full, snapkv 0.25, snapkv 0.5 */
                const double ratio = v == 0 ? 1.0 : v == 1 ? 0.25 : 0.5;
                for (int smp = 0; smp < 4; smp++) {
                    char def[512], key[65], sample[16], label[64];
                    snprintf(sample, sizeof sample, "s%d", smp);
                    snprintf(def, sizeof def,
                             "kvsieve-cell 2\nexperiment=quant\nkind=task\nmodel=m h%s%s\nsample=%s\n"
                             "mode=%s\nmethod=%s\nbudget=%g\n",
                             caches[ci][0] ? " kv_cache=" : "", caches[ci], sample, modes[mo],
                             v ? "snapkv" : "full", ratio);
                    kvs_sha256_hex(def, strlen(def), key);
                    snprintf(label, sizeof label, "%s%s", v ? "snapkv" : "full", mo ? " [query_agnostic]" : "");
                    kvs_cell_row c = {.key = key, .experiment = "quant", .kind = "task", .definition = def,
                                      .model = "m", .model_hash = "h", .dataset = "niah", .sample_id = sample,
                                      .shape = "-", .n_tokens = 1000, .seed = 1,
                                      .method = v ? "snapkv" : "full", .label = label, .params_json = "{}",
                                      .budget_ratio = ratio};
                    /* the needle: found on every sample by f16 full; fewer with fewer bits or tokens */
                    const double found = (smp < 4 - ci - (v == 1) - mo) ? 1.0 : 0.0;
                    const double mib = 100.0 * ratio * per64[ci] / 64;
                    kvs_score sc[2] = {{"needle", found}, {"kv_kept_mb", mib}};
                    kvs_result_row r = {.prediction = "x", .kv_bytes_after = (int64_t)(mib * 1048576),
                                        .n_scores = 2, .scores = sc};
                    CHECK_OK(kvs_store_put(s, 1, &c, &r, 1, &err), &err);
                }
            }
    kvs_store_close(s);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *t = malloc((size_t)n + 1);
    if (t && fread(t, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (t) t[n] = '\0';
    fclose(f);
    return t;
}

static char *render(kvs_store *s, kvs_report_format fmt, const char *name) {
    char out[256];
    snprintf(out, sizeof out, "%s/%s", dir, name);
    kvs_err err = {0};
    FILE *f = fopen(out, "w");
    CHECK(f != NULL);
    if (!f) return NULL;
    kvs_report_opts o = {NULL, 0, fmt, 1000, 20260};
    CHECK_OK(kvs_report_write(s, &o, f, &err), &err);
    fclose(f);
    return slurp(out);
}

static void check_config(void) {
    kvs_config cfg;
    kvs_err err = {0};
    const char *per_type =
        "for _, ct in ipairs({ 'f16', 'q8_0', 'q4_0' }) do\n"
        "  experiment { name = 'q', kind = 'task', backend = { embedded = true, cache = { type = ct } },\n"
        "    dataset = niah { lengths = { 512 }, depths = { 0.5 } }, methods = { 'full' }, budgets = { 0.5 },\n"
        "    metrics = { 'needle' } }\n"
        "end\n";
    memset(&cfg, 0, sizeof cfg);
    CHECK_OK(kvs_config_load_text("q.lua", per_type, NULL, 0, &cfg, &err), &err);
    CHECK_EQ_INT(cfg.n_experiments, 3);
    kvs_config_free(&cfg);
    const char *twice =
        "for _, ct in ipairs({ 'q8_0', 'q8_0' }) do\n"
        "  experiment { name = 'q', kind = 'task', backend = { embedded = true, cache = { type = ct } },\n"
        "    dataset = niah { lengths = { 512 }, depths = { 0.5 } }, methods = { 'full' }, budgets = { 0.5 },\n"
        "    metrics = { 'needle' } }\n"
        "end\n";
    memset(&cfg, 0, sizeof cfg);
    CHECK_FAILS(kvs_config_load_text("q.lua", twice, NULL, 0, &cfg, &err), KVS_ERR_INVALID, &err,
                "defined twice");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_eval_report_quant GOLDEN_DIR\n");
        return 2;
    }
    if (eval_tmpdir(dir, "rquant")) return 1;
    char db[256];
    snprintf(db, sizeof db, "%s/quant.db", dir);
    build_db(db);
    kvs_store *s = NULL;
    kvs_err err = {0};
    CHECK_OK(kvs_store_open(db, &s, &err), &err);
    if (!s) return kvs_test_finish("test_eval_report_quant");
    char *md = render(s, KVS_REPORT_MD, "quant.md");
    char gold[512];
    snprintf(gold, sizeof gold, "%s/report-quant.md", argv[1]);
    const char *upd = getenv("KVS_UPDATE_GOLDEN");
    if (md && upd && *upd == '1') {
        FILE *g = fopen(gold, "w");
        if (g) fputs(md, g), fclose(g);
        printf("rewrote %s\n", gold);
    }
    char *want = slurp(gold);
    CHECK_MSG(md && want && !strcmp(md, want), "%s/quant.md differs from %s (diff them)", dir, gold);
    /* the properties the golden file shows, checked by name too */
    CHECK(md && strstr(md, "| snapkv @q4_0 [query_agnostic] | 4 |"));
    CHECK(md && strstr(md, "| full @q4_0 | 28.125 | 0.5 | snapkv | 0.25 | 25.000 | 0.75 | 0.889 | +0.25 |"));
    CHECK(md && strstr(md, "| full @q8_0 | 53.125 | 0.75 | snapkv | 0.5 | 50.000 | 1 | 0.941 | +0.25 |"));
    CHECK(md && !strstr(md, "| full @q4_0 | 28.125 | 0.5 | snapkv | 0.5 |"));
    free(want);
    free(md);
    char *csv = render(s, KVS_REPORT_CSV, "quant.csv");
    CHECK(csv && strstr(csv, "quant,task,0.25,0,snapkv @q4_0,snapkv,needle,4,0.25,"));
    CHECK(csv && strstr(csv, "quant,task,0.25,0,snapkv,snapkv,needle,4,0.75,"));
    free(csv);
    kvs_store_close(s);
    check_config();
    eval_rmdir(dir);
    return kvs_test_finish("test_eval_report_quant");
}

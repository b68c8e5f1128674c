/* test_eval_report_decode.c -- the decode-speed table (eval/report_decode.c)
 * on hand-made rows whose numbers are worked out below: tokens/s as total
 * tokens / total time, the speed-up paired per prompt, the bytes-read
 * prediction, length classes, which cells take part (ignore_eos only, a
 * `full` on the same prompt needed), a table per KV cache type against the
 * f16 full, the JSON member, nothing for CSV, and
 * the gnuplot file (or the error naming gnuplot when it is missing); and
 * experiments/decode.lua loads as the study it describes. */
#include "eval_test_util.h"
#include "kvs_eval.h"
#include "test_util.h"

#include <sys/stat.h>

static char dir[64];

#define MB (1024.0 * 1024.0)

static const char *put_cache = ""; /* the cells' KV cache type ("": f16) */

/* One task cell + result: sample, method (full / flashcache), ratio, prompt
 * tokens, decode tokens and ms, KV bytes after, model bytes. */
static void put(kvs_store *s, const char *exp, const char *sample, int ignore_eos, int full,
                double ratio, int64_t n_tok, int64_t dec_tok, double dec_ms, double kv_after,
                int64_t model_bytes) {
    char key[65], def[512];
    snprintf(def, sizeof def, "exp=%s\nmodel=m h%s%s\nsample=%s\nmode=query_aware\nn_predict=64 %s\nmethod=%s\n"
             "budget=%g\n", exp, put_cache[0] ? " kv_cache=" : "", put_cache, sample,
             ignore_eos ? "stop=none ignore_eos=1" : "stop=newline", full ? "full" : "flashcache", ratio);
    kvs_sha256_hex(def, strlen(def), key);
    kvs_cell_row c = {0};
    c.key = key;
    c.experiment = exp;
    c.kind = "task";
    c.definition = def;
    c.model = "m";
    c.model_hash = "h";
    c.dataset = "niah";
    c.sample_id = sample;
    c.n_tokens = n_tok;
    c.method = full ? "full" : "flashcache";
    c.budget_ratio = full ? 1.0 : ratio;
    c.model_bytes = model_bytes;
    kvs_result_row r = {0};
    r.prediction = "x";
    r.decode_tokens = dec_tok;
    r.decode_ms = dec_ms;
    r.kv_bytes_before = (int64_t)(200 * MB);
    r.kv_bytes_after = (int64_t)kv_after;
    kvs_err err = {0};
    CHECK_OK(kvs_store_put(s, 0, &c, &r, 1, &err), &err);
}

static char *render(kvs_store *s, kvs_report_format fmt, const char *exp, int *n_rows) {
    char path[128];
    snprintf(path, sizeof path, "%s/out.txt", dir);
    FILE *f = fopen(path, "w+");
    if (!f) abort();
    kvs_report_opts o = {0};
    o.format = fmt;
    o.experiment = exp;
    kvs_err err = {0};
    CHECK_OK(kvs_report_decode(s, &o, f, n_rows, &err), &err);
    long n = ftell(f);
    rewind(f);
    char *t = calloc((size_t)n + 1, 1);
    if (!t) abort(); /* never NULL below */
    if (fread(t, 1, (size_t)n, f) != (size_t)n) t[0] = '\0';
    fclose(f);
    return t;
}

/* experiments/decode.lua loads as the study it documents. */
static void test_config(const char *golden) {
    char path[1200];
    snprintf(path, sizeof path, "%s/../../../experiments/decode.lua", golden);
    kvs_config cfg;
    kvs_err err = {0};
    CHECK_OK(kvs_config_load(path, NULL, 0, &cfg, &err), &err);
    if (err.code) return;
    CHECK_EQ_INT(cfg.n_experiments, 6); /* 2 models x 3 cache types */
    for (int i = 0; i < cfg.n_experiments; i++) {
        const kvs_experiment *e = &cfg.experiments[i];
        CHECK_EQ_INT(e->kind, KVS_KIND_TASK);
        CHECK_EQ_INT(e->ignore_eos, 1);
        CHECK_EQ_INT(e->variants_per_request, 1);
        CHECK_EQ_INT(e->n_lengths, 5);
        CHECK_EQ_INT(e->n_budgets, 6);
        CHECK_EQ_INT(e->n_variants, 2);
        CHECK_EQ_INT(e->backend_embedded, 1);
        CHECK_EQ_INT(e->in_flight, 1);
    }
    static const char *const ct[3] = {"f16", "q8_0", "q4_0"};
    for (int i = 0; i < cfg.n_experiments && i < 6; i++) {
        CHECK(!strcmp(cfg.experiments[i].model, i < 3 ? "qwen2.5-0.5b" : "gemma3-270m"));
        CHECK(!strcmp(cfg.experiments[i].backend_cache_k, ct[i % 3]) &&
              !strcmp(cfg.experiments[i].backend_cache_v, ct[i % 3]));
    }
    kvs_config_free(&cfg);
}

int main(int argc, char **argv) {
    if (argc > 1) test_config(argv[1]);
    if (eval_tmpdir(dir, "rdec")) return 1;
    char db[128];
    snprintf(db, sizeof db, "%s/r.db", dir);
    kvs_store *s = NULL;
    kvs_err err = {0};
    CHECK_OK(kvs_store_open(db, &s, &err), &err);
    if (!s) return kvs_test_finish("test_eval_report_decode");
    const int64_t W = (int64_t)(400 * MB);
    /* prompt A (2000 tokens): full 64 tok in 1000 ms (64 tok/s), KV 100 MiB; 0.5: 64 in 800 ms
     * (80 tok/s, x1.25), KV 50 MiB; predicted (400 + 100) / (400 + 50) = 1.1111
     * prompt B (1800 tokens): full 64 in 2000 ms (32 tok/s), KV 200 MiB; 0.5: 64 in 1000 ms
     * (64 tok/s, x2), KV 100 MiB; predicted 600 / 500 = 1.2
     * group 2K, 0.5: n 2, tokens 1900, KV 75 MiB, 128 tok / 1.8 s = 71.1 tok/s, speed-up mean
     * 1.625, predicted mean 1.15556, measured / predicted 1.40625 */
    put(s, "dec", "A", 1, 1, 1.0, 2000, 64, 1000, 100 * MB, W);
    put(s, "dec", "A", 1, 0, 0.5, 2000, 64, 800, 50 * MB, W);
    put(s, "dec", "B", 1, 1, 1.0, 1800, 64, 2000, 200 * MB, W);
    put(s, "dec", "B", 1, 0, 0.5, 1800, 64, 1000, 100 * MB, W);
    /* prompt C (8000 tokens: class 8K): full 10 in 100 ms, 0.5: 10 in 50 ms (x2); predicted
     * (400 + 300) / (400 + 100) = 1.4 */
    put(s, "dec", "C", 1, 1, 1.0, 8000, 10, 100, 300 * MB, W);
    put(s, "dec", "C", 1, 0, 0.5, 8000, 10, 50, 100 * MB, W);
    /* left out: a prompt without its full; cells decoded with the newline stop */
    put(s, "dec", "D", 1, 0, 0.5, 2000, 64, 100, 1 * MB, W);
    put(s, "other", "A", 0, 1, 1.0, 2000, 64, 1000, 100 * MB, W);
    put(s, "other", "A", 0, 0, 0.5, 2000, 64, 500, 50 * MB, W);

    int rows = -1;
    char *md = render(s, KVS_REPORT_MD, NULL, &rows);
    CHECK_EQ_INT(rows, 4); /* 2K full, 2K 0.5, 8K full, 8K 0.5 */
    CHECK_MSG(strstr(md, "## decode speed: dec (m; weights 400.0 MiB)"), "title: %s", md);
    CHECK_MSG(strstr(md, "| 2K | 1900 | 1 (full) | 2 | 150.00 | 42.7 | 1.000 [1.000, 1.000] | "
                               "1.000 | 1.000 |"),
              "2K full row (128 tok / 3 s = 42.7 tok/s): %s", md);
    CHECK_MSG(strstr(md, "| 2K | 1900 | 0.5 | 2 | 75.00 | 71.1 | 1.625 [1.250, 2.000] | 1.156 | "
                               "1.406 |"),
              "2K 0.5 row: %s", md);
    CHECK_MSG(strstr(md, "| 8K | 8000 | 0.5 | 1 | 100.00 | 200.0 | 2.000 [2.000, 2.000] | 1.400 | "
                               "1.429 |"),
              "8K 0.5 row: %s", md);
    CHECK_MSG(!strstr(md, "other"), "cells without ignore_eos are not in the table");
    /* order: 2K before 8K, full before the ratios */
    CHECK(strstr(md, "| 2K | 1900 | 1 (full)") < strstr(md, "| 2K | 1900 | 0.5") &&
          strstr(md, "| 2K | 1900 | 0.5") < strstr(md, "| 8K |"));
    free(md);

    char *js = render(s, KVS_REPORT_JSON, "dec", &rows);
    CHECK_MSG(!strncmp(js, ", \"decode\": [", 13), "JSON member: %s", js);
    CHECK_MSG(strstr(js, "\"length_class\": 8192, \"prompt_tokens\": 8000, \"budget_ratio\": 0.5"),
              "JSON row: %s", js);
    CHECK_MSG(strstr(js, "\"speedup\": 1.625"), "JSON speed-up: %s", js);
    free(js);
    char *csv = render(s, KVS_REPORT_CSV, NULL, &rows);
    CHECK_MSG(csv[0] == '\0', "nothing for CSV: %s", csv);
    free(csv);
    char *none = render(s, KVS_REPORT_MD, "other", &rows);
    CHECK(none[0] == '\0' && rows == 0);
    free(none);

    /* the plot */
    kvs_report_opts o = {0};
    char plot[128], want[160];
    snprintf(plot, sizeof plot, "%s/p.svg", dir);
    snprintf(want, sizeof want, "%s/p-dec.svg", dir);
    int nf = -1;
    int have_gnuplot = system("command -v gnuplot >/dev/null 2>&1") == 0;
    kvs_status rc = kvs_report_decode_plot(s, &o, plot, &nf, &err);
    if (have_gnuplot) {
        CHECK_OK(rc, &err);
        CHECK_EQ_INT(nf, 1);
        struct stat sb;
        CHECK_MSG(stat(want, &sb) == 0 && sb.st_size > 500, "plot %s written", want);
    } else {
        CHECK_MSG(rc == KVS_ERR_UNSUPPORTED && strstr(err.msg, "gnuplot"), "%s", err.msg);
    }
    CHECK_FAILS(kvs_report_decode_plot(s, &o, "x.pdf", &nf, &err), KVS_ERR_INVALID, &err, ".svg");

    /* cache types: a q8_0 table of its own, against the f16 full of the prompt. f16 full: 64 tok
     * in 1000 ms, KV 100 MiB. q8_0 full: 64 in 800 ms (80 tok/s, x1.25), KV 53.125 MiB, predicted
     * 500 / 453.125 = 1.1034, ratio 1.1328; q8_0 at 0.5: 64 in 625 ms (102.4 tok/s, x1.6), KV
     * 26.5625 MiB, predicted 500 / 426.5625 = 1.1722, ratio 1.3650 */
    put(s, "decq", "A", 1, 1, 1.0, 2000, 64, 1000, 100 * MB, W);
    put_cache = "q8_0";
    put(s, "decq", "A", 1, 1, 1.0, 2000, 64, 800, 53.125 * MB, W);
    put(s, "decq", "A", 1, 0, 0.5, 2000, 64, 625, 26.5625 * MB, W);
    put_cache = "";
    char *mq = render(s, KVS_REPORT_MD, "decq", &rows);
    CHECK_EQ_INT(rows, 3);
    CHECK_MSG(strstr(mq, "## decode speed: decq (m; weights 400.0 MiB)") &&
                  strstr(mq, "## decode speed: decq (m; KV cache q8_0; weights 400.0 MiB)"),
              "a table per cache type: %s", mq);
    CHECK_MSG(strstr(mq, "| 2K | 2000 | 1 (full) | 1 | 53.12 | 80.0 | 1.250 [1.250, 1.250] | 1.103 | 1.133 |"),
              "q8_0 full row: %s", mq);
    CHECK_MSG(strstr(mq, "| 2K | 2000 | 0.5 | 1 | 26.56 | 102.4 | 1.600 [1.600, 1.600] | 1.172 | 1.365 |"),
              "q8_0 0.5 row: %s", mq);
    CHECK(strstr(mq, "KV cache q8_0") > strstr(mq, "| 2K | 2000 | 1 (full) | 1 | 100.00 |"));
    free(mq);
    char *jq = render(s, KVS_REPORT_JSON, "decq", &rows);
    CHECK_MSG(strstr(jq, "\"model\": \"m\", \"cache_type\": \"q8_0\"") &&
                  strstr(jq, "\"model\": \"m\", \"cache_type\": \"f16\""),
              "JSON cache types: %s", jq);
    free(jq);
    kvs_store_close(s);
    eval_rmdir(dir);
    return kvs_test_finish("test_eval_report_decode");
}

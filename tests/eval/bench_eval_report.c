/* bench_eval_report.c -- benchmark (prints, asserts nothing): time of a
 * Markdown report (bootstrap 1000 resamples) over a database of ROWS
 * results (8 methods x 3 budgets, 4 scores each, i.e. 4 x ROWS score rows).
 * usage: bench_eval_report [ROWS]   (default 100000) */
#include "eval_test_util.h"
#include "kvs_eval.h"

#include <sqlite3.h>

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 100000;
    if (n <= 0) return 2;
    char dir[64], db[128];
    if (eval_tmpdir(dir, "benchrep")) return 1;
    snprintf(db, sizeof db, "%s/bench.db", dir);
    kvs_store *s = NULL;
    kvs_err err = {0};
    if (kvs_store_open(db, &s, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const int batch = 1000;
    kvs_cell_row *c = calloc(batch, sizeof *c);
    kvs_result_row *r = calloc(batch, sizeof *r);
    char(*keys)[65] = calloc(batch, 65);
    kvs_score(*sc)[4] = calloc(batch, sizeof *sc);
    double budgets[3] = {0.1, 0.2, 0.5};
    uint64_t rng = 1;
    double t0 = kvs_now_ms();
    for (int i = 0; i < n; i += batch) {
        int k = n - i < batch ? n - i : batch;
        for (int j = 0; j < k; j++) {
            int id = i + j, m = id % 8, b = (id / 8) % 3;
            const kvs_method *meth = kvs_method_at(m);
            char def[64];
            snprintf(def, sizeof def, "cell-%d", id);
            kvs_sha256_hex(def, strlen(def), keys[j]);
            c[j] = (kvs_cell_row){.key = keys[j], .experiment = "bench", .kind = "fidelity",
                                  .definition = keys[j], .dataset = "synthetic", .sample_id = "s",
                                  .shape = "tiny", .n_tokens = 1024, .seed = id / 24,
                                  .method = meth->name, .label = meth->name, .params_json = "{}",
                                  .budget_ratio = budgets[b]};
            double e = 0.3 * (1 - budgets[b]) * (m + 1) / 8 + 0.05 * kvs_rng_uniform(&rng);
            sc[j][0] = (kvs_score){"mean_rel_err", e};
            sc[j][1] = (kvs_score){"max_rel_err", 2 * e};
            sc[j][2] = (kvs_score){"retention", 1 - e};
            sc[j][3] = (kvs_score){"compress_ms", 1 + kvs_rng_uniform(&rng)};
            r[j] = (kvs_result_row){.compress_ms = sc[j][3].value, .n_scores = 4, .scores = sc[j]};
        }
        if (kvs_store_put(s, 0, c, r, k, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
    }
    double t1 = kvs_now_ms();
    printf("bench_eval_report: built %d results (%d score rows) in %.0f ms\n", n, 4 * n, t1 - t0);
    FILE *devnull = fopen("/dev/null", "w");
    kvs_report_opts o = {NULL, 0, KVS_REPORT_MD, 1000, 20260};
    for (int rep = 0; rep < 3; rep++) {
        double a = kvs_now_ms();
        if (kvs_report_write(s, &o, devnull, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        printf("report md over %d results, bootstrap 1000: %.0f ms\n", n, kvs_now_ms() - a);
    }
    o.format = KVS_REPORT_CSV;
    double a = kvs_now_ms();
    kvs_report_write(s, &o, devnull, &err);
    printf("report csv: %.0f ms\n", kvs_now_ms() - a);
    fclose(devnull);
    free(c);
    free(r);
    free(keys);
    free(sc);
    kvs_store_close(s);
    eval_rmdir(dir);
    return 0;
}

/* bench_eval_store.c -- benchmark (prints, asserts nothing): result rows
 * written per second by kvs_store_put, batched (one transaction per batch)
 * and one transaction per row (what the runner does per finished cell).
 * usage: bench_eval_store [ROWS] [BATCH]   (defaults 100000, 1000) */
#include "eval_test_util.h"
#include "kvs_eval.h"

#include <sqlite3.h>

static double write_rows(kvs_store *s, const char *tag, int n, int batch) {
    kvs_cell_row *c = calloc((size_t)batch, sizeof *c);
    kvs_result_row *r = calloc((size_t)batch, sizeof *r);
    char(*keys)[80] = calloc((size_t)batch, 80);
    kvs_score sc[4] = {{"mean_rel_err", 0.1}, {"max_rel_err", 0.3}, {"retention", 0.9}, {"compress_ms", 1.5}};
    kvs_err err = {0};
    double t0 = kvs_now_ms();
    for (int i = 0; i < n; i += batch) {
        int k = n - i < batch ? n - i : batch;
        for (int j = 0; j < k; j++) {
            char def[64];
            snprintf(def, sizeof def, "%s-%d", tag, i + j);
            kvs_sha256_hex(def, strlen(def), keys[j]); /* real 64-hex keys */
            c[j] = (kvs_cell_row){.key = keys[j], .experiment = tag, .kind = "fidelity",
                                  .definition = keys[j], .dataset = "synthetic", .sample_id = "seed=1",
                                  .shape = "qwen2.5-vl-7b", .n_tokens = 4096, .seed = i + j,
                                  .method = "flashcache", .label = "flashcache gamma=0.1",
                                  .params_json = "{\"gamma\":\"0.1\",\"dba\":\"true\"}", .budget_ratio = 0.2};
            r[j] = (kvs_result_row){.compress_ms = 1.5, .kv_bytes_before = 1 << 20,
                                    .kv_bytes_after = 1 << 18, .n_scores = 4, .scores = sc};
        }
        if (kvs_store_put(s, 0, c, r, k, &err)) {
            fprintf(stderr, "bench: %s\n", err.msg);
            exit(1);
        }
    }
    double ms = kvs_now_ms() - t0;
    free(c);
    free(r);
    free(keys);
    return ms;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 100000;
    int batch = argc > 2 ? atoi(argv[2]) : 1000;
    if (n <= 0 || batch <= 0) return 2;
    char dir[64], db[128];
    if (eval_tmpdir(dir, "bench")) return 1;
    snprintf(db, sizeof db, "%s/bench.db", dir);
    kvs_store *s = NULL;
    kvs_err err = {0};
    if (kvs_store_open(db, &s, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    printf("bench_eval_store: sqlite %s, WAL, synchronous=NORMAL, database in %s\n", sqlite3_libversion(), dir);
    double ms = write_rows(s, "batched", n, batch);
    printf("batched   : %d result rows (+4 scores each) in batches of %d: %.0f ms, %.0f rows/s\n", n,
           batch, ms, n / (ms / 1000));
    int n1 = n / 10 > 0 ? n / 10 : 1;
    ms = write_rows(s, "single", n1, 1);
    printf("per-cell  : %d result rows, one transaction each: %.0f ms, %.0f rows/s\n", n1, ms, n1 / (ms / 1000));
    kvs_store_close(s);
    eval_rmdir(dir);
    return 0;
}

/* test_eval_paired.c -- the report's paired comparisons and the needle
 * heatmap on a small synthetic task store built here.
 *
 * Store: experiment "needles" (kind task, dataset niah), 30 samples keyed as
 * datasets/needle.c keys them ("L<len>-D<depth>-S<k>", lengths 512 and 1024,
 * depths 0, 0.5, 1, k = 0..4; sample i in that order), score `needle` (0/1):
 *   full 1 everywhere (budget 1); at budget 0.2:
 *   flashcache 0 on samples {0, 1}, snapkv 0 on {1..9}, random 0 on {0..15}.
 * So (hand-checked; b = only the method right, c = only the other right):
 *   flashcache vs full   b 0 c 2   p = 2 * 1/4          = 0.5
 *   snapkv vs full       b 0 c 9   p = 2 / 2^9          = 0.00390625
 *   random vs full       b 0 c 16  p = 2 / 2^16         = 3.0517578125e-05
 *   flashcache vs snapkv b 8 c 1   p = 2 * 10 / 2^9     = 0.0390625 (best other
 *                                  of each other: one test)
 *   random vs flashcache b 0 c 14  p = 2 / 2^14         = 0.0001220703125
 * Holm over these 5 tests: 3.05e-5 * 5 = 1.52587890625e-4, 1.2207e-4 * 4 =
 * 4.8828125e-4, 0.00390625 * 3 = 0.01171875, 0.0390625 * 2 = 0.078125,
 * 0.5 * 1 = 0.5: significant random vs full, random vs flashcache, snapkv
 * vs full; not flashcache vs snapkv (0.078) nor flashcache vs full.
 * MDE of flashcache vs snapkv: p_d = 9/30, 2.8015852181 * sqrt(0.3 / 30) =
 * 0.28015852181. argv[1] is the golden folder (unused). */
#include "eval_test_util.h"
#include "kvs_eval.h"
#include "test_util.h"

#include <sqlite3.h>
#include <sys/stat.h>

static char dir[64];

static int zero_of(int m, int i) {
    switch (m) {
    case 1: return i <= 1;           /* flashcache */
    case 2: return i >= 1 && i <= 9; /* snapkv */
    case 3: return i <= 15;          /* random */
    default: return 0;               /* full */
    }
}

static void build_db(const char *db) {
    kvs_store *s = NULL;
    kvs_err err = {0};
    CHECK_OK(kvs_store_open(db, &s, &err), &err);
    if (!s) return;
    CHECK(sqlite3_exec(kvs_store_db(s),
                       "INSERT INTO runs(id, experiment, kind, config_path, config_text, config_hash,"
                       " git_rev, host, device, versions, kvsieve_version, started_at, ended_at,"
                       " status, pid, n_cells, n_done) VALUES"
                       "(1, 'needles', 'task', 'n.lua', 'experiment{}', '12', NULL, 'host',"
                       " 'cpu: test', '{}', '0.1.0', '2026-01-01T00:00:00Z', NULL, 'done', 1, 120, 120)",
                       NULL, NULL, NULL) == SQLITE_OK);
    const char *methods[4] = {"full", "flashcache", "snapkv", "random"};
    const int lens[2] = {512, 1024};
    const double deps[3] = {0, 0.5, 1};
    for (int m = 0; m < 4; m++)
        for (int i = 0; i < 30; i++) {
            char key[64], sample[64];
            snprintf(key, sizeof key, "k-%d-%d", m, i);
            snprintf(sample, sizeof sample, "L%d-D%g-S%d", lens[i / 15], deps[(i / 5) % 3], i % 5);
            kvs_cell_row c = {.key = key, .experiment = "needles", .kind = "task",
                              .definition = key, .dataset = "niah", .sample_id = sample,
                              .shape = "-", .n_tokens = lens[i / 15], .seed = 0,
                              .method = methods[m], .label = methods[m], .params_json = "{}",
                              .budget_ratio = m == 0 ? 1.0 : 0.2};
            kvs_score sc[2] = {{"needle", zero_of(m, i) ? 0.0 : 1.0},
                               {"compress_ms", 1.0 + m + 0.01 * i}};
            kvs_result_row r = {.compress_ms = sc[1].value, .n_scores = 2, .scores = sc};
            CHECK_OK(kvs_store_put(s, 1, &c, &r, 1, &err), &err);
        }
    kvs_store_close(s);
}

static char *report(kvs_store *s, kvs_report_format fmt, const char *name) {
    char out[256];
    snprintf(out, sizeof out, "%s/%s", dir, name);
    FILE *f = fopen(out, "w+");
    CHECK(f != NULL);
    if (!f) return NULL;
    kvs_report_opts o = {NULL, 0, fmt, 1000, 20260};
    kvs_err err = {0};
    CHECK_OK(kvs_report_write(s, &o, f, &err), &err);
    long n = ftell(f);
    rewind(f);
    char *t = malloc((size_t)n + 1);
    if (t && fread(t, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (t) t[n] = '\0';
    fclose(f);
    return t;
}

#define HAS(text, needle)                                                                  \
    CHECK_MSG((text) && strstr((text), (needle)), "missing \"%s\" in:\n%s", (needle),      \
              (text) ? (text) : "(none)")

static void test_tables(kvs_store *s) {
    char *csv = report(s, KVS_REPORT_CSV, "r.csv");
    /* experiment,budget_ratio,budget_tokens,metric,variant,vs,vs_kind,pairs,binary,delta,
     * ci_lo,ci_hi,b,c,p,p_holm,significant,mde,table_mde */
    HAS(csv, "needles,0.2,0,needle,flashcache,full,full,30,1,-0.0666666666667,");
    HAS(csv, ",0,2,0.5,0.5,0,");
    HAS(csv, "needles,0.2,0,needle,snapkv,full,full,30,1,-0.3,");
    HAS(csv, ",0,9,0.00390625,0.01171875,1,");
    HAS(csv, "needles,0.2,0,needle,random,full,full,30,1,-0.533333333333,");
    HAS(csv, ",0,16,3.0517578125e-05,0.000152587890625,1,");
    HAS(csv, "needles,0.2,0,needle,flashcache,snapkv,best_other,30,1,0.233333333333,");
    HAS(csv, ",8,1,0.0390625,0.078125,0,0.280158521811,");
    HAS(csv, "needles,0.2,0,needle,snapkv,flashcache,best_other,30,1,-0.233333333333,");
    HAS(csv, ",1,8,0.0390625,0.078125,0,0.280158521811,"); /* the same test, mirrored */
    HAS(csv, "needles,0.2,0,needle,random,flashcache,best_other,30,1,-0.466666666667,");
    HAS(csv, ",0,14,0.0001220703125,0.00048828125,1,");
    /* the CIs contain their point estimates */
    const char *q = csv ? strstr(csv, "\nexperiment,budget_ratio") : NULL;
    CHECK(q != NULL);
    int rows = 0;
    for (const char *line = q ? strchr(q + 1, '\n') : NULL; line && line[1]; line = strchr(line + 1, '\n')) {
        double delta, lo, hi;
        const char *f = line + 1;
        for (int k = 0; k < 9 && f; k++) f = strchr(f, ',') ? strchr(f, ',') + 1 : NULL;
        if (!f || sscanf(f, "%lf,%lf,%lf", &delta, &lo, &hi) != 3) break;
        CHECK_MSG(lo <= delta && delta <= hi, "CI [%g, %g] misses %g", lo, hi, delta);
        rows++;
    }
    CHECK_EQ_INT(rows, 6); /* 3 vs full + 3 vs best other */
    free(csv);
    char *md = report(s, KVS_REPORT_MD, "r.md");
    HAS(md, "Paired differences in needle (budget 0.2):");
    HAS(md, "| random | full | 30 | -0.5333 [");
    HAS(md, "| 0 / 16 | 3.1e-05 | 0.0002 * |");
    HAS(md, "| flashcache | best other: snapkv | 30 | +0.2333 [");
    HAS(md, "| 8 / 1 | 0.0391 | 0.0781 | 0.2802 |"); /* not marked */
    HAS(md, "Holm–Bonferroni across this table's 5 distinct comparisons");
    HAS(md, "exact McNemar");
    HAS(md, "(z₀.₉₇₅ + z₀.₈) √(p_d / n)");
    /* mean discordance over the 6 rows: (16 + 14 + 9 + 9 + 2 + 9) / 6 / 30 = 0.32778;
     * 2.8015852181 * sqrt(0.32778 / 30) = 0.29284 */
    HAS(md, "mean p_d = 0.3278 and n = 30: **MDE = 0.2928**");
    free(md);
    char *js = report(s, KVS_REPORT_JSON, "r.json");
    HAS(js, "\"paired\": [");
    HAS(js, "\"variant\": \"flashcache\", \"vs\": \"snapkv\", \"vs_kind\": \"best_other\"");
    free(js);
    char *tex = report(s, KVS_REPORT_LATEX, "r.tex");
    HAS(tex, "paired differences in needle");
    HAS(tex, "Holm--Bonferroni over 5 comparisons");
    free(tex);
}

static void test_heatmap(kvs_store *s) {
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        printf("SKIP heatmap: gnuplot is not installed (scripts/setup.sh installs gnuplot-nox)\n");
        return;
    }
    char svg[256], hm[256];
    snprintf(svg, sizeof svg, "%s/p.svg", dir);
    snprintf(hm, sizeof hm, "%s/p-heatmap.svg", dir);
    kvs_report_opts o = {NULL, 0, KVS_REPORT_MD, 1000, 20260};
    kvs_err err = {0};
    CHECK_OK(kvs_report_plot(s, &o, svg, &err), &err);
    struct stat sb;
    CHECK_MSG(stat(hm, &sb) == 0 && sb.st_size > 0, "no heatmap at %s", hm);
    FILE *f = fopen(hm, "r");
    char *t = NULL;
    if (f) {
        t = malloc((size_t)sb.st_size + 1);
        size_t n = t ? fread(t, 1, (size_t)sb.st_size, f) : 0;
        if (t) t[n] = '\0';
        fclose(f);
    }
    HAS(t, "<svg");
    const char *names[4] = {"full", "flashcache @ 0.2", "snapkv @ 0.2", "random @ 0.2"};
    for (int i = 0; i < 4; i++) HAS(t, names[i]);
    HAS(t, "needle depth");
    free(t);
}

int main(void) {
    if (eval_tmpdir(dir, "paired")) return 1;
    char db[256];
    snprintf(db, sizeof db, "%s/n.db", dir);
    build_db(db);
    kvs_store *s = NULL;
    kvs_err err = {0};
    CHECK_OK(kvs_store_open(db, &s, &err), &err);
    if (s) {
        test_tables(s);
        test_heatmap(s);
        kvs_store_close(s);
    }
    eval_rmdir(dir);
    return kvs_test_finish("test_eval_paired");
}

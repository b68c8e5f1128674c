/*
 * task.c -- the `task` kind: prompts from a dataset, completions from a
 * backend over HTTP (one request per sample and mode with all its pending
 * variants), scores, storage, resume.
 *
 * What it is: dataset loading (datasets/), the grid and its exact keys, the
 * backend (embedded `kvsieve serve` child or URLs), model identity (SHA-256
 * of the GGUF file when the server's /v1/models names a readable local file
 * of the advertised size, else of the metadata it reports), the request
 * window over eval/client, scoring with eval/metrics and one store
 * transaction per answered request.
 * What it is not: no HTTP details (client.c), no process handling
 * (embedded.c), no compression (the backend does it).
 *
 * Scores stored per cell: each configured metric, and for the report's
 * head-to-head columns prefill_ms, compress_ms, decode_tok_s and kv_kept_mb
 * (KV bytes after compression, MiB). RULER samples: metric "ruler" is each
 * sample's own metric, stored again under the task's name, plus
 * prompt_tokens (the generator's count). Samples with answer spans send
 * kv_spans; a variant's span_kept becomes answer_kept_l<L> (per layer, mean
 * over spans) and answer_kept (mean over layers).
 * The cell row records the weight bytes a
 * decode step reads (cells.model_bytes: /v1/models meta.step_bytes, else the
 * file's size; what a step reads besides the KV, for the decode-speed study
 * of report_decode.c). Under --shard I/N only the
 * request units of shard I run (kvs_shard_of).
 * ruler{} is generated after the backend is up: its lengths are counted by
 * the backend's /tokenize. Its cells generate each task's own tokens
 * (n_predict caps them) without stop strings ("stop=none" in the key); the
 * other datasets stop at a newline. Images (MileBench): a sample's images
 * are read (and checked against the bytes the dataset hash names) when its
 * request is built and sent as multimodal_data, one per media marker of the
 * prompt, to a url backend of the kvsieve API (a multimodal one: kvsieve-hf;
 * `kvsieve serve` answers 400 naming the field). The embedded backend and
 * api = "openai" take text only, so there a dataset with image samples is
 * refused before anything starts.
 */
#include "kvs_task.h"

#include "kvs_client.h"
#include "kvs_datasets.h"
#include "kvs_metrics.h"

#include <assert.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Variants per request at most: the embedded server is started with --batch
 * MAX_PER_REQUEST so that a sample's whole grid (every preset at four ratios)
 * shares one prefill and one observation per method; a URL backend gets the
 * server's default batch, URL_PER_REQUEST, unless variants_per_request says more. */
#define MAX_PER_REQUEST 160
#define URL_PER_REQUEST 64

typedef struct {
    char key[65];
    char def[1400];
    int mode, sample, variant, budget; /* budget -1: full */
} tcell;

/* One request: the pending cells of one (mode, sample), or of one sample in
 * both settings (both: the backend takes compress_suffix), at most per_request. */
typedef struct {
    int mode, sample;
    int both; /* cells of both modes: the query-agnostic prompt, query-aware cells with compress_suffix */
    int n;
    int cells[MAX_PER_REQUEST]; /* indices into the cell array */
    int state; /* 0 waiting, 1 in flight, 2 done */
} unit;

typedef struct {
    kvs_store *s;
    const kvs_experiment *e;
    const kvs_run_opts *o;
    const kvs_dataset *d;
    int64_t run_id;
    tcell *cells;
    unit *units;
    kvs_metric_fn *metric_fns; /* [e->n_metrics] */
    const char *model_name, *model_hash, *tmpl_name, *tmpl_hash;
    double model_bytes; /* weights a decode step reads (/v1/models meta.step_bytes, else meta.size); < 0 unknown */
    int n_new, n_flight_cells;
    /* where the time goes (server side, summed over answered requests): one
     * prefill per request, compress per variant (run one after another), and
     * decode as the longest variant of a request (its variants share batched
     * steps) */
    double t_prefill, t_compress, t_decode;
    int n_requests;
    int sent_spans; /* kv_spans are sent (kvsieve API) */
    kvs_status rc;
    kvs_err err;
    /* progress */
    double t0, last;
    int total, shown;
} run_ctx;

/* ---- model identity ------------------------------------------------------- */

/* Declared in kvs_eval.h (SHA-256 section): `kvsieve bench` hashes its model with it too. */
kvs_status kvs_sha256_file(const char *path, char out[65], kvs_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return kvs_errorf(err, KVS_ERR_IO, "%s: cannot open for hashing", path);
    kvs_sha256_ctx c;
    kvs_sha256_init(&c);
    unsigned char *buf = malloc(1 << 20);
    if (!buf) {
        fclose(f);
        return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    }
    size_t n;
    while ((n = fread(buf, 1, 1 << 20, f)) > 0) kvs_sha256_update(&c, buf, n);
    int bad = ferror(f);
    fclose(f);
    free(buf);
    if (bad) return kvs_errorf(err, KVS_ERR_IO, "%s: read error while hashing", path);
    uint8_t d[32];
    kvs_sha256_final(&c, d);
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
    return KVS_OK;
}

/* name and hash of the model a backend serves (GET /v1/models). */
static kvs_status model_identity(const char *url, char *name, size_t name_n, char *hash,
                                 size_t hash_n, char *ident, size_t ident_n, double *file_bytes,
                                 char kv_cache[32], int *compress_suffix, kvs_err *err) {
    *file_bytes = -1;
    *compress_suffix = 0;
    kv_cache[0] = 0;
    long status = 0;
    char *body = NULL;
    kvs_status rc = kvs_http_get(url, "/v1/models", 30, &status, &body, err);
    if (rc) return kvs_err_prefix(err, "asking the backend which model it serves");
    cJSON *root = cJSON_Parse(body ? body : "");
    const cJSON *m0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "data"), 0);
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(m0, "id");
    if (status != 200 || !cJSON_IsString(id)) {
        rc = kvs_errorf(err, KVS_ERR_FORMAT, "%s/v1/models: HTTP %ld without data[0].id: %.200s",
                        url, status, body ? body : "");
        goto done;
    }
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(m0, "meta");
    const cJSON *kf, *fields = cJSON_GetObjectItemCaseSensitive(m0, "kv_compression_fields");
    cJSON_ArrayForEach(kf, fields) *compress_suffix |= cJSON_IsString(kf) && !strcmp(kf->valuestring, "compress_suffix");
    const cJSON *mname = cJSON_GetObjectItemCaseSensitive(meta, "name");
    const cJSON *path = cJSON_GetObjectItemCaseSensitive(meta, "path");
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(meta, "size");
    snprintf(name, name_n, "%s", cJSON_IsString(mname) && mname->valuestring[0] ? mname->valuestring
                                                                                 : id->valuestring);
    struct stat sb;
    char hex[65];
    if (cJSON_IsString(path) && cJSON_IsNumber(size) && stat(path->valuestring, &sb) == 0 &&
        (double)sb.st_size == size->valuedouble) {
        if ((rc = kvs_sha256_file(path->valuestring, hex, err))) goto done;
        snprintf(hash, hash_n, "sha256:%s", hex);
    } else {
        /* a remote file: what the server says about it */
        char *txt = meta ? cJSON_PrintUnformatted(meta) : NULL;
        const char *s = txt ? txt : id->valuestring;
        kvs_sha256_hex(s, strlen(s), hex);
        snprintf(hash, hash_n, "meta-sha256:%s", hex);
        free(txt);
    }
    /* the KV cache type the server decodes with ("f16", "q4_0", "q8_0/q4_0" for K/V): outputs
     * depend on it, so a cell key carries it where it is not the default f16 */
    const cJSON *ct = meta ? cJSON_GetObjectItemCaseSensitive(meta, "cache_type") : NULL;
    if (cJSON_IsString(ct) && strcmp(ct->valuestring, "f16") != 0) snprintf(kv_cache, 32, "%s", ct->valuestring);
    snprintf(ident, ident_n, "%s size=%.0f%s%s", name, cJSON_IsNumber(size) ? size->valuedouble : -1.0,
             kv_cache[0] ? " kv_cache=" : "", kv_cache);
    /* what a decode step reads: the server's step_bytes where it reports one (kvsieve serve: the file's
     * tensors less an untied embedding table), else the file's size */
    const cJSON *step = meta ? cJSON_GetObjectItemCaseSensitive(meta, "step_bytes") : NULL;
    if (cJSON_IsNumber(step) && step->valuedouble > 0) *file_bytes = step->valuedouble;
    else if (cJSON_IsNumber(size) && size->valuedouble > 0) *file_bytes = size->valuedouble;
done:
    cJSON_Delete(root);
    free(body);
    return rc;
}

/* Tokens generated for a sample: ruler samples carry their task's own
 * (n_predict, when given, caps it); the others take n_predict. */
static int sample_n_predict(const kvs_experiment *e, const kvs_sample *sm) {
    if (sm->task && sm->max_tokens > 0)
        return e->n_predict > 0 && e->n_predict < sm->max_tokens ? e->n_predict : sm->max_tokens;
    return e->n_predict;
}

/* RULER generates without stop strings; the other datasets stop at a newline
 * (their answers are one line). Part of the cell key. */
static int stops_at_newline(const kvs_experiment *e) {
    return strcmp(e->dataset, "ruler") != 0 && !e->ignore_eos; /* ignore_eos: exactly n_predict tokens */
}

/* ---- the grid -------------------------------------------------------------- */

static void budget_text(const kvs_budget *b, char *out, size_t n) {
    if (b->tokens > 0)
        snprintf(out, n, "tokens:%lld", (long long)b->tokens);
    else
        snprintf(out, n, "ratio:%.17g", b->ratio);
}

static kvs_status expand(const kvs_experiment *e, const kvs_dataset *d, const char *model_name,
                         const char *model_hash, const char *kv_cache, const char *tmpl, const char *tmpl_hash,
                         tcell **out, int *n_out, kvs_err *err) {
    *out = NULL;
    *n_out = 0;
    int64_t per = 0;
    for (int v = 0; v < e->n_variants; v++)
        per += e->variants[v].method == &kvs_method_full ? 1 : e->n_budgets;
    int64_t total = per * d->n_samples * e->n_modes;
    if (total > 5000000)
        return kvs_errorf(err, KVS_ERR_INVALID, "experiment '%s': %lld cells; at most 5,000,000",
                          e->name, (long long)total);
    if (total == 0) return KVS_OK;
    tcell *c = calloc((size_t)total, sizeof *c);
    if (!c) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory for %lld cells", (long long)total);
    int64_t k = 0;
    for (int m = 0; m < e->n_modes; m++)
        for (int si = 0; si < d->n_samples; si++)
            for (int v = 0; v < e->n_variants; v++) {
                const kvs_variant *var = &e->variants[v];
                int full = var->method == &kvs_method_full;
                for (int b = 0; b < (full ? 1 : e->n_budgets); b++) {
                    tcell *x = &c[k++];
                    x->mode = m, x->sample = si, x->variant = v, x->budget = full ? -1 : b;
                    char bt[64] = "all";
                    if (!full) budget_text(&e->budgets[b], bt, sizeof bt);
                    int len = snprintf(
                        x->def, sizeof x->def,
                        "kvsieve-cell 2\nexperiment=%s\nkind=task\nmodel=%s %s%s%s\n"
                        "dataset=%s version=%s sha256=%s\nsample=%s\ntemplate=%s sha256=%s\n"
                        "mode=%s\nn_predict=%d stop=%s%s\nmethod=%s\nparams=%s\nbudget=%s\n",
                        e->name, model_name, model_hash, kv_cache[0] ? " kv_cache=" : "", kv_cache,
                        d->name, d->version, d->hash,
                        d->samples[si].id, tmpl, tmpl_hash,
                        kvs_prompt_mode_name((kvs_prompt_mode)e->modes[m]),
                        sample_n_predict(e, &d->samples[si]), stops_at_newline(e) ? "newline" : "none",
                        e->ignore_eos ? " ignore_eos=1" : "",
                        var->method->name, var->params_json, bt);
                    if (len < 0 || (size_t)len >= sizeof x->def) {
                        free(c);
                        return kvs_errorf(err, KVS_ERR_INVALID,
                                          "sample '%.100s': cell definition longer than %zu bytes "
                                          "(a very long sample id?)",
                                          d->samples[si].id, sizeof x->def);
                    }
                    kvs_sha256_hex(x->def, (size_t)len, x->key);
                }
            }
    *out = c;
    *n_out = (int)total;
    return KVS_OK;
}

/* ---- dataset --------------------------------------------------------------- */

/* The token counter of ruler{}: the backend's /tokenize. */
static kvs_status count_tokens(void *ctx, const char *text, size_t n, int64_t *tokens, kvs_err *err) {
    return kvs_http_count_tokens((const char *)ctx, text, n, 120, tokens, err);
}

/* ruler{} needs the backend (its tokenizer counts the lengths): url is the
 * backend's, NULL for the other datasets. */
static kvs_status load_dataset(const kvs_config *cfg, const kvs_experiment *e, const char *url,
                               kvs_dataset **d, kvs_err *err) {
    kvs_status rc;
    *d = NULL;
    if (!strcmp(e->dataset, "ruler")) {
        int64_t *lens = malloc(sizeof *lens * (size_t)e->n_lengths);
        if (!lens) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
        for (int i = 0; i < e->n_lengths; i++) lens[i] = e->lengths[i];
        kvs_ruler_opts ro;
        memset(&ro, 0, sizeof ro);
        ro.tasks = e->ruler_tasks;
        ro.n_tasks = e->n_ruler_tasks;
        ro.lengths = lens;
        ro.n_lengths = e->n_lengths;
        ro.n = e->per_cell;
        ro.seed = (uint64_t)e->seeds[0];
        ro.data_dir = e->dataset_data[0] ? e->dataset_data : NULL;
        ro.count = count_tokens;
        ro.count_ctx = (void *)url;
        rc = kvs_ruler_generate(&ro, kvs_sha256_hex, d, err);
        free(lens);
        if (rc) kvs_err_prefix(err, "%s:%d: experiment '%s': ruler{}", cfg->path, e->line, e->name);
        return rc;
    }
    if (!strcmp(e->dataset, "niah")) {
        int64_t *chars = malloc(sizeof *chars * (size_t)e->n_lengths);
        if (!chars) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
        for (int i = 0; i < e->n_lengths; i++) chars[i] = kvs_tokens_to_chars(e->lengths[i]);
        kvs_needle_opts no;
        memset(&no, 0, sizeof no);
        no.lengths = chars;
        no.n_lengths = e->n_lengths;
        no.depths = e->depths;
        no.n_depths = e->n_depths;
        no.samples_per_cell = e->per_cell;
        no.seed = (uint64_t)e->seeds[0];
        char *essays = NULL;
        if (!strcmp(e->haystack, "paul_graham")) {
            /* the Paul Graham essays of the RULER data (never shipped) */
            size_t hl = 0;
            if ((rc = kvs_ruler_essays(e->dataset_data[0] ? e->dataset_data : NULL, &essays, &hl, err))) {
                free(chars);
                return kvs_err_prefix(err, "%s:%d: experiment '%s': niah{ haystack = \"paul_graham\" }",
                                      cfg->path, e->line, e->name);
            }
            no.haystack = essays;
            no.haystack_len = hl;
        }
        rc = kvs_needle_generate(&no, kvs_sha256_hex, d, err);
        free(chars);
        free(essays);
        return rc;
    }
    struct stat sb;
    if (stat(e->dataset_path, &sb) != 0)
        return kvs_errorf(err, KVS_ERR_NOTFOUND,
                          "%s:%d: dataset.path: %s does not exist (%s datasets are not shipped: "
                          "download the data and point dataset.path at it)",
                          cfg->path, e->line, e->dataset_path, e->dataset);
    if ((rc = kvs_dataset_load(e->dataset, e->dataset_path, kvs_sha256_hex, d, err))) return rc;
    if (e->limit > 0 && e->limit < (*d)->n_samples) {
        /* keep the first `limit` samples (the content hash stays the file's;
         * the cells name their sample ids): free the rest through a dataset
         * that owns only them */
        int keep = e->limit;
        kvs_dataset *drop = calloc(1, sizeof *drop);
        if (!drop) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
        drop->n_samples = (*d)->n_samples - keep;
        drop->samples = malloc(sizeof *drop->samples * (size_t)drop->n_samples);
        if (!drop->samples) {
            free(drop);
            return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
        }
        memcpy(drop->samples, (*d)->samples + keep, sizeof *drop->samples * (size_t)drop->n_samples);
        kvs_dataset_free(drop);
        (*d)->n_samples = keep;
    }
    return KVS_OK;
}

/* The embedded backend (`kvsieve serve`) and plain OpenAI servers take text
 * only: refuse image samples up front there (a url backend of the kvsieve
 * API gets the images and, if text-only, says so naming multimodal_data). */
static kvs_status require_text(const kvs_config *cfg, const kvs_experiment *e, const kvs_dataset *d,
                               kvs_err *err) {
    if (!e->backend_embedded && !e->backend_openai) return KVS_OK;
    for (int i = 0; i < d->n_samples; i++)
        if (kvs_sample_has_images(&d->samples[i]))
            return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                              "%s:%d: experiment '%s': dataset '%s' sample '%s' has %d image%s, but %s "
                              "takes text only: use a multimodal backend such as kvsieve-hf with "
                              "backend{ url = ... }",
                              cfg->path, e->line, e->name, d->name, d->samples[i].id, d->samples[i].n_images,
                              d->samples[i].n_images == 1 ? "" : "s",
                              e->backend_embedded ? "the embedded backend (kvsieve serve)"
                                                  : "backend api = \"openai\"");
    return KVS_OK;
}

/* The images of a sample's request, in marker order: each distinct image
 * read once (bytes[i] for image i), media[] pointing into them. */
typedef struct {
    unsigned char **bytes; /* [n_images] */
    size_t *sizes;         /* [n_images] */
    kvs_client_media *media; /* [n_media] */
    int n_images;
} sample_media;

static void sample_media_free(sample_media *m) {
    for (int i = 0; m->bytes && i < m->n_images; i++) free(m->bytes[i]);
    free(m->bytes);
    free(m->sizes);
    free(m->media);
    memset(m, 0, sizeof *m);
}

static kvs_status sample_media_read(const kvs_dataset *d, const kvs_sample *sm, sample_media *m,
                                    kvs_err *err) {
    memset(m, 0, sizeof *m);
    if (sm->n_media == 0) return KVS_OK;
    m->n_images = sm->n_images;
    m->bytes = calloc((size_t)sm->n_images, sizeof *m->bytes);
    m->sizes = calloc((size_t)sm->n_images, sizeof *m->sizes);
    m->media = calloc((size_t)sm->n_media, sizeof *m->media);
    if (!m->bytes || !m->sizes || !m->media) {
        sample_media_free(m);
        return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    }
    for (int k = 0; k < sm->n_media; k++) {
        int i = sm->media[k];
        assert(i >= 0 && i < sm->n_images);
        if (!m->bytes[i]) {
            kvs_status rc = kvs_sample_read_image(d, sm, i, kvs_sha256_hex, &m->bytes[i], &m->sizes[i], err);
            if (rc) {
                sample_media_free(m);
                return rc;
            }
        }
        m->media[k].data = m->bytes[i];
        m->media[k].n = m->sizes[i];
    }
    return KVS_OK;
}

static const char *default_template(const kvs_dataset *d) {
    if (!strcmp(d->kind, "needle")) return "needle";
    if (!strcmp(d->kind, "ruler")) return "ruler";
    if (!strcmp(d->kind, "milebench")) return "milebench";
    for (int i = 0; i < d->n_samples; i++)
        if (d->samples[i].n_choices > 0) return "choice";
    return "qa";
}

/* ---- progress --------------------------------------------------------------- */

static void progress(run_ctx *x, int force) {
    const kvs_run_opts *o = x->o;
    if (!o->progress) return;
    double now = kvs_now_ms();
    double every = o->progress_tty ? 200.0 : (o->progress_every_s > 0 ? o->progress_every_s : 5) * 1e3;
    if (!force && now - x->last < every) return;
    if (force && x->shown == x->n_new) return; /* already on screen */
    x->last = now;
    x->shown = x->n_new;
    double el = (now - x->t0) / 1000.0;
    double rate = el > 0 ? x->n_new / el : 0;
    double eta = rate > 0 ? (x->total - x->n_new) / rate : -1;
    char eb[32] = "?";
    if (eta >= 0 && eta < 1e7) {
        long t = (long)(eta + 0.5);
        snprintf(eb, sizeof eb, "%ldm%02lds", t / 60, t % 60);
    }
    fprintf(o->progress, o->progress_tty ? "\r\033[K[%d/%d] %.2f cells/s, ETA %s" : "[%d/%d] %.2f cells/s, ETA %s\n",
            x->n_new, x->total, rate, eb);
    fflush(o->progress);
}

/* ---- one answered request --------------------------------------------------- */

static void label_of(const kvs_experiment *e, const tcell *c, char *out, size_t n) {
    const char *lab = e->variants[c->variant].label;
    if (e->modes[c->mode] == KVS_PROMPT_QUERY_AGNOSTIC)
        snprintf(out, n, "%s [query_agnostic]", lab);
    else
        snprintf(out, n, "%s", lab);
}

/* "answer_kept_l<L>" for L in [0, 256) (static storage for the score names). */
static const char *kept_name(int l) {
    static char names[256][24];
    static int ready = 0;
    if (!ready) {
        for (int i = 0; i < 256; i++) snprintf(names[i], sizeof names[i], "answer_kept_l%d", i);
        ready = 1;
    }
    return l >= 0 && l < 256 ? names[l] : NULL;
}

static void on_done(void *ctxp, void *tag, const kvs_client_result *r) {
    run_ctx *x = ctxp;
    unit *u = tag;
    const kvs_experiment *e = x->e;
    u->state = 2;
    x->n_flight_cells -= u->n;
    if (x->rc) return;
    if (r->status) {
        const kvs_sample *sm = &x->d->samples[u->sample];
        int agn = e->modes[u->mode] == KVS_PROMPT_QUERY_AGNOSTIC && strstr(r->error, "suffix");
        x->rc = kvs_errorf(&x->err, r->status, "sample '%s' (%s): %s%s", sm->id,
                           kvs_prompt_mode_name((kvs_prompt_mode)e->modes[u->mode]), r->error,
                           agn ? " (query_agnostic needs a backend that decodes the per-variant "
                                 "suffix after compressing)"
                               : "");
        return;
    }
    assert(r->n_outputs == u->n);
    const kvs_sample *sm = &x->d->samples[u->sample];
    kvs_cell_row rows[MAX_PER_REQUEST];
    kvs_result_row res[MAX_PER_REQUEST];
    /* per cell: the metrics, the task's own score, prompt_tokens, 4 timing
     * and memory scores, answer_kept and one answer_kept_l<L> per layer */
    enum { SC_CAP = 32 + 8 + 256 };
    kvs_score(*sc)[SC_CAP] = malloc(sizeof *sc * (size_t)u->n);
    char labels[MAX_PER_REQUEST][200], notes[MAX_PER_REQUEST][320];
    if (!sc) {
        x->rc = kvs_errorf(&x->err, KVS_ERR_NOMEM, "out of memory storing sample '%s'", sm->id);
        return;
    }
    memset(rows, 0, sizeof rows);
    memset(res, 0, sizeof res);
    int nm = e->n_metrics < 32 ? e->n_metrics : 32;
    kvs_metric_fn own = NULL; /* the sample's RULER metric, for metric "ruler" */
    if (sm->metric) {
        kvs_err e2 = {0};
        if (kvs_metric_lookup(sm->metric, &own, &e2)) {
            x->rc = kvs_errorf(&x->err, KVS_ERR_INTERNAL, "sample '%s': %s", sm->id, e2.msg);
            free(sc);
            return;
        }
    }
    for (int i = 0; i < u->n; i++) {
        const tcell *c = &x->cells[u->cells[i]];
        const kvs_variant *var = &e->variants[c->variant];
        const kvs_client_output *out = &r->outputs[i];
        kvs_cell_row *row = &rows[i];
        label_of(e, c, labels[i], sizeof labels[i]);
        row->key = c->key;
        row->experiment = e->name;
        row->kind = "task";
        row->definition = c->def;
        row->model = x->model_name;
        row->model_hash = x->model_hash;
        row->model_bytes = x->model_bytes > 0 ? (int64_t)x->model_bytes : 0;
        row->dataset = x->d->name;
        row->dataset_version = x->d->version;
        row->sample_id = sm->id;
        row->n_tokens = out->prompt_n;
        row->seed = !strcmp(e->dataset, "niah") || !strcmp(e->dataset, "ruler") ? e->seeds[0] : 0;
        row->method = var->method->name;
        row->label = labels[i];
        row->params_json = var->params_json;
        if (c->budget < 0) {
            row->budget_ratio = 1.0;
        } else {
            row->budget_ratio = e->budgets[c->budget].ratio;
            row->budget_tokens = e->budgets[c->budget].tokens;
        }
        row->prompt_hash = x->tmpl_hash;
        int ns = 0;
        for (int m = 0; m < nm; m++) {
            kvs_metric_fn fn = own && !strcmp(e->metrics[m], "ruler") ? own : x->metric_fns[m];
            double val = fn(out->content, (const char *const *)sm->answers, sm->n_answers,
                            (const char *const *)sm->choices, sm->n_choices);
            sc[i][ns++] = (kvs_score){e->metrics[m], val};
            /* the task's own column (e.g. niah_single_1): RULER's per-task table */
            if (own && sm->task && !strcmp(e->metrics[m], "ruler")) sc[i][ns++] = (kvs_score){sm->task, val};
        }
        if (sm->task && sm->n_tokens > 0) sc[i][ns++] = (kvs_score){"prompt_tokens", (double)sm->n_tokens};
        if (!isnan(out->prompt_ms)) sc[i][ns++] = (kvs_score){"prefill_ms", out->prompt_ms};
        if (!isnan(out->compress_ms)) sc[i][ns++] = (kvs_score){"compress_ms", out->compress_ms};
        if (out->predicted_n > 0 && out->predicted_ms > 0)
            sc[i][ns++] = (kvs_score){"decode_tok_s", 1e3 * (double)out->predicted_n / out->predicted_ms};
        if (out->bytes_after >= 0)
            sc[i][ns++] = (kvs_score){"kv_kept_mb", (double)out->bytes_after / (1024.0 * 1024.0)};
        if (out->span_kept && out->span_n > 0 && out->span_layers > 0) {
            /* per layer the kept share of the answer's tokens, averaged over
             * the spans; answer_kept: over layers too */
            double all = 0;
            int L = out->span_layers < 256 ? out->span_layers : 256;
            for (int l = 0; l < L; l++) {
                double m = 0;
                for (int k = 0; k < out->span_n; k++) m += out->span_kept[(size_t)k * (size_t)out->span_layers + (size_t)l];
                m /= out->span_n;
                all += m;
                sc[i][ns++] = (kvs_score){kept_name(l), m};
            }
            sc[i][ns++] = (kvs_score){"answer_kept", all / L};
        }
        snprintf(notes[i], sizeof notes[i], "mode=%s template=%s stop=%s%s%s%.200s",
                 kvs_prompt_mode_name((kvs_prompt_mode)e->modes[c->mode]), x->tmpl_name,
                 out->stop_type, sm->n_spans > 0 && !out->span_kept && x->sent_spans
                     ? " span_kept=absent (the backend did not answer kv_spans)" : "",
                 out->note[0] ? " " : "", out->note);
        kvs_result_row *rr = &res[i];
        rr->prediction = out->content;
        rr->prefill_ms = out->prompt_ms;
        rr->compress_ms = out->compress_ms;
        rr->decode_ms = out->predicted_ms;
        rr->decode_tokens = out->predicted_n;
        rr->kv_bytes_before = out->bytes_before;
        rr->kv_bytes_after = out->bytes_after;
        rr->note = notes[i];
        rr->n_scores = ns;
        rr->scores = sc[i];
    }
    x->rc = kvs_store_put(x->s, x->run_id, rows, res, u->n, &x->err);
    free(sc);
    if (!x->rc) {
        double dec = 0;
        for (int i = 0; i < u->n; i++) {
            if (!isnan(res[i].compress_ms)) x->t_compress += res[i].compress_ms;
            if (res[i].decode_ms > dec) dec = res[i].decode_ms;
        }
        if (u->n > 0 && !isnan(res[0].prefill_ms)) x->t_prefill += res[0].prefill_ms;
        x->t_decode += dec;
        x->n_requests++;
        x->n_new += u->n;
    }
    progress(x, 0);
}

/* ---- the experiment ----------------------------------------------------------- */

static void print_dry(FILE *f, const kvs_experiment *e, const kvs_dataset *d, const tcell *cells,
                      int n, const unsigned char *done, int n_done, const char *model,
                      const char *tmpl) {
    fprintf(f, "experiment '%s' (kind task, line %d)\n", e->name, e->line);
    fprintf(f, "  dataset  %s %s: %d samples (sha256 %.12s), template %s, %d mode(s)\n", d->name,
            d->version, d->n_samples, d->hash, tmpl, e->n_modes);
    fprintf(f, "  model    %s\n", model);
    fprintf(f, "  variants %d (methods x params), budgets %d ('full' runs once per sample)\n",
            e->n_variants, e->n_budgets);
    fprintf(f, "  cells    %d total, %d already done, %d to run\n", n, n_done, n - n_done);
    for (int i = 0; i < n && i < 200; i++) {
        const tcell *c = &cells[i];
        char bl[32] = "all";
        if (c->budget >= 0) {
            if (e->budgets[c->budget].tokens > 0)
                snprintf(bl, sizeof bl, "%lld tok", (long long)e->budgets[c->budget].tokens);
            else
                snprintf(bl, sizeof bl, "%g", e->budgets[c->budget].ratio);
        }
        fprintf(f, "  %s %.12s  %s %s  %s  budget %s\n", done[i] ? "done" : "todo", c->key,
                d->samples[c->sample].id, kvs_prompt_mode_name((kvs_prompt_mode)e->modes[c->mode]),
                e->variants[c->variant].label, bl);
    }
    if (n > 200) fprintf(f, "  ... %d more\n", n - 200);
}

kvs_status kvs_task_run(kvs_store *s, const kvs_config *cfg, const kvs_experiment *e,
                        const kvs_run_opts *o, kvs_run_summary *sum, kvs_err *err) {
    kvs_status rc = KVS_OK;
    kvs_dataset *d = NULL;
    kvs_embedded *emb = NULL;
    kvs_client *cl = NULL;
    tcell *cells = NULL;
    unit *units = NULL;
    unsigned char *done = NULL;
    kvs_metric_fn *fns = NULL;
    int n = 0, n_done = 0, n_units = 0;
    int64_t run_id = 0;
    int run_open = 0, stopped = 0;
    run_ctx x;
    memset(&x, 0, sizeof x);

    /* dataset, template, metrics: everything that can fail before a backend
     * starts; ruler{} is generated after, with the backend's tokenizer */
    int late = !strcmp(e->dataset, "ruler");
    if (!late && ((rc = load_dataset(cfg, e, NULL, &d, err)) || (rc = require_text(cfg, e, d, err))))
        goto fail;
    const char *tmpl_name = e->prompt_template[0] ? e->prompt_template : late ? "ruler" : default_template(d);
    const kvs_prompt_template *tmpl = NULL;
    char tmpl_hash[65];
    if ((rc = kvs_prompt_template_get(tmpl_name, &tmpl, err)) ||
        (rc = kvs_prompt_template_hash(tmpl, kvs_sha256_hex, tmpl_hash, err)))
        goto fail;
    fns = calloc((size_t)(e->n_metrics > 0 ? e->n_metrics : 1), sizeof *fns);
    if (!fns) {
        rc = kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int m = 0; m < e->n_metrics; m++)
        if ((rc = kvs_metric_lookup(e->metrics[m], &fns[m], err))) goto fail;

    /* the backend */
    const char *urls[64];
    int n_urls = 0;
    if (e->backend_embedded) {
        if (!o->kvsieve_bin) {
            rc = kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                            "%s:%d: experiment '%s': backend { embedded = true } needs the kvsieve "
                            "binary to start `kvsieve serve` (run it with `kvsieve run`, or give "
                            "backend = { url = ... })",
                            cfg->path, e->line, e->name);
            goto fail;
        }
        kvs_embedded_opts eo;
        memset(&eo, 0, sizeof eo);
        eo.bin = o->kvsieve_bin;
        eo.model = e->model;
        eo.threads = e->backend_threads > 0 ? e->backend_threads : o->threads_override;
        eo.ctx = e->backend_ctx;
        eo.slots = 1;
        eo.cache_type_k = e->backend_cache_k;
        eo.cache_type_v = e->backend_cache_v;
        eo.batch = MAX_PER_REQUEST;
        if (o->progress)
            fprintf(o->progress, "experiment '%s': starting the embedded backend (kvsieve serve "
                    "--model %s)\n", e->name, e->model);
        if ((rc = kvs_embedded_start(&eo, &emb, err))) goto fail;
        urls[n_urls++] = kvs_embedded_url(emb);
    } else {
        for (int i = 0; i < e->n_backend_urls && i < 64; i++) urls[n_urls++] = e->backend_urls[i];
    }
    char model_name[256], model_hash[128], ident[340], kv_cache[32];
    double file_bytes;
    int csfx = 0; /* every backend takes compress_suffix: a sample's two settings share one request */
    if ((rc = model_identity(urls[0], model_name, sizeof model_name, model_hash, sizeof model_hash,
                             ident, sizeof ident, &file_bytes, kv_cache, &csfx, err)))
        goto fail;
    for (int i = 1; i < n_urls; i++) {
        char n2[256], h2[128], id2[340], kv2[32];
        double fb2;
        int cs2;
        if ((rc = model_identity(urls[i], n2, sizeof n2, h2, sizeof h2, id2, sizeof id2, &fb2, kv2, &cs2, err)))
            goto fail;
        csfx &= cs2;
        if (strcmp(ident, id2) != 0) {
            rc = kvs_errorf(err, KVS_ERR_INVALID,
                            "%s:%d: backend.url[%d] %s serves '%s', url[1] %s serves '%s': every "
                            "backend of an experiment must serve the same model",
                            cfg->path, e->line, i + 1, urls[i], id2, urls[0], ident);
            goto fail;
        }
    }
    if (!e->backend_embedded && strcmp(e->model, "default") != 0 && strcmp(e->model, model_name) != 0 &&
        !strstr(model_name, e->model)) {
        rc = kvs_errorf(err, KVS_ERR_INVALID,
                        "%s:%d: model = '%s' but %s serves '%s'", cfg->path, e->line, e->model,
                        urls[0], model_name);
        goto fail;
    }

    if (late) {
        if (o->progress)
            fprintf(o->progress, "experiment '%s': generating RULER prompts (%d tasks x %d lengths x %d), "
                    "lengths counted by %s/tokenize\n", e->name, e->n_ruler_tasks, e->n_lengths,
                    e->per_cell, urls[0]);
        if ((rc = load_dataset(cfg, e, urls[0], &d, err)) || (rc = require_text(cfg, e, d, err))) goto fail;
    }

    /* grid and resume */
    if ((rc = expand(e, d, model_name, model_hash, kv_cache, tmpl_name, tmpl_hash, &cells, &n, err))) goto fail;
    if (o->shard_count > 1) { /* this shard's request units, whole (kvs_shard_of) */
        int k = 0;
        for (int i = 0; i < n; i++) {
            char unit_key[600];
            snprintf(unit_key, sizeof unit_key, "task-unit\n%s\n%s\n%s", e->name,
                     kvs_prompt_mode_name((kvs_prompt_mode)e->modes[cells[i].mode]),
                     d->samples[cells[i].sample].id);
            if (kvs_shard_of(unit_key, o->shard_count) == o->shard_index) cells[k++] = cells[i];
        }
        n = k;
    }
    done = calloc((size_t)(n > 0 ? n : 1), 1);
    if (!done) {
        rc = kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < n; i++) {
        int dd = 0;
        if ((rc = kvs_store_is_done(s, cells[i].key, &dd, err))) goto fail;
        done[i] = (unsigned char)dd;
        n_done += dd;
    }
    sum->n_cells += n;
    sum->n_already += n_done;
    if (o->dry_run) {
        char model_desc[400];
        snprintf(model_desc, sizeof model_desc, "%s (%.40s)", model_name, model_hash);
        if (o->progress) print_dry(o->progress, e, d, cells, n, done, n_done, model_desc, tmpl_name);
        goto fail; /* rc == KVS_OK: the common exit */
    }
    if (n_done == n) {
        if (o->progress)
            fprintf(o->progress, "experiment '%s': all %d cells already done\n", e->name, n);
        goto fail;
    }
    /* units: pending cells grouped per (mode, sample), <= per_request each;
     * cells of a (mode, sample) are adjacent in the grid. Where the backend
     * takes compress_suffix, a sample's cells of both modes join one unit
     * (one prefill of the context; query-aware cells prefill the question
     * before their compression): the sample's open unit is found by index. */
    const int both = csfx && !e->backend_openai && e->n_modes == 2 && e->modes[0] != e->modes[1];
    const int per_request = e->variants_per_request > 0 ? e->variants_per_request
                            : e->backend_embedded       ? MAX_PER_REQUEST
                                                        : URL_PER_REQUEST;
    units = calloc((size_t)(n - n_done), sizeof *units);
    if (!units) {
        rc = kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    int *open_unit = both ? malloc(sizeof(int) * (size_t)d->n_samples) : NULL; /* [sample] unit or -1 */
    if (both && !open_unit) {
        rc = kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int k = 0; both && k < d->n_samples; k++) open_unit[k] = -1;
    for (int i = 0; i < n; i++) {
        if (done[i]) continue;
        const int sm = cells[i].sample;
        unit *u = n_units ? &units[n_units - 1] : NULL;
        if (both && d->samples[sm].n_media == 0) {
            u = open_unit[sm] >= 0 ? &units[open_unit[sm]] : NULL;
            if (u && u->n == per_request) u = NULL;
            if (u && u->mode != cells[i].mode) u->both = 1;
        } else if (u && (u->both || u->mode != cells[i].mode || u->sample != sm)) {
            u = NULL;
        }
        if (!u || u->n == per_request) {
            if (both && d->samples[sm].n_media == 0) open_unit[sm] = n_units;
            u = &units[n_units++];
            u->mode = cells[i].mode;
            u->sample = sm;
        }
        u->cells[u->n++] = i;
    }
    free(open_unit);

    kvs_run_info info = {e->name, "task", cfg->path, cfg->text, cfg->hash, cfg->overrides, cfg->dir, n};
    if ((rc = kvs_store_run_begin(s, &info, &run_id, err))) goto fail;
    run_open = 1;
    if (o->shard_count > 1) {
        char shard[32];
        snprintf(shard, sizeof shard, "%d/%d", o->shard_index, o->shard_count);
        if ((rc = kvs_store_run_shard(s, run_id, shard, err))) goto fail;
    }
    sum->run_id = run_id;
    if (o->progress)
        fprintf(o->progress, "experiment '%s': %d cells, %d already done, run %lld, model %s, %d "
                "backend URL(s), %d requests\n", e->name, n, n_done, (long long)run_id, model_name,
                n_urls, n_units);

    kvs_client_opts co;
    kvs_client_opts_defaults(&co);
    co.urls = urls;
    co.n_urls = n_urls;
    co.api = e->backend_openai ? KVS_API_OPENAI : KVS_API_KVSIEVE;
    co.model = e->backend_openai ? e->model : NULL;
    co.per_url = e->in_flight > 0 ? e->in_flight : 2;
    /* The embedded server is ours and local: a request of a whole leaderboard
     * grid (up to 160 variants) queued behind another can take far longer
     * than a URL backend's 900 s on a loaded machine; its death ends the run
     * through the connection, not through this clock. */
    if (e->backend_embedded) co.timeout_s = 4 * 3600.0;
    if ((rc = kvs_client_new(&co, &cl, err))) goto fail;

    x.s = s, x.e = e, x.o = o, x.d = d, x.run_id = run_id, x.cells = cells, x.units = units;
    x.metric_fns = fns, x.model_name = model_name, x.model_hash = model_hash;
    x.tmpl_name = tmpl_name, x.tmpl_hash = tmpl_hash, x.model_bytes = file_bytes;
    x.sent_spans = co.api == KVS_API_KVSIEVE && !e->no_kv_spans;
    x.t0 = kvs_now_ms(), x.total = n - n_done;
    int window = n_urls * co.per_url;
    static const char *const stops[] = {"\n"}; /* answers are one line; part of the cell key */
    int next = 0;
    for (;;) {
        int limit_hit = o->max_cells > 0 && x.n_new + x.n_flight_cells >= o->max_cells;
        int stop_now = (o->stop && *o->stop) || x.rc || limit_hit;
        if (stop_now && next < n_units) stopped = !x.rc;
        while (!stop_now && next < n_units && kvs_client_pending(cl) < window) {
            unit *u = &units[next];
            if (o->max_cells > 0 && x.n_new + x.n_flight_cells + u->n > o->max_cells) {
                /* trim the last request to the limit */
                u->n = o->max_cells - x.n_new - x.n_flight_cells;
                if (u->n <= 0) break;
            }
            const kvs_sample *sm = &d->samples[u->sample];
            char *cp = NULL, *ap = NULL;
            kvs_prompt_mode mode = u->both ? KVS_PROMPT_QUERY_AGNOSTIC : (kvs_prompt_mode)e->modes[u->mode];
            if ((rc = kvs_prompt_render(tmpl, sm, mode, &cp, &ap, err))) {
                kvs_err_prefix(err, "sample '%s'", sm->id);
                goto drain;
            }
            kvs_client_variant vs[MAX_PER_REQUEST];
            for (int i = 0; i < u->n; i++) {
                const tcell *c = &cells[u->cells[i]];
                const kvs_variant *var = &e->variants[c->variant];
                vs[i].method = var->method->name;
                vs[i].params_json = var->method == &kvs_method_full ? NULL : var->params_json;
                vs[i].ratio = c->budget >= 0 ? e->budgets[c->budget].ratio : 1.0;
                vs[i].tokens = c->budget >= 0 ? e->budgets[c->budget].tokens : 0;
                vs[i].compress_suffix = u->both && e->modes[c->mode] == KVS_PROMPT_QUERY_AWARE;
            }
            kvs_client_request rq;
            memset(&rq, 0, sizeof rq);
            rq.prompt = cp;
            rq.suffix = mode == KVS_PROMPT_QUERY_AGNOSTIC ? ap : NULL;
            rq.max_tokens = sample_n_predict(e, sm);
            rq.stop = stops_at_newline(e) ? stops : NULL;
            rq.n_stop = stops_at_newline(e) ? 1 : 0; /* ignore_eos: exactly n_predict tokens */
            rq.ignore_eos = e->ignore_eos;
            rq.n_variants = u->n;
            rq.variants = vs;
            /* kv_spans: where the answers sit in the prompt (the context's
             * spans shifted by where the template puts the context) */
            int64_t spans[2 * 64];
            int64_t off = kvs_prompt_context_offset(tmpl, sm);
            if (x.sent_spans && off >= 0)
                for (int k = 0; k < sm->n_spans && k < 64; k++) {
                    spans[2 * rq.n_spans] = off + sm->spans[k].start;
                    spans[2 * rq.n_spans + 1] = off + sm->spans[k].end;
                    rq.n_spans++;
                }
            rq.spans = spans;
            sample_media med;
            if ((rc = sample_media_read(d, sm, &med, err))) {
                free(cp);
                free(ap);
                goto drain;
            }
            rq.media = med.media;
            rq.n_media = sm->n_media;
            rc = kvs_client_submit(cl, &rq, u, err);
            sample_media_free(&med); /* the body holds its own base64 copy */
            free(cp);
            free(ap);
            if (rc) {
                kvs_err_prefix(err, "sample '%s'", sm->id);
                goto drain;
            }
            u->state = 1;
            x.n_flight_cells += u->n;
            next++;
        }
        int pending = kvs_client_pending(cl);
        if (pending == 0 && (next >= n_units || stop_now)) break;
        if ((rc = kvs_client_poll(cl, 200, on_done, &x, NULL, err))) goto drain;
    }
drain:
    /* finish what is in flight (its cells are stored), then close */
    while (cl && kvs_client_pending(cl) > 0) {
        kvs_err e2 = {0};
        if (kvs_client_poll(cl, 200, on_done, &x, NULL, &e2)) break;
    }
    if (!rc && x.rc) {
        rc = x.rc;
        *err = x.err;
    }
    progress(&x, 1);
    if (o->progress && o->progress_tty) fputc('\n', o->progress);
    /* the server's clocks, for the run's accounting (runner.c stores and prints it) */
    sum->acct.requests += x.n_requests;
    sum->acct.prefill_ms += x.t_prefill;
    sum->acct.compress_ms += x.t_compress;
    sum->acct.decode_ms += x.t_decode;
    sum->n_done += x.n_new;
    if (rc) {
        sum->n_failed++;
        kvs_err_prefix(err, "experiment '%s'", e->name);
    } else if (stopped) {
        sum->interrupted = 1;
        if (o->progress) {
            fprintf(o->progress, "stopped: %d new cells stored, %d of %d still to run\n", x.n_new,
                    n - n_done - x.n_new, n);
            if (o->resume_hint) fprintf(o->progress, "resume with: %s\n", o->resume_hint);
        }
    }
fail:
    if (run_open) {
        kvs_err e2 = {0};
        kvs_status r2 = kvs_store_run_end(s, run_id, rc ? "failed" : stopped ? "interrupted" : "done",
                                          x.n_new, rc ? err->msg : NULL, &e2);
        if (!rc && r2) {
            rc = r2;
            *err = e2;
        }
    }
    kvs_client_free(cl);
    if (emb) {
        kvs_err e2 = {0};
        kvs_status r2 = kvs_embedded_stop(emb, &e2);
        if (!rc && r2) {
            rc = r2;
            *err = e2;
        }
    }
    free(units);
    free(cells);
    free(done);
    free(fns);
    kvs_dataset_free(d);
    return rc;
}

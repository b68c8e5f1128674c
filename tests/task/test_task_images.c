/*
 * test_task_images.c -- the task runner sends a MileBench sample's images:
 * a tiny task (three few-byte "PNG" files in images/, written here) run
 * against an in-process fake multimodal backend (libmicrohttpd: /v1/models
 * and /v1/completions, every body kept). The image sample's request carries
 * multimodal_data decoding to the files' bytes in marker order (the
 * unreferenced image first, an image used twice sent twice), the text
 * sample's none; resume skips the cells, and changed image bytes make new
 * cells (the dataset hash, part of every cell key, follows the bytes). The
 * refusals: the embedded backend and api = "openai" before anything starts,
 * a missing image before anything is sent, and a text-only server's 400
 * naming multimodal_data surfaced with the sample.
 */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sqlite3.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "../eval/eval_test_util.h"
#include "kvs_client.h"
#include "kvs_datasets.h"
#include "kvs_eval.h"
#include "task_media_util.h"
#include "test_util.h"

enum { MAX_BODIES = 64 };

typedef struct {
    struct MHD_Daemon *d;
    char url[64];
    pthread_mutex_t mu;
    int text_only; /* answer 400 naming multimodal_data, as `kvsieve serve` does */
    int n_http;    /* every request, /v1/models included */
    int n_bodies;
    char *bodies[MAX_BODIES]; /* /v1/completions bodies, in arrival order */
} fake;

typedef struct {
    char *buf;
    size_t n;
} upload;

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)c, (void)toe;
    upload *u = *con_cls;
    if (u) {
        free(u->buf);
        free(u);
    }
    *con_cls = NULL;
}

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *text) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

/* A kvsieve-API answer: one output per requested variant. */
static char *answer(const char *req) {
    cJSON *in = cJSON_Parse(req);
    const cJSON *vs = cJSON_GetObjectItem(cJSON_GetObjectItem(in, "kv_compression"), "variants");
    cJSON *out = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(out, "variants");
    for (int i = 0; i < cJSON_GetArraySize(vs); i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "content", "a cat");
        cJSON_AddNumberToObject(o, "tokens_predicted", 2);
        cJSON_AddStringToObject(o, "stop_type", "eos");
        cJSON *t = cJSON_AddObjectToObject(o, "timings");
        cJSON_AddNumberToObject(t, "prompt_n", 40);
        cJSON_AddNumberToObject(t, "prompt_ms", 5.0);
        cJSON_AddNumberToObject(t, "predicted_n", 2);
        cJSON_AddNumberToObject(t, "predicted_ms", 4.0);
        cJSON_AddItemToArray(arr, o);
    }
    char *s = cJSON_PrintUnformatted(out);
    cJSON_Delete(out);
    cJSON_Delete(in);
    return s;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                 const char *version, const char *data, size_t *data_size, void **con_cls) {
    (void)version;
    fake *f = cls;
    upload *u = *con_cls;
    if (!u) {
        u = calloc(1, sizeof *u);
        *con_cls = u;
        return u ? MHD_YES : MHD_NO;
    }
    if (*data_size) {
        char *nb = realloc(u->buf, u->n + *data_size + 1);
        if (!nb) return MHD_NO;
        memcpy(nb + u->n, data, *data_size);
        u->buf = nb;
        u->n += *data_size;
        u->buf[u->n] = '\0';
        *data_size = 0;
        return MHD_YES;
    }
    pthread_mutex_lock(&f->mu);
    f->n_http++;
    pthread_mutex_unlock(&f->mu);
    if (!strcmp(method, "GET") && !strcmp(url, "/v1/models"))
        return reply(c, 200, "{\"object\": \"list\", \"data\": [{\"id\": \"fake-vl\", \"meta\": {\"name\": \"fake-vl\"}}]}");
    if (strcmp(method, "POST") != 0 || strcmp(url, "/v1/completions") != 0)
        return reply(c, 404, "{\"error\": {\"message\": \"not found\"}}");
    const char *b = u->buf ? u->buf : "{}";
    pthread_mutex_lock(&f->mu);
    if (f->n_bodies < MAX_BODIES) f->bodies[f->n_bodies++] = strdup(b);
    int text_only = f->text_only;
    pthread_mutex_unlock(&f->mu);
    if (text_only && strstr(b, "\"multimodal_data\""))
        return reply(c, 400, "{\"error\": {\"message\": \"multimodal_data: this server is text-only; it takes no "
                             "images\", \"field\": \"multimodal_data\"}}");
    char *a = answer(b);
    enum MHD_Result r = reply(c, 200, a);
    free(a);
    return r;
}

static int fake_start(fake *f) {
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->mu, NULL);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    f->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL,
                            on_access, f, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, f, MHD_OPTION_END);
    if (!f->d) return -1;
    snprintf(f->url, sizeof f->url, "http://127.0.0.1:%d",
             MHD_get_daemon_info(f->d, MHD_DAEMON_INFO_BIND_PORT)->port);
    return 0;
}

static void fake_clear(fake *f) {
    pthread_mutex_lock(&f->mu);
    for (int i = 0; i < f->n_bodies; i++) free(f->bodies[i]);
    f->n_bodies = 0;
    f->n_http = 0;
    pthread_mutex_unlock(&f->mu);
}

static void fake_stop(fake *f) {
    MHD_stop_daemon(f->d);
    fake_clear(f);
    pthread_mutex_destroy(&f->mu);
}

static char dir[64];

static void put(const char *path, const void *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(data, 1, n, fp) != n) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    fclose(fp);
}

static unsigned char IMG[3][10] = {
    {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0x00, 'a'},
    {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0x01, 'b'},
    {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0x02, 'c'},
};

static void write_images(void) {
    char p[256];
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/mb/images/p%d.png", dir, i + 1);
        put(p, IMG[i], sizeof IMG[i]);
    }
}

/* The body of the request whose prompt contains `words` (NULL when none). */
static cJSON *body_with(fake *f, const char *words) {
    cJSON *found = NULL;
    pthread_mutex_lock(&f->mu);
    for (int i = f->n_bodies - 1; i >= 0 && !found; i--) {
        cJSON *b = cJSON_Parse(f->bodies[i]);
        const cJSON *p = cJSON_GetObjectItem(b, "prompt");
        if (cJSON_IsString(p) && strstr(p->valuestring, words)) found = b;
        else cJSON_Delete(b);
    }
    pthread_mutex_unlock(&f->mu);
    return found;
}

static int count_str(const char *s, const char *w) {
    int n = 0;
    for (const char *p = strstr(s, w); p; p = strstr(p + strlen(w), w)) n++;
    return n;
}

/* The image sample's request: 4 markers and images p3 (unreferenced, first),
 * p2, p1, p2. */
static void check_image_body(fake *f) {
    cJSON *b = body_with(f, "Look ");
    CHECK(b != NULL);
    if (!b) return;
    const char *prompt = cJSON_GetObjectItem(b, "prompt")->valuestring;
    CHECK_MSG(strstr(prompt, KVS_CLIENT_MEDIA_MARKER "Look " KVS_CLIENT_MEDIA_MARKER " and " KVS_CLIENT_MEDIA_MARKER
                             ", again " KVS_CLIENT_MEDIA_MARKER ".") != NULL,
              "%s", prompt);
    CHECK_EQ_INT(count_str(prompt, KVS_CLIENT_MEDIA_MARKER), 4);
    const cJSON *md = cJSON_GetObjectItem(b, "multimodal_data");
    CHECK_EQ_INT(cJSON_GetArraySize(md), 4);
    const int want[4] = {2, 1, 0, 1};
    for (int k = 0; k < 4 && k < cJSON_GetArraySize(md); k++) {
        const cJSON *it = cJSON_GetArrayItem(md, k);
        size_t n = 0;
        unsigned char *got = cJSON_IsString(it) ? media_b64_decode(it->valuestring, &n) : NULL;
        CHECK_MSG(got && n == sizeof IMG[want[k]] && !memcmp(got, IMG[want[k]], n),
                  "multimodal_data[%d] is not p%d.png", k, want[k] + 1);
        free(got);
    }
    CHECK_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetObjectItem(b, "kv_compression"), "variants")), 2);
    cJSON_Delete(b);
}

static int64_t q_int(sqlite3 *db, const char *sql) {
    sqlite3_stmt *st = NULL;
    int64_t v = -1;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

static kvs_status run(kvs_store *s, const char *name, const char *backend, kvs_run_summary *sum, kvs_err *err) {
    char text[1024], cfgp[256];
    snprintf(text, sizeof text,
             "experiment { name = \"%s\", kind = \"task\", backend = %s,\n"
             "  dataset = milebench { path = \"mb/T.json\" }, methods = { \"full\", \"snapkv\" },\n"
             "  budgets = 0.5, metrics = \"contains\", n_predict = 4 }\n",
             name, backend);
    char file[96];
    snprintf(file, sizeof file, "%s.lua", name);
    eval_write(dir, file, text, cfgp, sizeof cfgp);
    kvs_config cfg;
    kvs_status rc = kvs_config_load(cfgp, NULL, 0, &cfg, err);
    if (rc) return rc;
    kvs_run_opts o;
    memset(&o, 0, sizeof o);
    memset(sum, 0, sizeof *sum);
    rc = kvs_run_config(s, &cfg, &o, sum, err);
    kvs_config_free(&cfg);
    return rc;
}

int main(void) {
    kvs_err err = {0};
    /* the loader's marker is the one on the wire */
    CHECK(!strcmp(KVS_MEDIA_MARKER, KVS_CLIENT_MEDIA_MARKER));
    if (eval_tmpdir(dir, "taskimg")) {
        perror("mkdtemp");
        return 1;
    }
    char p[256], db[256], backend[160];
    snprintf(p, sizeof p, "%s/mb", dir);
    mkdir(p, 0700);
    snprintf(p, sizeof p, "%s/mb/images", dir);
    mkdir(p, 0700);
    write_images();
    eval_write(dir, "mb/T.json",
               "{\"meta_data\": {\"question_type\": \"open-ended\", \"task_instruction\": [\"Describe.\"]},\n"
               " \"data\": [\n"
               "  {\"sample_id\": \"a\", \"task_instance\": {\"context\": \"Look {image#2} and {image#1}, again "
               "{image#2}.\",\n"
               "   \"images_path\": [\"p1.png\", \"p2.png\", \"p3.png\"]}, \"response\": \"a cat\"},\n"
               "  {\"sample_id\": \"b\", \"task_instance\": {\"context\": \"No images here.\"}, \"response\": \"y\"}\n"
               " ]}\n",
               p, sizeof p);
    fake f;
    CHECK(fake_start(&f) == 0);
    snprintf(db, sizeof db, "%s/r.db", dir);
    kvs_store *s = NULL;
    CHECK_OK(kvs_store_open(db, &s, &err), &err);
    if (!s) return kvs_test_finish("task_images");
    kvs_run_summary sum;
    snprintf(backend, sizeof backend, "{ url = \"%s\" }", f.url);

    /* 2 samples x (full + snapkv at one budget): one request per sample */
    CHECK_OK(run(s, "mb", backend, &sum, &err), &err);
    CHECK_EQ_INT(sum.n_cells, 4);
    CHECK_EQ_INT(sum.n_done, 4);
    CHECK_EQ_INT(f.n_bodies, 2);
    check_image_body(&f);
    cJSON *tb = body_with(&f, "No images here.");
    CHECK(tb && cJSON_GetObjectItem(tb, "multimodal_data") == NULL);
    CHECK(tb && !strstr(cJSON_GetObjectItem(tb, "prompt")->valuestring, KVS_CLIENT_MEDIA_MARKER));
    cJSON_Delete(tb);
    sqlite3 *h = kvs_store_db(s);
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM results"), 4);
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM cells WHERE dataset_version = 'milebench-2'"), 4);
    /* resume: nothing to send */
    fake_clear(&f);
    CHECK_OK(run(s, "mb", backend, &sum, &err), &err);
    CHECK_EQ_INT(sum.n_already, 4);
    CHECK_EQ_INT(sum.n_done, 0);
    CHECK_EQ_INT(f.n_bodies, 0);
    /* an image's bytes change: new cell keys, the new bytes sent */
    IMG[0][9] = 'A';
    write_images();
    fake_clear(&f);
    CHECK_OK(run(s, "mb", backend, &sum, &err), &err);
    CHECK_EQ_INT(sum.n_already, 0);
    CHECK_EQ_INT(sum.n_done, 4);
    check_image_body(&f);
    CHECK_EQ_INT(q_int(h, "SELECT count(DISTINCT key) FROM cells WHERE experiment = 'mb'"), 8);

    /* a text-only server's 400 naming the field reaches the user with the sample */
    fake_clear(&f);
    f.text_only = 1;
    CHECK_FAILS(run(s, "mbtext", backend, &sum, &err), KVS_ERR_INVALID, &err, "multimodal_data");
    CHECK_MSG(strstr(err.msg, "sample 'a'") && strstr(err.msg, "text-only"), "%s", err.msg);
    f.text_only = 0;

    /* text-only backends refuse up front (no binary needed, nothing sent) */
    fake_clear(&f);
    CHECK_FAILS(run(s, "mbemb", "{ embedded = true }", &sum, &err), KVS_ERR_UNSUPPORTED, &err, "sample 'a'");
    CHECK_MSG(strstr(err.msg, "embedded") && strstr(err.msg, "kvsieve-hf") && strstr(err.msg, "backend{ url"),
              "%s", err.msg);
    char oai[200];
    snprintf(oai, sizeof oai, "{ url = \"%s\", api = \"openai\" }", f.url);
    char text[1024], cfgp[256];
    snprintf(text, sizeof text,
             "experiment { name = \"mboai\", kind = \"task\", backend = %s, model = \"fake-vl\",\n"
             "  dataset = milebench { path = \"mb/T.json\" }, methods = \"full\", budgets = 0.5,\n"
             "  metrics = \"contains\" }\n",
             oai);
    eval_write(dir, "mboai.lua", text, cfgp, sizeof cfgp);
    kvs_config cfg;
    kvs_err_clear(&err);
    kvs_status lrc = kvs_config_load(cfgp, NULL, 0, &cfg, &err);
    CHECK_OK(lrc, &err);
    if (!lrc) {
        kvs_run_opts o;
        memset(&o, 0, sizeof o);
        CHECK_FAILS(kvs_run_config(s, &cfg, &o, &sum, &err), KVS_ERR_UNSUPPORTED, &err, "openai");
        CHECK_MSG(strstr(err.msg, "sample 'a'") && strstr(err.msg, "kvsieve-hf"), "%s", err.msg);
        kvs_config_free(&cfg);
    }
    CHECK_EQ_INT(f.n_http, 0);

    /* a missing image: an error naming the task, the sample and the path,
     * before anything is sent */
    snprintf(p, sizeof p, "%s/mb/images/p3.png", dir);
    unlink(p);
    fake_clear(&f);
    CHECK_FAILS(run(s, "mbgone", backend, &sum, &err), KVS_ERR_IO, &err, p);
    CHECK_MSG(strstr(err.msg, "T.json") && strstr(err.msg, "sample 'a'"), "%s", err.msg);
    CHECK_EQ_INT(f.n_http, 0);

    kvs_store_close(s);
    fake_stop(&f);
    eval_rmdir(dir);
    return kvs_test_finish("task_images");
}

/*
 * test_task_config.c -- the task fields of a Lua config: backend (embedded,
 * model, one or several URLs, api "openai"), file datasets, mode, template,
 * n_predict, metric names; each refused value names file:line and field.
 */
#include "kvs_datasets.h"
#include "kvs_eval.h"
#include "test_util.h"

static kvs_status load(const char *text, kvs_config *cfg, kvs_err *err) {
    return kvs_config_load_text("/tmp/task.lua", text, NULL, 0, cfg, err);
}

/* text must fail to load with a message containing every needle. */
static void refuse(const char *text, const char *needle, const char *needle2) {
    kvs_config cfg;
    kvs_err err = {0};
    kvs_status rc = load(text, &cfg, &err);
    CHECK_MSG(rc != KVS_OK && strstr(err.msg, needle) && (!needle2 || strstr(err.msg, needle2)),
              "expected '%s'%s%s, got %d: %s", needle, needle2 ? " and " : "",
              needle2 ? needle2 : "", rc, err.msg);
    if (rc == KVS_OK) kvs_config_free(&cfg);
}

#define HEAD "experiment {\n  name = \"t\", kind = \"task\",\n"
#define NIAH "  dataset = niah { lengths = 512, depths = { 0.5 } },\n"
#define TAIL "  methods = { \"full\", \"snapkv\" }, budgets = 0.2, metrics = { \"needle\" },\n"

int main(void) {
    kvs_config cfg;
    kvs_err err = {0};
    /* defaults: embedded backend, model default, query-aware, n_predict 24 */
    CHECK_OK(load(HEAD NIAH TAIL "}\n", &cfg, &err), &err);
    if (!err.code) {
        const kvs_experiment *e = &cfg.experiments[0];
        CHECK_EQ_INT(e->backend_embedded, 1);
        CHECK(!strcmp(e->model, "default"));
        CHECK_EQ_INT(e->n_modes, 1);
        CHECK_EQ_INT(e->modes[0], KVS_PROMPT_QUERY_AWARE);
        CHECK_EQ_INT(e->n_predict, 24);
        CHECK_EQ_INT(e->in_flight, 2);
        kvs_config_free(&cfg);
    }
    /* the quick start's form: backend = { embedded = true, model = ... } */
    CHECK_OK(load(HEAD "  backend = { embedded = true, model = \"/m/x.gguf\", threads = 2, ctx = 4096 },\n" NIAH
                  TAIL "  mode = { \"query_aware\", \"query_agnostic\" }, template = \"qa\", n_predict = 8,\n}\n",
                  &cfg, &err),
             &err);
    if (!err.code) {
        const kvs_experiment *e = &cfg.experiments[0];
        CHECK(!strcmp(e->model, "/m/x.gguf"));
        CHECK_EQ_INT(e->backend_threads, 2);
        CHECK_EQ_INT(e->backend_ctx, 4096);
        CHECK_EQ_INT(e->n_modes, 2);
        CHECK_EQ_INT(e->modes[1], KVS_PROMPT_QUERY_AGNOSTIC);
        CHECK(!strcmp(e->prompt_template, "qa"));
        CHECK_EQ_INT(e->n_predict, 8);
        kvs_config_free(&cfg);
    }
    /* several URLs; a file dataset relative to the config's folder */
    CHECK_OK(load(HEAD "  backend = { url = { \"http://a:1\", \"http://b:2\" }, in_flight = 3 },\n"
                  "  dataset = jsonl { path = \"data/qa.jsonl\", limit = 5 },\n" TAIL "}\n",
                  &cfg, &err),
             &err);
    if (!err.code) {
        const kvs_experiment *e = &cfg.experiments[0];
        CHECK_EQ_INT(e->n_backend_urls, 2);
        CHECK(!strcmp(e->backend_urls[1], "http://b:2"));
        CHECK(!strcmp(e->backend_url, "http://a:1"));
        CHECK_EQ_INT(e->in_flight, 3);
        CHECK(!strcmp(e->dataset, "jsonl"));
        CHECK(!strcmp(e->dataset_path, "/tmp/data/qa.jsonl"));
        CHECK_EQ_INT(e->limit, 5);
        CHECK_EQ_INT(e->n_predict, 64);
        kvs_config_free(&cfg);
    }
    /* api openai: full only */
    CHECK_OK(load(HEAD "  backend = { url = \"http://a:1\", api = \"openai\" },\n" NIAH
                  "  methods = \"full\", budgets = 0.2, metrics = \"needle\", model = \"m\" }\n",
                  &cfg, &err),
             &err);
    if (!err.code) {
        CHECK_EQ_INT(cfg.experiments[0].backend_openai, 1);
        kvs_config_free(&cfg);
    }
    refuse(HEAD "  backend = { url = \"http://a:1\", api = \"openai\" },\n" NIAH TAIL "}\n",
           "method 'snapkv': backend api 'openai'", "can only evaluate 'full'");
    refuse(HEAD "  backend = { url = \"http://a:1\", api = \"openai\" },\n" NIAH
                "  methods = \"full\", budgets = 0.2, metrics = \"needle\", mode = \"query_agnostic\" }\n",
           "task.lua:5: mode", "query_agnostic needs the kvsieve kv_compression extension");
    refuse(HEAD "  backend = { embedded = true, api = \"openai\" },\n" NIAH TAIL "}\n", "backend.api",
           "embedded backend");
    refuse(HEAD "  backend = { url = \"http://a:1\", api = \"grpc\" },\n" NIAH TAIL "}\n",
           "backend.api", "'grpc' is not one of: kvsieve, openai");
    refuse(HEAD "  backend = { url = { \"http://a:1\", \"ftp://b\" } },\n" NIAH TAIL "}\n",
           "backend.url[2]", "not an http:// or https:// URL");
    refuse(HEAD "  backend = { url = \"http://a:1\", embedded = true },\n" NIAH TAIL "}\n",
           "give exactly one of embedded = true or url", NULL);
    refuse(HEAD "  backend = { url = \"http://a:1\", threads = 2 },\n" NIAH TAIL "}\n",
           "backend.threads", "only for embedded = true");
    /* backend.cache: kvsieve serve's KV cache types */
    CHECK_OK(load(HEAD "  backend = { embedded = true, cache = { type = \"q4_0\" } },\n" NIAH TAIL "}\n", &cfg, &err),
             &err);
    if (!err.code) {
        CHECK(!strcmp(cfg.experiments[0].backend_cache_k, "q4_0") && !strcmp(cfg.experiments[0].backend_cache_v, "q4_0"));
        kvs_config_free(&cfg);
    }
    CHECK_OK(load(HEAD "  backend = { embedded = true, cache = { k = \"q8_0\" } },\n" NIAH TAIL "}\n", &cfg, &err),
             &err);
    if (!err.code) {
        CHECK(!strcmp(cfg.experiments[0].backend_cache_k, "q8_0") && !strcmp(cfg.experiments[0].backend_cache_v, "f16"));
        kvs_config_free(&cfg);
    }
    refuse(HEAD "  backend = { embedded = true, cache = { type = \"q5_0\" } },\n" NIAH TAIL "}\n",
           "backend.cache.type", "'q5_0' is not one of: f16, bf16, f32, q8_0, q4_0");
    refuse(HEAD "  backend = { embedded = true, cache = { type = \"q8_0\", v = \"q4_0\" } },\n" NIAH TAIL "}\n",
           "backend.cache", "not both");
    refuse(HEAD "  backend = { embedded = true, cache = \"q8_0\" },\n" NIAH TAIL "}\n", "backend.cache", "got a string");
    refuse(HEAD "  backend = { url = \"http://a:1\", cache = { type = \"q8_0\" } },\n" NIAH TAIL "}\n",
           "backend.cache", "only for embedded = true");
    refuse(HEAD "  backend = { embedded = true, model = \"a\" }, model = \"b\",\n" NIAH TAIL "}\n",
           "model", "differs from backend.model 'a'");
    refuse(HEAD NIAH TAIL "  mode = \"agnostic\",\n}\n", "task.lua:5: mode",
           "'agnostic' is not one of: query_aware, query_agnostic");
    refuse(HEAD NIAH TAIL "  template = \"neddle\",\n}\n", "template", "did you mean 'needle'");
    refuse(HEAD NIAH TAIL "  n_predict = 0,\n}\n", "n_predict", "out of range");
    refuse(HEAD NIAH "  methods = \"full\", budgets = 0.2, metrics = { \"needel\" } }\n", "metrics[1]",
           "'needel' is not one of");
    refuse(HEAD "  dataset = jsonl { file = \"x\" },\n" TAIL "}\n", "dataset.file", NULL);
    refuse(HEAD "  dataset = milebench { },\n" TAIL "}\n", "dataset.path: missing (required)", NULL);
    refuse("experiment { name = \"f\", dataset = jsonl { path = \"x\" }, methods = \"full\", budgets = 0.2 }\n",
           "jsonl{...} is for kind 'task'", NULL);
    refuse("experiment { name = \"f\", dataset = synthetic { shape = \"tiny\", n_tokens = 64 },\n"
           "  methods = \"full\", budgets = 0.2, mode = \"query_aware\" }\n",
           "mode", "belongs to kind 'task'");
    return kvs_test_finish("task_config");
}

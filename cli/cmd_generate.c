/*
 * cmd_generate.c -- `kvsieve generate`: one-shot greedy generation with a GGUF
 * model, optionally compressing the KV cache after prefill with a method.
 * Prints the generated text on stdout and timings / KV statistics on stderr.
 * What it is not: no sampling beyond greedy (the HTTP server has sampling),
 * no batching.
 */
#ifdef KVS_HAVE_BACKEND
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvs_backend.h"
#include "kvs_parts.h"
#include "kvsieve_methods.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvsieve generate --model PATH|default --prompt TEXT [options]\n"
            "  --max-tokens N      tokens to generate (default 64)\n"
            "  --threads N         worker threads (default 2)\n"
            "  --ctx N             context length (default: prompt + max tokens)\n"
            "  --cache-type T      KV cache element type: f16 (default), bf16, f32, q8_0, q4_0,\n"
            "                      kivi2, kivi4 (KIVI: G 32, R 128; K and V both kivi)\n"
            "  -ctk T, -ctv T      the K / V cache type alone (--cache-type-k, --cache-type-v)\n"
            "  --kivi-group G, --kivi-residual R   kivi caches' group and fp16 window (32, 128)\n"
            "  --chat              wrap the prompt in the model's chat template\n"
            "  --method M          compress the cache after prefill (see `kvsieve methods`; a name or\n"
            "                      a composition such as {\"score\":\"tova\",\"keep\":{\"sinks\":4}})\n"
            "  --ratio R | --tokens T   budget per layer (default ratio 0.5)\n"
            "  --param name=value  method parameter (repeatable)\n"
            "  --compress-local    also compress sliding-window layers\n"
            "  --show-tokens       print the prompt token ids to stderr\n");
}

/* greedy; a NaN logit ends the command (cli/ may exit) */
static int argmax(const float *x, int n) {
    int b = kvs_argmax(x, n);
    if (b < 0) {
        fprintf(stderr, "kvsieve: the model produced a NaN logit\n");
        exit(1);
    }
    return b;
}

int kvs_cmd_generate(int argc, char **argv) {
    const char *model_spec = NULL, *prompt = NULL, *method_name = NULL;
    const char *params[KVS_MAX_PARAMS];
    int n_params = 0, chat = 0, compress_local = 0, show_tokens = 0;
    long max_tokens = 64, threads = 2, ctx = 0;
    int cache_type = KVS_CACHE_F16, cache_type_v = 0, ctr;
    long kivi[2] = {0, 0}; /* --kivi-group, --kivi-residual */
    char ctname[32];
    double ratio = 0;
    long tokens_budget = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--model")) {
            if (!(model_spec = kvs_arg_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--prompt")) {
            if (!(prompt = kvs_arg_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--method")) {
            if (!(method_name = kvs_arg_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--max-tokens")) {
            const char *v = kvs_arg_value(argc, argv, &i);
            if (!v || kvs_arg_int(a, v, 0, 1 << 20, &max_tokens)) return 2;
        } else if (!strcmp(a, "--threads")) {
            const char *v = kvs_arg_value(argc, argv, &i);
            if (!v || kvs_arg_int(a, v, 1, 256, &threads)) return 2;
        } else if (!strcmp(a, "--ctx")) {
            const char *v = kvs_arg_value(argc, argv, &i);
            if (!v || kvs_arg_int(a, v, 1, 1 << 24, &ctx)) return 2;
        } else if ((ctr = kvs_arg_cache_type("generate", argc, argv, &i, &cache_type, &cache_type_v)) >= 0) {
            if (ctr) return 2;
        } else if ((ctr = kvs_arg_kivi(argc, argv, &i, kivi)) >= 0) {
            if (ctr) return 2;
        } else if (!strcmp(a, "--ratio")) {
            const char *v = kvs_arg_value(argc, argv, &i);
            if (!v || kvs_arg_double(a, v, 1e-9, 1.0, &ratio)) return 2;
        } else if (!strcmp(a, "--tokens")) {
            const char *v = kvs_arg_value(argc, argv, &i);
            if (!v || kvs_arg_int(a, v, 1, 1 << 24, &tokens_budget)) return 2;
        } else if (!strcmp(a, "--param")) {
            const char *v = kvs_arg_value(argc, argv, &i);
            if (!v) return 2;
            if (n_params == KVS_MAX_PARAMS) {
                fprintf(stderr, "kvsieve generate: too many --param flags\n");
                return 2;
            }
            params[n_params++] = v;
        } else if (!strcmp(a, "--chat")) {
            chat = 1;
        } else if (!strcmp(a, "--compress-local")) {
            compress_local = 1;
        } else if (!strcmp(a, "--show-tokens")) {
            show_tokens = 1;
        } else {
            fprintf(stderr, "kvsieve generate: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!model_spec || !prompt) {
        fprintf(stderr, "kvsieve generate: --model and --prompt are required\n");
        usage(stderr);
        return 2;
    }
    if (ratio > 0 && tokens_budget > 0) {
        fprintf(stderr, "kvsieve generate: give --ratio or --tokens, not both\n");
        return 2;
    }
    kvs_err err = {0};
    kvs_compress_opts co;
    memset(&co, 0, sizeof co);
    kvs_composed *owned = NULL; /* --method '{...}': composed from parts */
    if (method_name) {
        if (kvs_method_resolve(method_name, &co.method, &owned, &err) != KVS_OK) {
            fprintf(stderr, "kvsieve generate: --method: %s\n", err.msg);
            return 2;
        }
        kvs_params_defaults(co.method, &co.params);
        for (int i = 0; i < n_params; i++)
            if (kvs_params_set_kv(co.method, &co.params, params[i], &err) != KVS_OK) {
                fprintf(stderr, "kvsieve generate: --param: %s\n", err.msg);
                kvs_composed_free(owned);
                return 2;
            }
        if (tokens_budget > 0) co.budget.tokens = tokens_budget;
        else co.budget.ratio = ratio > 0 ? ratio : 0.5;
        co.compress_local = compress_local;
    } else if (n_params || ratio > 0 || tokens_budget > 0) {
        fprintf(stderr, "kvsieve generate: --param/--ratio/--tokens need --method\n");
        return 2;
    }

    int rc = 1;
    char path[1024];
    kvs_model *m = NULL;
    kvs_session *s = NULL;
    int32_t *toks = NULL;
    float *logits = NULL;
    char *text = NULL;
    if (kvs_model_resolve(model_spec, path, sizeof path, &err) != KVS_OK) {
        fprintf(stderr, "kvsieve generate: %s\n", err.msg);
        kvs_composed_free(owned);
        return 1;
    }
    kvs_model_opts mo = {(int)threads};
    double t_load = kvs_now_ms();
    if (kvs_model_load(path, &mo, &m, &err) != KVS_OK) goto fail;
    t_load = kvs_now_ms() - t_load;
    const kvs_model_info *info = kvs_model_get_info(m);
    if (chat) {
        kvs_chat_msg msg = {"user", prompt};
        if (kvs_chat_apply(m, &msg, 1, 1, &text, &err) != KVS_OK) goto fail;
    }
    int n = 0;
    if (kvs_tokenize(m, chat ? text : prompt, strlen(chat ? text : prompt), !chat, chat, &toks, &n, &err) != KVS_OK)
        goto fail;
    if (n == 0) {
        fprintf(stderr, "kvsieve generate: the prompt tokenised to nothing\n");
        goto cleanup;
    }
    if (show_tokens) {
        fprintf(stderr, "prompt tokens (%d):", n);
        for (int i = 0; i < n; i++) fprintf(stderr, " %d", toks[i]);
        fprintf(stderr, "\n");
    }
    kvs_session_opts so = {ctx > 0 ? (int)ctx : n + (int)max_tokens + 1, (int)threads, 0, cache_type, cache_type_v};
    if (co.method) so.record_queries = kvs_method_queries_needed(co.method, &co.params, n);
    const int recon = co.method && (co.method->needs & KVS_NEED_RECON); /* kvzip: the reconstruction pass */
    if (recon && ctx <= 0) so.n_ctx += (n < 2048 ? n : 2048) + 64; /* room for its input after the prompt */
    if (kvs_session_new(m, &so, &s, &err) != KVS_OK || kvs_kivi_apply(s, cache_type, kivi, &err) != KVS_OK) goto fail;
    if (recon) kvs_session_set_recon(s, -1);
    logits = malloc((size_t)info->n_vocab * sizeof *logits);
    if (!logits) {
        fprintf(stderr, "kvsieve generate: out of memory\n");
        goto cleanup;
    }
    double t0 = kvs_now_ms();
    if (kvs_session_prefill(s, toks, n, NULL, logits, &err) != KVS_OK) goto fail;
    double t_prefill = kvs_now_ms() - t0 - kvs_session_recon_ms(s); /* the pass counts in compress_ms */
    kvs_kv_stats st;
    if (kvs_session_compress(s, &co, &st, &err) != KVS_OK) goto fail;
    int generated = 0;
    double t1 = kvs_now_ms();
    int32_t tok = argmax(logits, info->n_vocab);
    while (generated < max_tokens) {
        if (kvs_token_is_eog(m, tok)) break;
        char piece[256];
        int w = kvs_token_to_piece(m, tok, 0, piece, sizeof piece);
        if (w > 0 && w <= (int)sizeof piece) fwrite(piece, 1, (size_t)w, stdout);
        fflush(stdout);
        generated++;
        if (generated == max_tokens || kvs_session_n_past(s) >= kvs_session_n_ctx(s)) break;
        if (kvs_session_decode(s, tok, logits, &err) != KVS_OK) goto fail;
        tok = argmax(logits, info->n_vocab);
    }
    double t_decode = kvs_now_ms() - t1;
    printf("\n");
    fprintf(stderr,
            "model %s (%s, %d layers, %d local), load %.0f ms, %s KV cache\n"
            "prompt %d tokens: prefill %.1f ms (%.1f tok/s)\n"
            "compress (%s): %.2f ms; KV bytes %lld -> %lld (global %lld -> %lld, local %lld -> %lld)%s%s\n"
            "decode %d tokens: %.1f ms (%.1f tok/s)\n",
            info->name, info->arch, info->n_layers, info->n_local_layers, t_load,
            kvs_cache_types_str(cache_type, cache_type_v, ctname), n, t_prefill,
            n * 1000.0 / t_prefill, st.method, st.compress_ms, (long long)st.bytes_before_total,
            (long long)st.bytes_after_total, (long long)st.bytes_before_global, (long long)st.bytes_after_global,
            (long long)st.bytes_before_local, (long long)st.bytes_after_local, st.note[0] ? "; " : "", st.note,
            generated, t_decode, generated > 1 ? (generated - 1) * 1000.0 / t_decode : 0.0);
    rc = 0;
    goto cleanup;
fail:
    fprintf(stderr, "kvsieve generate: %s\n", err.msg);
cleanup:
    free(text);
    free(logits);
    free(toks);
    kvs_session_free(s);
    kvs_model_free(m);
    kvs_composed_free(owned);
    return rc;
}
#endif

/*
 * main.c -- `kvsieve`: dispatch to a subcommand. Nothing else lives here.
 */
#include <stdio.h>
#include <string.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "cli.h"
#include "kvsieve.h"

static const kvs_cli_command commands[] = {
    {"demo", kvs_cmd_demo, "offline demo: synthesise a cache, compress with every method, print fidelity"},
    {"methods", kvs_cmd_methods, "list methods, their parameters, defaults and ranges"},
    {"synth", kvs_cmd_synth, "write a realistic synthetic cache dump (safetensors)"},
    {"compress", kvs_cmd_compress, "compress a cache dump: plan JSON and/or compressed dump"},
    {"fidelity", kvs_cmd_fidelity, "attention-output error and outlier retention, a row per method"},
    {"devices", kvs_cmd_devices, "list the CUDA devices the GPU path can use"},
#ifdef KVS_HAVE_EVAL
    {"run", kvs_cmd_run, "run a Lua experiment config into the results database"},
    {"report", kvs_cmd_report, "tables and plots from the results database"},
    {"merge", kvs_cmd_merge, "union results databases (the shards of a distributed run)"},
#endif
#ifdef KVS_HAVE_BACKEND
    {"generate", kvs_cmd_generate, "one-shot generation with a GGUF model (optionally compressed)"},
    {"bench", kvs_cmd_bench, "prefill and decode tokens/s of a model"},
    {"models", kvs_cmd_models, "the models --model NAME takes, and which are installed"},
#endif
#ifdef KVS_HAVE_SERVER
    {"serve", kvs_cmd_serve, "serve a GGUF model over HTTP with KV-compression hooks"},
#endif
};

static void usage(FILE *f) {
    fprintf(f, "kvsieve %s -- KV-cache compression benchmark and evaluation\n\nusage: kvsieve COMMAND [options]\n\n",
            KVS_VERSION);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n`kvsieve COMMAND --help` describes a command.\n");
}

/* Keep freed memory mapped. Every request allocates and frees scratch of
 * 0.1-30 MB (a method's workspace, cache copies); glibc's defaults hand such
 * blocks back to the kernel on free (mmap, or a heap trim), so the next
 * request takes a zero-filled page fault on every page again: 20-30% of
 * FlashCache's compress time at the quick start's shape (perf, cpu-clock).
 * Blocks up to 32 MiB (glibc's maximum) come from the heap, and a heap is
 * trimmed only when 512 MiB lie free at its top: a long-running server holds
 * its peak of such scratch, which the next request needs again. A process
 * setting, so it lives here (cli/ owns the process). */
static void heap_keep_pages(void) {
#if defined(__GLIBC__)
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
#endif
}

int main(int argc, char **argv) {
    heap_keep_pages();
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("kvsieve %s\n", KVS_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "kvsieve: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}

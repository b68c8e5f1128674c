/*
 * features.c -- what this CPU and this build can run: the probes behind the
 * ISA variants of backend/cpu/ (AVX-512 VNNI dots, the block-scale route's
 * AVX-512 VNNI and AMX-INT8 engines, the AVX-512F attention kernels) and the
 * block-scale route's choice (kvs_dot_bs_route). Each answer is a fact about
 * the machine and the process, computed once; KVSIEVE_BS=0, KVSIEVE_AMX=0
 * and KVSIEVE_ATTN512=0 in the environment turn a variant off.
 * dispatch.c reads these answers to send each call to its kernel; the
 * variants' own asserts read them too (this file calls no kernel).
 * Compiled with the build's common flags: it only asks, it runs nothing of
 * the instructions it asks about (AMX: CPUID, XCR0 and the Linux permission).
 * What it is not: no kernel, no choice between kernels (dispatch.c).
 */
#define _GNU_SOURCE /* syscall() */
#include <stdatomic.h>
#include <stdlib.h>

#if defined(KVS_HAVE_DOT_AMX)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "cpu_private.h"

/* ---- dot.c's VNNI build (dot_vnni.c) ---------------------------------------------- */
int kvs_dot_vnni_available(void) {
#if defined(KVS_HAVE_DOT_VNNI)
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
#else
    return 0;
#endif
}

/* ---- the AMX-INT8 engine (dot_amx.c) ----------------------------------------------- */
#if defined(KVS_HAVE_DOT_AMX)
/* CPUID says whether the CPU has AMX-TILE, AMX-INT8 and AVX-512; XCR0 whether
 * the kernel saves tile state; Linux then hands out tile data only to a
 * process that asked (arch_prctl ARCH_REQ_XCOMP_PERM). KVSIEVE_AMX=0 turns
 * the route off (valgrind cannot decode AMX; A/B measurements). The answer
 * is cached: a fact about this machine and process, computed once. */
#define KVS_ARCH_REQ_XCOMP_PERM 0x1023
#define KVS_XFEATURE_XTILEDATA 18

static int amx_probe(void) {
    const char *e = getenv("KVSIEVE_AMX");
    if (e && e[0] == '0') return 0;
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    int tile = (d >> 24) & 1, int8 = (d >> 25) & 1, f = (b >> 16) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
    int vnni = (c >> 11) & 1;
    if (!(tile && int8 && f && bw && vl && vnni)) return 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return 0; /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0x600e6) != 0x600e6) return 0; /* SSE, AVX, AVX-512 and tile state enabled */
    return syscall(SYS_arch_prctl, KVS_ARCH_REQ_XCOMP_PERM, KVS_XFEATURE_XTILEDATA) == 0;
}

int kvs_dot_amx_available(void) {
    static atomic_int state; /* 0 not asked yet, 1 usable, -1 not */
    int s = atomic_load_explicit(&state, memory_order_acquire);
    if (s == 0) {
        s = amx_probe() ? 1 : -1;
        atomic_store_explicit(&state, s, memory_order_release);
    }
    return s > 0;
}
#else
int kvs_dot_amx_available(void) { return 0; } /* this build has no AMX engine (dot_amx.c) */
#endif

/* ---- the block-scale route (dot_bs.c, dot_amx.c) ------------------------------------ */
#if defined(KVS_HAVE_DOT_BS)
/* ---- which engine ------------------------------------------------------------
 * AMX where kvs_dot_amx_available(), else the AVX-512 VNNI engine where the
 * CPU has AVX512F, BW, VL and VNNI: on a 2-core Zen 4 it decodes 8-32
 * sequences 1.5-2.9x faster than dot.c's kernels, 2-4 at their speed, one
 * 0-10% slower (docs/performance.md, "Batched decode").
 * KVSIEVE_BS=0 turns the route off (dot.c's kernels take every call: A/B
 * measurements, and outputs bit for bit those of an AVX2-only machine).
 * Cached: a fact about this machine and process. */
int kvs_dot_bs_vnni_available(void) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

static int bs_probe(void) {
    const char *e = getenv("KVSIEVE_BS");
    if (e && e[0] == '0') return 0;
    if (kvs_dot_amx_available()) return 2;
    return kvs_dot_bs_vnni_available() ? 1 : 0;
}

int kvs_dot_bs_engine(void) {
    static atomic_int state; /* 0 not asked yet, else engine + 1 */
    int s = atomic_load_explicit(&state, memory_order_acquire);
    if (s == 0) {
        s = bs_probe() + 1;
        atomic_store_explicit(&state, s, memory_order_release);
    }
    return s - 1;
}

int kvs_dot_bs_route(int type, int64_t n) {
    const int ok = type == KVS_GGML_Q8_0 || type == KVS_GGML_Q5_0
                       ? n % 32 == 0
                       : (type == KVS_GGML_Q4_K || type == KVS_GGML_Q6_K) && n % 256 == 0;
    return ok && n > 0 && n <= KVS_BS_NMAX && kvs_dot_bs_engine() > 0;
}
#else
/* This build has no block-scale route (dot_bs.c): it is never taken. */
int kvs_dot_bs_engine(void) { return 0; }
int kvs_dot_bs_vnni_available(void) { return 0; }
int kvs_dot_bs_route(int type, int64_t n) {
    (void)type, (void)n;
    return 0;
}
#endif

/* ---- the AVX-512F attention kernels (attn512.c) -------------------------------------- */
#if defined(KVS_HAVE_ATTN512)
int kvs_attn512_available(void) {
    static atomic_int state; /* 0 not asked yet, 1 no, 2 yes */
    int s = atomic_load_explicit(&state, memory_order_acquire);
    if (s == 0) {
        const char *e = getenv("KVSIEVE_ATTN512");
        s = (e && e[0] == '0') || !__builtin_cpu_supports("avx512f") ? 1 : 2;
        atomic_store_explicit(&state, s, memory_order_release);
    }
    return s == 2;
}
#endif

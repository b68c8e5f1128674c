/*
 * dot_vnni.c -- dot.c compiled with AVX-512 VNNI (backend/CMakeLists.txt
 * adds the flags; only KVS_DP4 differs). Its kernels run only where
 * kvs_dot_vnni_available() says the CPU has them.
 */
#define KVS_DOT_VNNI 1
#include "dot.c"

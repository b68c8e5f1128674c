/*
 * dot_vnni.c -- dot.c compiled with AVX-512 VNNI (backend/cpu/CMakeLists.txt
 * adds the flags; only KVS_DP4 differs). Its kernels run only where
 * kvs_dot_vnni_available() (features.c) says the CPU has them; dispatch.c
 * sends the calls. Reference: dot.c's x86-64-v3 build, bit for bit
 * (tests/backend/test_backend_quant_cols.c compares the two builds).
 */
#define KVS_DOT_VNNI 1
#include "dot.c"

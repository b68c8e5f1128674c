/*
 * abi_tensor.c -- tensor descriptors of the C ABI: validation of a caller's
 * kvs_abi_tensor, its conversion to a core kvs_view (in place when the
 * strides allow, else one contiguous copy on the host), and the checks of
 * output descriptors.
 * What it is not: no compression, no context logic (abi.c).
 */
#include "abi_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t abi_dtype_size(int dtype) {
    switch (dtype) {
    case KVS_ABI_F32: return 4;
    case KVS_ABI_F16: return 2;
    case KVS_ABI_BF16: return 2;
    case KVS_ABI_U8: return 1;
    case KVS_ABI_I32: return 4;
    case KVS_ABI_I64: return 8;
    default: return 0;
    }
}

const char *abi_dtype_name(int dtype) {
    switch (dtype) {
    case KVS_ABI_F32: return "F32";
    case KVS_ABI_F16: return "F16";
    case KVS_ABI_BF16: return "BF16";
    case KVS_ABI_U8: return "U8";
    case KVS_ABI_I32: return "I32";
    case KVS_ABI_I64: return "I64";
    default: return "unknown";
    }
}

kvs_status abi_read_struct(const void *in, size_t size, size_t min_size, void *local, const char *what,
                           kvs_err *err) {
    memset(local, 0, size);
    if (!in) return kvs_errorf(err, KVS_ERR_INVALID, "%s is NULL", what);
    uint32_t have;
    memcpy(&have, in, sizeof have);
    if (have < min_size)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "%s: struct_size %u is smaller than the ABI 1.0 struct (%zu bytes); set it "
                          "to sizeof the struct",
                          what, (unsigned)have, min_size);
    memcpy(local, in, have < size ? have : size);
    return KVS_OK;
}

static void shape_text(const kvs_abi_tensor *t, char *buf, size_t n) {
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < t->ndim && i < KVS_ABI_MAX_DIMS && o + 1 < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "[%lld]", (long long)t->shape[i]);
}

/* Common checks of a descriptor already copied to a full-size local. */
static kvs_status check_desc(const kvs_abi_tensor *t, const char *what, kvs_err *err) {
    if (t->dtype < KVS_ABI_F32 || t->dtype > KVS_ABI_I64)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: unknown dtype %d", what, (int)t->dtype);
    if (t->device != KVS_ABI_HOST && t->device != KVS_ABI_CUDA)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: unknown device %d (0 host, 1 cuda)", what,
                          (int)t->device);
    if (t->device == KVS_ABI_CUDA) {
#ifndef KVSIEVE_HAVE_CUDA
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "%s: CUDA tensor (device %d), but libkvsieve was built without CUDA", what,
                          (int)t->device_index);
#else
        if (t->device_index < 0)
            return kvs_errorf(err, KVS_ERR_INVALID, "%s: CUDA device_index %d", what,
                              (int)t->device_index);
#endif
    }
    if (t->ndim < 1 || t->ndim > KVS_ABI_MAX_DIMS)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: ndim %d outside [1, %d]", what, (int)t->ndim,
                          KVS_ABI_MAX_DIMS);
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] < 0 || t->shape[i] > INT32_MAX)
            return kvs_errorf(err, KVS_ERR_INVALID, "%s: shape[%d] = %lld outside [0, 2^31)", what, i,
                              (long long)t->shape[i]);
    if (!t->data) return kvs_errorf(err, KVS_ERR_INVALID, "%s: data is NULL", what);
    return KVS_OK;
}

/* Reads dims of a 3-dim [H][N][d] tensor, allowing a leading batch of 1. */
static kvs_status dims3(const kvs_abi_tensor *t, const char *what, int64_t dims[3], int64_t st[3],
                        kvs_err *err) {
    char sh[128];
    shape_text(t, sh, sizeof sh);
    int o = 0;
    if (t->ndim == 4) {
        if (t->shape[0] != 1)
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "%s: shape %s has batch %lld (the ABI takes one sequence: batch must "
                              "be 1)",
                              what, sh, (long long)t->shape[0]);
        o = 1;
    } else if (t->ndim != 3) {
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "%s: ndim %d, shape %s (need [H][N][d] or [1][H][N][d])", what,
                          (int)t->ndim, sh);
    }
    for (int i = 0; i < 3; i++) {
        dims[i] = t->shape[o + i];
        st[i] = t->strides[o + i];
        if (dims[i] < 1)
            return kvs_errorf(err, KVS_ERR_INVALID, "%s: shape %s has shape[%d] = %lld (need >= 1)",
                              what, sh, o + i, (long long)dims[i]);
    }
    return KVS_OK;
}

kvs_status abi_view_from_tensor(const kvs_abi_tensor *in, const char *what, kvs_view *out,
                                int *device_index, void **copy, int64_t *copied_bytes, kvs_err *err) {
    kvs_abi_tensor t;
    kvs_status st;
    *copy = NULL;
    *copied_bytes = 0;
    if ((st = abi_read_struct(in, sizeof t, sizeof t, &t, what, err))) return st;
    if ((st = check_desc(&t, what, err))) return st;
    if (t.dtype != KVS_ABI_F32 && t.dtype != KVS_ABI_F16 && t.dtype != KVS_ABI_BF16)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: dtype %s (need F32, F16 or BF16)", what,
                          abi_dtype_name(t.dtype));
    int64_t dims[3], s[3];
    if ((st = dims3(&t, what, dims, s, err))) return st;
    const int64_t H = dims[0], N = dims[1], d = dims[2];
    /* A stride of a size-1 dimension is never used: make it canonical, so
     * that e.g. torch's strides of a [1][N][d] slice do not force a copy. */
    if (d == 1) s[2] = 1;
    if (N == 1) s[1] = d;
    if (H == 1) s[0] = N * d;
    const int in_place = s[2] == 1 && s[1] >= d && s[0] >= d;
    out->dtype = t.dtype == KVS_ABI_F32 ? KVS_F32 : t.dtype == KVS_ABI_F16 ? KVS_F16 : KVS_BF16;
    out->device = t.device == KVS_ABI_CUDA ? KVS_CUDA : KVS_HOST;
    out->n_heads = (int)H;
    out->n_tokens = (int)N;
    out->head_dim = (int)d;
    *device_index = t.device == KVS_ABI_CUDA ? (int)t.device_index : 0;
    if (in_place) {
        out->data = t.data;
        out->s_head = s[0];
        out->s_tok = s[1];
        return KVS_OK;
    }
    if (t.device == KVS_ABI_CUDA)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "%s: CUDA tensor with strides [%lld][%lld][%lld] cannot be read in place "
                          "(need channel stride 1, head and token strides >= d = %lld); pass a "
                          "contiguous tensor",
                          what, (long long)s[0], (long long)s[1], (long long)s[2], (long long)d);
    const size_t es = abi_dtype_size(t.dtype);
    const size_t bytes = (size_t)H * (size_t)N * (size_t)d * es;
    unsigned char *dst = malloc(bytes); /* [H][N][d] */
    if (!dst)
        return kvs_errorf(err, KVS_ERR_NOMEM, "%s: no memory for a contiguous copy (%zu bytes)", what,
                          bytes);
    const unsigned char *src = t.data;
    size_t o = 0;
    for (int64_t h = 0; h < H; h++)
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < d; c++, o += es)
                memcpy(dst + o, src + (h * s[0] + n * s[1] + c * s[2]) * (int64_t)es, es);
    *copy = dst;
    *copied_bytes = (int64_t)bytes;
    out->data = dst;
    out->s_head = N * d;
    out->s_tok = d;
    return KVS_OK;
}

kvs_status abi_check_out(const kvs_abi_tensor *in, const char *what, unsigned allowed, int device,
                         int device_index, int nd, const int64_t *dims, int64_t *st, kvs_err *err) {
    kvs_abi_tensor t;
    kvs_status s;
    if ((s = abi_read_struct(in, sizeof t, sizeof t, &t, what, err))) return s;
    if ((s = check_desc(&t, what, err))) return s;
    if (!(allowed & (1u << t.dtype))) {
        char names[64] = "";
        for (int dt = KVS_ABI_F32; dt <= KVS_ABI_I64; dt++)
            if (allowed & (1u << dt)) {
                if (names[0]) strncat(names, ", ", sizeof names - strlen(names) - 1);
                strncat(names, abi_dtype_name(dt), sizeof names - strlen(names) - 1);
            }
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: dtype %s (need %s)", what, abi_dtype_name(t.dtype),
                          names);
    }
    if (t.device != device)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: %s tensor, but the cache is %s memory", what,
                          t.device == KVS_ABI_CUDA ? "CUDA" : "host",
                          device == KVS_ABI_CUDA ? "CUDA" : "host");
    if (device == KVS_ABI_CUDA && t.device_index != device_index)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: on CUDA device %d, but the cache is on device %d",
                          what, (int)t.device_index, device_index);
    char sh[128], want[128];
    shape_text(&t, sh, sizeof sh);
    size_t o = 0;
    want[0] = 0;
    for (int i = 0; i < nd && o + 1 < sizeof want; i++)
        o += (size_t)snprintf(want + o, sizeof want - o, "[%lld]", (long long)dims[i]);
    const int lead = t.ndim == nd + 1;
    if ((t.ndim != nd && !lead) || (lead && t.shape[0] != 1))
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: shape %s (need %s or [1]%s)", what, sh, want, want);
    for (int i = 0; i < nd; i++) {
        if (t.shape[lead + i] != dims[i])
            return kvs_errorf(err, KVS_ERR_INVALID, "%s: shape %s (need %s or [1]%s): shape[%d] differs",
                              what, sh, want, want, lead + i);
        st[i] = t.strides[lead + i];
        if (st[i] < 0)
            return kvs_errorf(err, KVS_ERR_INVALID, "%s: strides[%d] = %lld is negative", what, lead + i,
                              (long long)st[i]);
    }
    if (device == KVS_ABI_CUDA) {
        int64_t want_st = 1;
        for (int i = nd - 1; i >= 0; i--) {
            if (dims[i] > 1 && st[i] != want_st)
                return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                                  "%s: CUDA output must be contiguous; strides[%d] = %lld, need %lld",
                                  what, lead + i, (long long)st[i], (long long)want_st);
            st[i] = want_st;
            want_st *= dims[i];
        }
    }
    return KVS_OK;
}
